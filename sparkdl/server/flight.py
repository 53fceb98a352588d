"""A driver-side parameter server on Arrow Flight (gRPC), for asynchronous training.

The server holds the master copy of a model (named numeric arrays: weights, and optimizer
arrays when present), a version counter (starts at 0, +1 per applied update) and a
caller-supplied update rule. Workers pull the state and push updates with
:class:`sparkdl.server.ParameterServerClient`.

Protocol (Arrow Flight RPCs; spec: https://arrow.apache.org/docs/format/Flight.html):

* ``DoGet`` with ticket ``b"state"``: the master arrays as a stream of record batches in the
  wire format below; schema metadata ``sparkdl.version`` holds the version (decimal). Ticket
  ``b"weights"``: the weight arrays alone, in the same format. Ticket ``b"state:<worker>"``
  (round rules): the state that worker starts the open round from (BMUF's W + η·Δ, a
  per-worker mode's own model), in the ``b"state"`` format.
* ``DoPut`` with a command descriptor holding a UTF-8 JSON object ``{"kind": "update",
  "worker": str, "attempt": int, "seq": int, "base_version": int, "rows": int, "nbytes": int}``
  and a body of record batches in the wire format (the update arrays). The server answers
  with one ``app_metadata`` message, a JSON object ``{"applied": bool, "dropped": null |
  "duplicate" | "superseded_attempt" | "late", "version": int, "staleness": int | null}``
  (``"late"``: a round rule's round closed before the push came).
  The descriptor may also hold ``"encoding"``: ``"fp16"`` (the float arrays as float16, cast
  back to the master's dtypes before the rule sees them) or ``"1bit"``/``"threshold"`` (one
  uint8 array ``payload``, a :func:`sparkdl.core.compression.quantize` payload, decoded into the
  weight differences before the rule; ``meta["encoding"]`` tells the rule), and ``"extra"``: a JSON object passed to the rule as
  ``meta["extra"]`` (e.g. a training backend's metric sums); ``extra["clock"]`` (int), when
  present, sets the worker's clock (see ``wait_clock``).
* ``DoAction``: ``"version"``, ``"stats"``, ``"signature"`` (empty body), ``"wait_round"`` (round
  rules; body ``{"round": int, "timeout_s": float}``: waits until that many rounds closed,
  closing a straggler-tolerant round whose deadline passed; ``{"round": int, "reached": bool}``),
  ``"wait_version"`` (body ``{"version": int, "timeout_s": float}``), ``"heartbeat"`` (body
  ``{"worker": str, "state": "alive" | "done" | "error", "message": str}``: records the
  worker's last contact, see :meth:`ParameterServer.contacts`; a done or failed worker leaves
  the clocks), ``"progress"`` (body ``{"worker": str}``: ``{"attempt": int | null, "seq": int |
  null}``, the worker's highest attempt and its last applied seq, so a retried task can skip
  the pushes already applied) and ``"wait_clock"`` (body ``{"worker": str, "bound": int,
  "timeout_s": float}``: waits until the worker is at most ``bound`` clocks ahead of the slowest
  worker still registered, Stale Synchronous Parallel; ``{"reached": bool}``); results are JSON.

Wire format of arrays: the field layout of :mod:`sparkdl.serialization.arrow_codec` (field
``"i"`` of type ``large_list<T>``, field metadata ``name``, ``shape``, ``dtype`` plus
``role`` = ``"weight"`` | ``"optimizer"``; schema metadata ``sparkdl.format`` = ``"1"``,
``sparkdl.kind`` = ``"arrays"``), sent as several one-row record batches: in each batch a
column holds the next contiguous slice (C order) of its array's values, or an empty list.
Batches carry at most ``chunk_bytes`` of values (default 8 MiB), so a receiver can stop
reading as soon as a size limit is passed. Values travel as raw Arrow buffers (zero-copy on
the sending side); nothing is pickled, and any body that is not Arrow IPC is rejected by
the IPC reader before a handler sees it.

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
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from sparkdl.core.state import ModelState
from sparkdl.errors import CodecError, ConfigError, InvariantError, ServerError
from sparkdl.serialization.arrow_codec import FORMAT_VERSION
from sparkdl.server.auth import BearerTokenMiddlewareFactory, new_token

STATE_TICKET = b"state"
WORKER_STATE_PREFIX = b"state:"  # + worker id: the state that worker starts its round from (round rules)
ENCODINGS = ("fp16", "1bit", "threshold")  # compressed pushes (sparkdl.core.compression)
WEIGHTS_TICKET = b"weights"  # the weights alone (asynchronous workers keep their own optimizer state)
DEFAULT_CHUNK_BYTES = 8 << 20
MAX_DESCRIPTOR_BYTES = 64 << 10
MAX_WAIT_S = 3600.0
SHUTDOWN_TIMEOUT_S = 30.0  # seconds shutdown waits for calls in progress
_KIND = "arrays"
_ROLES = ("weight", "optimizer")

UpdateRule = Callable[[ModelState, ModelState, Mapping], ModelState]
"""``rule(master, update, meta) -> new master``. ``update.weights`` (and ``update.optimizer``
when sent) match the server's signature; ``meta`` holds ``worker``, ``attempt``, ``seq``,
``base_version``, ``rows``, ``staleness`` and ``version`` (before this update). The rule must
return a :class:`ModelState` of the same signature; returning new arrays keeps the master
intact when the rule raises."""


# ---------------------------------------------------------------------------- wire format
@dataclass(frozen=True)
class ArraySpec:
    """Name, shape, dtype and role (``"weight"`` or ``"optimizer"``) of one array."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    role: str = "weight"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def describe(self) -> str:
        return f"shape {self.shape} {self.dtype}"

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype.str, "role": self.role}


def _arrow_type(dtype: np.dtype, name: str) -> pa.DataType:
    if dtype.kind not in "biuf":
        raise CodecError(f"array {name!r} must have a numeric or bool dtype. Received: {dtype}")
    try:
        return pa.from_numpy_dtype(dtype)
    except (pa.ArrowNotImplementedError, NotImplementedError, TypeError) as exc:
        raise CodecError(f"array {name!r} must have a numeric or bool dtype. Received: {dtype}") from exc


def specs_of(state: ModelState, names: Sequence[str] | None = None, optimizer_names: Sequence[str] | None = None) -> list[ArraySpec]:
    """The signature of ``state``: one :class:`ArraySpec` per weight, then per optimizer array.

    Raises:
        ConfigError: when a names list differs in length from its arrays, or names repeat.
        CodecError: on an array of a non-numeric dtype.
    """
    specs = []
    for role, arrays, given in (("weight", state.weights, names), ("optimizer", state.optimizer or [], optimizer_names)):
        if given is None:
            given = [f"{role}/{i}" for i in range(len(arrays))]
        if len(given) != len(arrays):
            raise ConfigError(f"{role} names must be one per array. Received: {len(given)} names for {len(arrays)} arrays")
        for name, array in zip(given, arrays, strict=True):
            array = np.asarray(array)
            _arrow_type(array.dtype, str(name))
            specs.append(ArraySpec(str(name), tuple(int(d) for d in array.shape), array.dtype, role))
    seen = [(s.role, s.name) for s in specs]
    if len(set(seen)) != len(seen):
        raise ConfigError(f"array names must be unique within weights and within optimizer arrays. Received: {[s.name for s in specs]}")
    return specs


def wire_schema(specs: Sequence[ArraySpec], metadata: Mapping[str, str] | None = None) -> pa.Schema:
    """The Arrow schema of the wire format for ``specs`` (see the module docstring)."""
    fields = []
    for i, spec in enumerate(specs):
        meta = {"name": spec.name, "shape": json.dumps(list(spec.shape)), "dtype": spec.dtype.str, "role": spec.role}
        fields.append(pa.field(str(i), pa.large_list(_arrow_type(spec.dtype, spec.name)), metadata=meta))
    schema_meta = {"sparkdl.format": FORMAT_VERSION, "sparkdl.kind": _KIND, **(metadata or {})}
    return pa.schema(fields, metadata=schema_meta)


def specs_from_schema(schema: pa.Schema) -> list[ArraySpec]:
    """Reads the signature a wire schema declares.

    Raises:
        CodecError: when the schema is not sparkdl arrays format 1, or a field lacks its
            metadata or has a value type other than its dtype's.
    """
    meta = schema.metadata or {}
    version = meta.get(b"sparkdl.format", b"").decode("utf-8", "replace")
    kind = meta.get(b"sparkdl.kind", b"").decode("utf-8", "replace")
    if version != FORMAT_VERSION or kind != _KIND:
        raise CodecError(f"body must be sparkdl arrays format {FORMAT_VERSION}. Received: format {version!r}, kind {kind!r}")
    specs = []
    for i, field in enumerate(schema):
        fmeta = field.metadata or {}
        try:
            name = fmeta[b"name"].decode()
            shape = tuple(int(d) for d in json.loads(fmeta[b"shape"]))
            dtype = np.dtype(fmeta[b"dtype"].decode())
            role = fmeta.get(b"role", b"weight").decode()
        except (KeyError, ValueError, TypeError, UnicodeDecodeError) as exc:
            raise CodecError(f"field {i} must carry name, shape and dtype metadata. Received: {dict(fmeta)!r:.200}") from exc
        if role not in _ROLES or any(d < 0 for d in shape):
            raise CodecError(f"field {name!r} must have role in {_ROLES} and a non-negative shape. Received: role {role!r}, shape {shape}")
        if field.type != pa.large_list(_arrow_type(dtype, name)):
            raise CodecError(f"field {name!r} must have type large_list<{_arrow_type(dtype, name)}> for dtype {dtype}. Received: {field.type}")
        specs.append(ArraySpec(name, shape, dtype, role))
    return specs


def _values_array(flat: np.ndarray, value_type: pa.DataType) -> pa.Array:
    if flat.dtype.kind == "b":
        return pa.array(flat, type=value_type)  # Arrow bools are bit-packed: one copy
    return pa.Array.from_buffers(value_type, len(flat), [None, pa.py_buffer(flat)])  # zero-copy


def iter_batches(schema: pa.Schema, arrays: Sequence[np.ndarray], chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[pa.RecordBatch]:
    """Splits ``arrays`` (C order, matching ``schema``) into one-row batches of at most
    ``chunk_bytes`` of values each (one array's element may exceed it on its own); at least
    one batch is yielded. The batches reference the arrays' memory (no copy, except bools)."""
    n = len(schema)
    value_types = [schema.field(i).type.value_type for i in range(n)]
    empty = [pa.LargeListArray.from_arrays(pa.array([0, 0], pa.int64()), pa.array([], t)) for t in value_types]
    flats = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    columns, room = list(empty), chunk_bytes
    pending = False
    for i, flat in enumerate(flats):
        pos, itemsize = 0, max(1, flat.dtype.itemsize)
        while pos < flat.size:
            take = min(flat.size - pos, max(1, room // itemsize))
            values = _values_array(flat[pos : pos + take], value_types[i])
            columns[i] = pa.LargeListArray.from_arrays(pa.array([0, take], pa.int64()), values)
            pos += take
            room -= take * itemsize
            pending = True
            if room <= 0:
                yield pa.RecordBatch.from_arrays(columns, schema=schema)
                columns, room, pending = list(empty), chunk_bytes, False
    if pending or n == 0 or all(f.size == 0 for f in flats):
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


class Assembler:
    """Fills preallocated arrays from wire batches; counts the bytes received.

    Raises (from :meth:`add` / :meth:`finish`):
        CodecError: a batch with other than one row, nulls, or more values than an array
            holds; from :meth:`finish`, an array that received fewer values than its shape.
    """

    def __init__(self, specs: Sequence[ArraySpec]) -> None:
        self.specs = list(specs)
        self.arrays = [np.empty(s.shape, s.dtype) for s in self.specs]
        self._flats = [a.reshape(-1) for a in self.arrays]
        self._pos = [0] * len(self.specs)
        self.nbytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows != 1 or batch.num_columns != len(self.specs):
            raise CodecError(f"each batch must hold one row and {len(self.specs)} columns. Received: {batch.num_rows} rows, {batch.num_columns} columns")
        for i, column in enumerate(batch.columns):
            if column.null_count:
                raise CodecError(f"array {self.specs[i].name!r} must not hold nulls. Received: a null list")
            values = column.flatten()
            n = len(values)
            if n == 0:
                continue
            if values.null_count:
                raise CodecError(f"array {self.specs[i].name!r} must not hold null values. Received: {values.null_count} nulls")
            pos, flat = self._pos[i], self._flats[i]
            if pos + n > flat.size:
                raise CodecError(f"array {self.specs[i].name!r} must hold {flat.size} values for {self.specs[i].describe()}. Received: at least {pos + n}")
            flat[pos : pos + n] = values.to_numpy(zero_copy_only=self.specs[i].dtype.kind != "b")
            self._pos[i] = pos + n

    def finish(self) -> list[np.ndarray]:
        for spec, pos in zip(self.specs, self._pos, strict=True):
            if pos != spec.size:
                raise CodecError(f"array {spec.name!r} must hold {spec.size} values for {spec.describe()}. Received: {pos}")
        return self.arrays


def check_signature(expected: Sequence[ArraySpec], received: Sequence[ArraySpec], what: str = "update") -> None:
    """Raises CodecError naming the first difference between two signatures."""
    if [s.role for s in received] != [s.role for s in expected][: len(received)] or len(received) > len(expected):
        raise CodecError(f"{what} must hold the {sum(s.role == 'weight' for s in expected)} weights, then optionally the "
                         f"{sum(s.role == 'optimizer' for s in expected)} optimizer arrays. Received: roles {[s.role for s in received]}")
    n_weights = sum(s.role == "weight" for s in expected)
    if len(received) not in (n_weights, len(expected)):
        raise CodecError(f"{what} must hold {n_weights} weight arrays (plus all {len(expected) - n_weights} optimizer arrays or none). Received: {len(received)} arrays")
    for e, r in zip(expected, received, strict=False):
        if (e.name, e.shape, e.dtype) != (r.name, r.shape, r.dtype):
            raise CodecError(f"{what} must hold array {e.name!r} of {e.describe()}. Received: array {r.name!r} of {r.describe()}")


def _check_encoded(specs: Sequence[ArraySpec], encoding: str | None, received: Sequence[ArraySpec]) -> None:
    """Raises CodecError unless a push of ``encoding`` has its signature: the master's (None); its
    float arrays as float16 (``"fp16"``); one 1-d uint8 array ``"payload"`` (``"1bit"``, ``"threshold"``)."""
    if encoding is None:
        check_signature(specs, received)
    elif encoding == "fp16":
        check_signature([ArraySpec(s.name, s.shape, np.dtype(np.float16) if s.dtype.kind == "f" else s.dtype, s.role) for s in specs], received)
    elif len(received) != 1 or received[0].name != "payload" or received[0].dtype != np.uint8 or len(received[0].shape) != 1:
        raise CodecError(f"a {encoding} push must hold one 1-d uint8 array 'payload'. Received: {[r.describe() for r in received]}")


def _decoded(specs: Sequence[ArraySpec], received: Sequence[ArraySpec], arrays: Sequence[np.ndarray], encoding: str | None) -> ModelState:
    """The update a rule receives: as sent (None); float16 values as the master's dtypes (fp16:
    still differences); the dequantized weight differences (1bit, threshold; no optimizer arrays)."""
    if encoding is None:
        return _split(received, arrays)
    if encoding == "fp16":
        dtypes = {s.name: s.dtype for s in specs}
        return _split(received, [a.astype(dtypes[r.name]) if a.dtype == np.float16 else a for r, a in zip(received, arrays, strict=True)])
    from sparkdl.core.compression import dequantize

    return ModelState(dequantize(arrays[0].tobytes(), [s for s in specs if s.role == "weight"]), None)


def _split(specs: Sequence[ArraySpec], arrays: Sequence[np.ndarray]) -> ModelState:
    weights = [a for s, a in zip(specs, arrays, strict=True) if s.role == "weight"]
    optimizer = [a for s, a in zip(specs, arrays, strict=True) if s.role == "optimizer"]
    return ModelState(weights, optimizer if any(s.role == "optimizer" for s in specs) else None)


def _int_field(meta: Mapping, key: str) -> int:
    value = meta.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= 2**63:
        raise CodecError(f"descriptor field {key!r} must be an integer >= 0. Received: {value!r:.100}")
    return value


def parse_push_descriptor(descriptor: flight.FlightDescriptor) -> dict:
    """Parses and checks a push descriptor (see the module docstring).

    Raises:
        CodecError: not a command descriptor, over 64 KiB, not UTF-8 JSON, or a field of the
            wrong type.
    """
    if descriptor.descriptor_type != flight.DescriptorType.CMD:
        raise CodecError("push descriptor must be a command (FlightDescriptor.for_command). Received: a path descriptor")
    command = descriptor.command or b""
    if len(command) > MAX_DESCRIPTOR_BYTES:
        raise CodecError(f"push descriptor must be at most {MAX_DESCRIPTOR_BYTES} bytes. Received: {len(command)} bytes")
    try:
        meta = json.loads(bytes(command).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CodecError(f"push descriptor must be a UTF-8 JSON object. Received: {len(command)} bytes starting {bytes(command[:16])!r}") from exc
    if not isinstance(meta, dict) or meta.get("kind", "update") != "update":
        raise CodecError(f"push descriptor must be a JSON object with kind 'update'. Received: {str(meta)[:100]!r}")
    worker = meta.get("worker")
    if isinstance(worker, int) and not isinstance(worker, bool):
        worker = str(worker)
    if not isinstance(worker, str) or not 0 < len(worker) <= 256:
        raise CodecError(f"descriptor field 'worker' must be a string of 1 to 256 characters. Received: {worker!r:.100}")
    out = {"worker": worker}
    for key in ("attempt", "seq", "base_version", "rows", "nbytes"):
        out[key] = _int_field(meta, key)
    encoding = meta.get("encoding")
    if encoding is not None and encoding not in ENCODINGS:
        raise CodecError(f"descriptor field 'encoding' must be null or one of {list(ENCODINGS)}. Received: {encoding!r:.100}")
    out["encoding"] = encoding
    extra = meta.get("extra")
    if extra is not None:
        if not isinstance(extra, dict):
            raise CodecError(f"descriptor field 'extra' must be a JSON object. Received: {type(extra).__name__}")
        out["extra"] = extra
    return out


def _json_result(obj) -> list[flight.Result]:
    return [flight.Result(json.dumps(obj).encode())]


# ---------------------------------------------------------------------------- the server
class _FlightService(flight.FlightServerBase):
    def __init__(self, owner: ParameterServer, location, **kwargs) -> None:
        super().__init__(location, **kwargs)
        self._owner = owner

    def do_get(self, context, ticket):
        return self._owner._handle_get(ticket)

    def do_put(self, context, descriptor, reader, writer):
        self._owner._handle_put(descriptor, reader, writer)

    def do_action(self, context, action):
        return self._owner._handle_action(action)

    def list_actions(self, context):
        return [
            ("version", "current version, JSON {\"version\": int}"),
            ("stats", "counters, JSON object (see ParameterServer.stats)"),
            ("signature", "names, shapes, dtypes and roles of the master arrays, JSON"),
            ("wait_version", "body {\"version\": int, \"timeout_s\": float}: wait until the version reaches it"),
            ("wait_round", "body {\"round\": int, \"timeout_s\": float}: wait until a round rule closed that many rounds"),
            ("heartbeat", "body {\"worker\": str, \"state\": \"alive\"|\"done\"|\"error\", \"message\": str}"),
            ("progress", "body {\"worker\": str}: the worker's highest attempt and last applied seq"),
            ("wait_clock", "body {\"worker\": str, \"bound\": int, \"timeout_s\": float}: SSP wait"),
        ]


class ParameterServer:
    """The master state of an asynchronous fit, served over Arrow Flight on the driver.

    Args:
        initial: the starting master state. The arrays are copied; the server owns its copy.
        rule: ``rule(master, update, meta) -> ModelState`` (see :data:`UpdateRule`), e.g. a
            rule of :mod:`sparkdl.core.async_rules`. It runs under the server's lock unless
            ``lock`` is False.
        names: one name per weight (e.g. ``"dense/kernel"``); default ``"weight/<i>"``.
        optimizer_names: one name per optimizer array; default ``"optimizer/<i>"``.
        token: the bearer token clients must send; default a fresh ``secrets.token_hex(32)``.
        host: interface to bind (default loopback ``"127.0.0.1"``; executors on other hosts
            need the driver's address, e.g. ``"0.0.0.0"`` together with TLS).
        port: TCP port; 0 picks a free one (see :attr:`port` after :meth:`start`).
        lock: apply updates one at a time under a lock (True), or concurrently without it
            (False: Hogwild, Recht et al. NIPS 2011; the dedupe bookkeeping and the version
            counter stay atomic, but with an out-of-place rule concurrent updates may
            overwrite each other and a raising in-place rule may leave a partial update).
            Default: ``getattr(rule, "lock", True)``.
        max_message_bytes: largest push body accepted, in bytes of Arrow buffers; default
            4 × the model's bytes (weights and optimizer) + 1 MiB. A push whose declared
            ``nbytes`` is larger is refused before its body is read; while reading, the
            server stops at the first batch that takes the running total past the limit, so
            it reads at most the limit plus one batch (the client sends batches of
            ``chunk_bytes``). pyarrow does not expose gRPC's ``grpc.max_receive_message_length``
            for servers (Flight sets it to unlimited), so one giant gRPC message from a
            hostile, authenticated client is still buffered whole by gRPC.
        chunk_bytes: bytes of values per record batch sent on pulls (default 8 MiB).
        tls_cert_path, tls_key_path: PEM certificate chain and private key; when given the
            server speaks ``grpc+tls`` and clients need the certificate (or its CA) as
            ``tls_root_cert``.

    Raises:
        ConfigError: on an argument out of range (port, sizes), a rule that is not callable,
            one TLS path without the other, or an unreadable TLS file.
        CodecError: on initial arrays of a non-numeric dtype.
        ServerError: from :meth:`start` when ``host:port`` cannot be bound.

    Use as a context manager: ``with ParameterServer(state, DownpourRule()) as server:``
    starts it (gRPC serves on its own C++ threads; no Python thread is started) and
    :meth:`shutdown` runs on exit, also on exceptions and KeyboardInterrupt.
    """

    def __init__(
        self,
        initial: ModelState,
        rule: UpdateRule,
        *,
        names: Sequence[str] | None = None,
        optimizer_names: Sequence[str] | None = None,
        token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        lock: bool | None = None,
        max_message_bytes: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        tls_cert_path: str | None = None,
        tls_key_path: str | None = None,
    ) -> None:
        if not callable(rule):
            raise ConfigError(f"rule must be callable as rule(master, update, meta). Received: {type(rule).__name__}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ConfigError(f"port must be an integer in [0, 65535] (0 picks a free port). Received: {port!r}")
        if not isinstance(host, str) or not host:
            raise ConfigError(f"host must be a non-empty string. Received: {host!r}")
        if not isinstance(chunk_bytes, int) or chunk_bytes < 1024:
            raise ConfigError(f"chunk_bytes must be an integer >= 1024 bytes. Received: {chunk_bytes!r}")
        if (tls_cert_path is None) != (tls_key_path is None):
            raise ConfigError("tls_cert_path and tls_key_path must be given together. Received: only one of them")
        self._specs = specs_of(initial, names, optimizer_names)
        arrays = [*initial.weights, *(initial.optimizer or [])]
        owned = [np.array(a, dtype=s.dtype, order="C", copy=True) for s, a in zip(self._specs, arrays, strict=True)]
        self._state = _split(self._specs, owned)
        model_bytes = sum(s.nbytes for s in self._specs)
        if max_message_bytes is None:
            max_message_bytes = 4 * model_bytes + (1 << 20)
        if not isinstance(max_message_bytes, int) or isinstance(max_message_bytes, bool) or max_message_bytes < 1:
            raise ConfigError(f"max_message_bytes must be a positive integer (bytes). Received: {max_message_bytes!r}")
        self._tls = None
        if tls_cert_path is not None:
            try:
                with open(tls_cert_path, "rb") as f:
                    cert = f.read()
                with open(tls_key_path, "rb") as f:
                    key = f.read()
            except OSError as exc:
                raise ConfigError(f"tls_cert_path and tls_key_path must be readable PEM files. Received: {exc}") from exc
            self._tls = [flight.CertKeyPair(cert, key)]
        self.rule = rule
        self.lock = bool(getattr(rule, "lock", True) if lock is None else lock)
        self.host = host
        self.max_message_bytes = max_message_bytes
        self.chunk_bytes = chunk_bytes
        self.token = token if token is not None else new_token()
        self._auth = BearerTokenMiddlewareFactory(self.token)
        self._requested_port = port
        self._port: int | None = None
        self._server: _FlightService | None = None
        self._closing = False
        self._lock = threading.Lock()  # bookkeeping: version, dedupe, stats, state reference
        self._cond = threading.Condition(self._lock)
        self._apply_lock = threading.Lock() if self.lock else None
        self._version = 0
        self._workers: dict[str, list[int]] = {}  # worker -> [highest attempt, last applied seq]
        self._counts = {"updates_applied": 0, "duplicates_dropped": 0, "rejected": 0, "pulls": 0, "pushes": 0,
                        "bytes_pushed": 0, "bytes_pulled": 0, "late_dropped": 0}
        self._staleness: dict[int, int] = {}
        self._contacts: dict[str, list] = {}  # worker -> [time.monotonic() of last contact, state, message]
        self._clocks: dict[str, int] = {}  # SSP clocks of the registered workers

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ParameterServer:
        """Binds ``host:port`` and starts serving (idempotent). Returns self.

        Raises:
            ServerError: the port is taken or the host is not a local address.
        """
        if self._server is not None:
            return self
        scheme = "tls" if self._tls else "tcp"
        location = f"grpc+{scheme}://{self._netloc(self._requested_port)}"
        kwargs = {"middleware": {"auth": self._auth}}
        if self._tls:
            kwargs["tls_certificates"] = self._tls
        try:
            server = _FlightService(self, location, **kwargs)
        except (pa.ArrowException, OSError) as exc:
            raise ServerError(
                f"parameter server must bind a free local address. Received: {self.host}:{self._requested_port} could not be "
                f"bound ({exc}); choose another serverPort, or 0 to pick a free port"
            ) from exc
        self._closing = False
        self._server = server
        self._port = server.port
        return self

    def shutdown(self) -> None:
        """Stops serving: wakes ``wait_version`` callers, waits for calls in progress, frees the port."""
        server, self._server = self._server, None
        if server is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        # gRPC's shutdown waits for calls in progress, and a client stalled mid-stream (a dead host,
        # no FIN) would hold it forever: wait at most SHUTDOWN_TIMEOUT_S, then leave it to finish alone.
        stopper = threading.Thread(target=lambda: (server.shutdown(), server.wait()), name="sparkdl-ps-shutdown", daemon=True)
        stopper.start()
        stopper.join(SHUTDOWN_TIMEOUT_S)

    def __enter__(self) -> ParameterServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def _netloc(self, port: int) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{port}"

    @property
    def port(self) -> int:
        if self._port is None:
            raise ServerError("parameter server must be started before its port is known. Received: a server not started")
        return self._port

    @property
    def location(self) -> str:
        """``grpc+tcp://host:port`` (``grpc+tls://`` with TLS), for :class:`ParameterServerClient`."""
        return f"grpc+{'tls' if self._tls else 'tcp'}://{self._netloc(self.port)}"

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
        (duplicate seqs and superseded attempts), ``rejected`` (bad descriptor, signature, size,
        base version or a raising rule), ``pushes``, ``pulls``, ``bytes_pushed`` / ``bytes_pulled``
        (Arrow buffer bytes of bodies read / sent), ``staleness_mean``, ``staleness_max`` (updates;
        0 when none applied), ``staleness_counts`` ({staleness: updates}) and ``unauthenticated``
        (calls refused for their token)."""
        with self._lock:
            out = dict(self._counts)
            n = sum(self._staleness.values())
            out["version"] = self._version
            out["staleness_mean"] = (sum(k * v for k, v in self._staleness.items()) / n) if n else 0.0
            out["staleness_max"] = max(self._staleness, default=0)
            out["staleness_counts"] = {str(k): v for k, v in sorted(self._staleness.items())}
        out["unauthenticated"] = self._auth.refused
        return out

    def wait_version(self, version: int, timeout_s: float) -> bool:
        """Blocks until the version is >= ``version`` or ``timeout_s`` seconds pass (or the
        server shuts down); returns whether the version was reached."""
        with self._cond:
            self._cond.wait_for(lambda: self._version >= version or self._closing, timeout=max(0.0, timeout_s))
            return self._version >= version

    def close_due_round(self) -> None:
        """Let a round rule close its open round when its deadline allows it (straggler-tolerant
        rounds: the minimum of pushes arrived and the deadline passed)."""
        close = getattr(self.rule, "close_if_due", None)
        if close is None:
            return
        with self._apply_lock or nullcontext():
            with self._lock:
                master = self._state
            new = close(master)
            if new is None:
                return
            new = self._checked_result(new)
            with self._cond:
                self._state = new
                self._cond.notify_all()

    def wait_round(self, round_: int, timeout_s: float) -> tuple[bool, int]:
        """Blocks until the round rule closed at least ``round_`` rounds (closing a due round on the
        way, every 50 ms) or ``timeout_s`` seconds pass (or the server shuts down); returns
        ``(reached, rounds closed)``.

        Raises:
            ServerError: the rule has no rounds.
        """
        if getattr(self.rule, "close_if_due", None) is None:
            raise ServerError(f"wait_round needs a round rule. Received: rule {type(self.rule).__name__}")
        until = time.monotonic() + max(0.0, timeout_s)
        while True:
            self.close_due_round()
            with self._cond:
                current = self.rule.round
                remaining = until - time.monotonic()
                if current >= round_ or self._closing or remaining <= 0:
                    return current >= round_, current
                self._cond.wait(min(remaining, 0.05))

    def contacts(self) -> dict[str, dict]:
        """Per worker: ``seconds`` since its last push or heartbeat, its ``state`` (``"alive"``,
        ``"done"``, ``"error"``) and the ``message`` it sent with it."""
        now = time.monotonic()
        with self._lock:
            return {w: {"seconds": now - t, "state": state, "message": message} for w, (t, state, message) in self._contacts.items()}

    def register_clocks(self, workers: Sequence[str]) -> None:
        """Registers ``workers`` (ids as they push them) at clock 0 for ``wait_clock``."""
        with self._cond:
            for worker in workers:
                self._clocks.setdefault(str(worker), 0)
            self._cond.notify_all()

    def clocks(self) -> dict[str, int]:
        with self._lock:
            return dict(self._clocks)

    def wait_clock(self, worker: str, bound: int, timeout_s: float) -> bool:
        """Blocks until ``worker`` is at most ``bound`` clocks ahead of the slowest registered
        worker (or ``timeout_s`` pass, or the server shuts down); returns whether it is."""

        def ready() -> bool:
            if worker not in self._clocks or not self._clocks:
                return True
            return self._clocks[worker] - min(self._clocks.values()) <= bound

        with self._cond:
            self._cond.wait_for(lambda: ready() or self._closing, timeout=max(0.0, timeout_s))
            return ready()

    def _touch(self, worker: str, state: str = "alive", message: str = "") -> None:
        with self._cond:
            self._contacts[worker] = [time.monotonic(), state, message]
            if state != "alive" and worker in self._clocks:
                self._clocks.pop(worker)
                self._cond.notify_all()

    # ------------------------------------------------------------------ handlers
    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def _handle_get(self, ticket: flight.Ticket):
        raw = bytes(ticket.ticket)
        if raw.startswith(WORKER_STATE_PREFIX):
            served = getattr(self.rule, "served", None)
            worker = raw[len(WORKER_STATE_PREFIX):].decode("utf-8", "replace")
            if served is None or not 0 < len(worker) <= 256:
                raise flight.FlightServerError(f"ticket {raw[:40]!r} needs a round rule serving each worker's start state and a worker id")
            with self._apply_lock or nullcontext():  # not while a push closes a round
                with self._lock:
                    version, master = self._version, self._state
                state = served(worker, master)
            raw = STATE_TICKET
        elif raw not in (STATE_TICKET, WEIGHTS_TICKET):
            raise flight.FlightServerError(f"ticket must be {STATE_TICKET!r}, {WEIGHTS_TICKET!r} or state:<worker>. Received: {raw[:32]!r}")
        else:
            with self._lock:
                version, state = self._version, self._state
        if raw == WEIGHTS_TICKET:
            specs, arrays = [s for s in self._specs if s.role == "weight"], list(state.weights)
        else:
            specs, arrays = self._specs, [*state.weights, *(state.optimizer or [])]
        schema = wire_schema(specs, {"sparkdl.version": str(version)})
        batches = list(iter_batches(schema, arrays, self.chunk_bytes))
        nbytes = sum(b.get_total_buffer_size() for b in batches)
        with self._lock:
            self._counts["pulls"] += 1
            self._counts["bytes_pulled"] += nbytes
        return flight.RecordBatchStream(pa.Table.from_batches(batches, schema))

    def _reject(self, message: str) -> flight.FlightServerError:
        self._count("rejected")
        return flight.FlightServerError(message)

    def _handle_put(self, descriptor, reader, writer) -> None:
        self._count("pushes")
        try:
            meta = parse_push_descriptor(descriptor)
        except CodecError as exc:
            raise self._reject(str(exc)) from None
        if meta["nbytes"] > self.max_message_bytes:
            raise self._reject(f"push body must be at most max_message_bytes={self.max_message_bytes} bytes. "
                               f"Received: a declared body of {meta['nbytes']} bytes; nothing was read")
        encoding = meta["encoding"]
        try:
            received = specs_from_schema(reader.schema)
            _check_encoded(self._specs, encoding, received)
        except CodecError as exc:
            raise self._reject(f"{exc}; the master state is unchanged") from None
        assembler = Assembler(received)
        total = 0
        try:
            while True:
                try:
                    batch = reader.read_chunk().data
                except StopIteration:
                    break
                if batch is None:
                    continue
                total += batch.get_total_buffer_size()
                if total > self.max_message_bytes:
                    raise CodecError(f"push body must be at most max_message_bytes={self.max_message_bytes} bytes. "
                                     f"Received: more than {total} bytes (stopped reading there)")
                assembler.add(batch)
            arrays = assembler.finish()
        except CodecError as exc:
            self._count("bytes_pushed", total)
            raise self._reject(f"{exc}; the master state is unchanged") from None
        except pa.ArrowException as exc:
            self._count("bytes_pushed", total)
            raise self._reject(f"push body must be Arrow IPC record batches. Received: {exc}; the master state is unchanged") from None
        self._count("bytes_pushed", total)
        self._touch(meta["worker"])
        try:
            update = _decoded(self._specs, received, arrays, encoding)
        except (CodecError, InvariantError) as exc:
            raise self._reject(f"{exc}; the master state is unchanged") from None
        response = self._apply(update, meta)
        writer.write(pa.py_buffer(json.dumps(response).encode()))

    def _apply(self, update: ModelState, meta: dict) -> dict:
        worker, attempt, seq, base = meta["worker"], meta["attempt"], meta["seq"], meta["base_version"]
        with self._apply_lock or nullcontext():
            with self._lock:
                mark = self._workers.get(worker)
                if mark is not None and attempt < mark[0]:
                    self._counts["duplicates_dropped"] += 1
                    return {"applied": False, "dropped": "superseded_attempt", "version": self._version, "staleness": None}
                if mark is not None and seq <= mark[1]:
                    # seq is the worker's deterministic slot index: whatever the attempt, a slot is
                    # applied once (a zombie of an older attempt and its retry cannot both apply it).
                    self._counts["duplicates_dropped"] += 1
                    return {"applied": False, "dropped": "duplicate", "version": self._version, "staleness": None}
                late = getattr(self.rule, "is_late", None)
                if late is not None and late(meta):  # a straggler's push for a round already closed
                    self._workers[worker] = [attempt, seq]
                    self._counts["late_dropped"] += 1
                    return {"applied": False, "dropped": "late", "version": self._version, "staleness": None}
                if base > self._version:
                    self._counts["rejected"] += 1
                    raise flight.FlightServerError(f"base_version must be <= the server version {self._version}. Received: {base}")
                previous = None if mark is None else list(mark)
                self._workers[worker] = [attempt, seq]  # reserved now, so a concurrent duplicate is dropped
                master, version = self._state, self._version
            staleness = version - base
            rule_meta = {**meta, "staleness": staleness, "version": version}
            try:
                new = self.rule(master, update, rule_meta)
                new = self._checked_result(new)
            except Exception as exc:
                with self._lock:
                    if self._workers.get(worker) == [attempt, seq]:
                        if previous is None:
                            self._workers.pop(worker)
                        else:
                            self._workers[worker] = previous
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
                if isinstance(clock, int) and worker in self._clocks:
                    self._clocks[worker] = max(self._clocks[worker], clock)
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
        return _split(self._specs, [np.asarray(a, order="C") for a in arrays])

    def _wait_request(self, kind: str, key: str, body: bytes) -> tuple[int, float]:
        """``(body[key], body["timeout_s"])`` of a wait action's JSON body; a rejection naming the form otherwise."""
        try:
            req = json.loads(body.decode("utf-8"))
            value = _int_field(req, key)
            timeout_s = float(req.get("timeout_s", 0.0))
            if not math.isfinite(timeout_s):
                raise ValueError(timeout_s)
        except (UnicodeDecodeError, ValueError, TypeError, AttributeError, CodecError) as exc:
            raise self._reject(f"{kind} body must be JSON {{\"{key}\": int, \"timeout_s\": float}}. "
                               f"Received: {len(body)} bytes starting {body[:16]!r} ({type(exc).__name__})") from None
        return value, timeout_s

    def _handle_action(self, action: flight.Action):
        kind = action.type
        body = action.body.to_pybytes() if action.body is not None else b""
        if kind == "version":
            return _json_result({"version": self.version})
        if kind == "stats":
            return _json_result(self.stats())
        if kind == "signature":
            return _json_result({"arrays": [s.to_json() for s in self._specs]})
        if kind == "wait_version":
            version, timeout_s = self._wait_request(kind, "version", body)
            reached = self.wait_version(version, min(timeout_s, MAX_WAIT_S))
            return _json_result({"version": self.version, "reached": reached})
        if kind == "wait_round":
            round_, timeout_s = self._wait_request(kind, "round", body)
            try:
                reached, current = self.wait_round(round_, min(timeout_s, MAX_WAIT_S))
            except ServerError as exc:
                raise self._reject(str(exc)) from None
            return _json_result({"round": current, "reached": reached})
        if kind in ("heartbeat", "progress", "wait_clock"):
            try:
                req = json.loads(body.decode("utf-8"))
                worker = req["worker"]
                worker = str(worker) if isinstance(worker, int) and not isinstance(worker, bool) else worker
                if not isinstance(worker, str) or not 0 < len(worker) <= 256:
                    raise ValueError(worker)
                if kind == "wait_clock":
                    bound = _int_field(req, "bound")
                    timeout_s = float(req.get("timeout_s", 0.0))
                    if not math.isfinite(timeout_s):
                        raise ValueError(timeout_s)
                state = req.get("state", "alive") if kind == "heartbeat" else "alive"
                if state not in ("alive", "done", "error"):
                    raise ValueError(state)
            except (UnicodeDecodeError, ValueError, TypeError, AttributeError, KeyError, CodecError) as exc:
                raise self._reject(f"{kind} body must be a JSON object with a 'worker' string (see the protocol). "
                                   f"Received: {len(body)} bytes starting {body[:16]!r} ({type(exc).__name__})") from None
            if kind == "heartbeat":
                self._touch(worker, state, str(req.get("message", ""))[:2000])
                return _json_result({"version": self.version})
            if kind == "progress":
                with self._lock:
                    mark = self._workers.get(worker)
                return _json_result({"attempt": None if mark is None else mark[0], "seq": None if mark is None else mark[1]})
            self._touch(worker)
            reached = self.wait_clock(worker, bound, min(timeout_s, MAX_WAIT_S))
            return _json_result({"reached": reached})
        raise self._reject(f"action must be one of version, stats, signature, wait_version, wait_round, heartbeat, progress, wait_clock. "
                           f"Received: {kind[:64]!r}")
