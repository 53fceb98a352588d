"""A stage of long-lived worker tasks, as the driver runs and watches it: shared by the transports
whose workers stay in their tasks across rounds (``ps``, ``sharded``).

- :class:`Stage`: the stage's Spark job, run in the background under its own job tag
  (:func:`~sparkdl.spark.jobs.run_job`: Spark's failures become sparkdl errors).
- :class:`Monitor`: a thread that watches the workers' heartbeats (recorded by a server's
  :class:`~sparkdl.core.liveness.Contacts`) and cancels the stage when one falls silent
  (:func:`~sparkdl.core.liveness.silent_worker`), and the cluster's task slots, cancelling the
  stage when a node is lost for good (:class:`~sparkdl.spark.training.nodes.SlotWatch`).
- :class:`StageWatch`: the driver's waits on a stage: until a condition holds, failing when the
  stage failed or ended first, a worker fell silent, or the round's time ran out; every wait has
  a timeout.

The stage is not a barrier stage: Spark retries a failed task on its own (``spark.task.maxFailures``)
while the other workers wait at the round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pyarrow as pa

from sparkdl.core.liveness import STARTUP_GRACE_S, silent_worker
from sparkdl.errors import FitCancelledError, InvariantError, NodeLostError, RoundTimeoutError, WorkerError
from sparkdl.spark.jobs import run_job
from sparkdl.spark.session import cancel_tag, is_connect
from sparkdl.spark.training import recovery

log = logging.getLogger("sparkdl")
POLL_S = 0.1  # how often the driver's waits look at the stage and the workers' liveness
MONITOR_TICK_S = 0.25  # how often the monitor looks at the heartbeats


class Stage(threading.Thread):
    """One stage of the workers' tasks: ``action`` (e.g. ``df.mapInArrow(...).toArrow``) run as a
    Spark job in the background; :attr:`table` or :attr:`error` once :attr:`finished` is set."""

    def __init__(self, spark, action, description: str, tag: str, timeout_s: float) -> None:
        super().__init__(name=tag, daemon=True)
        self.spark, self.action, self.description, self.tag, self.timeout_s = spark, action, description, tag, timeout_s
        self.table: pa.Table | None = None
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            self.table = run_job(self.spark, self.action, self.description, self.tag, self.timeout_s)
        except BaseException as exc:  # handed to the driver's thread
            self.error = exc
        finally:
            self.finished.set()

    def cancel(self, wait_s: float = 30.0) -> None:
        """Cancel the stage's job (if it still runs) and wait up to ``wait_s`` seconds for it to end."""
        if not self.finished.is_set():
            cancel_tag(self.spark, self.tag)
            self.finished.wait(wait_s)


class Monitor(threading.Thread):
    """Watches the workers of a running stage. The first silent longer than ``timeout_s`` seconds
    (no heartbeat: hung, stopped or cut off), or not heard from at all within ``max(timeout_s,
    STARTUP_GRACE_S)`` of the stage's start (never started), has its task attempt killed
    (``SparkContext.killTaskAttempt``): Spark runs the task again, and the transport's retry path
    (each slot applied once, a slice served again) gives the same model; the new attempt gets the
    start's grace. An attempt Spark no longer runs (its Python worker or its executor was killed:
    Spark retries the task, maybe after resubmitting the stage) is not killed but its retry gets
    the start's grace too, once per attempt (:func:`~sparkdl.spark.training.recovery.silence_verdict`).
    A partition silent again after ``max_kills`` kills, or whose attempt cannot be killed (Spark
    Connect, an attempt never heard from), is recorded in :attr:`silent` and the stage cancelled. Before silence it looks at the task slots (``nodes``): while the cluster has
    fewer than the stage's running workers, no worker is judged by its silence, and when they stay
    short the node counts as lost (:attr:`lost`) and the stage is cancelled. It never ends on an
    error of its own: a failed look is retried at the next tick.

    Args:
        spark: the fit's session.
        contacts: returns the workers' contacts now (a server's ``contacts()``).
        timeout_s: ``workerTimeout``.
        max_kills: silent attempts killed per partition before the fit fails.
        nodes: counts the stage's task slots (None where they are fixed: ``local``, Connect).
    """

    def __init__(self, spark, contacts: Callable[[], dict], timeout_s: float, max_kills: int = 2, nodes=None) -> None:
        super().__init__(name="sparkdl-worker-monitor", daemon=True)
        self.spark, self.contacts, self.timeout_s, self.max_kills, self.nodes = spark, contacts, timeout_s, max_kills, nodes
        self.stop = threading.Event()
        self.silent: tuple[int, float] | None = None
        self.lost = None  # a NodeLoss: the stage went short of task slots for good
        self.watch: tuple[str, list[int], float] | None = None  # (tag, partitions, since)
        self.since: dict[int, float] = {}  # partition -> when it was last watched from (a kill restarts its grace)
        self.killed: list[dict] = []  # the silent attempts killed: partition, attempt, seconds silent
        self.gone: set[tuple[int, int]] = set()  # (partition, attempt) found gone already, their retry given the start's grace
        self.errors = 0

    def watch_stage(self, tag: str, partitions: list[int]) -> None:
        """Watch the stage tagged ``tag`` whose tasks are ``partitions``, from now."""
        self.silent = self.lost = None
        if self.nodes is not None:
            self.nodes.reset()
        now = time.monotonic()
        self.since = {p: now for p in partitions}
        self.watch = (tag, list(partitions), now)

    def run(self) -> None:
        while not self.stop.wait(MONITOR_TICK_S):
            try:
                self._look()
            except Exception:  # noqa: BLE001 - the next tick looks again
                self.errors += 1

    def _look(self) -> None:
        watch = self.watch
        if watch is None or self.silent is not None or self.lost is not None:
            return
        tag, partitions, _ = watch
        now = time.monotonic()
        contacts = self.contacts()
        if self.nodes is not None:
            running = sum(1 for p in partitions if not _done_since(contacts.get(str(p)), now - self.since.get(p, now)))
            self.lost = self.nodes.look(running)
            if self.lost is not None:
                cancel_tag(self.spark, tag)
                return
            if self.nodes.short:  # a worker waiting for a slot is judged by the node's rule, not by its silence
                return
        found = silent_worker(contacts, partitions, {p: now - self.since.get(p, now) for p in partitions}, self.timeout_s, STARTUP_GRACE_S)
        if found is None:
            return
        partition, silent = found
        attempt = (contacts.get(str(partition)) or {}).get("attempt")
        kills = sum(1 for k in self.killed if k["partition"] == partition)
        killed = attempt is not None and kills < self.max_kills and kill_task_attempt(
            self.spark, attempt, f"sparkdl: worker {partition} silent for {silent:.1f} s (workerTimeout={self.timeout_s:g})")
        verdict = recovery.silence_verdict(kills=kills, max_kills=self.max_kills, killed=killed,
                                           kill_refused_by_spark=attempt is not None and not is_connect(self.spark),
                                           seen_gone=(partition, attempt) in self.gone)
        if verdict == recovery.KILLED:
            self.killed.append({"partition": partition, "attempt": attempt, "silent_s": round(silent, 1)})
            self.since[partition] = now  # its next attempt: judged from now, with the start's grace
            return
        if verdict == recovery.RETRYING:  # the attempt is gone already (killed Python worker, lost executor): Spark retries it
            self.gone.add((partition, attempt))
            self.since[partition] = now
            log.info("sparkdl: worker %d's task attempt %s is gone (Spark runs no such task); its retry gets %g s to be heard from",
                     partition, attempt, max(self.timeout_s, STARTUP_GRACE_S))
            return
        self.silent = found
        cancel_tag(self.spark, tag)

    def close(self) -> None:
        self.stop.set()
        self.join(5.0)


def _done_since(contact: dict | None, watched_s: float) -> bool:
    """Whether a worker's contact says its task ended in the stage watched for ``watched_s`` seconds
    (a ``done`` heard before, from an earlier stage, says nothing of this one)."""
    return contact is not None and contact["state"] == "done" and contact["seconds"] <= watched_s


def stage_attempt(spark, stage_id: int) -> int | None:
    """The current attempt of Spark stage ``stage_id`` (``SparkStatusTracker.getStageInfo``): 0, then
    1, 2, ... each time Spark resubmits it. None where it is not known (Spark Connect, a stage no
    longer tracked)."""
    from sparkdl.spark.session import is_connect

    if is_connect(spark):
        return None
    try:
        info = spark.sparkContext.statusTracker().getStageInfo(int(stage_id))
    except Exception:  # noqa: BLE001 - the JVM did not answer: no stage attempt for this registration
        return None
    return None if info is None else int(info.currentAttemptId)


def kill_task_attempt(spark, attempt: int, reason: str) -> bool:
    """Kill task attempt ``attempt`` (Spark's task id, ``TaskContext.taskAttemptId()``): Spark runs
    the task again (a killed attempt does not count toward ``spark.task.maxFailures``). Returns
    False where it cannot (Spark Connect, an attempt Spark no longer runs)."""
    from sparkdl.spark import internals
    from sparkdl.spark.session import is_connect

    if is_connect(spark):
        return False
    try:
        return internals.kill_task_attempt(spark.sparkContext, attempt, reason)
    except Exception:  # noqa: BLE001 - the JVM refused it: the caller fails the fit instead
        return False


class StageWatch:
    """The driver's view of one transport's stages: the running :class:`Stage` and its :class:`Monitor`.

    Args:
        spark: the fit's session.
        contacts: returns the workers' contacts (for the monitor and the failure messages).
        worker_timeout_s: ``workerTimeout``.
        round_timeout_s: ``roundTimeout``: the default bound of :meth:`wait`.
        what: the workers in words, for messages (``"ps worker"``).
        nodes: counts the task slots (:class:`~sparkdl.spark.training.nodes.SlotWatch`), or None.
        lost_advice: what to do when a node is lost for good (the end of :class:`NodeLostError`'s message).
    """

    def __init__(self, spark, contacts: Callable[[], dict], worker_timeout_s: float, round_timeout_s: float, what: str,
                 nodes=None, lost_advice: str = "") -> None:
        self.spark, self.contacts = spark, contacts
        self.worker_timeout_s, self.round_timeout_s, self.what, self.lost_advice = worker_timeout_s, round_timeout_s, what, lost_advice
        self.stage: Stage | None = None
        self.monitor = Monitor(spark, contacts, worker_timeout_s, nodes=nodes)
        self.monitor.start()

    def run(self, action, description: str, tag: str, timeout_s: float, partitions: list[int]) -> Stage:
        """Start ``action`` as the stage, watched from now."""
        self.stage = Stage(self.spark, action, description, tag, timeout_s)
        self.monitor.watch_stage(tag, partitions)
        self.stage.start()
        return self.stage

    @property
    def running(self) -> bool:
        return self.stage is not None and not self.stage.finished.is_set()

    def end(self, what: str) -> pa.Table | None:
        """Wait for the running stage to end (its workers ran their slots, or were told to stop) and
        return its table (None when no stage ran).

        Raises:
            WorkerError, RoundTimeoutError, FitCancelledError: see :meth:`wait`.
        """
        stage = self.stage
        if stage is None:
            return None
        self.wait(lambda: stage.finished.is_set(), what, stage_may_end=True)
        self.monitor.watch = None
        self.stage = None
        if stage.error is not None:
            raise self.failure(stage.error)
        return stage.table

    def abandon(self) -> None:
        """Cancel the running stage (a node was lost and the transport goes on without it) and forget it."""
        stage = self.stage
        self.monitor.watch = None
        self.stage = None
        self.monitor.silent = self.monitor.lost = None
        if stage is not None:
            stage.cancel()

    def failure(self, error: BaseException) -> BaseException:
        """The error to raise for a failed stage: a silent worker named, else Spark's cause with the
        workers' own messages."""
        if self.monitor.lost is not None:
            loss = self.monitor.lost
            return NodeLostError(f"every {self.what} needs a task slot at once: {loss.describe(self.what + 's')}; "
                                 f"the fit's job was cancelled. {self.lost_advice}".strip(), loss)
        if self.monitor.silent is not None:
            partition, silent = self.monitor.silent
            return WorkerError(
                f"every {self.what} must send a heartbeat at least every workerTimeout={self.worker_timeout_s:g} s. "
                f"Received: partition {partition} silent for {silent:.1f} s (dead, stopped, or never started: are there "
                "enough free task slots?); the fit's job was cancelled"
            )
        if isinstance(error, FitCancelledError):
            return error
        messages = "; ".join(f"partition {w}: {c['message']}" for w, c in sorted(self.contacts().items()) if c["state"] == "error")
        if messages and isinstance(error, WorkerError) and messages not in str(error):
            return type(error)(f"{error} | worker reports: {messages}"[:4000])
        return error

    def wait(self, ready: Callable[[], bool], what: str, stage_may_end: bool = False, timeout_s: float | None = None,
             block: Callable[[float], None] | None = None) -> None:
        """Wait until ``ready()``, failing when the stage failed or ended first, a worker went
        silent, or ``timeout_s`` (default ``roundTimeout``) passed. ``block(seconds)`` waits for
        what may make ``ready()`` true (a push, a report); the stage and the liveness are looked
        at every :data:`POLL_S`.

        Raises:
            WorkerError: a worker silent past ``workerTimeout``, or the stage failed for good;
                NodeLostError: a node lost for good left fewer task slots than workers.
            InvariantError: the stage ended before ``ready()`` (and ``stage_may_end`` is False).
            RoundTimeoutError: ``timeout_s`` passed; the stage was cancelled.
        """
        timeout_s = self.round_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while not ready():
            stage = self.stage
            if (self.monitor.silent is not None or self.monitor.lost is not None) and stage is not None:
                stage.finished.wait(30.0)
                raise self.failure(stage.error or WorkerError("a silent worker"))
            if stage is not None and stage.finished.is_set():
                if stage.error is not None:
                    raise self.failure(stage.error)
                if not stage_may_end and not ready():
                    raise InvariantError(f"the {self.what}s' tasks must run until {what}. Received: the stage ended first")
            if time.monotonic() > deadline:
                if stage is not None:
                    cancel_tag(self.spark, stage.tag)
                raise RoundTimeoutError(f"each round must finish within roundTimeout={timeout_s:g} s. Received: {what} still "
                                        "waiting; the fit's job was cancelled")
            if block is not None:
                block(POLL_S)
            elif stage is not None:
                stage.finished.wait(POLL_S)
            else:
                time.sleep(POLL_S)

    def close(self) -> None:
        """Cancel a running stage and stop the monitor."""
        if self.stage is not None:
            self.stage.cancel()
        self.monitor.close()
