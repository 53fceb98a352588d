"""Arrow columns to numpy tensors, as read by training and inference tasks.

The Spark layer first casts every model column to a plain Arrow type: a scalar numeric column,
``array<T>`` (ml vectors are turned into arrays beforehand), ``array<array<T>>`` for a
variable-length sequence input, or ``binary`` for a column a user decoder turns into arrays.

A model input (or output) is a :class:`TensorSpec`: one or more :class:`ColumnSpec` whose values
are concatenated per row, in the given order, then reshaped to the tensor's per-row shape.
:class:`ModelColumns` is the whole mapping a task reads: the model's inputs and outputs, the
sample-weight column, Keras ``class_weight`` and the rule for invalid rows.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkdl.errors import ConfigError, SchemaError

PAD_VALUE = 0.0  # the default pad of a shorter sequence row (the padValue Param): Masking's mask_value, Embedding(mask_zero)'s id


@dataclass(frozen=True)
class ColumnSpec:
    """How a task reads one column.

    Attributes:
        name: the column's name in the task's DataFrame.
        shape: per-row shape of this column's values, e.g. ``(784,)``, ``()`` for a scalar; a
            sequence column ``(steps, k)`` holds rows of up to ``steps`` inner arrays of ``k`` values,
            a sequence column ``(steps,)`` rows of up to ``steps`` values (token ids).
        dtype: numpy dtype name of the result, e.g. ``"float32"``, ``"int64"``.
        source: the user's column name, for error messages.
        decoder: the function, or its name ``"module:function"``, that turns one row's bytes into an array of
            exactly ``shape`` (binary columns); see :func:`resolve_decoder`.
        ragged: a sequence column (``array<T>`` of shape ``(steps,)``, ``array<array<T>>`` of shape
            ``(steps, k)``) whose rows are padded after their values with ``pad`` to ``shape[0]`` steps.
        pad: the value that pads a sequence row (the ``padValue`` Param).
    """

    name: str
    shape: tuple
    dtype: str
    source: str
    decoder: str | Callable | None = None
    ragged: bool = False
    pad: float = PAD_VALUE


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output and the columns that fill it.

    Attributes:
        name: the model input's (output's) name.
        shape: per-row shape, e.g. ``(28, 28, 1)``.
        dtype: numpy dtype name, e.g. ``"float32"``; integer ids stay integers.
        columns: the columns whose values, concatenated in order, fill ``prod(shape)`` per row.
    """

    name: str
    shape: tuple
    dtype: str
    columns: tuple[ColumnSpec, ...]

    @property
    def source(self) -> str:
        """The user's column name(s), for messages."""
        return ", ".join(c.source for c in self.columns)


@dataclass(frozen=True)
class ModelColumns:
    """Every column a training task reads, and how.

    Attributes:
        inputs: one :class:`TensorSpec` per model input, in the model's input order.
        outputs: one :class:`TensorSpec` per model output (the labels), in output order.
        weight: the sample-weight column (float32, shape ``()``), or None.
        class_weight: Keras ``class_weight`` ({class index: weight}) as ``((index, weight), ...)``, or None.
        skip_invalid: drop rows with a null, NaN or ±inf value in any model column, or another
            number of values than the model input's (``handleInvalid="skip"``); else such rows are
            an error found by the check job.
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    weight: ColumnSpec | None = None
    class_weight: tuple | None = None
    skip_invalid: bool = False

    @property
    def input_pads(self) -> tuple:
        """Per model input, in input order: the value that pads a sequence input's rows, None for
        any other input (what :meth:`sparkdl.keras.replica.Replica.train` trims each batch by)."""
        return tuple(t.columns[0].pad if t.columns[0].ragged else None for t in self.inputs)

    @property
    def all_columns(self) -> list[ColumnSpec]:
        cols = [c for t in (*self.inputs, *self.outputs) for c in t.columns]
        return cols + ([self.weight] if self.weight is not None else [])


@dataclass
class PartitionArrays:
    """A partition as numpy: ``x`` one array per model input ``(rows, *shape)``, ``y`` one per output,
    ``w`` the sample weights ``(rows,)`` float32 or None. Arrays may be read from files by row (``sparkdl.spark.partitions.FileArray``)."""

    x: list
    y: list
    w: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.x[0]) if self.x else 0

    @property
    def arrays(self) -> list[np.ndarray]:
        return [*self.x, *self.y] + ([self.w] if self.w is not None else [])

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray], inputs: int, outputs: int) -> PartitionArrays:
        """Split the flat list of :attr:`arrays` back into x, y and w."""
        arrays = list(arrays)
        return cls(arrays[:inputs], arrays[inputs : inputs + outputs], arrays[inputs + outputs] if len(arrays) > inputs + outputs else None)

    @staticmethod
    def empty(columns: ModelColumns) -> PartitionArrays:
        return PartitionArrays(
            [np.zeros((0, *t.shape), t.dtype) for t in columns.inputs],
            [np.zeros((0, *t.shape), t.dtype) for t in columns.outputs],
            np.zeros(0, np.float32) if columns.weight is not None else None,
        )


def _list_like(data_type) -> bool:
    return pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_fixed_size_list(data_type)


def invalid_rows(column: pa.Array) -> np.ndarray:
    """Per row: True where the row is null, holds a null element, or a NaN or ±inf value.

    Args:
        column: a scalar, list or list-of-lists column (binary columns: only nulls count).

    Returns:
        bool array of shape ``(rows,)``.
    """
    n = len(column)
    bad = np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool) if column.null_count else np.zeros(n, bool)
    values, parents = column, np.arange(n)
    while _list_like(values.type):
        if values is not column and values.null_count:  # a null inner array (a sequence's null step)
            null_entries = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
            bad[np.unique(parents[null_entries])] = True
        lengths = pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False)
        parents = np.repeat(parents, lengths)
        values = values.flatten()
    if len(values) == 0 or not (pa.types.is_floating(values.type) or values.null_count):
        return bad
    element_bad = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool) if values.null_count else np.zeros(len(values), bool)
    if pa.types.is_floating(values.type):
        finite = pc.is_finite(values).to_numpy(zero_copy_only=False)
        element_bad |= ~np.asarray(finite, dtype=bool) if values.null_count == 0 else ~np.nan_to_num(np.asarray(finite, dtype=float), nan=0).astype(bool)
    if element_bad.any():
        bad[np.unique(parents[element_bad])] = True
    return bad


@dataclass
class RowFaults:
    """Per row of an Arrow column (or a model input), what keeps it from being scored; each a bool
    array of shape ``(rows,)``.

    Attributes:
        null: the row is null.
        null_element: the row holds a null element (or a null step of a sequence).
        nan: the row holds a NaN.
        inf: the row holds +inf or -inf.
        size: the row holds another number of values than the model input takes (or a sequence
            step of another width).
    """

    null: np.ndarray
    null_element: np.ndarray
    nan: np.ndarray
    inf: np.ndarray
    size: np.ndarray

    @classmethod
    def none(cls, rows: int) -> RowFaults:
        return cls(*(np.zeros(rows, bool) for _ in range(5)))

    @property
    def any(self) -> np.ndarray:
        """Rows with any fault."""
        return self.null | self.null_element | self.nan | self.inf | self.size

    def __or__(self, other: RowFaults) -> RowFaults:
        return RowFaults(self.null | other.null, self.null_element | other.null_element, self.nan | other.nan,
                         self.inf | other.inf, self.size | other.size)

    def describe(self) -> str:
        """The counts as a message says them, e.g. ``"1 null rows, 2 rows with NaN"``."""
        counts = [(self.null, "null rows"), (self.null_element, "rows with null elements"), (self.size, "wrongly sized rows"),
                  (self.nan, "rows with NaN"), (self.inf, "rows with ±inf")]
        return ", ".join(f"{int(mask.sum())} {what}" for mask, what in counts if mask.any())


def _rows_of(elements: np.ndarray, levels: list[np.ndarray]) -> np.ndarray:
    """The row index of each flattened element index, through each list level's per-row lengths."""
    for lengths in reversed(levels):
        elements = np.searchsorted(np.cumsum(lengths), elements, side="right")
    return elements


def row_faults(column: pa.Array, size: int | None = None, width: int | None = None) -> RowFaults:
    """Per row of ``column``, what keeps it from being scored: nulls, null elements, NaN, ±inf and
    wrong sizes, each counted apart (:class:`RowFaults`). Element-level work is done in Arrow
    compute; only the faulty elements are mapped back to their rows.

    Args:
        column: a scalar, list or list-of-lists column (binary columns: only nulls count; a
            decoder's output is checked after decoding).
        size: values per row the model input takes (a list column's row length), or None for no
            length rule (a sequence, or a column assembled with others).
        width: values per step of a sequence column (``array<array<T>>``), or None.

    Returns:
        :class:`RowFaults` of ``len(column)`` rows.
    """
    n = len(column)
    faults = RowFaults.none(n)
    if column.null_count:
        faults.null |= np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    values, levels = column, []
    while _list_like(values.type):
        lengths = pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False)
        if values is not column and values.null_count:  # a null inner array (a sequence's null step)
            faults.null_element[_rows_of(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False)), levels)] = True
        if not levels and size is not None:
            faults.size |= (lengths != size) & ~faults.null
        elif len(levels) == 1 and width is not None:
            wrong = (lengths != width) & ~np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
            faults.size[_rows_of(np.flatnonzero(wrong), levels)] = True
        levels.append(lengths)
        values = values.flatten()
    if not levels and size not in (None, 1):  # a scalar column holds one value per row
        faults.size |= ~faults.null
    if len(values) == 0:
        return faults
    if levels and values.null_count:
        faults.null_element[_rows_of(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False)), levels)] = True
    if pa.types.is_floating(values.type) and not pc.all(pc.fill_null(pc.is_finite(values), True)).as_py():  # one pass when all are finite
        for mask, test in ((faults.nan, pc.is_nan), (faults.inf, pc.is_inf)):
            hits = np.flatnonzero(np.asarray(pc.fill_null(test(values), False).to_numpy(zero_copy_only=False), dtype=bool))
            if hits.size:
                mask[_rows_of(hits, levels)] = True  # a scalar column's elements are its rows
    return faults


def array_faults(values: np.ndarray) -> RowFaults:
    """Per row of a numeric array ``(rows, ...)`` (e.g. a decoder's output): NaN and ±inf rows."""
    rows = len(values)
    faults = RowFaults.none(rows)
    if values.dtype.kind == "f" and rows:
        flat = values.reshape(rows, -1)
        faults.nan = np.isnan(flat).any(axis=1)
        faults.inf = np.isinf(flat).any(axis=1)
    return faults


_decoders: dict[str, Callable] = {}

BY_VALUE_MODULE = "__main__"  # a script's or a notebook's module: no executor can import a function from it


def decoder_name(decoder: str | Callable) -> str:
    """A decoder as messages and saves name it: a name as given (``"pkg.images:decode_png"``), a
    function as ``"module:qualname"`` (``"__main__:decode"`` for one defined in a script or notebook)."""
    if isinstance(decoder, str):
        return decoder
    module = getattr(decoder, "__module__", None) or BY_VALUE_MODULE
    return f"{module}:{getattr(decoder, '__qualname__', None) or type(decoder).__name__}"


def split_decoder_name(name: str) -> tuple[str, str]:
    """``(module, attribute)`` of ``"module:function"`` or ``"module.function"`` (as the job config's
    ``model.factory``), or ``("", "")`` for a name of neither form."""
    module, sep, attribute = name.partition(":")
    if not sep:
        module, _, attribute = name.rpartition(".")
    return (module, attribute) if module and attribute else ("", "")


def resolve_decoder(decoder: str | Callable, column: str | None = None) -> Callable:
    """The decoder function itself: a callable as it is; a name ``"package.module:function"`` (or
    ``"package.module.function"``) imported once per process, except ``"__main__:function"``, looked
    up in this process's ``__main__`` every time (a notebook may redefine it).

    Runs on the driver (checked before any job) and in every task that decodes the column, so a
    module the driver imports but the executors do not (a local folder on the driver's
    ``sys.path``) fails in the task, naming the module, how to ship it and the Python that ran.
    A function given itself travels with the tasks as Keras custom objects do
    (:mod:`sparkdl.keras.custom_objects`): by reference when its module is importable, by value
    when it is defined in ``__main__`` (a spark-submit script, a notebook); a ``"__main__:f"``
    name is resolved on the driver, and the function travels the same way.

    Args:
        decoder: a name or a callable.
        column: the binary column it decodes, for messages.

    Raises:
        ConfigError: when the name is not ``module:function``; when the module (or one it imports)
            cannot be imported in this Python: its one line names the module, the ways to ship it
            (``--py-files``, ``SparkContext.addPyFile``, a wheel on the cluster) and this Python's
            ``sys.executable`` and host; when the module has no such callable (for ``__main__``:
            how to pass the function itself).
    """
    if callable(decoder) and not isinstance(decoder, str):
        return decoder
    name = decoder
    if name in _decoders:
        return _decoders[name]
    module_name, attribute = split_decoder_name(name) if isinstance(name, str) else ("", "")
    if not module_name:
        raise ConfigError(f"a decoder must be a function or named 'module:function' (or 'module.function'). Received: {name!r}")
    try:
        function = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(_import_message(name, getattr(exc, "name", None) or module_name, exc)) from exc
    try:
        for part in attribute.split("."):
            function = getattr(function, part)
    except AttributeError as exc:
        if module_name == BY_VALUE_MODULE:
            where = f"column {column!r}" if column else "its column"
            raise ConfigError(
                f"decoder {name!r} names a function of __main__ (a script or notebook) that this process does not define: "
                f"define it here and pass the function itself, decoders={{{column or 'column'!r}: {attribute.split('.')[-1]}}} "
                f"(setDecoders on a loaded model), for {where}. Received: {exc}"
            ) from exc
        raise ConfigError(f"decoder {name!r} must be an importable callable: a function of module {module_name!r}. Received: {exc}") from exc
    if not callable(function):
        raise ConfigError(f"decoder {name!r} must be callable. Received: {type(function).__name__}")
    if module_name != BY_VALUE_MODULE:
        _decoders[name] = function
    return function


def shipped_decoder(decoder: str | Callable, column: str | None = None) -> str | Callable:
    """What a task carries for ``decoder``, resolved on the driver: a name of an importable module
    as it is (each executor imports it), the function itself for a callable or a ``"__main__:f"``
    name (it travels by value, as a custom object of ``__main__`` does).

    Raises:
        ConfigError: as :func:`resolve_decoder`.
    """
    function = resolve_decoder(decoder, column)
    if isinstance(decoder, str) and split_decoder_name(decoder)[0] != BY_VALUE_MODULE:
        return decoder
    return function


def _import_message(decoder: str, module: str, exc: ImportError) -> str:
    """One line: the module a decoder needs, how to ship it to the executors, and this Python."""
    import socket
    import sys

    return (
        f"decoder {decoder!r} must be an importable callable on the driver and every executor: module {module!r} cannot be "
        f"imported by this Python ({sys.executable}, Python {sys.version.split()[0]}, host {socket.gethostname()}); ship "
        f"your own code with spark-submit --py-files, SparkContext.addPyFile(path) or a wheel installed on the cluster (a "
        f"package: pip install it there). Received: {type(exc).__name__}: {exc}"
    )


def _decode(column: pa.Array, spec: ColumnSpec) -> np.ndarray:
    decode, name = resolve_decoder(spec.decoder, spec.source), decoder_name(spec.decoder)
    shape = tuple(spec.shape)
    out = np.empty((len(column), *shape), dtype=spec.dtype)
    for i, value in enumerate(column.to_pylist()):
        if value is None:
            raise SchemaError(f"column {spec.source!r} must have no null values. Received a null row")
        try:
            array = np.asarray(decode(value))
        except Exception as exc:
            raise SchemaError(f"decoder {name!r} failed on a row of column {spec.source!r}: {type(exc).__name__}: {exc}") from exc
        # The exact shape, not just as many values: a channels-first (3, 4, 4) image reshaped to
        # (4, 4, 3) would train on scrambled pixels without a word.
        if array.shape != shape:
            raise SchemaError(
                f"decoder {name!r} must turn each row of column {spec.source!r} into an array of the model "
                f"input's shape {shape}. Received: an array of shape {array.shape}"
            )
        if array.dtype.kind not in "biuf":
            raise SchemaError(f"decoder {name!r} must return numbers. Received: dtype {array.dtype} for column {spec.source!r}")
        out[i] = array
    return out


def _ragged(column: pa.Array, spec: ColumnSpec) -> np.ndarray:
    """Sequence rows padded after their values with ``spec.pad`` to ``shape[0]`` steps: ``array<T>``
    rows of up to ``steps`` values (shape ``(steps,)``), or ``array<array<T>>`` rows of up to
    ``steps`` steps of ``shape[1]`` values (shape ``(steps, k)``), as
    ``keras.utils.pad_sequences(rows, maxlen=steps, padding="post", value=pad)``."""
    steps = spec.shape[0]
    out = np.full((len(column), *spec.shape), spec.pad, dtype=spec.dtype)
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
    if len(lengths) and lengths.max() > steps:
        raise SchemaError(f"column {spec.source!r} must hold at most {steps} steps per row. Received a row of {int(lengths.max())}")
    rows = np.repeat(np.arange(len(column)), lengths)
    positions = np.arange(len(rows)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    if len(spec.shape) == 1:  # token ids: one value per step
        values = column.flatten().to_numpy(zero_copy_only=False) if len(rows) else np.zeros(0)
        out[rows, positions] = values
        return out
    width = spec.shape[1]
    inner = column.flatten()
    inner_lengths = pc.list_value_length(inner).to_numpy(zero_copy_only=False) if len(inner) else np.zeros(0, np.int64)
    if len(inner_lengths) and (inner_lengths != width).any():
        raise SchemaError(f"column {spec.source!r} must hold {width} values per step. Received a step of {int(inner_lengths[inner_lengths != width][0])}")
    values = inner.flatten().to_numpy(zero_copy_only=False).reshape(-1, width) if len(inner) else np.zeros((0, width))
    out[rows, positions] = values
    return out


def column_to_numpy(column: pa.Array | pa.ChunkedArray, name: str, shape: Sequence[int], dtype, spec: ColumnSpec | None = None) -> np.ndarray:
    """Convert one Arrow column of n rows into an array of shape ``(n, *shape)``.

    Args:
        column: a numeric column (then ``shape`` is ``()`` or ``(1,)``), a list column whose
            rows all hold ``prod(shape)`` values, or (per ``spec``) a sequence or binary column.
        name: the DataFrame column's name, for error messages.
        shape: per-row shape, e.g. ``(28, 28, 1)``; ``()`` for a scalar per row.
        dtype: numpy dtype of the result, e.g. ``np.float32``.
        spec: the column's :class:`ColumnSpec` when it is decoded or a padded sequence.

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
        if spec is not None and spec.decoder:
            out[row : row + rows] = _decode(chunk, spec)
        elif spec is not None and spec.ragged:
            out[row : row + rows] = _ragged(chunk, spec)
        else:
            out[row : row + rows] = _chunk_to_numpy(chunk, name, shape).reshape((rows, *shape))
        row += rows
    return out


def _chunk_to_numpy(column: pa.Array, name: str, shape: Sequence[int]) -> np.ndarray:
    size = int(np.prod(shape, dtype=np.int64))
    n = len(column)
    if _list_like(column.type):
        lengths = column.value_lengths().to_numpy(zero_copy_only=False) if n else np.zeros(0, np.int64)
        bad = np.flatnonzero(lengths != size)
        if bad.size:
            raise SchemaError(
                f"column {name!r} must hold {size} values per row to fill the model input of shape "
                f"{tuple(shape)}: change the column, or the model's keras.Input(shape=...) when the data is right. "
                f"Received a row of {int(lengths[bad[0]])} values"
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


def tensor_to_numpy(table: pa.Table | pa.RecordBatch, tensor: TensorSpec) -> np.ndarray:
    """One model input (output) of ``table``'s rows: its columns' values concatenated per row, in
    order, and reshaped to ``(rows, *tensor.shape)`` of ``tensor.dtype``.

    Raises:
        SchemaError: a null, a wrongly sized row, or a decoder's wrong output (the column is named).
    """
    if len(tensor.columns) == 1:
        c = tensor.columns[0]
        return column_to_numpy(table.column(c.name), c.source, tensor.shape, tensor.dtype, c)
    parts = [column_to_numpy(table.column(c.name), c.source, c.shape, tensor.dtype, c).reshape(table.num_rows, -1) for c in tensor.columns]
    return np.concatenate(parts, axis=1).reshape((table.num_rows, *tensor.shape))


def valid_mask(table: pa.Table | pa.RecordBatch, columns: ModelColumns) -> np.ndarray | None:
    """Rows with no null, NaN or ±inf in any model column and the model input's number of values in
    each (:func:`fixed_width_columns`), or None when ``columns.skip_invalid`` is off."""
    if not columns.skip_invalid:
        return None
    bad = np.zeros(table.num_rows, bool)
    widths = fixed_width_columns(columns)
    for c in columns.all_columns:
        column = table.column(c.name)
        for offset, chunk in _chunks_with_offsets(column):
            bad[offset : offset + len(chunk)] |= invalid_rows(chunk)
            if c.name in widths:
                bad[offset : offset + len(chunk)] |= wrong_width_rows(chunk, widths[c.name])
    return ~bad


def wrong_width_rows(column: pa.Array, width: int) -> np.ndarray:
    """Per row: True where a list row holds other than ``width`` values (a null row is not counted
    here: :func:`invalid_rows` counts it); all False for a column that is not a list.

    Args:
        column: one column of a batch.
        width: the values each row must hold (the model input's size).

    Returns:
        bool array of shape ``(rows,)``.
    """
    if not _list_like(column.type):
        return np.zeros(len(column), bool)
    lengths = pc.fill_null(pc.list_value_length(column), width).to_numpy(zero_copy_only=False)
    return np.asarray(lengths != width, dtype=bool)


def fixed_width_columns(columns: ModelColumns) -> dict[str, int]:
    """Column name -> the values each of its rows must hold, for every model input fed by one plain
    column (not a sequence, decoded or assembled one): the rows of another width that
    ``handleInvalid="skip"`` drops (the check job counts them with the same rule)."""
    out = {}
    for tensor in columns.inputs:
        if len(tensor.columns) == 1 and not tensor.columns[0].ragged and not tensor.columns[0].decoder:
            out[tensor.columns[0].name] = int(np.prod(tensor.shape, dtype=np.int64))
    return out


def _chunks_with_offsets(column):
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    offset = 0
    for chunk in chunks:
        yield offset, chunk
        offset += len(chunk)


def table_to_arrays(table: pa.Table | pa.RecordBatch, columns: ModelColumns) -> PartitionArrays:
    """Every model column of ``table`` as numpy (invalid rows dropped first with ``skip_invalid``)."""
    mask = valid_mask(table, columns)
    if mask is not None and not mask.all():
        table = table.filter(pa.array(mask))
    return PartitionArrays(
        [tensor_to_numpy(table, t) for t in columns.inputs],
        [tensor_to_numpy(table, t) for t in columns.outputs],
        column_to_numpy(table.column(columns.weight.name), columns.weight.source, (), np.float32) if columns.weight is not None else None,
    )


def class_weights_to_sample_weights(y: np.ndarray, class_weight: Sequence[tuple[int, float]]) -> np.ndarray:
    """Per-row weights from Keras ``class_weight``, as ``keras.Model.fit`` derives them: the class of
    a row is ``argmax(y)`` for one-hot labels (last axis > 1), else ``round(y)``; a row whose class
    is not in ``class_weight`` weighs 1.0, whatever its value: a loss's ``ignore_class`` (-1, 255)
    included, as in Keras (the loss masks those rows out: their weight changes only weighted
    metrics, where Keras counts them with 1.0).

    Args:
        y: labels ``(rows,)``, ``(rows, 1)`` or ``(rows, classes)``.
        class_weight: ``(class index, weight)`` pairs.

    Returns:
        float32 array of shape ``(rows,)``.
    """
    y = np.asarray(y)
    classes = np.argmax(y, axis=-1) if y.ndim > 1 and y.shape[-1] > 1 else np.round(y.reshape(len(y))).astype(np.int64)
    weights = np.ones(len(classes), np.float32)
    for k, v in class_weight:  # by value, never by position: -1 is not the last class
        weights[classes == int(k)] = v
    return weights
