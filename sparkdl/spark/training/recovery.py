"""Recovery's owner on the worker side: every decision a long-lived worker task makes about faults
(Spark retried it, resubmitted its stage, lost an executor), as small pure functions of the facts,
and the one place a ``sharded`` owner takes its slice back from.

The decisions:

* :func:`supersession`: go on, hand the slice off and end (a later attempt of this worker took
  over), or end soon (Spark resubmitted the stage: its new tasks need this task's slot, and no
  replacement of this worker registered yet to hand off to), once its slice's versions reached an
  owner of the newer stage attempt.
* :func:`hand_order`: to whom a superseded attempt hands its copies before it ends.
* :func:`restore_order`: where a retried owner takes its slice from: the fit's start (the driver
  or a checkpoint), its previous owner while it answers, this executor's disk, the slice's backup
  holder, or any other owner that holds a copy.
* :func:`start_order` (``overlap``): where a retried worker takes the start of the round it trains
  again (its carried contribution to the round before): this executor's disk, then the pieces the
  owners keep, else the round's own start (counted).
* :func:`carried_hand_order`: to whom a superseded attempt hands each contribution piece it keeps.

Where copies live (``sharded``): owner j keeps its slice in memory and on its executor's disk
(:class:`DiskCopies`, the last two versions), and sends every version to its backup holder
(j + 1), which keeps it in memory **and on its own executor's disk** as well. A Python worker ends
with its task when Spark resubmits the stage (its slice server with it), but its executor's disk
stays: every new owner that starts on an executor loads every copy found on that disk, its
neighbours' included, and serves them to whoever asks. Spark may run the resubmitted tasks on a
replacement executor and leave a live one idle, so a disk alone is not enough: before an attempt of
the superseded stage ends, it puts its own slice's versions and the backups it keeps for its
neighbour to owners of the new stage attempt (bounded), and, where that fails, one that holds the
only live copy of its neighbour's slice serves it until that slice's new owner took it. So a slice
and the backups its owner kept survive any single executor loss, with or without a stage
resubmission: the lost executor took one copy of two slices (its own and the one it backed up), and
the other copy of each reaches a live owner of the new stage attempt. A slice found nowhere within :data:`RESTORE_WAIT_S`
is a loss no retry can mend: :class:`~sparkdl.server.slices.SliceLost`, reported to the driver,
which fails the fit at once naming the slice, its owner and its holder.

Every wait here is bounded and says at INFO what it waits for once :data:`QUIET_S` pass.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from sparkdl.server.slices import SliceVersion, holder_of, read_slice, write_slice

log = logging.getLogger("sparkdl")
KEEP_ON_DISK = 2  # versions of each slice an executor's disk keeps (the accepted one and its candidate)
RESTORE_WAIT_S = 90.0  # how long a retried owner looks for its slice before SliceLost (seconds)
RESTORE_PAUSE_S = 3.0  # between two looks (seconds): new owners of a resubmitted stage load their disks meanwhile
QUIET_S = 5.0  # a wait says at INFO what it waits for after this many seconds, then every this many seconds

# ---- decisions (pure) ---------------------------------------------------------------------------

GO_ON, HAND_OFF, SERVE_BACKUP, END_NOW = "go_on", "hand_off", "serve_backup", "end_now"


def supersession(*, later_attempt: bool, newer_stage: bool, only_copy: bool = False) -> str:
    """What a running worker attempt does about attempts that replace it.

    Args:
        later_attempt: a later task attempt of this same worker registered (the driver's heartbeat
            reply said so, or the slice map shows it serving this worker's slice).
        newer_stage: a task of a newer attempt of this task's Spark stage registered (Spark
            resubmitted the stage after a lost executor's shuffle output).
        only_copy: this attempt's server may hold the only live copy of its neighbour's slice (it
            backs that slice up, and the slice's owner of this stage attempt does not answer).

    Returns:
        :data:`HAND_OFF` when a later attempt of this worker registered: serve it the slice (and the
        neighbour's backups) until it took them, bounded, then end; :data:`SERVE_BACKUP` when only a
        newer stage attempt registered and this server holds the only copy of its neighbour's
        slice: stop training, serve that copy until the neighbour's new owner took it (or this
        worker's own replacement did), bounded, then end; :data:`END_NOW` when only a newer stage
        attempt registered: end soon, freeing this task's slot for the resubmitted tasks. Before
        either of the last two ends, its own slice's versions reach an owner of the newer stage
        attempt (bounded; its copies are on this executor's disk as well, for whichever new owner
        starts here), and so do the backups it keeps for its neighbour. :data:`GO_ON` otherwise.
    """
    if later_attempt:
        return HAND_OFF
    if newer_stage:
        return SERVE_BACKUP if only_copy else END_NOW
    return GO_ON


KILLED, RETRYING, FAIL = "killed", "retrying", "fail"


def silence_verdict(*, kills: int, max_kills: int, killed: bool, kill_refused_by_spark: bool, seen_gone: bool) -> str:
    """What the driver makes of a worker silent past ``workerTimeout`` (the driver-side decision).

    Args:
        kills: how many of this partition's silent attempts were killed already.
        max_kills: the most the fit allows before it fails.
        killed: Spark killed the attempt now (``killTaskAttempt`` answered True): it runs the task again.
        kill_refused_by_spark: Spark answered that it runs no such attempt (on a classic session:
            the attempt is gone already, e.g. its Python worker or its executor was SIGKILLed, and
            Spark retries the task, maybe after resubmitting the whole stage); False where killing
            cannot work at all (Spark Connect).
        seen_gone: this very attempt was found gone before and its retry given the start's grace.

    Returns:
        :data:`KILLED` (counted; the next attempt gets the start's grace), :data:`RETRYING` (not
        counted: the retry of an attempt already gone gets the start's grace, once per attempt), or
        :data:`FAIL` (the fit fails naming the partition).
    """
    if kills >= max_kills:
        return FAIL
    if killed:
        return KILLED
    if kill_refused_by_spark and not seen_gone:
        return RETRYING
    return FAIL


FIT_START, CHECKPOINT, PREVIOUS, DISK, HOLDER, PEERS = "start", "checkpoint", "previous", "disk", "holder", "peers"


def restore_order(*, first_registration: bool, at_fit_start: bool, checkpoint: bool, on_disk: bool,
                  previous_answers: bool) -> tuple[str, ...]:
    """Where an owner takes its slice from, in the order it asks.

    Args:
        first_registration: this slice's first owner of the fit.
        at_fit_start: the version the driver accepted is the fit's start (no round closed yet).
        checkpoint: the fit starts from a sharded checkpoint's slices.
        on_disk: this executor's disk holds the version the driver accepted.
        previous_answers: the previous owner's slice server answered a probe.

    Returns:
        ``(FIT_START,)`` or ``(CHECKPOINT,)`` for a fit's start; else the sources among
        ``PREVIOUS`` (the previous owner, which holds the candidate after the accepted version too,
        and the backups it kept), ``DISK``, ``HOLDER`` (the slice's backup holder) and ``PEERS``
        (every other registered owner: one that loaded a lost holder's disk).
    """
    if first_registration or (at_fit_start and not checkpoint):
        return (CHECKPOINT,) if checkpoint else (FIT_START,)
    if previous_answers:
        return (PREVIOUS, DISK, HOLDER, PEERS)
    if on_disk:
        return (DISK, HOLDER, PEERS, PREVIOUS)
    return (HOLDER, PEERS, PREVIOUS)


OWNERS, ROUND_START = "owners", "round_start"


def start_order(*, follows: bool, keeps_carried: bool, owners: int) -> tuple[str, ...]:
    """``overlap``: where a retried worker takes the start of the first round it trains, in the
    order it asks (:mod:`sparkdl.core.modes.overlap`).

    Args:
        follows: the round follows this worker's round before it (not a sync point): it trains from
            its carried contribution to that round, not from the round's own start.
        keeps_carried: the owners keep each worker's contribution pieces (no encoding, no
            ``keepLocalOptimizer``: a contribution is then the carried start itself).
        owners: the fit's slices (with one, its only piece went with its executor).

    Returns:
        ``(ROUND_START,)`` for a sync point; else ``DISK`` (this executor's), then ``OWNERS`` (the
        pieces, where kept), then ``ROUND_START``: the fallback, counted in ``local_state_resets``.
    """
    if not follows:
        return (ROUND_START,)
    return (DISK, OWNERS, ROUND_START) if keeps_carried and owners > 1 else (DISK, ROUND_START)


def carried_hand_order(worker: int, slice_index: int, newer) -> list[int]:
    """To whom a superseded attempt offers slice ``slice_index`` of ``worker``'s contribution piece
    before it ends, in order, among the owners of the newer stage attempt (``newer``): the worker's
    replacement (which assembles its start from it), the slice's new owner, then the others
    ascending; so that no one owner receives every piece."""
    newer = set(newer)
    return [j for j in dict.fromkeys([worker, slice_index, *sorted(newer)]) if j in newer]


def hand_order(slice_index: int, newer: list[int], owner: int, owners: int) -> list[int]:
    """To whom a superseded attempt (owner ``owner`` of the old stage attempt) offers its copy of
    slice ``slice_index`` before it ends, in order: the owners of the newer stage attempt
    (``newer``) but the slice's own and its own (a new owner serves its own slice from what it
    installs, not from its backups, and this attempt's replacement takes everything from it
    directly), starting with the slice's backup holder and going round the ring, so that the copies
    of several slices spread over several owners."""
    preferred = holder_of(slice_index, owners) or 0
    return sorted((j for j in set(newer) if j not in (owner, slice_index)), key=lambda j: (j - preferred) % owners)


# ---- copies on this executor's disk ------------------------------------------------------------

_NAME = re.compile(r"^slice-(\d+)-v(\d+)\.arrow$")


class DiskCopies:
    """Copies of slices on this executor's disk, whichever Python worker wrote them: its own slice
    and the backups it keeps for a neighbour, the last :data:`KEEP_ON_DISK` versions of each, as
    Arrow IPC files ``slice-<k>-v<version>.arrow`` (written whole, then moved).

    Args:
        folder: the fit's directory on this executor (Spark's per-application files directory).
        has_optimizer: whether the slices hold optimizer pieces.
        keep: the versions of each slice kept (one more than :data:`KEEP_ON_DISK` with ``overlap``,
            whose retried rounds may carry onto the start before).
    """

    def __init__(self, folder: str, has_optimizer: bool, keep: int = KEEP_ON_DISK) -> None:
        self.folder, self.has_optimizer, self.keep = folder, has_optimizer, keep

    def path(self, slice_index: int, version: int) -> str:
        return os.path.abspath(os.path.join(self.folder, f"slice-{slice_index}-v{version}.arrow"))

    def write(self, slice_index: int, version: SliceVersion) -> None:
        """Keep ``version`` of slice ``slice_index``; drop the versions older than the last :attr:`keep`."""
        write_slice(self.path(slice_index, version.version), version, self.has_optimizer)
        for old in self.versions(slice_index)[:-self.keep]:
            try:
                os.remove(self.path(slice_index, old))
            except OSError:
                pass

    def versions(self, slice_index: int) -> list[int]:
        """The versions of slice ``slice_index`` on this disk, ascending."""
        return sorted(v for k, v in self._files() if k == slice_index)

    def read(self, slice_index: int, version: int) -> SliceVersion | None:
        """Version ``version`` of slice ``slice_index``; None when absent or cut short."""
        path = self.path(slice_index, version)
        if not os.path.exists(path):
            return None
        try:
            found = read_slice(path)
        except Exception:  # noqa: BLE001 - a write cut short: not this version
            return None
        found.version = version
        return found

    def everything(self) -> dict[int, dict[int, SliceVersion]]:
        """Every readable copy on this disk: ``{slice: {version: SliceVersion}}``."""
        found: dict[int, dict[int, SliceVersion]] = {}
        for k, v in self._files():
            held = self.read(k, v)
            if held is not None:
                found.setdefault(k, {})[v] = held
        return found

    def _files(self) -> list[tuple[int, int]]:
        try:
            names = os.listdir(self.folder)
        except OSError:
            return []
        return [(int(m.group(1)), int(m.group(2))) for m in map(_NAME.match, names) if m is not None]


# ---- the bounded wait ----------------------------------------------------------------------------


@dataclass
class Look:
    """One source's answer to "do you hold version v of slice j": ``what`` it is, ``where`` it
    serves, the ``versions`` it holds (None when it did not answer) and the error when it failed."""

    what: str
    where: str
    versions: list[int] | None = None
    error: str | None = None

    def __str__(self) -> str:
        if self.error is not None:
            return f"{self.what} at {self.where}: {self.error}"
        return f"{self.what} at {self.where} holds versions {self.versions}"


def wait_bounded(attempt: Callable[[], object | None], what: str, timeout_s: float, pause_s: float,
                 describe: Callable[[], str], check: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
    """Call ``attempt()`` until it returns something other than None, at most ``timeout_s`` seconds,
    ``pause_s`` apart; after :data:`QUIET_S` seconds, logs at INFO ``what`` it waits for and
    ``describe()`` (where things stand), then every :data:`QUIET_S` seconds.

    Returns:
        ``attempt()``'s answer, or None when ``timeout_s`` passed without one.

    Raises:
        whatever ``check()`` raises between two looks (e.g. this attempt was superseded).
    """
    started = clock()
    said = started
    while True:
        found = attempt()
        if found is not None:
            return found
        now = clock()
        if now - started >= timeout_s:
            return None
        if now - said >= QUIET_S:
            log.info("sparkdl: %s: still waiting after %.0f s (of %.0f s): %s", what, now - started, timeout_s, describe())
            said = now
        sleep(min(pause_s, max(0.0, timeout_s - (now - started))))
        if check is not None:
            check()
