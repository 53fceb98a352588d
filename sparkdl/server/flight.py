"""A driver-side parameter server on Arrow Flight (gRPC): the transport of backend ``ps``.

The server holds the master copy of a model (named numeric arrays: weights, and optimizer
arrays when present), a version counter (starts at 0, +1 per applied push) and a caller-supplied
update rule: an asynchronous mode's rule, applied to each push as it arrives, or a
:class:`~sparkdl.core.board.RoundBoard`, which collects a round mode's pushes for the driver's
loop. Workers pull the state and push updates with :class:`sparkdl.server.ParameterServerClient`.
The wire format (tickets, descriptors, arrays as record batches) is :mod:`sparkdl.server.wire`.

Protocol (Arrow Flight RPCs; spec: https://arrow.apache.org/docs/format/Flight.html):

* ``DoGet`` with ticket ``b"state"``: the master arrays in the wire format; schema metadata
  ``sparkdl.version`` holds the version (decimal) and ``sparkdl.control`` the driver's orders
  (JSON ``{"stop": bool, "learning_rate": float | null}``). Ticket ``b"weights"``: the weight
  arrays alone, likewise. Ticket ``b"state:<worker>"`` (round modes): the state that worker
  starts the open round from (the master, BMUF's W + η·Δ, a per-worker mode's own model).
  Ticket ``b"local:<worker>"``: the worker's own state (``residual`` and ``optimizer`` arrays,
  metadata ``sparkdl.version``: the round it follows, -1 for none) it put last, or that a
  resumed fit restored.
* ``DoPut`` with a command descriptor holding a UTF-8 JSON object ``{"kind": "update",
  "worker": str, "attempt": int, "seq": int, "base_version": int, "rows": int, "nbytes": int}``
  and a body of record batches in the wire format (the update arrays). The server answers
  with one ``app_metadata`` message, a JSON object ``{"applied": bool, "dropped": null |
  "duplicate" | "superseded_attempt" | "late", "version": int, "staleness": int | null}``
  (``"late"``: the round of the push had closed). The descriptor may also hold ``"encoding"``:
  ``"fp16"`` (the float arrays as float16 differences) or ``"1bit"``/``"threshold"`` (one uint8
  array ``payload``, a :func:`sparkdl.core.compression.quantize` payload), decoded into the
  weight differences before the rule (``meta["encoding"]`` tells the rule), and ``"extra"``: a
  JSON object passed to the rule as ``meta["extra"]`` (metric sums, the epoch);
  ``extra["clock"]`` (int) advances the worker's SSP clock. A descriptor of ``"kind": "local"``
  (``worker``, ``attempt``, ``seq``, ``nbytes``) carries a worker's own state after slot
  ``seq`` (arrays of roles ``residual`` and ``optimizer``).
* ``DoAction`` (JSON bodies and results): ``"version"``, ``"stats"``, ``"signature"``,
  ``"control"`` (empty bodies); ``"wait_round"`` (round modes; ``{"round": int, "timeout_s":
  float}``: waits until the driver opened that round; see
  :meth:`~sparkdl.core.board.RoundBoard.wait_open`); ``"wait_version"`` (``{"version": int,
  "timeout_s": float}``); ``"heartbeat"`` (``{"worker": str, "attempt": int, "state": "alive" |
  "done" | "error", "message": str}``: the worker's last contact, see
  :meth:`ParameterServer.contacts`; a done worker leaves the SSP clocks, a failed one keeps its
  clock for its retry; answered with the driver's orders and ``superseded``: a later attempt of the
  worker was heard); ``"progress"`` (``{"worker": str}``:
  ``{"attempt": int | null, "seq": int | null}``, the worker's highest attempt and its last
  applied seq, so a retried task skips the slots already applied); ``"wait_clock"``
  (``{"worker": str, "bound": int, "timeout_s": float}``: waits until the worker is at most
  ``bound`` clocks ahead of the slowest registered worker, Stale Synchronous Parallel;
  ``{"reached": bool, "stop": bool, "learning_rate": ...}``).

Exactly once: each push carries ``(worker, attempt, seq)``, ``seq`` being the worker's
deterministic slot index. Per worker the server keeps the highest attempt seen and the last
applied seq; a push from a lower attempt, or with ``seq <=`` the last applied seq (of any
attempt: a zombie of an older attempt and its retry cannot both apply a slot), is dropped
(counted, not applied) and answered normally, so clients may retry pushes freely.

Staleness of a push = server version when it is applied − ``base_version`` (the version the
worker pulled); the rule receives it in ``meta["staleness"]``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from sparkdl.core.board import LatePush, decode_metric_sums
from sparkdl.core.ledger import ApplyLedger
from sparkdl.core.modes.asynchronous import SSPClock
from sparkdl.core.state import ModelState, WorkerLocal
from sparkdl.errors import CodecError, ConfigError, InvariantError
from sparkdl.server.service import FlightEndpoint, json_result
from sparkdl.server.tls import TLSIdentity
from sparkdl.server.wire import (
    DEFAULT_CHUNK_BYTES,
    LOCAL_PREFIX,
    STATE_TICKET,
    VALIDATION_PREFIX,
    WEIGHTS_TICKET,
    WORKER_STATE_PREFIX,
    ArraySpec,
    array_stream,
    check_encoded,
    decode_push,
    read_body,
    parse_push_descriptor,
    specs_from_schema,
    specs_of,
    split_arrays,
)

UpdateRule = Callable[[ModelState, ModelState, Mapping], ModelState]
"""``rule(master, update, meta) -> new master``. ``update.weights`` (and ``update.optimizer``
when sent) match the server's signature; ``meta`` holds ``worker``, ``attempt``, ``seq``,
``base_version``, ``rows``, ``staleness`` and ``version`` (before this update). The rule must
return a :class:`ModelState` of the same signature; returning new arrays keeps the master
intact when the rule raises."""


class ParameterServer(FlightEndpoint):
    """The master state of a fit, served over Arrow Flight on the driver.

    Args:
        initial: the starting master state. The arrays are copied; the server owns its copy.
        rule: ``rule(master, update, meta) -> ModelState`` (see :data:`UpdateRule`): a rule of
            :mod:`sparkdl.core.modes.asynchronous` (wrapped in an
            :class:`~sparkdl.core.board.EpochLedger`), or a :class:`~sparkdl.core.board.RoundBoard`
            (round modes: pushes are collected for the driver, and ``state:<worker>`` pulls and
            ``wait_round`` are served by it). It runs under the server's lock unless ``lock`` is False.
        names: one name per weight (e.g. ``"dense/kernel"``); default ``"weight/<i>"``.
        optimizer_names: one name per optimizer array; default ``"optimizer/<i>"``.
        token: the bearer token clients must send; default a fresh ``secrets.token_hex(32)``.
        host: interface to bind (default loopback ``"127.0.0.1"``; ``"0.0.0.0"`` binds every one).
        advertise: the address clients dial (:attr:`location`), when it is not ``host`` (a driver
            bound to ``0.0.0.0``, or behind NAT: ``spark.driver.host``).
        port: TCP port; 0 picks a free one (see :attr:`port` after :meth:`start`).
        lock: apply updates one at a time under a lock (True), or concurrently without it
            (False: Hogwild, Recht et al. NIPS 2011; the dedupe bookkeeping and the version
            counter stay atomic, but with an out-of-place rule concurrent updates may
            overwrite each other and a raising in-place rule may leave a partial update).
            Default: ``getattr(rule, "lock", True)``.
        max_message_bytes: largest push body accepted, in bytes of Arrow buffers; default
            4 × the model's bytes (weights and optimizer) + 1 MiB. A push whose declared
            ``nbytes`` is larger is refused before its body is read; while reading, the
            server stops at the first batch that takes the running total past the limit.
        chunk_bytes: bytes of values per record batch sent on pulls (default 8 MiB).
        tls: a :class:`~sparkdl.server.tls.TLSIdentity` (certificate and key): the server speaks
            ``grpc+tls``; clients pin its certificate (:meth:`~sparkdl.server.tls.TLSIdentity.pin`).
        marks: per worker ``[attempt, last applied seq]`` to start from (a resumed fit).
        local: per worker the own state it had after its last applied slot
            (:class:`~sparkdl.core.state.WorkerLocal`, a resumed fit), served on ``local:<worker>``.
        workers: the fit's worker count: pushes, pulls and actions naming another worker id than
            its partitions (``"0"`` ..), or a task attempt far above those heard, are refused and
            nothing is recorded of them (a holder of the token could otherwise register any
            number of ids, or supersede a worker's real attempts for good); None: any id.
        max_seq: the fit's slot count: a push of a higher ``seq`` is refused (marked, it would drop
            the worker's real pushes as duplicates); None: any seq.

    Raises:
        ConfigError: on an argument out of range (port, sizes), a rule that is not callable.
        CodecError: on initial arrays of a non-numeric dtype.
        ServerError: from :meth:`start` when ``host:port`` cannot be bound.

    Use as a context manager: ``with ParameterServer(state, DownpourRule()) as server:``
    starts it (gRPC serves on its own C++ threads; no Python thread is started) and
    :meth:`shutdown` runs on exit, also on exceptions and KeyboardInterrupt.
    """

    PORT_SETTING = "serverPort"
    ACTIONS = (
        ("version", "current version, JSON {\"version\": int}"),
        ("stats", "counters, JSON object (see ParameterServer.stats)"),
        ("signature", "names, shapes, dtypes and roles of the master arrays, JSON"),
        ("wait_version", "body {\"version\": int, \"timeout_s\": float}: wait until the version reaches it"),
        ("wait_round", "body {\"round\": int, \"timeout_s\": float}: wait until the driver opened that round"),
        ("heartbeat", "body {\"worker\": str, \"attempt\": int, \"state\": \"alive\"|\"done\"|\"error\", \"message\": str}"),
        ("progress", "body {\"worker\": str}: the worker's highest attempt and last applied seq"),
        ("wait_clock", "body {\"worker\": str, \"bound\": int, \"timeout_s\": float}: SSP wait"),
        ("control", "the driver's orders: JSON {\"stop\": bool, \"learning_rate\": float | null}"),
        ("wait_validation", "body {\"worker\": str, \"epoch\": int, \"timeout_s\": float}: wait for a validation to run"),
        ("validation", "body {\"worker\": str, \"attempt\": int, \"epoch\": int, \"rows\": int, \"metrics\": list | null}"),
    )

    def __init__(
        self,
        initial: ModelState,
        rule: UpdateRule,
        *,
        names: Sequence[str] | None = None,
        optimizer_names: Sequence[str] | None = None,
        token: str | None = None,
        host: str = "127.0.0.1",
        advertise: str | None = None,
        port: int = 0,
        lock: bool | None = None,
        max_message_bytes: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        tls: TLSIdentity | None = None,
        marks: Mapping[str, Sequence[int]] | None = None,
        local: Mapping[str, WorkerLocal] | None = None,
        workers: int | None = None,
        max_seq: int | None = None,
    ) -> None:
        if not callable(rule):
            raise ConfigError(f"rule must be callable as rule(master, update, meta). Received: {type(rule).__name__}")
        if max_seq is not None and (isinstance(max_seq, bool) or not isinstance(max_seq, int) or max_seq < 0):
            raise ConfigError(f"max_seq must be an integer >= 0 (the fit's slots) or None. Received: {max_seq!r}")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ConfigError(f"workers must be a positive integer (the fit's partitions) or None. Received: {workers!r}")
        super().__init__(token=token, host=host, advertise=advertise, port=port, tls=tls, what="parameter server",
                         workers=workers)
        if not isinstance(chunk_bytes, int) or chunk_bytes < 1024:
            raise ConfigError(f"chunk_bytes must be an integer >= 1024 bytes. Received: {chunk_bytes!r}")
        self._specs = specs_of(initial, names, optimizer_names)
        arrays = [*initial.weights, *(initial.optimizer or [])]
        owned = [np.array(a, dtype=s.dtype, order="C", copy=True) for s, a in zip(self._specs, arrays, strict=True)]
        self._state = split_arrays(self._specs, owned)
        self.model_bytes = sum(s.nbytes for s in self._specs)
        if max_message_bytes is None:
            max_message_bytes = 4 * self.model_bytes + (1 << 20)
        if not isinstance(max_message_bytes, int) or isinstance(max_message_bytes, bool) or max_message_bytes < 1:
            raise ConfigError(f"max_message_bytes must be a positive integer (bytes). Received: {max_message_bytes!r}")
        self.rule = rule
        self.lock = bool(getattr(rule, "lock", True) if lock is None else lock)
        self.max_message_bytes = max_message_bytes
        self.chunk_bytes = chunk_bytes
        # self._lock (the base's): bookkeeping: version, dedupe, stats, state reference
        self._apply_lock = threading.Lock() if self.lock else None
        self._version = 0
        self._ledger = ApplyLedger(marks, max_seq=max_seq)
        self._local: dict[str, WorkerLocal] = {str(w): v for w, v in (local or {}).items()}
        self._counts = {"updates_applied": 0, "duplicates_dropped": 0, "rejected": 0, "pulls": 0, "pushes": 0,
                        "bytes_pushed": 0, "bytes_pulled": 0, "late_dropped": 0, "local_puts": 0, "bytes_local": 0}
        self._staleness: dict[int, int] = {}
        self._clocks = SSPClock()  # SSP clocks of the registered workers
        self.clock_gap_max = 0  # SSP: the largest lead over the slowest worker with which a worker went on
        self._control = {"stop": False, "learning_rate": None}

    # ------------------------------------------------------------------ lifecycle
    def _on_shutdown(self) -> None:
        stop = getattr(self.rule, "stop", None)
        if stop is not None:
            stop()

    @property
    def signature(self) -> list[ArraySpec]:
        return list(self._specs)

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    def state(self) -> tuple[int, ModelState]:
        """``(version, copy of the master state)``."""
        with self._lock:
            version, state = self._version, self._state
        return version, ModelState([a.copy() for a in state.weights], None if state.optimizer is None else [a.copy() for a in state.optimizer])

    def stats(self) -> dict:
        """Counters since start: ``version``, ``updates_applied``, ``duplicates_dropped``
        (duplicate seqs and superseded attempts), ``late_dropped``, ``rejected`` (bad descriptor,
        signature, size, base version or a raising rule), ``pushes``, ``pulls``, ``local_puts``,
        ``bytes_pushed`` / ``bytes_pulled`` (Arrow buffer bytes of update bodies read / of bodies
        sent), ``bytes_local`` (of the workers' own states put),
        ``staleness_mean``, ``staleness_max`` (updates; 0 when none applied), ``staleness_counts``
        ({staleness: updates}) and ``unauthenticated`` (calls refused for their token)."""
        with self._lock:
            out = dict(self._counts)
            n = sum(self._staleness.values())
            out["version"] = self._version
            out["staleness_mean"] = (sum(k * v for k, v in self._staleness.items()) / n) if n else 0.0
            out["staleness_max"] = max(self._staleness, default=0)
            out["staleness_counts"] = {str(k): v for k, v in sorted(self._staleness.items())}
        out["unauthenticated"] = self.refused
        return out

    def marks(self) -> dict[str, list[int]]:
        """Per worker ``[highest attempt, last applied seq]`` (what a snapshot keeps)."""
        with self._lock:
            return self._ledger.marks()

    def local(self, worker: str) -> WorkerLocal | None:
        """The own state ``worker`` last sent (a ``local`` put), or None."""
        with self._lock:
            return self._local.get(str(worker))

    # ------------------------------------------------------------------ the driver's orders
    def set_control(self, stop: bool | None = None, learning_rate: float | None = None) -> None:
        """Orders the asynchronous workers read with every pull and clock wait: ``stop`` (return
        at the next slot), ``learning_rate`` (train with it from the next slot)."""
        with self._cond:
            if stop is not None:
                self._control["stop"] = bool(stop)
            if learning_rate is not None:
                self._control["learning_rate"] = float(learning_rate)
            self._cond.notify_all()

    def set_state(self, state: ModelState) -> None:
        """Replace the master (a callback set the weights between epochs)."""
        new = self._checked_result(state)
        with self._apply_lock or nullcontext():
            with self._cond:
                self._state = new
                self._cond.notify_all()

    def register_clocks(self, clocks: Mapping[str, int]) -> None:
        """Registers workers (ids as they push them) at their clocks for ``wait_clock``."""
        with self._cond:
            for worker, clock in clocks.items():
                self._clocks.register(str(worker), int(clock))
            self._cond.notify_all()

    def clocks(self) -> dict[str, int]:
        with self._lock:
            return {str(w): c for w, c in self._clocks.clocks().items()}

    def wait_version(self, version: int, timeout_s: float) -> bool:
        """Blocks until the version is >= ``version`` or ``timeout_s`` seconds pass (or the
        server shuts down); returns whether the version was reached."""
        with self._cond:
            self._cond.wait_for(lambda: self._version >= version or self._closing, timeout=max(0.0, timeout_s))
            return self._version >= version

    def wait_clock(self, worker: str, bound: int, timeout_s: float) -> bool:
        """Blocks until ``worker`` is at most ``bound`` clocks ahead of the slowest registered
        worker (or ``timeout_s`` pass, the driver stops the fit, or the server shuts down);
        returns whether it is."""
        with self._cond:
            self._cond.wait_for(lambda: self._clocks.can_advance(worker, bound) or self._closing or self._control["stop"],
                                timeout=max(0.0, timeout_s))
            reached = self._clocks.can_advance(worker, bound)
            clocks = self._clocks.clocks()
            if reached and worker in clocks:  # how far ahead of the slowest a worker went on (the bound, checked)
                self.clock_gap_max = max(self.clock_gap_max, clocks[worker] - self._clocks.min_clock())
            return reached

    def _touch(self, worker: str, state: str = "alive", message: str = "", attempt: int | None = None) -> None:
        if self.liveness.touch(worker, state, message, attempt) and state == "done":
            with self._cond:  # a finished worker no longer holds the others back; a failed one will be retried
                self._clocks.unregister(worker)
                self._cond.notify_all()

    # ------------------------------------------------------------------ handlers
    def _handle_get(self, ticket: flight.Ticket):
        raw = bytes(ticket.ticket)
        control = None
        if raw.startswith(LOCAL_PREFIX):
            worker = raw[len(LOCAL_PREFIX):].decode("utf-8", "replace")
            self._check_worker("ticket local:<worker>", worker)
            return self._serve_local(worker)
        if raw.startswith(VALIDATION_PREFIX):
            return self._serve_validation(raw)
        if raw.startswith(WORKER_STATE_PREFIX):
            served = getattr(self.rule, "served", None)
            worker = raw[len(WORKER_STATE_PREFIX):].decode("utf-8", "replace")
            if served is None or not 0 < len(worker) <= 256:
                raise flight.FlightServerError(f"ticket {raw[:40]!r} needs a round rule serving each worker's start state and a worker id")
            self._check_worker("ticket state:<worker>", worker)
            with self._lock:
                version, master = self._version, self._state
            state = served(worker, master)
            raw = STATE_TICKET
        elif raw not in (STATE_TICKET, WEIGHTS_TICKET):
            raise flight.FlightServerError(f"ticket must be {STATE_TICKET!r}, {WEIGHTS_TICKET!r}, state:<worker> or local:<worker>. "
                                           f"Received: {raw[:32]!r}")
        else:
            with self._lock:
                version, state, control = self._version, self._state, dict(self._control)
        if raw == WEIGHTS_TICKET:
            specs, arrays = [s for s in self._specs if s.role == "weight"], list(state.weights)
        else:
            specs, arrays = self._specs, [*state.weights, *(state.optimizer or [])]
            if state.optimizer is None and any(s.role == "optimizer" for s in specs):
                specs = [s for s in specs if s.role == "weight"]
        metadata = {"sparkdl.version": str(version)}
        if control is not None:
            metadata["sparkdl.control"] = json.dumps(control)
        return self._stream(specs, arrays, metadata)

    def _stream(self, specs, arrays, metadata) -> flight.RecordBatchStream:
        stream, nbytes = array_stream(specs, arrays, metadata, self.chunk_bytes)
        with self._lock:
            self._counts["pulls"] += 1
            self._counts["bytes_pulled"] += nbytes
        return stream

    def _serve_validation(self, raw: bytes):
        """The weights the driver posted for an epoch's validation in the workers' tasks."""
        posted = getattr(self.rule, "validation_weights", None)
        try:
            epoch = int(raw[len(VALIDATION_PREFIX):].decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            epoch = -1
        weights = posted(epoch) if posted is not None and epoch >= 0 else None
        if weights is None:
            raise flight.FlightServerError(f"ticket val:<epoch> must name the open validation's epoch of a round rule. Received: {raw[:40]!r}")
        return self._stream([s for s in self._specs if s.role == "weight"], list(weights), {"sparkdl.version": str(epoch)})

    def _serve_local(self, worker: str):
        """A worker's own state (residual, optimizer): the last it put, or the one a resumed fit
        restored; no arrays (version -1) when there is none."""
        local = self.local(worker)
        if local is None:
            return self._stream([], [], {"sparkdl.version": "-1"})
        specs, arrays = [], []
        for role, values in (("residual", local.residual), ("optimizer", local.optimizer)):
            for i, array in enumerate(values or []):
                array = np.asarray(array)
                specs.append(ArraySpec(f"{role}/{i}", tuple(array.shape), array.dtype, role))
                arrays.append(array)
        return self._stream(specs, arrays, {"sparkdl.version": str(local.version),
                                            "sparkdl.groups": json.dumps([local.residual is not None, local.optimizer is not None])})

    def _read_body(self, reader, received: Sequence[ArraySpec], counter: str = "bytes_pushed") -> list[np.ndarray]:
        try:
            arrays, _ = read_body(reader, received, self.max_message_bytes, count=lambda n: self._count(counter, n))
        except CodecError as exc:
            raise self._reject(f"{exc}; the master state is unchanged") from None
        return arrays

    def _handle_put(self, descriptor, reader, writer) -> None:
        self._count("pushes")
        try:
            meta = parse_push_descriptor(descriptor)
        except CodecError as exc:
            raise self._reject(str(exc)) from None
        if meta["nbytes"] > self.max_message_bytes:
            raise self._reject(f"push body must be at most max_message_bytes={self.max_message_bytes} bytes. "
                               f"Received: a declared body of {meta['nbytes']} bytes; nothing was read")
        # a worker id, attempt or seq out of the fit's bounds: refused before the body is read, nothing recorded
        self._check_worker("push", meta["worker"], meta["attempt"])
        out_of_range = self._ledger.refusal(meta["seq"])
        if out_of_range is not None:
            raise self._reject(f"push: {out_of_range}; nothing was read")
        try:
            received = specs_from_schema(reader.schema)
            if meta["kind"] == "update":
                check_encoded(self._specs, meta["encoding"], received)
        except CodecError as exc:
            raise self._reject(f"{exc}; the master state is unchanged") from None
        arrays = self._read_body(reader, received, "bytes_pushed" if meta["kind"] == "update" else "bytes_local")
        self._touch(meta["worker"], attempt=meta["attempt"])
        if meta["kind"] == "local":
            response = self._put_local(meta, received, arrays)
        else:
            try:
                update = decode_push(self._specs, received, arrays, meta["encoding"])
            except (CodecError, InvariantError) as exc:
                raise self._reject(f"{exc}; the master state is unchanged") from None
            response = self._apply(update, meta)
        writer.write(pa.py_buffer(json.dumps(response).encode()))

    def _put_local(self, meta: dict, received: Sequence[ArraySpec], arrays: Sequence[np.ndarray]) -> dict:
        """A worker's own state after slot ``seq`` (collected for a snapshot; kept for its retries)."""
        worker, attempt = meta["worker"], meta["attempt"]
        groups = {role: [a for s, a in zip(received, arrays, strict=True) if s.role == role] for role in ("residual", "optimizer")}
        local = WorkerLocal(meta["seq"] - 1, groups["residual"] or None, groups["optimizer"] or None)
        with self._lock:
            attempt_seen, _ = self._ledger.progress(worker)
            if attempt_seen is not None and attempt < attempt_seen:
                return {"applied": False, "dropped": "superseded_attempt"}
            self._local[worker] = local
            self._counts["local_puts"] += 1
        add = getattr(self.rule, "add_local", None)
        if add is not None:
            add(int(worker), local)
        return {"applied": True, "dropped": None}

    def _apply(self, update: ModelState, meta: dict) -> dict:
        worker, attempt, seq, base = meta["worker"], meta["attempt"], meta["seq"], meta["base_version"]
        with self._apply_lock or nullcontext():
            with self._lock:
                dropped = self._ledger.verdict(worker, attempt, seq)
                if dropped is not None:  # a superseded attempt, or a slot applied already (core.ledger)
                    self._counts["duplicates_dropped"] += 1
                    return {"applied": False, "dropped": dropped, "version": self._version, "staleness": None}
                late = getattr(self.rule, "is_late", None)
                if late is not None and late(meta):  # a straggler's push for a round already closed
                    self._ledger.reserve(worker, attempt, seq)
                    self._counts["late_dropped"] += 1
                    return {"applied": False, "dropped": "late", "version": self._version, "staleness": None}
                if base > self._version:
                    self._counts["rejected"] += 1
                    raise flight.FlightServerError(f"base_version must be <= the server version {self._version}. Received: {base}")
                previous = self._ledger.reserve(worker, attempt, seq)  # now, so a concurrent duplicate is dropped
                master, version = self._state, self._version
            staleness = version - base
            rule_meta = {**meta, "staleness": staleness, "version": version}
            try:
                new = self.rule(master, update, rule_meta)
                new = new if new is master else self._checked_result(new)
            except LatePush:  # the round closed while this push was on its way to the rule
                with self._lock:
                    self._counts["late_dropped"] += 1
                return {"applied": False, "dropped": "late", "version": version, "staleness": None}
            except Exception as exc:
                with self._lock:
                    self._ledger.release(worker, attempt, seq, previous)
                    self._counts["rejected"] += 1
                raise flight.FlightServerError(
                    f"update rule must return a ModelState of the master's signature without raising; the master state "
                    f"is unchanged (version {version}). Received: {type(exc).__name__}: {exc}"
                ) from None
            with self._cond:
                self._state = new
                self._version += 1
                self._counts["updates_applied"] += 1
                self._staleness[staleness] = self._staleness.get(staleness, 0) + 1
                clock = (meta.get("extra") or {}).get("clock")
                if isinstance(clock, int):
                    self._clocks.advance(worker, clock)
                new_version = self._version
                self._cond.notify_all()
        return {"applied": True, "dropped": None, "version": new_version, "staleness": staleness}

    def _checked_result(self, new) -> ModelState:
        if not isinstance(new, ModelState):
            raise TypeError(f"rule returned {type(new).__name__}, not ModelState")
        has_opt = any(s.role == "optimizer" for s in self._specs)
        if (new.optimizer is not None) != has_opt:
            raise ValueError(f"rule returned optimizer={'None' if new.optimizer is None else 'arrays'}, the master has {'arrays' if has_opt else 'None'}")
        arrays = [*new.weights, *(new.optimizer or [])]
        if len(arrays) != len(self._specs):
            raise ValueError(f"rule returned {len(arrays)} arrays, the master has {len(self._specs)}")
        for spec, a in zip(self._specs, arrays, strict=True):
            if not isinstance(a, np.ndarray) or a.shape != spec.shape or a.dtype != spec.dtype:
                got = f"shape {getattr(a, 'shape', None)} {getattr(a, 'dtype', type(a).__name__)} ({type(a).__name__})"
                raise ValueError(f"rule returned array {spec.name!r} of {got}, the master has {spec.describe()}")
        return split_arrays(self._specs, [np.asarray(a, order="C") for a in arrays])

    def _handle_action(self, kind: str, body: bytes):
        if kind == "version":
            return json_result({"version": self.version})
        if kind == "stats":
            return json_result(self.stats())
        if kind == "signature":
            return json_result({"arrays": [s.to_json() for s in self._specs]})
        if kind == "control":
            with self._lock:
                return json_result(dict(self._control))
        if kind == "wait_version":
            req = self._json_body(kind, body, ["version"])
            reached = self.wait_version(req["version"], req["timeout_s"])
            return json_result({"version": self.version, "reached": reached})
        if kind == "wait_round":
            req = self._json_body(kind, body, ["round"])
            wait_open = getattr(self.rule, "wait_open", None)
            if wait_open is None:
                raise self._reject(f"wait_round needs a round rule. Received: rule {type(self.rule).__name__}")
            if "worker" in req:
                self._touch(req["worker"])
            return json_result(wait_open(req["round"], req["timeout_s"], req.get("worker")))
        if kind in ("wait_validation", "validation"):
            return json_result(self._validation_action(kind, body))
        if kind == "heartbeat":
            req, superseded, recorded = self._heartbeat(body)
            if recorded and req.get("state") == "done":  # a finished worker no longer holds the others back
                with self._cond:
                    self._clocks.unregister(req["worker"])
                    self._cond.notify_all()
            with self._lock:
                return json_result({"version": self._version, "superseded": superseded, **self._control})
        if kind == "progress":
            req = self._json_body(kind, body, ["worker"])
            with self._lock:
                attempt, seq = self._ledger.progress(req["worker"])
            return json_result({"attempt": attempt, "seq": seq})
        if kind == "wait_clock":
            req = self._json_body(kind, body, ["worker", "bound"])
            self._touch(req["worker"])
            reached = self.wait_clock(req["worker"], req["bound"], req["timeout_s"])
            with self._lock:
                return json_result({"reached": reached, **self._control})
        raise self._reject("action must be one of version, stats, signature, control, wait_version, wait_round, heartbeat, "
                           f"progress, wait_clock, wait_validation, validation. Received: {kind[:64]!r}")

    def _validation_action(self, kind: str, body: bytes) -> dict:
        """A worker's wait for a validation to run (:meth:`~sparkdl.core.board.RoundBoard.wait_validation`),
        or its report of one (:meth:`~sparkdl.core.board.RoundBoard.report_validation`)."""
        if getattr(self.rule, "report_validation", None) is None:
            raise self._reject(f"{kind} needs a round rule. Received: rule {type(self.rule).__name__}")
        if kind == "wait_validation":
            req = self._json_body(kind, body, ["worker", "epoch"])
            self._touch(req["worker"])
            return self.rule.wait_validation(int(req["worker"]), req["epoch"], req["timeout_s"])
        req = self._json_body(kind, body, ["worker", "attempt", "epoch", "rows"])
        try:
            sums = decode_metric_sums(req["metrics"]) if req.get("metrics") is not None else None
        except (ValueError, TypeError) as exc:
            raise self._reject(f"validation metrics must be [[shape, values], ...]. Received: {type(exc).__name__}") from None
        self._touch(req["worker"], attempt=req["attempt"])
        return {"recorded": self.rule.report_validation(int(req["worker"]), req["epoch"], req["rows"], sums)}


