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


class Contacts:
    """Per worker: the time of its last contact, its state (``"alive"``, ``"done"``, ``"error"``),
    the message it sent with it and the task attempt it came from; and every attempt heard.

    A contact from an attempt older than the last one heard is ignored (a zombie of a superseded
    attempt says nothing of the worker)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._contacts: dict[str, list] = {}  # worker -> [time.monotonic(), state, message, attempt]
        self._attempts: dict[str, set[int]] = {}

    def touch(self, worker: str, state: str = "alive", message: str = "", attempt: int | None = None) -> bool:
        """Record a contact; returns False when it came from a superseded attempt (ignored)."""
        worker = str(worker)
        with self._lock:
            previous = self._contacts.get(worker)
            if attempt is None and previous is not None:
                attempt = previous[3]
            if previous is not None and previous[3] is not None and attempt is not None and attempt < previous[3]:
                return False
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
