"""Exactly once: which pushes a server has applied, keyed by worker, task attempt and sequence number.

Every push of a long-lived worker carries ``(worker, attempt, seq)``: the worker's id (its
partition), Spark's task attempt id (unique and rising: a retry supersedes) and its deterministic
slot (``seq`` = round + 1). Per worker the ledger keeps the highest attempt seen and the last
applied seq; a push from a lower attempt, or with ``seq <=`` the last applied one (of any attempt:
a zombie of an older attempt and its retry cannot both apply a slot), is dropped, so a client may
send a push again freely. Shared by the parameter server of backend ``ps`` and the slice servers
of backend ``sharded`` (where ``seq`` is the round + 1 of a slice's contribution).

Pure Python; not thread-safe: call it under the server's lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SUPERSEDED = "superseded_attempt"
DUPLICATE = "duplicate"


class ApplyLedger:
    """Per worker ``[highest attempt, last applied seq]`` (see the module docstring).

    Args:
        marks: per worker ``[attempt, seq]`` to start from (a resumed fit).
        max_seq: the fit's last slot (its slot count): a push of a higher ``seq`` is refused
            (:meth:`refusal`), since marked it would drop every real push of the worker as a
            duplicate; None: unbounded (a ledger not told).
    """

    def __init__(self, marks: Mapping[str, Sequence[int]] | None = None, max_seq: int | None = None) -> None:
        self._marks: dict[str, list[int]] = {str(w): [int(a), int(q)] for w, (a, q) in (marks or {}).items()}
        self.max_seq = max_seq

    def refusal(self, seq: int) -> str | None:
        """Why a push's ``seq`` is none of the fit's slots (rule and what was received), or None."""
        if self.max_seq is not None and not 0 <= seq <= self.max_seq:
            return f"seq must be a slot of the fit, in [0, {self.max_seq}]. Received: {seq}"
        return None

    def verdict(self, worker: str, attempt: int, seq: int) -> str | None:
        """Why a push would be dropped (:data:`SUPERSEDED`, :data:`DUPLICATE`), or None: it may apply."""
        mark = self._marks.get(str(worker))
        if mark is not None and attempt < mark[0]:
            return SUPERSEDED
        if mark is not None and seq <= mark[1]:
            return DUPLICATE
        return None

    def reserve(self, worker: str, attempt: int, seq: int) -> list[int] | None:
        """Mark ``(attempt, seq)`` applied now (a concurrent duplicate is then dropped); returns the
        previous mark for :meth:`release`."""
        previous = self._marks.get(str(worker))
        self._marks[str(worker)] = [int(attempt), int(seq)]
        return None if previous is None else list(previous)

    def release(self, worker: str, attempt: int, seq: int, previous: list[int] | None) -> None:
        """Undo :meth:`reserve` of a push that failed to apply (unless a later push marked since)."""
        if self._marks.get(str(worker)) == [attempt, seq]:
            if previous is None:
                self._marks.pop(str(worker))
            else:
                self._marks[str(worker)] = previous

    def progress(self, worker: str) -> tuple[int | None, int | None]:
        """``(highest attempt, last applied seq)`` of ``worker``, ``(None, None)`` before any push."""
        mark = self._marks.get(str(worker))
        return (None, None) if mark is None else (mark[0], mark[1])

    def marks(self) -> dict[str, list[int]]:
        """Every worker's mark (what a snapshot keeps)."""
        return {w: list(m) for w, m in self._marks.items()}
