"""Recovery's owner on the driver: the membership of a fit's stage of long-lived worker tasks
(backends ``ps`` and ``sharded``).

One :class:`Membership` per fit holds everything the driver knows about who works and what became
of them, and makes the driver's recovery decisions:

- **the workers and their task attempts**: each partition's current attempt, its state and when it
  was last heard from (the server's :class:`~sparkdl.core.liveness.Contacts`, fed by the workers'
  registrations, pushes, reports and heartbeats), and every attempt that registered
  (:meth:`Membership.info`'s ``task_attempts``);
- **Spark's stage attempts** (:func:`stage_attempt`, Spark's status tracker): the ``sharded``
  coordinator stamps each registration with it, so an attempt of a resubmitted stage
  supersedes the older stage's attempts (the worker side decides what to do about it:
  :mod:`~sparkdl.spark.training.recovery`);
- **silence**: a worker silent past ``workerTimeout`` has its attempt killed and retried, an
  attempt Spark no longer runs has its retry given the start's grace, and a partition silent again
  after two kills fails the stage (:func:`~sparkdl.spark.training.recovery.silence_verdict`, by
  :class:`Monitor`, the watcher thread);
- **executors lost and a node lost for good**: the task slots counted at each look
  (:class:`~sparkdl.spark.training.nodes.SlotWatch`: the executors removed since the fit started,
  named on the console at once; a :class:`~sparkdl.spark.training.nodes.NodeLoss` when no
  replacement came in time), which stops the stage.

The stage's waits (:class:`~sparkdl.spark.training.stage.StageWatch`) ask it for its verdicts
(:attr:`Membership.silent`, :attr:`Membership.lost`); the backends ask it for their ``fitInfo``
keys (:meth:`Membership.info`). It never ends on an error of its own: a failed look is retried at
the next tick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sparkdl.core.liveness import STARTUP_GRACE_S, silent_worker
from sparkdl.spark import internals
from sparkdl.spark.session import cancel_tag, is_connect
from sparkdl.spark.training import recovery

log = logging.getLogger("sparkdl")
MONITOR_TICK_S = 0.25  # how often the watcher looks at the heartbeats (a small fraction of workerTimeout >= 5 s)


class Membership:
    """The driver's membership of a fit's long-lived stage (see the module docstring). Its watcher
    thread starts now; :meth:`close` stops it.

    Args:
        spark: the fit's session.
        contacts: returns the workers' contacts now (a server's ``contacts()``: partition -> its
            ``attempt``, ``state``, ``seconds`` since last heard, ``message``).
        attempts: returns every task attempt that registered, per partition (a server's ``attempts()``).
        worker_timeout_s: ``workerTimeout``.
        nodes: counts the stage's task slots (:class:`~sparkdl.spark.training.nodes.SlotWatch`), or
            None where they are fixed (``local``, Connect, dynamic allocation).
        max_kills: silent attempts killed per partition before the fit fails.
    """

    def __init__(self, spark, contacts: Callable[[], dict], attempts: Callable[[], dict], worker_timeout_s: float,
                 nodes=None, max_kills: int = 2) -> None:
        self.spark, self.contacts, self._attempts, self.worker_timeout_s = spark, contacts, attempts, worker_timeout_s
        self.monitor = Monitor(spark, contacts, worker_timeout_s, max_kills=max_kills, nodes=nodes)
        self.monitor.start()

    def watch_stage(self, tag: str, partitions: list[int]) -> None:
        """Watch the stage tagged ``tag`` whose tasks are ``partitions``, from now (each partition
        given the start's grace)."""
        self.monitor.watch_stage(tag, partitions)

    def unwatch(self, forget_verdicts: bool = False) -> None:
        """Stop watching the stage (it ended, or was abandoned: ``forget_verdicts`` then clears a
        silent worker or a lost node found in it, as the transport goes on without that stage)."""
        self.monitor.watch = None
        if forget_verdicts:
            self.monitor.silent = self.monitor.lost = None

    @property
    def silent(self) -> tuple[int, float] | None:
        """``(partition, seconds silent)`` of a worker whose silence failed the stage, or None."""
        return self.monitor.silent

    @property
    def lost(self):
        """The :class:`~sparkdl.spark.training.nodes.NodeLoss` that stopped the stage, or None."""
        return self.monitor.lost

    def info(self) -> dict:
        """The ``fitInfo`` keys of the membership: ``task_attempts`` (partition -> the attempts that
        registered) and ``silent_attempts_killed`` (partition, attempt, seconds silent)."""
        return {"task_attempts": self._attempts(), "silent_attempts_killed": list(self.monitor.killed)}

    def close(self) -> None:
        """Stop the watcher thread (within 5 s)."""
        self.monitor.close()


class Monitor(threading.Thread):
    """:class:`Membership`'s watcher thread: watches the workers of a running stage. The first silent longer than ``timeout_s`` seconds
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
    if is_connect(spark):
        return False
    try:
        return internals.kill_task_attempt(spark.sparkContext, attempt, reason)
    except Exception:  # noqa: BLE001 - the JVM refused it: the caller fails the fit instead
        return False
