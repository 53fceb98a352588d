"""A stage of long-lived worker tasks, as the driver runs and waits on it: shared by the transports
whose workers stay in their tasks across rounds (``ps``, ``sharded``).

- :class:`Stage`: the stage's Spark job, run in the background under its own job tag
  (:func:`~sparkdl.spark.jobs.run_job`: Spark's failures become sparkdl errors).
- :class:`StageWatch`: the driver's waits on a stage: until a condition holds, failing when the
  stage failed or ended first, the stage's :class:`~sparkdl.spark.training.membership.Membership`
  found a worker silent or a node lost for good, or the round's time ran out; every wait has a
  timeout.

The stage is not a barrier stage: Spark retries a failed task on its own (``spark.task.maxFailures``)
while the other workers wait at the round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pyarrow as pa

from sparkdl.errors import FitCancelledError, InvariantError, NodeLostError, RoundTimeoutError, WorkerError
from sparkdl.spark.jobs import run_job
from sparkdl.spark.session import cancel_tag

log = logging.getLogger("sparkdl")
POLL_S = 0.1  # how often the driver's waits look at the stage and the workers' liveness


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


class StageWatch:
    """The driver's view of one transport's stages: the running :class:`Stage`, watched by the fit's
    :class:`~sparkdl.spark.training.membership.Membership`.

    Args:
        spark: the fit's session.
        members: the fit's membership (the workers, their silence, a node lost for good); closed with this.
        round_timeout_s: ``roundTimeout``: the default bound of :meth:`wait`.
        what: the workers in words, for messages (``"ps worker"``).
        lost_advice: what to do when a node is lost for good (the end of :class:`NodeLostError`'s message).
    """

    def __init__(self, spark, members, round_timeout_s: float, what: str, lost_advice: str = "") -> None:
        self.spark, self.members = spark, members
        self.round_timeout_s, self.what, self.lost_advice = round_timeout_s, what, lost_advice
        self.stage: Stage | None = None

    def run(self, action, description: str, tag: str, timeout_s: float, partitions: list[int]) -> Stage:
        """Start ``action`` as the stage, watched from now."""
        self.stage = Stage(self.spark, action, description, tag, timeout_s)
        self.members.watch_stage(tag, partitions)
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
        self.members.unwatch()
        self.stage = None
        if stage.error is not None:
            raise self.failure(stage.error)
        return stage.table

    def abandon(self) -> None:
        """Cancel the running stage (a node was lost and the transport goes on without it) and forget it."""
        stage = self.stage
        self.members.unwatch(forget_verdicts=True)
        self.stage = None
        if stage is not None:
            stage.cancel()

    def failure(self, error: BaseException) -> BaseException:
        """The error to raise for a failed stage: a silent worker named, else Spark's cause with the
        workers' own messages."""
        if self.members.lost is not None:
            loss = self.members.lost
            return NodeLostError(f"every {self.what} needs a task slot at once: {loss.describe(self.what + 's')}; "
                                 f"the fit's job was cancelled. {self.lost_advice}".strip(), loss)
        if self.members.silent is not None:
            partition, silent = self.members.silent
            return WorkerError(
                f"every {self.what} must send a heartbeat at least every workerTimeout={self.members.worker_timeout_s:g} s. "
                f"Received: partition {partition} silent for {silent:.1f} s (dead, stopped, or never started: are there "
                "enough free task slots?); the fit's job was cancelled"
            )
        if isinstance(error, FitCancelledError):
            return error
        messages = "; ".join(f"partition {w}: {c['message']}" for w, c in sorted(self.members.contacts().items()) if c["state"] == "error")
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
            if (self.members.silent is not None or self.members.lost is not None) and stage is not None:
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
        """Cancel a running stage and stop the membership's watcher."""
        if self.stage is not None:
            self.stage.cancel()
        self.members.close()
