"""Arrow IPC codec for a list of named numpy arrays (model weights, optimizer state).

Wire format (version 1): one Arrow IPC stream holding one record batch of one row. Array
``i`` is the field ``"i"`` of type ``list<T>`` where ``T`` is the Arrow type of the array's
dtype; its single value holds the array's elements in C order. Field metadata keeps
``name`` (e.g. ``"sequential/dense/kernel"``), ``shape`` (JSON list, ``[]`` for 0-d arrays)
and ``dtype`` (numpy ``dtype.str``); schema metadata keeps ``sparkdl.format`` = ``"1"`` and
``sparkdl.kind`` = ``"arrays"``. Values travel as raw Arrow buffers, so round trips are
bit-exact for every numeric dtype. Nothing is pickled.

Spec: Arrow IPC streaming format, https://arrow.apache.org/docs/format/Columnar.html#ipc-streaming-format
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sparkdl.errors import CodecError

FORMAT_VERSION = "1"
_KIND = "arrays"


@dataclass(frozen=True)
class NamedArrays:
    """Decoded payload: parallel lists of names and arrays, in encoding order."""

    names: list[str]
    arrays: list[np.ndarray]


class EncodedArrays(list):
    """Arrays that are read-only views of one :func:`encode_arrays` payload (:func:`encoded_views`):
    a list of the arrays, with the ``payload`` bytes and the ``names`` they came from, so that a
    consumer that wants them encoded (``ModelSpec.with_weights``) takes the payload as it is."""

    payload: bytes
    names: list[str]


def encoded_views(payload: bytes) -> EncodedArrays:
    """The arrays of ``payload`` as read-only views of its memory (no copy), remembering the payload.

    Raises:
        CodecError: as :func:`decode_arrays`.
    """
    decoded = decode_arrays(payload, copy=False)
    out = EncodedArrays(decoded.arrays)
    out.payload, out.names = payload, list(decoded.names)
    return out


def encode_arrays(arrays: Sequence[np.ndarray], names: Sequence[str] | None = None) -> bytes:
    """Encode arrays as one Arrow IPC stream (:func:`encode_buffer`'s stream as ``bytes``).

    Args:
        arrays: numpy arrays of any shape (0-d included) and numeric or bool dtype.
        names: one name per array; defaults to ``"0"``, ``"1"``, ...

    Returns:
        The IPC stream bytes (a few hundred bytes of header plus the raw values).

    Raises:
        CodecError: as :func:`encode_buffer`.
    """
    return bytes(encode_buffer(arrays, names))


def encode_buffer(arrays: Sequence[np.ndarray], names: Sequence[str] | None = None) -> bytearray:
    """The stream of :func:`encode_arrays` written once, into a ``bytearray`` of exactly its size
    (memory Python owns, not Arrow's pool, which keeps freed memory). A caller that holds the only
    references to ``arrays`` can drop them before it takes ``bytes(...)`` of the result, so that a
    payload of B bytes never costs more than 2·B at once (encode_arrays: 3·B, the arrays included).

    Args:
        arrays: numpy arrays of any shape (0-d included) and numeric or bool dtype.
        names: one name per array; defaults to ``"0"``, ``"1"``, ...

    Returns:
        The IPC stream (a few hundred bytes of header plus the raw values), writable.

    Raises:
        CodecError: when names and arrays differ in length, or a dtype has no Arrow type
            (object, string, complex).
    """
    if names is None:
        names = [str(i) for i in range(len(arrays))]
    if len(names) != len(arrays):
        raise CodecError(f"names and arrays must have the same length. Received: {len(names)} names, {len(arrays)} arrays")
    fields, columns = [], []
    for i, (name, array) in enumerate(zip(names, arrays, strict=True)):
        array = np.asarray(array, order="C")  # keeps 0-d arrays 0-d, unlike ascontiguousarray
        try:
            value_type = pa.from_numpy_dtype(array.dtype)
        except (pa.ArrowNotImplementedError, NotImplementedError, TypeError) as exc:
            raise CodecError(f"array {name!r} must have a numeric or bool dtype. Received: {array.dtype}") from exc
        if array.dtype.kind not in "biuf":
            raise CodecError(f"array {name!r} must have a numeric or bool dtype. Received: {array.dtype}")
        values = pa.array(array.reshape(-1), type=value_type)  # numeric: a view of the array's memory
        columns.append(pa.LargeListArray.from_arrays(pa.array([0, len(values)], pa.int64()), values))
        meta = {"name": str(name), "shape": json.dumps(list(array.shape)), "dtype": array.dtype.str}
        fields.append(pa.field(str(i), pa.large_list(value_type), metadata=meta))
    schema = pa.schema(fields, metadata={"sparkdl.format": FORMAT_VERSION, "sparkdl.kind": _KIND})
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    # The stream is written once to measure it (nothing is kept), then into its buffer.
    mock = pa.MockOutputStream()
    with pa.ipc.new_stream(mock, schema) as writer:
        writer.write_batch(batch)
    out = bytearray(mock.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(pa.py_buffer(out)), schema) as writer:
        writer.write_batch(batch)
    return out


def decode_arrays(payload: bytes, copy: bool = True) -> NamedArrays:
    """Decode bytes written by :func:`encode_arrays`.

    Args:
        payload: the IPC stream bytes.
        copy: True returns writable copies; False returns read-only views of ``payload``'s memory
            (no copy; they keep ``payload`` alive), for values that are read once, e.g. loaded into
            a model.

    Returns:
        :class:`NamedArrays` with arrays of the encoded shapes and dtypes.

    Raises:
        CodecError: when the payload is not an Arrow IPC stream, has another format version,
            or a field's element count does not match its shape.
    """
    try:
        with pa.ipc.open_stream(pa.py_buffer(payload)) as reader:
            schema = reader.schema
            batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise CodecError(f"payload must be an Arrow IPC stream. Received {len(payload)} bytes: {exc}") from exc
    meta = schema.metadata or {}
    version = meta.get(b"sparkdl.format", b"").decode()
    if version != FORMAT_VERSION or meta.get(b"sparkdl.kind", b"").decode() != _KIND:
        raise CodecError(f"payload must be sparkdl arrays format {FORMAT_VERSION}. Received format {version!r}")
    if len(batches) != 1 or batches[0].num_rows != 1:
        raise CodecError(f"payload must hold one record batch of one row. Received {len(batches)} batches")
    batch = batches[0]
    names, arrays = [], []
    for field, column in zip(schema, batch.columns, strict=True):
        fmeta = field.metadata or {}
        try:
            shape = tuple(json.loads(fmeta[b"shape"]))
            dtype = np.dtype(fmeta[b"dtype"].decode())
            name = fmeta[b"name"].decode()
        except (KeyError, ValueError, TypeError) as exc:
            raise CodecError(f"field {field.name!r} must carry name, shape and dtype metadata") from exc
        values = column.values.to_numpy(zero_copy_only=False)
        if values.size != int(np.prod(shape, dtype=np.int64)):
            raise CodecError(f"field {name!r} must hold {int(np.prod(shape))} values for shape {shape}. Received {values.size}")
        arrays.append((np.array(values, dtype=dtype) if copy else values.astype(dtype, copy=False)).reshape(shape))
        names.append(name)
    return NamedArrays(names, arrays)
