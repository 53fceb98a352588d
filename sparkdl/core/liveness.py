"""Which workers are alive: each worker's last contact with a server of the fit, and the rule that
names a silent one. Shared by every transport with long-lived tasks (``ps``, ``sharded``): the
servers record contacts (:class:`Contacts`), the driver's monitor asks :func:`silent_worker`.

A worker's task sends a heartbeat every ``FitConfig.heartbeat_s`` seconds (a tenth of
``workerTimeout``) from a thread of its own, so silence means a dead or stopped worker, never a
slow step. A worker not heard from since its stage started (a Python worker starting, TensorFlow
importing) and a worker whose failed attempt Spark is retrying get a start's grace instead.

Pure Python: no Spark, no network; thread-safe (the servers' handlers call it from many threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

# A task's first heartbeat comes once Spark has scheduled it and its Python worker has started and
# read the task (importing TensorFlow on a cold one): a worker not heard from yet gets this long.
STARTUP_GRACE_S = 180.0
# How far a task attempt id (Spark's taskAttemptId: unique in the application and rising) may be
# ahead of the highest one a fit's server has heard: the tasks Spark may launch meanwhile. A far
# higher one is no task of this application (it would supersede a worker's real attempts for good).
ATTEMPT_LEAD = 1 << 20


class Contacts:
    """Per worker: the time of its last contact, its state (``"alive"``, ``"done"``, ``"error"``),
    the message it sent with it and the task attempt it came from; and every attempt heard.

    A contact from an attempt older than the last one heard is ignored (a zombie of a superseded
    attempt says nothing of the worker), and so is an ``"alive"`` heartbeat that arrives after its own
    attempt said ``"done"`` (sent before the task ended; the task needs no slot any more).

    Args:
        workers: the fit's worker count: only the ids ``"0"`` .. ``str(workers - 1)`` (its
            partitions) are workers; None: any id (a server not told).
        attempt_lead: with ``workers``, an attempt more than this above the highest heard is
            refused (:meth:`refusal`; the first attempt heard sets the reference).
    """

    def __init__(self, workers: int | None = None, attempt_lead: int = ATTEMPT_LEAD) -> None:
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive integer or None. Received: {workers!r}")
        self.workers, self.attempt_lead = workers, attempt_lead
        self._lock = threading.Lock()
        self._contacts: dict[str, list] = {}  # worker -> [time.monotonic(), state, message, attempt]
        self._attempts: dict[str, set[int]] = {}
        self._highest: int | None = None  # the highest attempt heard from any worker

    def known(self, worker: str) -> bool:
        """Whether ``worker`` is one of the fit's workers (any id when the count is not known)."""
        worker = str(worker)
        if self.workers is None:
            return True
        return worker.isdigit() and worker == str(int(worker)) and int(worker) < self.workers

    def refusal(self, worker: str, attempt: int | None = None) -> str | None:
        """Why a call naming ``worker`` (and ``attempt``) is not one of the fit's workers', as a
        rule and what was received, or None: an id that is not a partition of the fit, or an
        attempt more than ``attempt_lead`` above the highest heard (no task of this application:
        accepted, it would make every real attempt of the worker look superseded)."""
        if self.workers is None:  # a server not told the fit's workers: no bounds
            return None
        if not self.known(worker):
            return (f"worker must be one of the fit's {self.workers} partitions, '0' to '{self.workers - 1}'. "
                    f"Received: {str(worker)[:40]!r}")
        with self._lock:
            highest = self._highest
        if attempt is not None and highest is not None and attempt > highest + self.attempt_lead:
            return (f"attempt must be at most {self.attempt_lead} above the highest task attempt heard ({highest}). "
                    f"Received: {attempt}")
        return None

    def touch(self, worker: str, state: str = "alive", message: str = "", attempt: int | None = None) -> bool:
        """Record a contact; returns False when it came from a superseded attempt or is refused
        (:meth:`refusal`), and is ignored."""
        worker = str(worker)
        if self.refusal(worker, attempt) is not None:
            return False
        with self._lock:
            if attempt is not None:
                self._highest = attempt if self._highest is None else max(self._highest, attempt)
            previous = self._contacts.get(worker)
            if attempt is None and previous is not None:
                attempt = previous[3]
            if previous is not None and previous[3] is not None and attempt is not None and attempt < previous[3]:
                return False
            if previous is not None and previous[1] == "done" and state == "alive" and attempt == previous[3]:
                return True  # a heartbeat sent before its task's "done" and received after: the task ended
            self._contacts[worker] = [time.monotonic(), state, message, attempt]
            if attempt is not None:
                self._attempts.setdefault(worker, set()).add(attempt)
            return True

    def superseded(self, worker: str, attempt: int | None) -> bool:
        """Whether a later attempt than ``attempt`` of ``worker`` has been heard."""
        with self._lock:
            contact = self._contacts.get(str(worker))
            return attempt is not None and contact is not None and contact[3] is not None and contact[3] > attempt

    def snapshot(self) -> dict[str, dict]:
        """Per worker: ``seconds`` since its last contact, ``state``, ``message``, ``attempt``."""
        now = time.monotonic()
        with self._lock:
            return {w: {"seconds": now - t, "state": state, "message": message, "attempt": attempt}
                    for w, (t, state, message, attempt) in self._contacts.items()}

    def attempts(self) -> dict[str, int]:
        """Per worker, the number of task attempts heard from (more than 1: Spark retried it)."""
        with self._lock:
            return {w: len(a) for w, a in sorted(self._attempts.items())}


def silent_worker(contacts: dict[str, dict], partitions: Iterable[int], watched_s: float | dict, timeout_s: float,
                  grace_s: float = STARTUP_GRACE_S) -> tuple[int, float] | None:
    """The first of ``partitions`` silent too long, as ``(partition, seconds silent)``, or None.

    Args:
        contacts: :meth:`Contacts.snapshot` (by worker id, the partition's decimal string).
        partitions: the workers of the running stage.
        watched_s: seconds since the stage started (a worker not heard from since is judged from
            then), or per partition (a worker whose silent attempt was killed: since the kill).
        timeout_s: ``workerTimeout``: the silence allowed to a worker heard from in this stage.
        grace_s: the silence allowed to a worker not heard from yet in this stage, or being retried
            after an error (at least ``timeout_s``).
    """
    grace = max(timeout_s, grace_s)
    for partition in partitions:
        watched = watched_s[partition] if isinstance(watched_s, dict) else watched_s
        contact = contacts.get(str(partition))
        if contact is None or contact["seconds"] > watched:  # not heard from since it was watched
            silent, limit = watched, grace
        elif contact["state"] == "done":
            continue
        else:  # a worker that reported an error is being retried: its new attempt gets the start's grace
            silent = contact["seconds"]
            limit = grace if contact["state"] == "error" else timeout_s
        if silent > limit:
            return partition, silent
    return None
