"""A slice of a fit's state, owned and served by one worker of backend ``sharded`` from its executor.

Owner j holds slice j of the master (:class:`~sparkdl.core.slices.SliceLayout`): the weights and
optimizer pieces of its range, and the mode's state for them (BMUF's block momentum, DiLoCo's outer
momentum). A round g, as the owner sees it:

1. every worker that trained in round g puts its contribution to slice j (its state's slice j, or
   its encoded difference from the round's start: :mod:`sparkdl.core.piece_codec`) with
   ``(round, worker, attempt, rows)``; each worker's contribution is counted once per round (a
   retried push, or a retried task's, is dropped as a duplicate:
   :class:`~sparkdl.core.ledger.ApplyLedger` keyed by worker, attempt and round);
2. once every worker with rows in round g has been counted, the owner's applier thread applies the
   mode's policy to its slice (the same pure-numpy code the driver runs for the other backends:
   :mod:`sparkdl.core.modes`, elementwise), checks the new slice is finite, sends it to the slice's
   backup holder (the next owner, :func:`holder_of`) and reports it ready to the driver's
   coordinator: the candidate of version g + 1;
3. once the driver opened round g + 1 (every slice was ready), a worker's pull of round g + 1's start
   commits the candidate; the version before it is kept until then, so a worker retrying round g
   can still pull round g's start.

With ``overlap`` and no encoding, a worker's contribution to round g is the start it trains round
g + 1 from (its carried start, :mod:`sparkdl.core.modes.overlap`), which lives on its executor. So
that a worker retried on another executor starts from it all the same, each owner keeps the pieces
it counted of the last two rounds (``keep_carried``), each worker puts its own slice's piece to its
backup holder too (``carried`` puts), and an attempt superseded by a resubmitted stage hands what it
keeps, with its own carried starts, to owners of the newer stage attempt (a piece of an earlier
attempt never replaces a later one's): a retried worker assembles its carried start from the pieces
the owners hold (``carried`` action and ticket).

A lost owner's slice is served again by its retried task: from the previous owner's server when it
still runs (a stage that ended at an epoch's end), else from the backup its holder keeps (the last
two versions; three with ``overlap``, whose sender may carry a retried round onto the start before); the other workers put their contributions of the open round again. A slice that can
be found nowhere fails the fit, naming it (:class:`SliceLost`).

Protocol (Arrow Flight, TLS with a certificate each server makes for itself and registers with the
coordinator, the fit's bearer token on every call; arrays in :mod:`sparkdl.server.wire`'s format,
roles ``weight``, ``optimizer``, ``mode`` named ``m/<key>/<i>``):

* ``DoGet`` ``start:<g>``: the start of round g (waits up to :data:`WAIT_S` for it; UNAVAILABLE
  when it is not there yet; an error when it is older than every version held: gone for good). ``master:<v>``: the slice's master at version v (-1: the newest);
  ``weights:<v>``, ``optimizer:<v>``: its weights, its optimizer state alone. ``held:<k>:<v>``: version v of slice k as this server holds
  it (its own, or a backup of slice k). ``carried:<w>:<g>:<k>``: slice k of worker w's contribution to round g, as kept.
* ``DoPut`` with a JSON command ``{"kind": "contrib", "round", "worker", "attempt", "rows",
  "encoding", "nbytes"}`` (a worker's contribution; answered ``{"applied": bool, "dropped": null |
  "duplicate" | "late" | "superseded_attempt"}``), or ``{"kind": "backup", "slice", "version",
  "attempt", "nbytes"}`` (another owner's slice, kept as its backup), or ``{"kind": "carried", "worker", "round",
  "slice", "attempt", "nbytes"}`` (slice k of a worker's contribution to round g, kept for its retried task).
* ``DoAction`` ``held`` (``{"slice": int}``: the versions this server holds of slice k), ``carried``
  (``{"of": int, "round": int}``: the slices of worker ``of``'s contribution to that round this server keeps), ``status``
  (versions, counts, bytes), ``write`` (``{"uri": str, "version": int}``: write the slice's version
  to a file through ``pyarrow.fs``; answers its SHA-256 and bytes), ``release`` (the slice moved
  to another owner: forget it).

Nothing here imports Spark, TensorFlow or Keras.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from sparkdl.core import piece_codec
from sparkdl.core.aggregation import WeightedMean
from sparkdl.core.piece_codec import PIECEWISE
from sparkdl.core.compression import decode_mean
from sparkdl.core.ledger import ApplyLedger
from sparkdl.core.slices import SliceLayout
from sparkdl.core.state import FitState, ModelState, RoundUpdates
from sparkdl.errors import CodecError, InvariantError, ServerError
from sparkdl.server.client import ParameterServerClient
from sparkdl.server.service import FlightEndpoint, json_result
from sparkdl.server.tls import TLSIdentity
from sparkdl.server.wire import (
    MAX_DESCRIPTOR_BYTES,
    ArraySpec,
    array_stream,
    int_field,
    read_body,
    specs_from_schema,
)

log = logging.getLogger("sparkdl")
WAIT_S = 5.0  # the longest a pull waits on the server for the version it asks (seconds); the client asks again
KEEP_VERSIONS = 2  # versions of a slice a backup holder keeps (one more with ``keep_previous``)
CHUNK_BYTES = 1 << 20  # bytes of values per record batch a slice server sends: what a reader holds at once
KEEP_CARRIED = 2  # rounds of each worker's contribution pieces an owner keeps with ``keep_carried``
PUT_KEYS = {"contrib": ("round", "worker", "attempt", "rows", "nbytes"), "backup": ("slice", "version", "attempt", "nbytes"),
            "carried": ("worker", "round", "slice", "attempt", "nbytes")}


class SliceLost(InvariantError):
    """A slice of the state could be served again from nowhere (its owner and its backup holder lost)."""


def holder_of(owner: int, owners: int) -> int | None:
    """The owner that keeps slice ``owner``'s backup: the next one (None with a single owner)."""
    return None if owners < 2 else (owner + 1) % owners


@dataclass
class SliceVersion:
    """One version of a slice: ``master`` (weights and optimizer pieces), the mode's state for them,
    and ``start``, the state workers start round ``version`` from (the policy's ``starts``)."""

    version: int
    master: ModelState
    mode: dict[str, list[np.ndarray]] = field(default_factory=dict)
    start: ModelState | None = None

    def arrays(self, start: bool = False) -> tuple[list[ArraySpec], list[np.ndarray]]:
        """The wire form (names ``w/i``, ``o/i``, ``m/<key>/i``); ``start``: the start state's pieces instead."""
        state = self.start if start and self.start is not None else self.master
        specs, arrays = [], []
        for role, prefix, values in (("weight", "w", state.weights), ("optimizer", "o", state.optimizer or [])):
            for i, a in enumerate(values):
                a = np.ascontiguousarray(a)
                specs.append(ArraySpec(f"{prefix}/{i}", tuple(a.shape), a.dtype, role))
                arrays.append(a)
        if not start:
            for key in sorted(self.mode):
                for i, a in enumerate(self.mode[key]):
                    a = np.ascontiguousarray(a)
                    specs.append(ArraySpec(f"m/{key}/{i}", tuple(a.shape), a.dtype, "mode"))
                    arrays.append(a)
        return specs, arrays

    @classmethod
    def from_arrays(cls, version: int, specs: Sequence[ArraySpec], arrays: Sequence[np.ndarray], has_optimizer: bool) -> SliceVersion:
        weights = [a for s, a in zip(specs, arrays, strict=True) if s.role == "weight"]
        optimizer = [a for s, a in zip(specs, arrays, strict=True) if s.role == "optimizer"]
        mode: dict[str, list[np.ndarray]] = {}
        for s, a in zip(specs, arrays, strict=True):
            if s.role == "mode":
                mode.setdefault(s.name.split("/")[1], []).append(a)
        return cls(version, ModelState(weights, optimizer if has_optimizer else None), mode)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays()[1])


def _parse_command(descriptor: flight.FlightDescriptor) -> dict:
    command = bytes(descriptor.command or b"")
    if descriptor.descriptor_type != flight.DescriptorType.CMD or len(command) > MAX_DESCRIPTOR_BYTES:
        raise CodecError("a slice put needs a JSON command descriptor of at most 64 KiB")
    try:
        meta = json.loads(command.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CodecError(f"a slice put's descriptor must be JSON. Received: {command[:16]!r}") from exc
    if not isinstance(meta, dict) or meta.get("kind") not in PUT_KEYS:
        raise CodecError(f"a slice put's kind must be one of {sorted(PUT_KEYS)}. Received: {str(meta)[:80]!r}")
    keys = PUT_KEYS[meta["kind"]]
    out = {"kind": meta["kind"], **{k: int_field(meta, k) for k in keys}}
    if meta["kind"] == "contrib":
        encoding = meta.get("encoding")
        if encoding not in (None, "fp16", *PIECEWISE):
            raise CodecError(f"a contribution's encoding must be null, fp16 or one of {list(PIECEWISE)}. Received: {encoding!r:.40}")
        out["encoding"] = encoding
    return out


class SliceServer(FlightEndpoint):
    """Owner ``owner``'s slice of a fit's state, served over Arrow Flight (see the module docstring).

    Args:
        owner: this slice's index j (the worker's partition).
        layout: the fit's slice layout.
        policy: the mode's policy built for this slice's pieces (``trainable`` per piece).
        expected: ``expected(g)``: the workers whose contribution round g waits for.
        names: the names of this slice's weight pieces (messages).
        token: the fit's bearer token.
        tls: this server's certificate and key (made on the executor; the key never leaves it).
        host, advertise: where it binds, and the address workers dial.
        on_ready: ``on_ready(version, finite_message)``: a candidate is ready (message None) or not
            finite (the first non-finite piece named); called from the applier thread.
        persist: ``persist(slice_index, version)``: keep a new version of this slice, or of a slice
            this server backs up, where a later task on this executor finds it (its disk); called
            from a writer thread of its own, the newest version of each slice, off the round's path
            (None: nowhere).
        send_backup: ``send_backup(version)``: put a version to this slice's holder (None: no holder);
            called from the applier thread after each apply.
        max_message_bytes: the largest put accepted (bytes); default 4 × a slice + 1 MiB.
        keep_previous: also keep the version before the committed one (and one more version of a
            slice backed up): with ``overlap`` a retried worker's sender may still carry its round onto
            that start (:mod:`sparkdl.core.modes.overlap`).
        keep_carried: keep the contribution pieces counted (and put as ``carried``) of each worker's
            last :data:`KEEP_CARRIED` rounds: with ``overlap`` and no encoding, a contribution is its
            worker's carried start (the module docstring). Memory: 2 × the state's bytes of pieces it
            counted, and what superseded attempts hand it after a resubmitted stage.

    Raises:
        ServerError: from :meth:`start`, when the port cannot be bound.
    """

    PORT_SETTING = "port"
    ACTIONS = (
        ("held", "body {\"slice\": int}: the versions of slice k this server holds"),
        ("carried", "body {\"of\": int, \"round\": int}: the slices of worker of's contribution to that round this server keeps"),
        ("status", "versions, counts and bytes of this slice, JSON"),
        ("write", "body {\"uri\": str, \"version\": int}: write a version of the slice to a file; its sha256 and bytes"),
        ("release", "the slice moved to another owner: forget it"),
    )

    def __init__(self, owner: int, layout: SliceLayout, policy, expected: Callable[[int], set[int]], *, names: Sequence[str],
                 token: str, tls: TLSIdentity | None, host: str = "127.0.0.1", advertise: str | None = None,
                 on_ready: Callable[[int, str | None], None] | None = None, send_backup: Callable[[int], None] | None = None,
                 persist: Callable[[int, SliceVersion], None] | None = None, max_message_bytes: int | None = None,
                 keep_previous: bool = False, keep_carried: bool = False) -> None:
        super().__init__(token=token, host=host, advertise=advertise, port=0, tls=tls, what=f"slice server {owner}")
        self.owner, self.layout, self.policy, self.expected, self.names = owner, layout, policy, expected, list(names)
        self.on_ready, self.send_backup, self.persist = on_ready, send_backup, persist
        slice_bytes = layout.nbytes(owner)
        self.max_message_bytes = max_message_bytes or 4 * max(slice_bytes, max(layout.nbytes(j) for j in range(layout.owners))) + (1 << 20)
        self.committed: SliceVersion | None = None
        self.candidate: SliceVersion | None = None
        self.keep_previous = keep_previous
        self.keep_versions = KEEP_VERSIONS + int(keep_previous)
        self.previous: SliceVersion | None = None  # with keep_previous: the version before the committed one
        self.backups: dict[int, dict[int, SliceVersion]] = {}  # slice -> version -> what its owner sent
        self.keep_carried = keep_carried
        # (worker, round, slice) -> (the contributing task attempt, its contribution's piece)
        self.carried: dict[tuple[int, int, int], tuple[int, ModelState]] = {}
        self._ledger = ApplyLedger()
        self._round: int | None = None  # the round being collected (the committed version)
        self._counted: dict[int, int] = {}  # worker -> rows, of that round
        self._weights, self._optimizer = WeightedMean(), WeightedMean()
        self._counts = {"rejected": 0, "contributions": 0, "duplicates_dropped": 0, "late_dropped": 0, "bytes_in": 0,
                        "bytes_out": 0, "backups_in": 0, "applied": 0, "apply_s": 0.0}
        self._due = threading.Event()
        self.released = threading.Event()  # a new owner took the slice (``release``)
        self.backup_taken = threading.Event()  # a version of the slice this server backs up (its neighbour's) was served
        # slice -> version -> what the disk writer has not written yet (the last keep_versions of each: a restore asks for
        # the version the driver accepted, which may be the one before the newest)
        self._to_disk: dict[int, dict[int, SliceVersion]] = {}
        self._writing = False
        self._written = threading.Event()
        self._writer: threading.Thread | None = None
        self._applier: threading.Thread | None = None
        self.failure: BaseException | None = None  # the applier's error, for the task to raise

    # ---- the owner's state ---------------------------------------------------------------------

    def install(self, committed: SliceVersion, candidate: SliceVersion | None = None) -> None:
        """Hold ``committed`` (and a ``candidate`` the previous owner had applied already), e.g. at
        the fit's start or after a restore; reports what is ready."""
        self.layout.check_slice(committed.master, self.owner)
        with self._cond:
            for version in (committed, candidate):
                if version is not None and version.start is None:
                    version.start = self._start_of(version)
            self.committed, self.candidate, self.previous = committed, candidate, None
            self._begin_round(committed.version)
            self._cond.notify_all()
        if self._applier is None:
            self._applier = threading.Thread(target=self._apply_loop, name=f"sparkdl-slice-{self.owner}", daemon=True)
            self._applier.start()
        for version in (committed, candidate):
            if version is not None and self.persist is not None:
                self.persist(self.owner, version)
        if self.on_ready is not None:
            self.on_ready(committed.version, None)
            if candidate is not None:
                self.on_ready(candidate.version, None)

    def _start_of(self, version: SliceVersion) -> ModelState:
        return self.policy.starts(FitState(identity={}, master=version.master, mode=version.mode))

    def _begin_round(self, g: int) -> None:
        self._round = g
        self._counted = {}
        self._weights, self._optimizer = WeightedMean(), WeightedMean()

    def _commit(self, version: int) -> None:
        """Under the lock: make the candidate of ``version`` the committed one (the driver opened it),
        and forget the copies of other slices than the neighbour's that a superseded owner handed
        here and that are older than ``version`` (no restore asks for them any more)."""
        if self.candidate is not None and self.candidate.version == version:
            if self.keep_previous:
                self.previous = self.committed
            self.committed, self.candidate = self.candidate, None
            self._begin_round(version)
            for k in [k for k, held in self.backups.items() if holder_of(k, self.layout.owners) != self.owner
                      and max(held, default=-1) < version]:
                del self.backups[k]

    def held(self, version: int) -> SliceVersion | None:
        """This slice's version ``version`` when held (-1: the newest)."""
        with self._lock:
            options = [v for v in (self.candidate, self.committed, self.previous) if v is not None]
            if version < 0:
                return options[0] if options else None
            return next((v for v in options if v.version == version), None)

    def start_of(self, g: int, timeout_s: float) -> ModelState | None:
        """Round ``g``'s start from this slice (its worker's own pull, in process), committing the
        candidate of version ``g`` (the driver opened round g); None when it is not held within
        ``timeout_s`` seconds."""
        if self.gone(g):
            raise ServerError(f"slice {self.owner} no longer holds round {g}'s start (its oldest version is newer)")
        found = self.wait_version(g, timeout_s)
        if found is None:
            return None
        with self._cond:
            self._commit(g)
        return found.start

    def gone(self, version: int) -> bool:
        """Whether ``version`` (>= 0) is older than every version this slice holds: gone for good."""
        with self._lock:
            oldest = min((v.version for v in (self.previous, self.committed, self.candidate) if v is not None), default=None)
        return oldest is not None and 0 <= version < oldest

    def wait_version(self, version: int, timeout_s: float) -> SliceVersion | None:
        """Wait up to ``timeout_s`` seconds until this slice holds ``version`` (-1: any)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                options = [v for v in (self.candidate, self.committed, self.previous) if v is not None]
                found = (options[0] if options else None) if version < 0 else next((v for v in options if v.version == version), None)
                if found is not None or self._closing or self.failure is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    # ---- contributions -------------------------------------------------------------------------

    def contribute(self, meta: dict, arrays: ModelState) -> dict:
        """Count one worker's contribution to round ``meta["round"]`` (see the module docstring).
        Called by the put handler, and directly by the owner's own worker (no network)."""
        g, worker, attempt, rows = meta["round"], meta["worker"], meta["attempt"], meta["rows"]
        with self._cond:
            if self.committed is None:
                raise flight.FlightUnavailableError(f"slice {self.owner} is not served yet (restoring); put again")
            self._commit(g)  # a worker already in round g: the driver opened it
            if self.candidate is not None and self.candidate.version == g + 1 or g < self._round:
                self._counts["duplicates_dropped"] += 1
                return {"applied": False, "dropped": "duplicate"}
            if g > self._round:
                raise flight.FlightUnavailableError(f"slice {self.owner} holds round {self._round}'s start, not round {g}'s; put again")
            verdict = self._ledger.verdict(str(worker), attempt, g + 1)
            if verdict is not None or worker in self._counted:
                self._counts["duplicates_dropped"] += 1
                return {"applied": False, "dropped": verdict or "duplicate"}
            if worker not in self.expected(g):
                self._counts["late_dropped"] += 1
                return {"applied": False, "dropped": "late"}
            encoding = meta.get("encoding")
            if encoding in PIECEWISE:  # decoded against the round's start, in float32; summed in float64 below
                state = piece_codec.decode(arrays, self.committed.start, encoding)
            else:
                state = arrays if encoding is None else decode_mean(arrays, self.committed.start)
            self.layout.check_slice(state, self.owner)
            if rows > 0:
                self._weights.add(state.weights, rows)
                if state.optimizer is not None:
                    self._optimizer.add(state.optimizer, rows)
            self._ledger.reserve(str(worker), attempt, g + 1)
            if self.keep_carried and encoding is None:
                self._keep_carried(worker, g, self.owner, attempt, arrays)
            self._counted[worker] = rows
            self._counts["contributions"] += 1
            if set(self._counted) >= self.expected(g):
                self._due.set()
            return {"applied": True, "dropped": None}

    def _apply_loop(self) -> None:
        while not self._closing:
            if not self._due.wait(0.5):
                continue
            self._due.clear()
            try:
                self._apply()
            except BaseException as exc:  # noqa: BLE001 - the task raises it (self.failure)
                self.failure = exc
                with self._cond:
                    self._cond.notify_all()
                log.error("sparkdl: slice %d could not apply its round: %s", self.owner, exc)
                return

    def _apply(self) -> None:
        started = time.perf_counter()
        with self._cond:
            g, committed = self._round, self.committed
            if g is None or committed is None or self.candidate is not None or not set(self._counted) >= self.expected(g):
                return
            rows = sum(self._counted.values())
            weights = self._weights.result()
            optimizer = self._optimizer.result() if self._optimizer.total_weight else None
        mean = None if weights is None else ModelState(weights, optimizer)
        transition = self.policy.apply(FitState(identity={}, master=committed.master, mode=committed.mode), RoundUpdates(rows, mean=mean))
        master = transition.master
        problem = None
        for name, array in zip(self.names, master.weights, strict=True):
            if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
                problem = f"non-finite values in {name!r} after round {g + 1}"
                break
        candidate = SliceVersion(g + 1, ModelState([np.asarray(a) for a in master.weights],
                                                   None if master.optimizer is None else [np.asarray(a) for a in master.optimizer]),
                                 {k: [np.asarray(a) for a in v] for k, v in transition.mode.items()})
        if problem is None:
            candidate.start = self._start_of(candidate)
            with self._cond:
                self.candidate = candidate
                self._counts["applied"] += 1
                self._counts["apply_s"] += time.perf_counter() - started
                self._cond.notify_all()
            self._keep_on_disk(self.owner, candidate)
            if self.send_backup is not None:  # its holder has it before anyone hears it is ready
                self.send_backup(g + 1)
        if self.on_ready is not None:
            self.on_ready(g + 1, problem)

    def _keep_on_disk(self, slice_index: int, version: SliceVersion) -> None:
        """Hand ``version`` of ``slice_index`` to the disk writer thread (the last :attr:`keep_versions`
        of each slice not written yet are written, oldest first)."""
        if self.persist is None:
            return
        with self._lock:
            waiting = self._to_disk.setdefault(slice_index, {})
            waiting[version.version] = version
            for old in sorted(waiting)[:-self.keep_versions]:
                waiting.pop(old)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name=f"sparkdl-slice-{self.owner}-disk", daemon=True)
                self._writer.start()
        self._written.set()

    def _write_loop(self) -> None:
        while not self._closing:
            if not self._written.wait(0.5):
                continue
            self._written.clear()
            with self._cond:
                pending, self._to_disk = self._to_disk, {}
                self._writing = True
            for k, version in [(k, versions[v]) for k, versions in sorted(pending.items()) for v in sorted(versions)]:
                try:
                    self.persist(k, version)
                except Exception as exc:  # noqa: BLE001 - a full disk costs the local copy, not the fit (the holder has one)
                    log.warning("sparkdl: slice server %d could not keep version %d of slice %d on this executor's disk: %s",
                                self.owner, version.version, k, exc)
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def flush_disk(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds until every version handed to the disk writer is written;
        returns whether it was."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._to_disk and not self._writing, timeout=max(0.0, timeout_s))

    # ---- backups --------------------------------------------------------------------------------

    def keep_backup(self, slice_index: int, version: SliceVersion, to_disk: bool = True) -> None:
        """Keep another owner's version as its backup (the last :data:`KEEP_VERSIONS` versions), in
        memory and (``to_disk``) on this executor's disk, where a later owner on this executor finds
        it when this server is gone."""
        with self._lock:
            held = self.backups.setdefault(slice_index, {})
            held[version.version] = version
            for old in sorted(held)[:-self.keep_versions]:
                held.pop(old)
            self._counts["backups_in"] += 1
        if to_disk:
            self._keep_on_disk(slice_index, version)

    def _keep_carried(self, worker: int, g: int, slice_index: int, attempt: int, piece: ModelState) -> bool:
        """Under the lock: keep slice ``slice_index`` of task attempt ``attempt``'s contribution to
        round ``g`` for ``worker``, unless a later attempt's is kept (Spark's attempt ids grow: a
        superseded attempt's late hand-off never replaces its replacement's piece); the worker's
        rounds older than its :data:`KEEP_CARRIED` newest are forgotten. Returns whether it was kept."""
        kept = self.carried.get((worker, g, slice_index))
        if kept is not None and kept[0] > attempt:
            return False
        self.carried[(worker, g, slice_index)] = (attempt, piece)
        rounds = sorted({r for w, r, _ in self.carried if w == worker})
        for old in rounds[:-KEEP_CARRIED]:
            for key in [key for key in self.carried if key[0] == worker and key[1] == old]:
                del self.carried[key]
        return True

    def keep_carried_piece(self, worker: int, g: int, slice_index: int, attempt: int, piece: ModelState) -> bool:
        """Keep slice ``slice_index`` of ``worker``'s contribution to round ``g`` made by task attempt
        ``attempt`` (a ``carried`` put, or a hand-off), for a retried task of that worker to find;
        returns whether it was kept (not when a later attempt's is).

        Raises:
            InvariantError: this server does not keep contributions (``keep_carried`` off), or ``g``
                is beyond the round after the newest version it holds.
        """
        with self._lock:
            if not self.keep_carried:
                raise InvariantError(f"slice server {self.owner} keeps no contribution pieces (overlap without an encoding only)")
            newest = max((v.version for v in (self.previous, self.committed, self.candidate) if v is not None), default=None)
            if newest is not None and g > newest:
                raise InvariantError(f"a carried piece's round must be at most {newest} (the newest version held). Received: {g}")
            return self._keep_carried(worker, g, slice_index, attempt, piece)

    def carried_piece(self, worker: int, g: int, slice_index: int) -> ModelState | None:
        """Slice ``slice_index`` of ``worker``'s contribution to round ``g``, when kept."""
        with self._lock:
            kept = self.carried.get((worker, g, slice_index))
            return None if kept is None else kept[1]

    def carried_pieces(self) -> dict[tuple[int, int, int], tuple[int, ModelState]]:
        """Every contribution piece kept, by ``(worker, round, slice)``: ``(its task attempt, the piece)``."""
        with self._lock:
            return dict(self.carried)

    def carried_slices(self, worker: int, g: int) -> list[int]:
        """The slices of ``worker``'s contribution to round ``g`` this server keeps."""
        with self._lock:
            return sorted(k for w, r, k in self.carried if w == worker and r == g)

    # ---- Flight handlers ------------------------------------------------------------------------

    def _serve(self, version: SliceVersion, start: bool = False, role: str | None = None):
        specs, arrays = version.arrays(start=start)
        if role is not None:  # one group alone: "weight" or "optimizer"
            keep = [i for i, s in enumerate(specs) if s.role == role]
            specs, arrays = [specs[i] for i in keep], [arrays[i] for i in keep]
        stream, nbytes = array_stream(specs, arrays, {"sparkdl.version": str(version.version)}, CHUNK_BYTES)
        self._count("bytes_out", nbytes)
        return stream

    def _handle_get(self, ticket: flight.Ticket):
        raw = bytes(ticket.ticket).decode("utf-8", "replace")
        kind, _, rest = raw.partition(":")
        try:
            numbers = [int(x) for x in rest.split(":")] if rest else []
        except ValueError:
            numbers = []
        if kind in ("start", "master", "weights", "optimizer") and len(numbers) == 1:
            if self.gone(numbers[0]):  # asking again cannot help
                raise flight.FlightServerError(f"slice {self.owner} no longer holds version {numbers[0]}")
            found = self.wait_version(numbers[0], WAIT_S)
            if found is None:
                raise flight.FlightUnavailableError(f"slice {self.owner} does not hold version {numbers[0]} yet; ask again")
            if kind == "start":
                with self._cond:
                    self._commit(numbers[0])
                    found = self.committed if self.committed is not None and self.committed.version == numbers[0] else found
            return self._serve(found, start=kind == "start", role={"weights": "weight", "optimizer": "optimizer"}.get(kind))
        if kind == "carried" and len(numbers) == 3:
            w, g, k = numbers
            piece = self.carried_piece(w, g, k)
            if piece is None:
                raise flight.FlightServerError(f"slice server {self.owner} keeps no slice {k} of worker {w}'s contribution to round {g}")
            return self._serve(SliceVersion(g, piece))
        if kind == "held" and len(numbers) == 2:
            k, v = numbers
            found = self.held(v) if k == self.owner else self.backups.get(k, {}).get(v)
            if found is None:
                raise flight.FlightServerError(f"slice server {self.owner} holds no version {v} of slice {k}")
            stream = self._serve(found)
            if k != self.owner and holder_of(k, self.layout.owners) == self.owner:  # the neighbour's new owner has it
                self.backup_taken.set()
            return stream
        raise flight.FlightServerError(f"ticket must be start:<g>, master:<v>, weights:<v>, optimizer:<v>, held:<k>:<v> or carried:<w>:<g>:<k>. "
                                       f"Received: {raw[:40]!r}")

    def _handle_put(self, descriptor, reader, writer) -> None:
        try:
            meta = _parse_command(descriptor)
            if meta["nbytes"] > self.max_message_bytes:
                raise CodecError(f"a slice put must be at most {self.max_message_bytes} bytes. Received: {meta['nbytes']}")
            received = specs_from_schema(reader.schema)
            arrays, _ = read_body(reader, received, self.max_message_bytes, count=lambda n: self._count("bytes_in", n))
        except CodecError as exc:
            raise self._reject(str(exc)) from None
        if meta["kind"] == "backup":
            version = SliceVersion.from_arrays(meta["version"], received, arrays, self.layout.has_optimizer)
            self.keep_backup(meta["slice"], version)
            answer = {"applied": True, "dropped": None}
        elif meta["kind"] == "carried":
            piece = SliceVersion.from_arrays(meta["round"], received, arrays, any(s.role == "optimizer" for s in received)).master
            try:
                if not (0 <= meta["slice"] < self.layout.owners and 0 <= meta["worker"] < self.layout.owners):
                    raise InvariantError(f"a carried piece's slice and worker must be below {self.layout.owners}. "
                                         f"Received: slice {meta['slice']}, worker {meta['worker']}")
                self.layout.check_slice(piece, meta["slice"])
                kept = self.keep_carried_piece(meta["worker"], meta["round"], meta["slice"], meta["attempt"], piece)
            except InvariantError as exc:
                raise self._reject(f"{exc}; nothing kept") from None
            answer = {"applied": kept, "dropped": None if kept else "superseded_attempt"}
        else:
            self.liveness.touch(str(meta["worker"]), attempt=meta["attempt"])
            state = SliceVersion.from_arrays(meta["round"], received, arrays, any(s.role == "optimizer" for s in received)).master
            try:
                answer = self.contribute(meta, state)
            except (CodecError, InvariantError) as exc:
                raise self._reject(f"{exc}; the slice is unchanged") from None
        writer.write(pa.py_buffer(json.dumps(answer).encode()))

    def _handle_action(self, kind: str, body: bytes):
        if kind == "held":
            req = self._json_body(kind, body, ["slice"])
            k = req["slice"]
            with self._lock:
                if k == self.owner:
                    versions = sorted(v.version for v in (self.previous, self.committed, self.candidate) if v is not None)
                else:
                    versions = sorted(self.backups.get(k, {}))
            return json_result({"slice": k, "versions": versions})
        if kind == "carried":
            req = self._json_body(kind, body, ["of", "round"])
            return json_result({"slices": self.carried_slices(req["of"], req["round"])})
        if kind == "status":
            return json_result(self.status())
        if kind == "write":
            req = self._json_body(kind, body, ["version"])
            uri = req.get("uri")
            if not isinstance(uri, str) or not uri:
                raise self._reject(f"write needs a uri. Received: {uri!r:.80}")
            found = self.wait_version(req["version"], WAIT_S)
            if found is None:
                raise flight.FlightUnavailableError(f"slice {self.owner} does not hold version {req['version']} yet; ask again")
            return json_result(write_slice(uri, found, self.layout.has_optimizer))
        if kind == "release":
            with self._cond:
                self.committed = self.candidate = self.previous = None
                self._cond.notify_all()
            self.released.set()
            return json_result({"released": True})
        raise self._reject(f"action must be one of held, carried, status, write, release. Received: {kind[:64]!r}")

    def status(self) -> dict:
        """Versions held, the round being collected and its contributions, and the counters."""
        with self._lock:
            return {"owner": self.owner, "committed": None if self.committed is None else self.committed.version,
                    "previous": None if self.previous is None else self.previous.version,
                    "candidate": None if self.candidate is None else self.candidate.version, "round": self._round,
                    "counted": sorted(self._counted), "backups": {str(k): sorted(v) for k, v in self.backups.items()},
                    "carried": len(self.carried),
                    **self._counts, "unauthenticated": self.refused}


def write_slice(uri: str, version: SliceVersion, has_optimizer: bool) -> dict:
    """Write ``version`` (master and mode pieces) to ``uri`` as Arrow IPC through ``pyarrow.fs``
    (written whole to a temporary file of its own beside it, then moved); returns ``{"uri", "sha256", "bytes", "version"}``."""
    from pyarrow import fs as pafs

    from sparkdl.serialization.arrow_codec import encode_arrays

    specs, arrays = version.arrays()
    names = [f"{s.role}|{s.name}" for s in specs]
    payload = encode_arrays(arrays, names)
    filesystem, path = pafs.FileSystem.from_uri(uri)
    parent = path.rsplit("/", 1)[0]
    filesystem.create_dir(parent, recursive=True)
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"  # two writers of one copy (an owner and its holder on one executor) never meet
    with filesystem.open_output_stream(temporary) as out:
        out.write(payload)
    filesystem.move(temporary, path)
    return {"uri": uri, "sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload), "version": version.version,
            "optimizer": has_optimizer}


def read_slice(uri: str, sha256: str | None = None) -> SliceVersion:
    """The inverse of :func:`write_slice` (its version from the caller's manifest).

    Raises:
        CodecError: the file's bytes do not match ``sha256``.
    """
    from pyarrow import fs as pafs

    from sparkdl.serialization.arrow_codec import decode_arrays

    filesystem, path = pafs.FileSystem.from_uri(uri)
    with filesystem.open_input_stream(path) as source:
        payload = source.read()
    if sha256 is not None and hashlib.sha256(payload).hexdigest() != sha256:
        raise CodecError(f"a checkpoint's slice must match its manifest's SHA-256. Received: another content in {uri}")
    decoded = decode_arrays(payload)
    specs, arrays = [], []
    for name, array in zip(decoded.names, decoded.arrays, strict=True):
        role, _, short = name.partition("|")
        specs.append(ArraySpec(short, tuple(array.shape), array.dtype, role))
        arrays.append(array)
    return SliceVersion.from_arrays(-1, specs, arrays, any(s.role == "optimizer" for s in specs))


class SliceClient(ParameterServerClient):
    """A client of one :class:`SliceServer` (retries, deadlines, token and pinned certificate as
    :class:`~sparkdl.server.ParameterServerClient`).

    Raises:
        ServerError: from every call the server refuses or does not answer in time.
    """

    SERVER = "slice server"

    def fetch(self, ticket: str, has_optimizer: bool, nbytes: int = 0) -> SliceVersion:
        """A version the server serves: ``start:<g>``, ``master:<v>``, ``weights:<v>``, ``held:<k>:<v>``."""
        version, specs, arrays, _ = self._get(ticket.encode(), nbytes)
        return SliceVersion.from_arrays(version, specs, arrays, has_optimizer and any(s.role == "optimizer" for s in specs))

    def fetch_into(self, ticket: str, targets: Sequence[np.ndarray]) -> int:
        """Read ``ticket``'s arrays straight into ``targets`` (views of a whole state, one per array
        of the answer, in order): no second copy. Returns the bytes read.

        Raises:
            ServerError: the answer's arrays differ from ``targets`` in count, size or dtype.
        """
        self._get(ticket.encode(), sum(t.nbytes for t in targets), out=list(targets))
        return sum(t.nbytes for t in targets)

    def put_contribution(self, state: ModelState, *, round_: int, worker: int, attempt: int, rows: int,
                         encoding: str | None = None) -> dict:
        """Put a worker's contribution to round ``round_`` (``state``: its slice, or its encoded difference)."""
        specs, arrays = SliceVersion(round_, state).arrays()
        command = {"kind": "contrib", "round": round_, "worker": worker, "attempt": attempt, "rows": rows, "encoding": encoding}
        return self._put(command, specs, arrays, "contribution")

    def put_backup(self, slice_index: int, version: SliceVersion, attempt: int) -> dict:
        """Put a version of slice ``slice_index`` for this server to keep as its backup."""
        specs, arrays = version.arrays()
        command = {"kind": "backup", "slice": slice_index, "version": version.version, "attempt": attempt}
        return self._put(command, specs, arrays, "backup")

    def put_carried(self, piece: ModelState, *, worker: int, round_: int, slice_index: int, attempt: int) -> dict:
        """Put slice ``slice_index`` of ``worker``'s contribution to round ``round_`` for the server to keep."""
        specs, arrays = SliceVersion(round_, piece).arrays()
        command = {"kind": "carried", "worker": worker, "round": round_, "slice": slice_index, "attempt": attempt}
        return self._put(command, specs, arrays, "carried piece")

    def carried(self, worker: int, round_: int) -> list[int]:
        """The slices of ``worker``'s contribution to round ``round_`` the server keeps."""
        return list(self._action("carried", json.dumps({"of": worker, "round": round_}).encode())["slices"])

    def held(self, slice_index: int) -> list[int]:
        """The versions of slice ``slice_index`` the server holds."""
        return list(self._action("held", json.dumps({"slice": slice_index}).encode())["versions"])

    def write(self, uri: str, version: int) -> dict:
        """Have the server write its slice's ``version`` to ``uri`` (a checkpoint)."""
        return self._action("write", json.dumps({"uri": uri, "version": version}).encode())

    def status(self) -> dict:
        return self._action("status")

    def release(self) -> dict:
        return self._action("release")


def unavailable(exc: BaseException) -> bool:
    """Whether a slice client's error means "not there yet, ask again" (not a refusal)."""
    return isinstance(exc, ServerError) and ("ask again" in str(exc) or "put again" in str(exc) or "no answer" in str(exc))
