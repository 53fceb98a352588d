"""Arrow columns to numpy tensors, as read by training and inference tasks.

The Spark layer first casts every model column to a plain Arrow type: a scalar numeric
column, or ``array<T>`` of fixed length (ml vectors are turned into arrays beforehand).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from sparkdl.errors import SchemaError


def column_to_numpy(column: pa.Array | pa.ChunkedArray, name: str, shape: Sequence[int], dtype) -> np.ndarray:
    """Convert one Arrow column of n rows into an array of shape ``(n, *shape)``.

    Args:
        column: a numeric column (then ``shape`` is ``()`` or ``(1,)``) or a list column whose
            rows all hold ``prod(shape)`` values.
        name: the DataFrame column's name, for error messages.
        shape: per-row shape, e.g. ``(28, 28, 1)``; ``()`` for a scalar per row.
        dtype: numpy dtype of the result, e.g. ``np.float32``.

    Returns:
        A C-contiguous array of shape ``(n, *shape)`` and dtype ``dtype``.

    Raises:
        SchemaError: when the column has nulls or a row's length differs from ``prod(shape)``.
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    n = sum(len(chunk) for chunk in chunks)
    nulls = sum(chunk.null_count for chunk in chunks)
    if nulls:
        raise SchemaError(f"column {name!r} must have no null values. Received {nulls} null rows of {n}")
    # Chunk by chunk into one preallocated array: Arrow lists have int32 offsets, so concatenating
    # the chunks of a partition of more than 2**31 values would fail; numpy has no such cap.
    out = np.empty((n, *shape), dtype=dtype)
    row = 0
    for chunk in chunks:
        rows = len(chunk)
        out[row : row + rows] = _chunk_to_numpy(chunk, name, shape).reshape((rows, *shape))
        row += rows
    return out


def _chunk_to_numpy(column: pa.Array, name: str, shape: Sequence[int]) -> np.ndarray:
    size = int(np.prod(shape, dtype=np.int64))
    n = len(column)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or pa.types.is_fixed_size_list(column.type):
        lengths = column.value_lengths().to_numpy(zero_copy_only=False) if n else np.zeros(0, np.int64)
        bad = np.flatnonzero(lengths != size)
        if bad.size:
            raise SchemaError(
                f"column {name!r} must hold {size} values per row to fill the model input of shape "
                f"{tuple(shape)}. Received a row of {int(lengths[bad[0]])} values"
            )
        values = column.flatten()
        if values.null_count:
            raise SchemaError(f"column {name!r} must have no null elements. Received {values.null_count}")
        return values.to_numpy(zero_copy_only=False)
    if size != 1:
        raise SchemaError(
            f"column {name!r} must be an array of {size} values for the model input of shape "
            f"{tuple(shape)}. Received a scalar column of type {column.type}"
        )
    return column.to_numpy(zero_copy_only=False)
