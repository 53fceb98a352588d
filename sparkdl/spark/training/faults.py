"""Fault injection: hooks a fit's tasks call at fixed points, for tests (``benchmarks/chaos.py``
fires its faults from outside the library).

A production fit carries no hooks. Inside ``with inject(hooks):`` on the driver, the fits started
by this thread carry ``hooks`` in their tasks' plain-value settings; each training task calls
``hooks.before_steps(point)`` before the local steps of every slot it trains, on the executor. The
hooks here keep a marker file per fault in a folder the executors share with the driver (a local
folder on ``local`` and ``local-cluster`` masters), so a fault fires once however often Spark
retries the task.

Hooks are plain objects shipped in the task closure: define them at module level (never capture
a SparkSession or a model).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass

_ACTIVE = threading.local()


@dataclass(frozen=True)
class Point:
    """Where a task is: its ``partition``, the slot's ``epoch`` and ``round_in_epoch`` (and the
    fit's round ``index``), and the task's ``attempt`` (Spark's attempt number, 0 first)."""

    partition: int
    epoch: int
    round_in_epoch: int
    index: int
    attempt: int


class TaskHooks:
    """Base of the hooks: every hook does nothing."""

    def before_steps(self, point: Point) -> None:
        """Called by a training task before the local steps of each slot it trains."""


@contextlib.contextmanager
def inject(hooks: TaskHooks):
    """Fits started by this thread inside the block carry ``hooks`` to their tasks."""
    previous = getattr(_ACTIVE, "hooks", None)
    _ACTIVE.hooks = hooks
    try:
        yield hooks
    finally:
        _ACTIVE.hooks = previous


def active() -> TaskHooks | None:
    """The hooks of the fits this thread starts now (None outside :func:`inject`)."""
    return getattr(_ACTIVE, "hooks", None)


def _once(marker_dir: str, name: str) -> bool:
    """True the first time ``name`` is claimed in ``marker_dir`` (an exclusive create), else False."""
    os.makedirs(marker_dir, exist_ok=True)
    try:
        fd = os.open(os.path.join(marker_dir, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


@dataclass(frozen=True)
class Delay(TaskHooks):
    """Partition ``partition`` sleeps ``seconds`` before each slot's steps (a straggler)."""

    partition: int
    seconds: float

    def before_steps(self, point: Point) -> None:
        if point.partition == self.partition:
            time.sleep(self.seconds)


@dataclass(frozen=True)
class Fault(TaskHooks):
    """One fault, once: when partition ``partition`` reaches the fit's round (slot) ``index`` (or,
    with ``index`` = −(e + 1), the validation after epoch e in a ``ps`` worker's task), its task
    fails as ``how`` says:

    - ``"exit"``: the Python worker dies (``os._exit(1)``, as an out-of-memory kill looks to Spark);
    - ``"kill"``: the Python worker is killed by SIGKILL;
    - ``"raise"``: the task raises ``RuntimeError`` (a transient error);
    - ``"executor"``: the executor's JVM (the Python worker's parent process) is SIGKILLed;
    - ``"node"``: the node goes, as a spot termination takes it (:func:`kill_node`);
    - ``"hang"``: the Python worker stops itself (SIGSTOP: no more heartbeats, no progress).

    ``marker_dir`` holds one marker per fault (named by ``name``), so a retry does not fail again.
    """

    partition: int
    index: int
    how: str
    marker_dir: str
    name: str = "fault"

    def before_steps(self, point: Point) -> None:
        if point.partition != self.partition or point.index != self.index:
            return
        if not _once(self.marker_dir, self.name):
            return
        if self.how == "raise":
            raise RuntimeError(f"injected fault: partition {point.partition}, round {point.index}, attempt {point.attempt}")
        if self.how == "exit":
            os._exit(1)
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.how == "executor":
            os.kill(executor_pid(), signal.SIGKILL)
            time.sleep(60)
        if self.how == "node":
            kill_node()
        if self.how == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
        raise ValueError(f"Fault.how must be exit, kill, raise, executor, node or hang. Received: {self.how!r}")


@dataclass(frozen=True)
class Faults(TaskHooks):
    """Several hooks, called in order."""

    hooks: tuple[TaskHooks, ...]

    def before_steps(self, point: Point) -> None:
        for hook in self.hooks:
            hook.before_steps(point)


def kill_node() -> None:
    """SIGKILL this task's node as a spot termination takes it: on a standalone cluster the Worker
    daemon that started the executor (the executor JVM's parent), so no executor comes back, then the
    executor JVM; elsewhere the executor JVM alone. Does not return."""
    executor = executor_pid()
    try:
        with open(f"/proc/{executor}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            if b"org.apache.spark.deploy.worker.Worker" in f.read():
                os.kill(parent, signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass
    os.kill(executor, signal.SIGKILL)
    time.sleep(60)


def executor_pid() -> int:
    """The JVM that started this Python worker: the parent of the pyspark daemon (or of the worker)."""
    pid = os.getppid()
    for _ in range(3):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"java" in f.read().split(b"\0")[0]:
                    return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return os.getppid()
