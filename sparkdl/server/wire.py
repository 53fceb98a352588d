"""The parameter server's wire format: tickets, push descriptors and arrays as Arrow record batches.

Wire format of arrays: the field layout of :mod:`sparkdl.serialization.arrow_codec` (field
``"i"`` of type ``large_list<T>``, field metadata ``name``, ``shape``, ``dtype`` plus
``role`` = ``"weight"`` | ``"optimizer"`` | ``"residual"``; schema metadata ``sparkdl.format`` = ``"1"``,
``sparkdl.kind`` = ``"arrays"``), sent as several one-row record batches: in each batch a
column holds the next contiguous slice (C order) of its array's values, or an empty list.
Batches carry at most ``chunk_bytes`` of values (default 8 MiB), so a receiver can stop
reading as soon as a size limit is passed. Values travel as raw Arrow buffers (zero-copy on
the sending side); nothing is pickled, and any body that is not Arrow IPC is rejected by
the IPC reader before a handler sees it.

Push descriptors are UTF-8 JSON objects (:func:`parse_push_descriptor`); the protocol's calls
are described in :mod:`sparkdl.server.flight`. Used by the server (:mod:`sparkdl.server.flight`)
and its client (:mod:`sparkdl.server.client`) alike; no server or client here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from sparkdl.core.state import ModelState
from sparkdl.errors import CodecError, ConfigError
from sparkdl.serialization.arrow_codec import FORMAT_VERSION

STATE_TICKET = b"state"
WORKER_STATE_PREFIX = b"state:"  # + worker id: the state that worker starts its round from (round rules)
ENCODINGS = ("fp16", "1bit", "threshold")  # compressed pushes (sparkdl.core.compression)
WEIGHTS_TICKET = b"weights"  # the weights alone (asynchronous workers keep their own optimizer state)
VALIDATION_PREFIX = b"val:"  # + epoch: the weights posted for that epoch's validation in the workers' tasks (round rules)
LOCAL_PREFIX = b"local:"  # + worker id: the own state that worker had after its last applied slot (residual, optimizer)
DEFAULT_CHUNK_BYTES = 8 << 20
MAX_DESCRIPTOR_BYTES = 64 << 10
KIND = "arrays"
ROLES = ("weight", "optimizer", "residual", "mode")  # residual: a worker's own state ('local' puts); mode: a slice's mode state


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
    schema_meta = {"sparkdl.format": FORMAT_VERSION, "sparkdl.kind": KIND, **(metadata or {})}
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
    if version != FORMAT_VERSION or kind != KIND:
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
        if role not in ROLES or any(d < 0 for d in shape):
            raise CodecError(f"field {name!r} must have role in {ROLES} and a non-negative shape. Received: role {role!r}, shape {shape}")
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

    def __init__(self, specs: Sequence[ArraySpec], out: Sequence[np.ndarray] | None = None) -> None:
        self.specs = list(specs)
        if out is not None:  # the caller's arrays (e.g. views of a whole state): filled in place, no second copy
            if len(out) != len(self.specs) or any(o.size != s.size or o.dtype != s.dtype for o, s in zip(out, self.specs, strict=True)):
                raise CodecError(f"a stream must hold {len(out)} arrays of the sizes and dtypes asked for. Received: "
                                 f"{[(s.size, s.dtype.str) for s in self.specs][:6]}")
            self.arrays = [o.reshape(s.shape) for o, s in zip(out, self.specs, strict=True)]
        else:
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


def array_stream(specs: Sequence[ArraySpec], arrays: Sequence[np.ndarray], metadata: Mapping[str, str],
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> tuple[flight.RecordBatchStream, int]:
    """A ``DoGet`` answer holding ``arrays`` in the wire format (no copy), and its Arrow buffer bytes."""
    schema = wire_schema(specs, metadata)
    batches = list(iter_batches(schema, arrays, chunk_bytes))
    nbytes = sum(b.get_total_buffer_size() for b in batches)
    return flight.RecordBatchStream(pa.Table.from_batches(batches, schema)), nbytes


def read_body(reader, received: Sequence[ArraySpec], max_bytes: int, count=None) -> tuple[list[np.ndarray], int]:
    """A ``DoPut`` body's arrays of signature ``received``, and its Arrow buffer bytes; reading stops
    at the first batch that takes the total past ``max_bytes``. ``count(nbytes)``, when given, is
    called with the bytes read, also when reading fails.

    Raises:
        CodecError: a body over ``max_bytes``, not of ``received``'s arrays, or not Arrow IPC.
    """
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
            if total > max_bytes:
                raise CodecError(f"push body must be at most max_message_bytes={max_bytes} bytes. "
                                 f"Received: more than {total} bytes (stopped reading there)")
            assembler.add(batch)
        return assembler.finish(), total
    except pa.ArrowException as exc:
        raise CodecError(f"push body must be Arrow IPC record batches. Received: {exc}") from None
    finally:
        if count is not None:
            count(total)


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


def check_encoded(specs: Sequence[ArraySpec], encoding: str | None, received: Sequence[ArraySpec]) -> None:
    """Raises CodecError unless a push of ``encoding`` has its signature: the master's (None); its
    float arrays as float16 (``"fp16"``); one 1-d uint8 array ``"payload"`` (``"1bit"``, ``"threshold"``)."""
    if encoding is None:
        check_signature(specs, received)
    elif encoding == "fp16":
        check_signature([ArraySpec(s.name, s.shape, np.dtype(np.float16) if s.dtype.kind == "f" else s.dtype, s.role) for s in specs], received)
    elif len(received) != 1 or received[0].name != "payload" or received[0].dtype != np.uint8 or len(received[0].shape) != 1:
        raise CodecError(f"a {encoding} push must hold one 1-d uint8 array 'payload'. Received: {[r.describe() for r in received]}")


def decode_push(specs: Sequence[ArraySpec], received: Sequence[ArraySpec], arrays: Sequence[np.ndarray], encoding: str | None) -> ModelState:
    """The update a rule receives: as sent (None); float16 values as the master's dtypes (fp16:
    still differences); the dequantized weight differences (1bit, threshold; no optimizer arrays)."""
    if encoding is None:
        return split_arrays(received, arrays)
    if encoding == "fp16":
        dtypes = {s.name: s.dtype for s in specs}
        return split_arrays(received, [a.astype(dtypes[r.name]) if a.dtype == np.float16 else a for r, a in zip(received, arrays, strict=True)])
    from sparkdl.core.compression import dequantize

    return ModelState(dequantize(arrays[0].tobytes(), [s for s in specs if s.role == "weight"]), None)


def split_arrays(specs: Sequence[ArraySpec], arrays: Sequence[np.ndarray]) -> ModelState:
    weights = [a for s, a in zip(specs, arrays, strict=True) if s.role == "weight"]
    optimizer = [a for s, a in zip(specs, arrays, strict=True) if s.role == "optimizer"]
    return ModelState(weights, optimizer if any(s.role == "optimizer" for s in specs) else None)


def int_field(meta: Mapping, key: str) -> int:
    value = meta.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= 2**63:
        raise CodecError(f"descriptor field {key!r} must be an integer >= 0. Received: {value!r:.100}")
    return value


def parse_push_descriptor(descriptor: flight.FlightDescriptor) -> dict:
    """Parses and checks a push descriptor: ``{"kind": "update", "worker", "attempt", "seq",
    "base_version", "rows", "nbytes", "encoding"?, "extra"?}``, or ``{"kind": "local", "worker",
    "attempt", "seq", "nbytes"}`` (a worker's own state after slot ``seq``: residual and optimizer
    arrays). ``worker`` is a string (an integer is taken as its decimal string).

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
    kind = meta.get("kind", "update") if isinstance(meta, dict) else None
    if kind not in ("update", "local"):
        raise CodecError(f"push descriptor must be a JSON object with kind 'update' or 'local'. Received: {str(meta)[:100]!r}")
    worker = meta.get("worker")
    if isinstance(worker, int) and not isinstance(worker, bool):
        worker = str(worker)
    if not isinstance(worker, str) or not 0 < len(worker) <= 256:
        raise CodecError(f"descriptor field 'worker' must be a string of 1 to 256 characters. Received: {worker!r:.100}")
    out = {"kind": kind, "worker": worker}
    for key in ("attempt", "seq", "nbytes") + (("base_version", "rows") if kind == "update" else ()):
        out[key] = int_field(meta, key)
    if kind == "local":
        return out
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
