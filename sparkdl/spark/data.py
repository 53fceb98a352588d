"""DataFrame checks and column preparation on the driver, before any training job.

A model input is filled from one column or several (``featuresCols``), each a numeric scalar,
``array<numeric>`` or an ml/mllib vector (dense or sparse), cast to ``array<T>`` of the input's
dtype (integer ids stay integers) so tasks read plain Arrow lists; or from one ``binary`` column
and a decoder; or, for a sequence input, from one column of rows of any length: ``array<numeric>``
(token ids) for an input ``(None,)``, ``array<array<numeric>>`` for an input ``(None, k)``, padded
after each row with the ``padValue`` Param to the longest row (each batch is then cut to its own).
Label columns (one per model output) may be a numeric scalar or an array/vector of numbers.

Everything the schema can tell is checked without a job (:func:`request_columns`); what only the
data can tell (nulls, NaN, lengths, label ranges, decoded shapes) is counted by one job over the
cached data (:func:`prepare_training_data`), before any training job.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import RDD
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from sparkdl.errors import ConfigError, InvariantError, SchemaError, did_you_mean
from sparkdl.serialization.columns import (ColumnSpec, ModelColumns, TensorSpec, column_to_numpy, invalid_rows, shipped_decoder,
                                           wrong_width_rows)
from sparkdl.spark.partitions import VALIDATION_FLAG

SPARK_TYPES = {
    "float16": T.FloatType(),
    "float32": T.FloatType(),
    "float64": T.DoubleType(),
    "int32": T.IntegerType(),
    "int64": T.LongType(),
    "int16": T.IntegerType(),
    "uint8": T.IntegerType(),
    "bool": T.FloatType(),
}


@dataclass(frozen=True)
class PreparedData:
    """A DataFrame as tasks see it: the model columns only, one partition per worker, cached.

    Attributes:
        df: persisted DataFrame of the model columns (features cast to ``array<T>``).
        partition_rows: rows of each partition, by partition id (valid rows, with ``skip``), counted
            by a job over ``df`` itself: ``len(partition_rows)`` is the number of partitions (workers).
        columns: how tasks read the columns (model inputs, outputs, weights).
        skipped: rows dropped as invalid (``handleInvalid="skip"``).
        label_ranges: per model output, ``(lowest, highest, values not whole)`` of its labels as
            the check job counted them (a loss's ``ignore_class`` left out), or None without any.
        role: ``"train"`` or ``"val"`` when ``df`` holds a fit's training and validation rows
            together (partition p of both in partition p; :func:`prepare_with_validation`), None
            when it holds these rows only.
    """

    df: DataFrame
    partition_rows: tuple[int, ...]
    columns: ModelColumns
    skipped: int = 0
    label_ranges: tuple = ()
    role: str | None = None

    @property
    def rows_df(self) -> DataFrame:
        """``df`` with this data's rows only: a fit's training and validation rows share one cached
        DataFrame (:func:`prepare_with_validation`), told apart by :data:`VALIDATION_FLAG`; its
        filter keeps the partitioning (no shuffle)."""
        if self.role is None:
            return self.df
        return self.df.where(col(VALIDATION_FLAG) if self.role == "val" else ~col(VALIDATION_FLAG))

    @property
    def total_rows(self) -> int:
        return sum(self.partition_rows)

    @property
    def empty_workers(self) -> int:
        """Partitions (workers) with no rows to train on."""
        return sum(1 for n in self.partition_rows if n == 0)

    def zero_one_labels(self) -> list[int]:
        """The outputs (indices) whose labels are all 0 or 1, both present: a classifier's labels."""
        return [i for i, found in enumerate(self.label_ranges)
                if found is not None and found[0] == 0 and found[1] == 1 and found[2] == 0]


FEATURES, LABEL, WEIGHT = "features", "label", "__sparkdl_weight"  # column names inside the prepared DataFrame


def col(name: str) -> Column:
    """A column by its exact name, dots and spaces included (backtick-quoted)."""
    return F.col("`" + name.replace("`", "``") + "`")


def _is_vector(data_type) -> bool:
    from pyspark.ml.linalg import VectorUDT  # on the driver only: pyspark.ml would cost each Python worker's start
    from pyspark.mllib.linalg import VectorUDT as MLlibVectorUDT

    return isinstance(data_type, (VectorUDT, MLlibVectorUDT))


def _is_numeric_array(data_type) -> bool:
    return isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, (T.NumericType, T.BooleanType))


def check_dataframe(dataset, who: str) -> None:
    """Refuse anything but a Spark DataFrame (classic or Spark Connect), before anything else: a
    pandas DataFrame, a numpy array, a path.

    Args:
        dataset: what was passed.
        who: the method, for the message (``"KerasEstimator.fit"``).

    Raises:
        ConfigError: naming the way to a Spark DataFrame for what was received
            (``spark.createDataFrame(pandas_df)`` for a pandas DataFrame).
    """
    if isinstance(dataset, DataFrame):
        return
    kind = type(dataset)
    received = f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__
    root = kind.__module__.split(".")[0]
    if root == "pyspark" and hasattr(dataset, "to_spark"):  # pandas-on-Spark
        how = "turn a pandas-on-Spark DataFrame into one with psdf.to_spark()"
    elif root == "pandas":
        how = "make one from a pandas DataFrame with spark.createDataFrame(pandas_df)"
    elif root == "polars":
        how = "make one from a polars DataFrame with spark.createDataFrame(polars_df.to_pandas())"
    elif isinstance(dataset, str):
        how = "read the file into one first, e.g. spark.read.parquet(path)"
    elif isinstance(dataset, RDD):
        how = ("make one from an RDD with spark.createDataFrame(rdd, schema), e.g. for (x, y) numpy pairs as Elephas "
               "takes them: spark.createDataFrame(rdd.map(lambda p: (p[0].tolist(), float(p[1]))), "
               "\"features array<double>, label double\")")
    else:
        how = ("make one with spark.createDataFrame(rows) (a pandas DataFrame, or a list of tuples or Rows, with a "
               "schema) or read one with spark.read")
    raise ConfigError(f"{who} needs a Spark DataFrame (pyspark.sql.DataFrame): {how}. Received: {received}")


def _field(df: DataFrame, name: str, role: str) -> T.StructField:
    if name not in df.columns:
        raise SchemaError(f"{role} column {name!r} must exist in the DataFrame.{did_you_mean(name, df.columns)} "
                          f"Received columns: {df.columns}")
    return df.schema[name]


def check_feature_column(df: DataFrame, name: str) -> None:
    """Check, without a Spark job, that ``name`` exists and is numeric, a numeric array or a vector.

    Raises:
        SchemaError: naming the column, the rule and the type found.
    """
    data_type = _field(df, name, "features").dataType
    if not (isinstance(data_type, (T.NumericType, T.BooleanType)) or _is_numeric_array(data_type) or _is_vector(data_type)):
        raise SchemaError(
            f"features column {name!r} must be numeric, array<numeric> or a Spark ML vector. "
            f"Received: {data_type.simpleString()}"
        )


def check_label_column(df: DataFrame, name: str) -> None:
    """Check, without a Spark job, that the label column exists and holds numbers.

    Raises:
        SchemaError: naming the column, the rule and the type found (strings: index them first).
    """
    data_type = _field(df, name, "label").dataType
    if isinstance(data_type, T.StringType):
        raise SchemaError(
            f"label column {name!r} must be numeric; index string labels first with "
            f"pyspark.ml.feature.StringIndexer. Received: string"
        )
    if not (isinstance(data_type, (T.NumericType, T.BooleanType)) or _is_numeric_array(data_type) or _is_vector(data_type)):
        raise SchemaError(f"label column {name!r} must be numeric, array<numeric> or a vector. Received: {data_type.simpleString()}")


def as_array(df: DataFrame, name: str, dtype: str) -> Column:
    """Column expression: ``name`` as ``array<T>`` with T the Spark type of numpy ``dtype``."""
    data_type = df.schema[name].dataType
    element = SPARK_TYPES.get(dtype, T.FloatType())
    if _is_vector(data_type):
        from pyspark.ml.functions import vector_to_array

        return vector_to_array(col(name), "float64" if dtype == "float64" else "float32").cast(T.ArrayType(element))
    if isinstance(data_type, T.ArrayType):
        return col(name).cast(T.ArrayType(element))
    # A null scalar stays a null row (``F.array`` alone would make it ``[null]``, a row with a null element).
    return F.when(col(name).isNull(), F.lit(None).cast(T.ArrayType(element))).otherwise(F.array(col(name).cast(element)))




_INTEGER_TYPES = (T.IntegerType, T.LongType, T.ShortType, T.ByteType)


def _is_nested_array(data_type) -> bool:
    return isinstance(data_type, T.ArrayType) and _is_numeric_array(data_type.elementType)


@dataclass(frozen=True)
class ColumnRequest:
    """The fit's columns as far as the schema tells, checked without a job.

    Attributes:
        inputs: per model input ``(input name, per-row shape, dtype, source columns)``.
        outputs: per model output ``(output name, per-row shape, label column)``.
        weight: the sample-weight column, or None.
        class_weight: Keras ``class_weight`` as ``((index, weight), ...)``, or None.
        decoders: binary column -> its decoder as tasks carry it: a name ``"module:function"`` of an
            importable module, or the function itself (:func:`~sparkdl.serialization.columns.shipped_decoder`).
        skip_invalid: ``handleInvalid="skip"``.
        pad_value: the value that pads sequence inputs' rows (``padValue``).
        custom_modules: the modules of the fit's registered custom objects (those defined in
            ``__main__`` travel by value): each check task imports them, as the training tasks will
            when they unpickle the objects, and reports a module it cannot import.
    """

    inputs: tuple
    outputs: tuple
    weight: str | None = None
    class_weight: tuple | None = None
    decoders: tuple = ()
    skip_invalid: bool = False
    pad_value: float = 0.0
    custom_modules: tuple = ()

    @property
    def source_columns(self) -> list[str]:
        names = [c for _, _, _, cols in self.inputs for c in cols] + [c for _, _, c in self.outputs]
        return names + ([self.weight] if self.weight else [])

    def label_specs(self, df: DataFrame, loss) -> list[tuple[tuple, str]]:
        """Per output, the label's per-row shape and dtype as tasks will read them, from the schema:
        for the driver's dry run of the loss and metrics before any job. ``int64`` for an integer
        column, else ``float32``; ``()`` for a scalar column, ``(1,)`` for an array under a sparse
        loss, the output's shape for another array or vector."""
        specs = []
        for (_, shape, name), info in zip(self.outputs, self.output_losses(loss), strict=True):
            data_type = df.schema[name].dataType
            dtype = "int64" if isinstance(data_type, _INTEGER_TYPES) else "float32"
            if isinstance(data_type, (T.NumericType, T.BooleanType)):
                specs.append(((), dtype))
            else:
                specs.append((((1,) if info.expects_class_index else tuple(shape)), dtype))
        return specs

    def output_losses(self, loss) -> list:
        """Each output's :class:`~sparkdl.keras.losses.LossInfo`, in output order: ``loss`` holds one
        per output (:meth:`~sparkdl.keras.spec.CompileSpec.output_losses`).

        Raises:
            InvariantError: another count than one per output.
        """
        if len(loss) != len(self.outputs):
            raise InvariantError(f"the data checks need one loss per model output ({len(self.outputs)}). Received: {len(loss)}")
        return list(loss)

    def known_label_shapes(self, df: DataFrame) -> list[tuple | None]:
        """Per output, the label's per-row shape where ``df``'s schema tells it without a job: ``()``
        for a scalar column, ``(width,)`` for an ML vector whose metadata records its width
        (``OneHotEncoder``, ``VectorAssembler``); None where only the rows tell (arrays)."""
        shapes = []
        for _, _, name in self.outputs:
            data_type = df.schema[name].dataType
            width = _vector_width(df, name)
            shapes.append(() if isinstance(data_type, (T.NumericType, T.BooleanType)) else (width,) if width is not None else None)
        return shapes


def _vector_width(df: DataFrame, name: str) -> int | None:
    """The width of an ML vector column as Spark ML's attribute metadata records it
    (``ml_attr.num_attrs``, written by ``OneHotEncoder`` and ``VectorAssembler``), or None."""
    if not _is_vector(df.schema[name].dataType):
        return None
    attributes = (df.schema[name].metadata or {}).get("ml_attr") or {}
    width = attributes.get("num_attrs")
    return int(width) if isinstance(width, int) and width > 0 else None


def map_inputs(df: DataFrame, spec, features_col: str, features_cols, decoders: dict) -> list[tuple]:
    """The model's inputs mapped to ``df``'s columns, each column's type checked, without a job.

    Returns:
        per model input ``(input name, per-row shape, dtype, source columns)``, in input order.

    Raises:
        SchemaError: see :func:`request_columns`.
        ConfigError: a decoder that cannot be imported.
    """
    from sparkdl.serialization.columns import resolve_decoder

    model_inputs = spec.input_specs
    if features_cols is None:
        features_cols = [features_col]
    if isinstance(features_cols, dict):
        names = [name for name, _, _ in model_inputs]
        unknown = sorted(set(features_cols) - set(names))
        missing = [n for n in names if n not in features_cols]
        if unknown or missing:
            raise SchemaError(
                f"featuresCols must map every model input by name: the model's inputs are {names}. Received: "
                + (f"no column for {missing}" if missing else "") + ("; " if missing and unknown else "")
                + (f"unknown inputs {unknown}" if unknown else "")
            )
        mapping = [(name, shape, dtype, (features_cols[name],) if isinstance(features_cols[name], str) else tuple(features_cols[name]))
                   for name, shape, dtype in model_inputs]
    else:
        if len(model_inputs) != 1:
            raise SchemaError(
                f"a model with {len(model_inputs)} inputs {[n for n, _, _ in model_inputs]} needs featuresCols as a dict "
                f"input name -> column(s). Received: {features_cols!r}"
            )
        name, shape, dtype = model_inputs[0]
        mapping = [(name, shape, dtype, tuple(features_cols))]
    for name, shape, dtype, cols in mapping:
        for c in cols:
            data_type = _field(df, c, "features").dataType
            if isinstance(data_type, T.BinaryType):
                if c not in decoders:
                    raise SchemaError(
                        f"features column {c!r} is binary: give a decoder that turns each row's bytes into an array of the "
                        f"input's shape {tuple(shape)}, decoders={{{c!r}: a_function}} or {{{c!r}: 'module:function'}}. Received: "
                        "binary without a decoder"
                    )
                resolve_decoder(decoders[c], c)
                if len(cols) != 1 or any(d is None for d in shape):
                    raise SchemaError(f"a decoded column must fill its input alone, of a fixed shape. Received: {list(cols)} for input {name!r} {shape}")
            elif len(shape) == 1 and shape[0] is None:
                if len(cols) != 1 or not _is_numeric_array(data_type):
                    raise SchemaError(
                        f"model input {name!r} of shape {shape} (a sequence of ids) must be filled by one array<numeric> column "
                        f"of any length per row (padded with padValue). Received: {[df.schema[x].dataType.simpleString() for x in cols]}"
                    )
            elif shape and shape[0] is None:
                if len(cols) != 1 or not _is_nested_array(data_type):
                    raise SchemaError(
                        f"model input {name!r} of shape {shape} (a sequence) must be filled by one array<array<numeric>> column, "
                        f"one inner array of {shape[1]} values per step. Received: {[df.schema[x].dataType.simpleString() for x in cols]}"
                    )
            elif _is_nested_array(data_type):
                raise SchemaError(
                    f"features column {c!r} is an array of arrays, which fills a sequence input of shape (None, k); model input "
                    f"{name!r} has shape {tuple(shape)}. Received: {data_type.simpleString()}"
                )
            else:
                check_feature_column(df, c)
    return mapping


def request_columns(df: DataFrame, spec, loss, features_col: str, features_cols, label_col: str, label_cols=None,
                    weight_col: str | None = None, class_weight: dict | None = None, decoders: dict | None = None,
                    handle_invalid: str = "error", pad_value: float = 0.0) -> ColumnRequest:
    """Map the model's inputs and outputs to ``df``'s columns and check their types, without a job.

    Args:
        df: the user's DataFrame.
        spec: the model (:class:`~sparkdl.keras.spec.ModelSpec`): its inputs' names, shapes and dtypes.
        loss: the loss descriptor (:class:`~sparkdl.keras.losses.LossInfo`), or a list of them, one per output.
        features_col: the one input's column when ``features_cols`` is None.
        features_cols: None; a list of columns concatenated per row, in order, into the one input;
            or a dict model input name -> column or list of columns.
        label_col: the one output's label column when ``label_cols`` is None.
        label_cols: None; a list of label columns in output order, or a dict output name -> column.
        weight_col: the sample-weight column, or None.
        class_weight: Keras ``class_weight``, or None.
        decoders: binary column -> a function (defined anywhere, ``__main__`` and notebooks included) or
            its name ``"module:function"`` / ``"module.function"``.
        handle_invalid: ``"error"`` or ``"skip"``.
        pad_value: the value that pads sequence inputs' rows (``padValue``).

    Raises:
        SchemaError: a missing column, a column of the wrong type (string labels, a binary column
            without a decoder, a nested array for a non-sequence input), an input or output left
            without a column, or one column used twice.
        ConfigError: ``class_weight`` with a sample-weight column or a multi-output model; a decoder
            that cannot be imported on the driver; a ``pad_value`` that an integer sequence input
            cannot hold.
    """
    request = map_columns(df, spec, features_col, features_cols, label_col, label_cols, weight_col, class_weight, decoders,
                          handle_invalid, pad_value)
    shapes = request.known_label_shapes(df)
    return ship_and_check_labels(request, [(request, shapes, "")], loss)


def ship_and_check_labels(request: ColumnRequest, checks: list, loss) -> ColumnRequest:
    """``request`` with its decoders as tasks carry them (:func:`~sparkdl.serialization.columns.shipped_decoder`:
    a function of ``__main__`` travels by value), after checking the label shapes the schemas tell
    against the losses (:meth:`~sparkdl.keras.losses.LossInfo.check_label_shape`).

    Args:
        request: the training columns (:func:`map_columns`).
        checks: ``(request, known label shapes, message prefix)`` per DataFrame checked (the
            training data's, and ``validationData``'s with the prefix ``"validationData: "``).
        loss: one LossInfo per output.

    Raises:
        SchemaError: a label shape the output cannot take under its loss, prefixed.
        ConfigError: a decoder that cannot be shipped.
    """
    shipped = tuple((c, shipped_decoder(d, c)) for c, d in request.decoders)
    for checked, shapes, prefix in checks:
        for (_, output_shape, c), shape, info in zip(checked.outputs, shapes, checked.output_losses(loss), strict=True):
            if shape is None:  # an array's length: the check job counts it
                continue
            try:
                info.check_label_shape(c, shape, tuple(output_shape))
            except SchemaError as exc:
                if not prefix:
                    raise
                raise SchemaError(f"{prefix}{exc}") from exc
    return dataclasses.replace(request, decoders=shipped)


def map_columns(df: DataFrame, spec, features_col: str, features_cols, label_col: str, label_cols=None,
                weight_col: str | None = None, class_weight: dict | None = None, decoders: dict | None = None,
                handle_invalid: str = "error", pad_value: float = 0.0) -> ColumnRequest:
    """:func:`request_columns` without what other modules decide: the decoders are kept as given
    (not yet :func:`~sparkdl.serialization.columns.shipped_decoder`'s form) and the labels are not
    checked against the losses. Arguments and errors as :func:`request_columns`'s (but the label
    shapes')."""

    decoders = dict(decoders or {})
    mapping = map_inputs(df, spec, features_col, features_cols, decoders)
    check_pad_value(mapping, pad_value)
    decoded = {c for _, _, _, cols in mapping for c in cols if isinstance(df.schema[c].dataType, T.BinaryType)}
    unused = sorted(set(decoders) - decoded)
    if unused:  # a decoder that would never run (a misspelt column, or not a binary feature column); fit only:
        # a fitted model keeps the Param, and transform may read already decoded arrays from another column
        found = ", ".join(f"{c!r} ({df.schema[c].dataType.simpleString() if c in df.columns else 'no such column'})" for c in unused)
        raise SchemaError(
            f"decoders must name binary feature columns (of featuresCol/featuresCols), the columns they decode: "
            f"here {sorted(decoded)}. Received decoders for {found}"
        )
    model_outputs = spec.output_specs
    if label_cols is None:
        label_cols = [label_col]
    if isinstance(label_cols, dict):
        names = [name for name, _ in model_outputs]
        if sorted(label_cols) != sorted(names):
            raise SchemaError(f"labelCols must map every model output by name: the outputs are {names}. Received: {sorted(label_cols)}")
        outputs = tuple((name, shape, label_cols[name]) for name, shape in model_outputs)
    else:
        if len(label_cols) != len(model_outputs):
            raise SchemaError(
                f"the model has {len(model_outputs)} outputs {[n for n, _ in model_outputs]}: give one label column each "
                f"(labelCols, a list in output order or a dict by name). Received: {list(label_cols)}"
            )
        outputs = tuple((name, shape, c) for (name, shape), c in zip(model_outputs, label_cols, strict=True))
    for _, _, c in outputs:
        check_label_column(df, c)
    if weight_col is not None:
        data_type = _field(df, weight_col, "sampleWeightCol").dataType
        if not isinstance(data_type, T.NumericType):
            raise SchemaError(f"sampleWeightCol {weight_col!r} must be a numeric column. Received: {data_type.simpleString()}")
    if class_weight is not None:
        if weight_col is not None:
            raise ConfigError(f"give classWeight or sampleWeightCol, not both (as keras.Model.fit). Received: classWeight and {weight_col!r}")
        if len(outputs) != 1:
            raise ConfigError(f"classWeight needs a single-output model, as in Keras. Received: {len(outputs)} outputs")
    request = ColumnRequest(
        inputs=tuple(mapping), outputs=outputs, weight=weight_col,
        class_weight=tuple(sorted((int(k), float(v)) for k, v in class_weight.items())) if class_weight else None,
        decoders=tuple(sorted(decoders.items())),  # as given: ship_and_check_labels ships them
        skip_invalid=handle_invalid == "skip", pad_value=float(pad_value),
    )
    used = request.source_columns
    twice = sorted({c for c in used if used.count(c) > 1})
    if twice:
        raise SchemaError(f"each column must have one role (feature, label or weight). Received: {twice} used more than once")
    return request


def check_pad_value(mapping: list[tuple], pad_value: float) -> None:
    """Refuse a ``padValue`` that a sequence input's dtype cannot hold (a fraction or out of range
    for integer ids, a NaN or ±inf), before any job.

    Args:
        mapping: per model input ``(input name, per-row shape, dtype, source columns)`` (:func:`map_inputs`).
        pad_value: the ``padValue`` Param.

    Raises:
        ConfigError: naming the input, its dtype and the value.
    """
    for name, shape, dtype, _ in mapping:
        if not (shape and shape[0] is None):
            continue
        kind, value = np.dtype(dtype).kind, float(pad_value)
        if kind in "iu":
            fits = value.is_integer() and np.iinfo(dtype).min <= value <= np.iinfo(dtype).max
        else:
            fits = value in (0.0, 1.0) if kind == "b" else bool(np.isfinite(value))
        if not fits:
            raise ConfigError(
                f"padValue must be a value the sequence input {name!r} of dtype {dtype} holds (a finite number; a whole number "
                f"for integer ids, 0 for Embedding(mask_zero=True)). Received: padValue={pad_value!r}"
            )


def read_dtype(df: DataFrame, source: str, dtype: str) -> str:
    """The dtype a feature column is read as before its check: the model input's own for float32
    and float64; for integer, bool and float16 inputs a wide one (int64 for an integer column, else
    float64; float32 for float16), so the check job sees NaN, fractional and out-of-range values
    before the tasks cast them (a cast in Spark SQL would truncate 1.7 to 1 without a word)."""
    kind = np.dtype(dtype).kind
    if kind == "f" and np.dtype(dtype).itemsize >= 4:
        return dtype
    if kind == "f":
        return "float32"
    data_type = df.schema[source].dataType
    element = data_type.elementType if isinstance(data_type, T.ArrayType) else data_type
    while isinstance(element, T.ArrayType):
        element = element.elementType
    return "int64" if isinstance(element, _INTEGER_TYPES + (T.BooleanType,)) else "float64"


def input_column(df: DataFrame, source: str, name: str, shape: tuple, dtype: str, decoders: dict,
                 pad_value: float = 0.0) -> tuple[Column, ColumnSpec]:
    """The expression that reads feature column ``source`` as column ``name`` (binary as it is, for
    its decoder; a sequence as ``array<T>`` (input ``(None,)``) or ``array<array<T>>`` (input
    ``(None, k)``), padded with ``pad_value`` in the tasks; anything else as ``array<T>``) and its draft
    :class:`ColumnSpec` (shape ``()`` for a plain column: its width is counted by the check job)."""
    data_type = df.schema[source].dataType
    if isinstance(data_type, T.BinaryType):
        return col(source).alias(name), ColumnSpec(name, shape, dtype, source, decoder=decoders[source])
    wide = read_dtype(df, source, dtype)
    if shape and shape[0] is None:
        element = SPARK_TYPES.get(wide, T.FloatType())
        sequence_type = T.ArrayType(element) if len(shape) == 1 else T.ArrayType(T.ArrayType(element))
        return col(source).cast(sequence_type).alias(name), ColumnSpec(name, shape, dtype, source, ragged=True, pad=float(pad_value))
    return as_array(df, source, wide).alias(name), ColumnSpec(name, (), dtype, source)


def _select(df: DataFrame, request: ColumnRequest) -> tuple[list[Column], list[ColumnSpec], list[ColumnSpec], ColumnSpec | None]:
    """The prepared DataFrame's columns (``x{i}_{j}``, ``y{k}``, the weight) and their draft specs
    (widths and padded lengths are filled in from the check job)."""
    decoders = dict(request.decoders)
    exprs, xs, ys = [], [], []
    for i, (_, shape, dtype, cols) in enumerate(request.inputs):
        for j, c in enumerate(cols):
            expr, spec = input_column(df, c, f"x{i}_{j}", tuple(shape), dtype, decoders, request.pad_value)
            exprs.append(expr)
            xs.append(spec)
    for k, (_, _, c) in enumerate(request.outputs):
        name = f"y{k}"
        data_type = df.schema[c].dataType
        if isinstance(data_type, _INTEGER_TYPES):
            exprs.append(col(c).cast(T.LongType()).alias(name))
            ys.append(ColumnSpec(name, (), "int64", c))
        elif isinstance(data_type, (T.NumericType, T.BooleanType)):
            exprs.append(col(c).cast(T.FloatType()).alias(name))
            ys.append(ColumnSpec(name, (), "float32", c))
        else:
            exprs.append(as_array(df, c, "float32").alias(name))
            ys.append(ColumnSpec(name, (1,), "float32", c))  # (1,): an array; its length comes from the check job
    weight = None
    if request.weight:
        exprs.append(col(request.weight).cast(T.FloatType()).alias(WEIGHT))
        weight = ColumnSpec(WEIGHT, (), "float32", request.weight)
    return exprs, xs, ys, weight


# One row per check task; the Spark schema is derived from the Arrow one (no DDL string: parsing one costs a fresh
# session 0.4 s of the JVM parser's start, on the way to the first step).
STATS_SCHEMA = pa.schema([("partition", pa.int32()), ("role", pa.int8()), ("rows", pa.int64()), ("skipped", pa.int64()),
                          ("stats", pa.string()), ("import_error", pa.string())])
STATS_SPARK_SCHEMA = from_arrow_schema(STATS_SCHEMA)


class _ColumnStats:
    """Running per-partition statistics of one model column, batch by batch (no concatenation,
    so a partition of more than 2**31 values is fine)."""

    def __init__(self, exclude: float | None = None) -> None:
        self.exclude = exclude  # a value left out of min, max and fractional (a loss's ignore_class)
        self.nulls = self.element_nulls = self.nans = self.fractional = self.invalid = 0
        self.wrong_width = 0  # rows of another number of values than the model input's (a plain list column)
        self.min_len = self.max_len = self.inner_min = self.inner_max = None
        self.min = self.max = None
        self.decode_error = None

    @staticmethod
    def _merge(current, value, pick):
        return value if current is None else (current if value is None else pick(current, value))

    def add(self, column: pa.Array) -> None:
        self.nulls += column.null_count
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            lengths = pc.min_max(pc.list_value_length(column))
            values = pc.list_flatten(column)
            low, high = lengths["min"].as_py(), lengths["max"].as_py()
            if pa.types.is_list(values.type):  # a sequence column: outer lengths are steps, inner ones widths
                self.element_nulls += values.null_count
                inner = pc.min_max(pc.list_value_length(values))
                self.inner_min = self._merge(self.inner_min, inner["min"].as_py(), min)
                self.inner_max = self._merge(self.inner_max, inner["max"].as_py(), max)
                values = pc.list_flatten(values)
            self.element_nulls += values.null_count
        else:
            values = column.drop_null()
            low = high = 1 if len(values) else None
        self.min_len = self._merge(self.min_len, low, min)
        self.max_len = self._merge(self.max_len, high, max)
        self._values(values)

    def _values(self, values) -> None:
        if pa.types.is_floating(values.type):
            bad = pc.invert(pc.is_finite(values))
            self.nans += pc.sum(pc.fill_null(bad, False)).as_py() or 0
            values = pc.drop_null(pc.if_else(bad, None, values))
        if self.exclude is not None:
            values = values.filter(pc.not_equal(values, pa.scalar(self.exclude).cast(values.type)))
        if pa.types.is_floating(values.type):
            self.fractional += pc.sum(pc.not_equal(pc.floor(values), values)).as_py() or 0
        if len(values) == 0 or not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
            return
        bounds = pc.min_max(values)
        self.min = self._merge(self.min, bounds["min"].as_py(), min)
        self.max = self._merge(self.max, bounds["max"].as_py(), max)

    def add_decoded(self, column: pa.Array, spec: ColumnSpec) -> None:
        """A binary column: decode every row (as the tasks will) and check the arrays."""
        self.nulls += column.null_count
        if self.decode_error is not None or len(column) == column.null_count:
            return
        try:
            values = column_to_numpy(column.drop_null(), spec.source, spec.shape, spec.dtype, spec)
        except ConfigError:  # the decoder cannot be imported in this executor's Python: the task fails, naming it
            raise
        except Exception as exc:
            self.decode_error = str(exc)[:500]
            return
        size = int(np.prod(spec.shape, dtype=np.int64))
        self.min_len = self._merge(self.min_len, size, min)
        self.max_len = self._merge(self.max_len, size, max)
        if values.dtype.kind == "f":
            self.nans += int((~np.isfinite(values)).sum())

    def as_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "exclude"}


# How long a check task waits, after its rows, for the Keras import it started (seconds).
WARM_UP_WAIT_S = 300.0


def _partition_stats(batches, specs: list[ColumnSpec], ignore_labels: dict, skip: bool,
                     backend: str | None = None, warm: Callable[[], None] | None = None, roles: int = 1,
                     widths: dict | None = None, custom_modules: tuple = ()) -> Iterator[pa.RecordBatch]:
    """One row of statistics of the task's partition per role (one row even when it is empty): rows
    kept, rows skipped, and per column a JSON dict of counts; with ``skip``, invalid rows (and rows
    of another width than ``widths`` gives their column: column name -> values per row) are
    counted per column and left out of the rest; without, the rows of another width are counted. ``roles``: 1, or 2 when the rows are a fit's
    training (role 0) and validation rows (role 1) told apart by :data:`VALIDATION_FLAG`.
    ``backend``: the driver's Keras backend, selected (``KERAS_BACKEND``) before a decoder may import
    Keras. Without decoders, Keras is imported (and ``warm`` run) on a thread beside the check, so
    that the training task this reused Python worker runs next starts warm. ``custom_modules`` (the
    modules of the fit's registered custom objects) are imported after the rows, as a training
    task's unpickling of the objects would: a module this Python cannot import is reported
    (``import_error``: the exception's last line), not raised, so the driver fails the fit at once
    instead of after Spark's task retries."""
    import json

    from pyspark import TaskContext

    from sparkdl.keras.runtime import configure, warm_up

    context = TaskContext.get()
    importing = None
    if any(s.decoder for s in specs):  # a decoder may start the backend: on this task's GPUs only
        configure(None, context.resources(), backend)
    else:  # Keras imported while the rows are checked: the training task on this reused Python worker starts warm
        importing = warm_up(context.cpus(), context.resources(), backend, warm)
    counts = [[0, 0] for _ in range(roles)]  # per role: rows, skipped
    stats = [{s.name: _ColumnStats(ignore_labels.get(s.name)) for s in specs} for _ in range(roles)]
    for whole in batches:
        parts = [whole] if roles == 1 else [whole.filter(pc.invert(whole.column(VALIDATION_FLAG))), whole.filter(whole.column(VALIDATION_FLAG))]
        for role, batch in enumerate(parts):
            wrong = {s.name: wrong_width_rows(batch.column(s.name), widths[s.name]) for s in specs if s.name in (widths or {})}
            for name, rows in wrong.items():
                stats[role][name].wrong_width += int(rows.sum())
            if skip and batch.num_rows:
                bad = np.zeros(batch.num_rows, bool)
                for s in specs:
                    column_bad = invalid_rows(batch.column(s.name))
                    if s.name in wrong:
                        column_bad |= wrong[s.name]
                    stats[role][s.name].invalid += int(column_bad.sum())
                    bad |= column_bad
                if bad.any():
                    counts[role][1] += int(bad.sum())
                    batch = batch.filter(pa.array(~bad))
            counts[role][0] += batch.num_rows
            for s in specs:
                if s.decoder:
                    stats[role][s.name].add_decoded(batch.column(s.name), s)
                else:
                    stats[role][s.name].add(batch.column(s.name))
    if importing is not None:
        importing.join(WARM_UP_WAIT_S)
    failed = None
    for module in custom_modules:  # after the warm-up: a custom object's module may import Keras
        import importlib

        try:
            importlib.import_module(module)
        except ImportError as exc:  # a module shipped to the driver only: no retry can import it
            failed = f"{type(exc).__name__}: {exc}"
            break
    partition = TaskContext.get().partitionId()
    out = [{"partition": partition, "role": role, "rows": counts[role][0], "skipped": counts[role][1],
            "stats": json.dumps({name: st.as_dict() for name, st in stats[role].items()}), "import_error": failed}
           for role in range(roles)]
    yield pa.RecordBatch.from_pylist(out, schema=STATS_SCHEMA)


def training_and_validation(df: DataFrame, request: ColumnRequest, seed: int, given: DataFrame | None, column: str | None,
                            fraction: float) -> tuple[DataFrame, DataFrame | None]:
    """A fit's training and validation DataFrames: ``given`` (``validationData``), else the rows of
    ``df`` where boolean ``column`` (``validationCol``) is true, else a seeded ``fraction``
    (``validationSplit``) of the rows (:func:`validation_split`), else ``(df, None)``. No job.

    Raises:
        ConfigError: more than one of them given.
        SchemaError: ``column`` missing or not boolean.
    """
    chosen = [name for name, on in (("validationData", given is not None), ("validationCol", column is not None),
                                    ("validationSplit", fraction > 0)) if on]
    if len(chosen) > 1:
        raise ConfigError(f"give one of validationData, validationCol and validationSplit. Received: {chosen}")
    if given is not None:
        return df, given
    if column is not None:
        if column not in df.columns:
            raise SchemaError(f"validationCol {column!r} must exist in the DataFrame.{did_you_mean(column, df.columns)} "
                              f"Received columns: {df.columns}")
        data_type = df.schema[column].dataType
        if not isinstance(data_type, T.BooleanType):
            raise SchemaError(f"validationCol {column!r} must be boolean (true: a validation row). Received: {data_type.simpleString()}")
        flag = F.coalesce(col(column), F.lit(False))
        return df.filter(~flag), df.filter(flag)
    if fraction > 0:
        flag = validation_split(df, request, fraction, seed)
        return df.filter(~flag), df.filter(flag)
    return df, None


@dataclass(frozen=True)
class CheckedColumns:
    """A fit's columns checked without a job (:func:`check_columns`).

    Attributes:
        request: the training columns, decoders as tasks carry them (:class:`ColumnRequest`).
        label_specs: per output, the label's per-row shape and dtype for the driver's dry run
            (:meth:`ColumnRequest.label_specs`).
        train_df, validation_df: the training rows and the validation rows (None: no validation).
    """

    request: ColumnRequest
    label_specs: list
    train_df: DataFrame
    validation_df: DataFrame | None


def check_columns(df: DataFrame, spec, loss, columns: dict, seed: int, given: DataFrame | None = None,
                  validation_col: str | None = None, fraction: float = 0.0) -> CheckedColumns:
    """Everything a fit checks of its DataFrames before any job, in one call: the model's columns
    mapped and typed (:func:`map_columns`), the validation rows chosen
    (:func:`training_and_validation`) and, for ``validationData``, the same columns in it; then the
    label shapes the schemas tell against the losses, and the decoders as tasks carry them
    (:func:`ship_and_check_labels`).

    Args:
        df: the training DataFrame; ``spec``: the model; ``loss``: one LossInfo per output.
        columns: :func:`map_columns`'s keyword arguments from the Params (``features_col``,
            ``features_cols``, ``label_col``, ``label_cols``, ``weight_col``, ``class_weight``,
            ``decoders``, ``handle_invalid``, ``pad_value``).
        seed, given, validation_col, fraction: as :func:`training_and_validation` takes them.

    Raises:
        SchemaError, ConfigError: as :func:`request_columns` and :func:`training_and_validation`
            raise them; a ``validationData`` problem prefixed ``validationData:``.
    """
    request = map_columns(df, spec, **columns)
    train_df, validation_df = training_and_validation(df, request, seed, given, validation_col, fraction)
    checks = [(request, request.known_label_shapes(df), "")]
    if given is not None:
        try:
            other = map_columns(validation_df, spec, **columns)
            checks.append((other, other.known_label_shapes(validation_df), "validationData: "))
        except SchemaError as exc:
            raise SchemaError(f"validationData: {exc}") from exc
    label_specs = request.label_specs(df, loss)
    return CheckedColumns(ship_and_check_labels(request, checks, loss), label_specs, train_df, validation_df)


def validation_split(df: DataFrame, request: ColumnRequest, fraction: float, seed: int) -> Column:
    """A boolean expression: True for the ``fraction`` of rows held out for validation, chosen by a
    seeded 64-bit hash of the row's model columns (xxhash64), so the same rows are chosen in every
    run whatever the input's partitioning or row order."""
    hashed = F.xxhash64(*[col(c) for c in request.source_columns], F.lit(int(seed)))
    return (F.pmod(hashed, F.lit(1_000_000)) / F.lit(1_000_000.0)) < F.lit(float(fraction))


@dataclass(frozen=True)
class Preparation:
    """What a fit's data preparation (:func:`prepare`) gives the fit.

    Attributes:
        data: the training data, cached, one partition per worker.
        validation: the validation data, cached (maybe in ``data``'s DataFrame: ``role``), or None
            (none given, or none left).
        warnings: what the check job found that the user should hear of (rows skipped, workers
            without rows, 0/1 labels under a regression loss), in words, in that order.
    """

    data: PreparedData
    validation: PreparedData | None
    warnings: tuple[str, ...] = ()


def prepare(df: DataFrame, validation_df: DataFrame | None, request: ColumnRequest, loss, task: str, num_workers: int,
            keep_partitioning: bool = False, run_job: Callable | None = None, warm: Callable[[], None] | None = None) -> Preparation:
    """A fit's data preparation, in one call: the training rows and the validation rows (when
    given) checked, cast, partitioned and cached, together in one DataFrame and one check job when
    their columns read alike (:func:`prepare_together`, :func:`prepare_with_validation`; not with
    ``keep_partitioning``), else each on its own (:func:`prepare_training_data`); an empty
    validation set is released and given as None.

    Args:
        df, validation_df: the training rows and the validation rows (None: no validation).
        request: the model's columns (:func:`request_columns`).
        loss: one :class:`~sparkdl.keras.losses.LossInfo` per output.
        task: the ``task`` Param (``"auto"``, ``"classification"``, ``"regression"``), for the 0/1 labels' warning.
        num_workers, keep_partitioning, run_job, warm: as :func:`prepare_training_data` takes them.

    Returns:
        :class:`Preparation` (the caller unpersists both DataFrames when the fit ends).

    Raises:
        SchemaError: what the check job found (nulls, NaN, lengths, labels, weights, no rows).
    """
    together = validation_df is not None and not keep_partitioning and prepare_together(df, validation_df, request)
    if together:  # one cache, one check job; partition p holds worker p's validation rows too
        data, validation = prepare_with_validation(df, validation_df, request, loss, num_workers, run_job=run_job, warm=warm)
    else:
        data = prepare_training_data(df, request, loss, num_workers, keep_partitioning=keep_partitioning, run_job=run_job, warm=warm)
        validation = None
    said = []
    try:
        if data.skipped:
            said.append(f"handleInvalid='skip': {data.skipped} rows with a null, NaN or infinite value or a wrong number of values "
                        f"were dropped, {data.total_rows} rows are trained on")
        if validation_df is not None:
            if validation is None:
                validation = prepare_training_data(validation_df, request, loss, num_workers, run_job=run_job, role="validation")
            if validation.skipped:
                said.append(f"handleInvalid='skip': {validation.skipped} validation rows with a null, NaN or infinite value "
                            "or a wrong number of values were dropped")
            if validation.total_rows == 0:
                said.append("the validation set is empty: the history has no val_* values")
    except BaseException:
        data.df.unpersist()
        raise
    workers = len(data.partition_rows)
    if keep_partitioning and workers != num_workers:
        said.append(f"keepPartitioning=True: training with {workers} workers, one per partition of the cached input, "
                    f"not numWorkers={num_workers} (after a shuffle a cached plan keeps spark.sql.shuffle.partitions "
                    "partitions: AQE does not coalesce it)")
    if data.empty_workers:  # counted on the partitions trained (round-robin may leave more empty than workers - rows)
        if keep_partitioning:
            said.append(f"keepPartitioning=True: {data.empty_workers} of the input's {workers} partitions are empty, "
                        "their workers have no rows to train on")
        else:
            said.append(f"{data.empty_workers} of numWorkers={workers} workers will have no rows to train on (the input's "
                        f"{data.total_rows} rows went to {workers - data.empty_workers} partitions): lower numWorkers")
    said.extend(zero_one_warnings(request, loss, task, data))
    if validation is not None and validation.total_rows == 0:
        if validation.df is not data.df:
            validation.df.unpersist()
        validation = None
    return Preparation(data, validation, tuple(said))


def zero_one_warnings(request: ColumnRequest, loss, task: str, data: PreparedData) -> list[str]:
    """What to say of outputs trained with a regression loss on labels that are all 0/1 (the check
    job's counts): a classifier's loss is probably meant, and Spark's BinaryClassificationEvaluator
    needs the rawPrediction column that a regression's transform does not write.

    Args:
        request: the fit's columns; ``loss``: one LossInfo per output; ``task``: the ``task`` Param.
        data: the prepared training data (its ``label_ranges``).
    """
    out = []
    for i in data.zero_one_labels():
        (name, shape, label_col), info = request.outputs[i], loss[i]
        if info.is_classifier or info.infer_task(task) != "regression":
            continue
        units = int(np.prod(shape)) if len(shape) else 1
        meant = ("binary_crossentropy (one sigmoid unit), or sparse_categorical_crossentropy over 2 softmax units"
                 if units == 1 else "categorical_crossentropy (softmax) or binary_crossentropy (multi-label, sigmoid)")
        output = f" of output {name!r}" if len(request.outputs) > 1 else ""
        out.append(
            f"label column {label_col!r}{output} holds only 0 and 1, and loss {info.name!r} is a regression loss: a classifier's "
            f"loss is probably meant ({meant}). As it is, the model is a regressor: transform writes no rawPrediction "
            "column, which BinaryClassificationEvaluator needs (it fails with FIELD_NOT_FOUND rawPrediction; "
            "RegressionEvaluator reads prediction; task='classification' keeps the loss and writes it)")
    return out


def prepare_training_data(
    df: DataFrame,
    request: ColumnRequest,
    loss,
    num_workers: int,
    keep_partitioning: bool = False,
    run_job: Callable | None = None,
    role: str = "training",
    warm: Callable[[], None] | None = None,
) -> PreparedData:
    """Check, cast, partition and cache the training (or validation) data; count the rows of every partition.

    The model columns are cast (:func:`_select`) and, by default, spread round-robin over
    ``num_workers`` partitions (``repartition(n)``, which adaptive query execution never
    coalesces), so that workers are balanced and every worker gets rows from every input partition
    (label-sorted files do not make label-sorted shards). With ``keep_partitioning`` the input's
    partitions are trained as they are, one worker each, however many there turn out to be at run
    time. The result is cached, and one job over the cached data itself counts rows per partition
    and checks nulls, NaNs, lengths, decoded shapes, label values and weights: the partition count
    and the rows per partition of the data that is trained are facts measured on it, never
    assumed. Errors are raised before any training job; the cache is released on every error path.

    Args:
        df: the user's DataFrame.
        request: the model's columns (:func:`request_columns`).
        loss: the loss descriptor (:class:`sparkdl.keras.losses.LossInfo`), or one per output: the label rules.
        num_workers: partitions (workers), unless ``keep_partitioning``.
        keep_partitioning: train on the input's own partitions instead of repartitioning.
        run_job: ``run_job(action, description)`` runs the check job (see :mod:`sparkdl.spark.jobs`);
            ``None`` calls the action directly.
        role: ``"training"`` or ``"validation"``, for messages; validation data may be empty.
        warm: run in each check task after Keras is imported there, on a thread beside the rows'
            check (the fit's replica built into the Python worker's cache); None: Keras is imported only.

    Returns:
        :class:`PreparedData` (the caller unpersists ``df`` when the fit ends).

    Raises:
        SchemaError: nulls or NaNs (rows or elements, with ``handleInvalid="error"``), a feature length
            that does not match the model input, labels of unequal length, not fitting the model
            output, or outside the loss's range (class indices not integers in [0, classes)),
            negative sample weights, a decoder's wrong output, or an empty training DataFrame.
        InvariantError: the counted partitions are not the ``num_workers`` asked for.
    """
    exprs, xs, ys, weight = _select(df, request)
    selected = df.select(*exprs)
    if not keep_partitioning:
        # Round-robin: balanced workers, each with rows from every input partition. (A hash of the
        # features would make the split independent of the input's partitioning, but puts equal
        # feature rows on one worker: 7 distinct rows gave one worker 3 times the other's rows.)
        # Training rows carry the validation flag (false) as they do beside validation rows: Spark sorts
        # each input partition's rows by their bytes before the round-robin, so the flag keeps the
        # training partitions the same with validation data or without.
        if role == "training":
            selected = selected.withColumn(VALIDATION_FLAG, _false())
        selected = selected.repartition(num_workers)
    (data,) = _cache_and_check(selected, request, loss, xs, ys, weight, num_workers, keep_partitioning, run_job, (role,), warm)
    return data


def prepare_with_validation(
    df: DataFrame,
    validation_df: DataFrame,
    request: ColumnRequest,
    loss,
    num_workers: int,
    run_job: Callable | None = None,
    warm: Callable[[], None] | None = None,
) -> tuple[PreparedData, PreparedData]:
    """:func:`prepare_training_data` of a fit's training rows (``df``) and validation rows
    (``validation_df``) together: one DataFrame of both, a :data:`VALIDATION_FLAG` column telling
    them apart, spread round-robin over ``num_workers`` partitions, cached once and checked by one
    job (each role's statistics apart). Partition p holds worker p's training rows and its share of
    the validation rows, so a long-lived worker task evaluates its own validation rows (backend
    ``ps``); a job of one role reads :attr:`PreparedData.rows_df`. The training rows' partitions are
    the ones :func:`prepare_training_data` makes of ``df`` alone, so validation data never changes
    what is trained (round-robin repartitioning spreads each input partition's rows on its own, in
    an order of their bytes, flag included; the training rows' input partitions come first).

    Returns:
        ``(training data, validation data)``, both with ``df`` the shared cached DataFrame (the
        caller unpersists it once).

    Raises:
        SchemaError: as :func:`prepare_training_data`; a validation row's problem begins
            ``validation data:``.
        InvariantError: the counted partitions are not the ``num_workers`` asked for.
    """
    exprs, xs, ys, weight = _select(df, request)
    train = df.select(*exprs, _false().alias(VALIDATION_FLAG))
    val = validation_df.select(*_select(validation_df, request)[0], F.lit(True).alias(VALIDATION_FLAG))
    if train.schema != val.schema:
        raise ConfigError(f"validation rows must read as the training rows do to share their DataFrame. Received: {val.schema.simpleString()} "
                          f"beside {train.schema.simpleString()} (see prepare_together)")
    selected = train.unionByName(val).repartition(num_workers)
    return _cache_and_check(selected, request, loss, xs, ys, weight, num_workers, False, run_job, ("training", "validation"), warm)


def _false() -> Column:
    """False for every row, as a column the optimizer cannot fold into a literal: a literal column
    is moved above the repartition's exchange when every row holds it, so the shuffled rows (whose
    bytes order each input partition before the round-robin) would differ from those beside
    validation rows, and so would the training partitions."""
    return F.spark_partition_id() < F.lit(0)


def prepare_together(df: DataFrame, validation_df: DataFrame, request: ColumnRequest) -> bool:
    """Whether :func:`prepare_with_validation` can put both DataFrames' rows in one: their model
    columns read with the same types (no job runs)."""
    return df.select(*_select(df, request)[0]).schema == validation_df.select(*_select(validation_df, request)[0]).schema


def _cache_and_check(selected: DataFrame, request: ColumnRequest, loss, xs, ys, weight, num_workers: int, keep_partitioning: bool,
                     run_job: Callable | None, roles: tuple[str, ...], warm) -> tuple[PreparedData, ...]:
    """Cache ``selected`` (the model columns, partitioned), run the check job over the cached data
    and return a :class:`PreparedData` per role in ``roles``; the cache is released on every error."""
    import json

    # The fit's own literal makes the cached plan unique to this fit: Spark's cache is keyed by plan,
    # so two concurrent fits on one DataFrame (CrossValidator(parallelism=2)) would otherwise share
    # one cache entry, and the first to finish would unpersist it under the other.
    selected = selected.withColumn("__sparkdl_fit", F.lit(secrets.randbits(63)))
    selected = selected.persist()
    try:
        ignore = {y.name: info.ignore_class for y, info in zip(ys, request.output_losses(loss), strict=True)}
        specs = xs + ys + ([weight] if weight else [])
        skip, count = request.skip_invalid, len(roles)
        widths = _fixed_widths(request, xs)
        from sparkdl.keras.runtime import keras_backend

        backend = keras_backend()
        custom = request.custom_modules
        stats_task = functools.partial(_partition_stats, specs=specs, ignore_labels=ignore, skip=skip, backend=backend, warm=warm,
                                       roles=count, widths=widths, custom_modules=custom)  # runs on the executors
        counting = selected.mapInArrow(stats_task, STATS_SPARK_SCHEMA)
        description = f"sparkdl: check and count {' and '.join(roles)} rows"
        rows = run_job(counting.collect, description) if run_job else counting.collect()
        failed = sorted({(s["partition"], s["import_error"]) for s in rows if s["import_error"]})
        if failed:
            from sparkdl.spark.jobs import failed_import_error

            partition, text = failed[0]
            raise failed_import_error(text, f"{description}, partition {partition},")
        out = []
        for index, role in enumerate(roles):
            found = sorted((s for s in rows if s["role"] == index), key=lambda s: s["partition"])
            if [s["partition"] for s in found] != list(range(len(found))):
                raise InvariantError(f"the check job must report each partition once. Received partitions {[s['partition'] for s in found]}")
            if not keep_partitioning and len(found) != num_workers:
                raise InvariantError(f"the {role} data must have numWorkers={num_workers} partitions. Received: {len(found)}")
            stats = [json.loads(s["stats"]) for s in found]
            total, skipped = sum(s["rows"] for s in found), sum(s["skipped"] for s in found)
            try:
                columns = _check_stats(stats, total, skipped, request, xs, ys, weight, loss, role)
            except SchemaError as exc:
                if role == "training":
                    raise
                raise SchemaError(f"{role} data: {exc}") from None
            ranges = tuple(_label_range(stats, y.name) for y in ys)
            out.append(PreparedData(df=selected, partition_rows=tuple(int(s["rows"]) for s in found), columns=columns, skipped=skipped,
                                    label_ranges=ranges, role=None if count == 1 else ("train", "val")[index]))
    except BaseException:
        selected.unpersist()
        raise
    return tuple(out)


def _fixed_widths(request: ColumnRequest, xs: list[ColumnSpec]) -> dict[str, int]:
    """Column name -> values per row, for each model input fed by one plain column (as
    :func:`~sparkdl.serialization.columns.fixed_width_columns` finds them for the training tasks)."""
    out, position = {}, 0
    for _, shape, _, cols in request.inputs:
        parts = xs[position : position + len(cols)]
        position += len(cols)
        if len(parts) == 1 and not parts[0].ragged and not parts[0].decoder:
            out[parts[0].name] = int(np.prod(tuple(shape), dtype=np.int64))
    return out


def _label_range(stats, name: str) -> tuple | None:
    """``(lowest, highest, values not whole)`` of a label column over every partition, or None."""
    lows, highs = _values(stats, name, "min"), _values(stats, name, "max")
    return (min(lows), max(highs), _total(stats, name, "fractional")) if lows else None


def _total(stats, name: str, key: str) -> int:
    return sum(s[name][key] or 0 for s in stats)


def _values(stats, name: str, key: str) -> set:
    return {s[name][key] for s in stats if s[name][key] is not None}


def _check_stats(stats, total: int, skipped: int, request: ColumnRequest, xs, ys, weight, loss, role: str) -> ModelColumns:
    """Raise on what the check job found wrong; return the columns as tasks read them."""
    if total == 0 and role == "training":
        reason = f" ({skipped} rows skipped as invalid)" if skipped else ""
        raise SchemaError(
            f"the DataFrame must have at least one row to fit on. Received: 0 rows in column {xs[0].source!r}{reason}"
        )
    invalid = []  # every column's nulls, null elements and NaN/inf at once, not only the first column's
    for spec in [*xs, *ys] + ([weight] if weight else []):
        nulls = _total(stats, spec.name, "nulls")
        if nulls:
            invalid.append(f"column {spec.source!r} must have no null values. Received: {nulls} null rows of {total}")
        element_nulls = _total(stats, spec.name, "element_nulls")
        if element_nulls:
            invalid.append(f"column {spec.source!r} must have no null elements. Received: {element_nulls} null elements in {total} rows")
        nans = _total(stats, spec.name, "nans")
        if nans:
            invalid.append(f"column {spec.source!r} must hold finite values. Received: {nans} NaN or infinite values in {total} rows")
    if invalid:
        # With "skip" only a decoder's output can be left: rows are dropped on their columns' values, before decoding.
        hint = " (a decoder's output must be finite: handleInvalid='skip' drops rows before decoding)" if request.skip_invalid \
            else " (handleInvalid='skip' drops such rows)"
        raise SchemaError("; ".join(invalid) + hint)
    for spec in xs:
        errors = [s[spec.name]["decode_error"] for s in stats if s[spec.name]["decode_error"]]
        if errors:
            raise SchemaError(errors[0])
    inputs, position = [], 0
    for name, shape, dtype, cols in request.inputs:
        parts = xs[position : position + len(cols)]
        position += len(cols)
        inputs.append(_input_tensor(stats, name, tuple(shape), dtype, parts, total))
    outputs = []
    for (name, output_shape, _), y, info in zip(request.outputs, ys, request.output_losses(loss), strict=True):
        outputs.append(_output_tensor(stats, name, tuple(output_shape), y, info))
    if weight is not None:
        lows = _values(stats, weight.name, "min")
        if lows and min(lows) < 0:
            raise SchemaError(f"sampleWeightCol {weight.source!r} must hold weights >= 0. Received: values from {min(lows):g}")
    return ModelColumns(tuple(inputs), tuple(outputs), weight, request.class_weight, request.skip_invalid)


def _check_range(stats, name: str, dtype: str, parts: list[ColumnSpec]) -> None:
    """Values a model input of ``dtype`` cannot hold: fractional values for integer inputs, values
    outside the dtype's range (``np.iinfo``, float16's ±65,504)."""
    target = np.dtype(dtype)
    if target.kind == "f" and target.itemsize >= 4:
        return
    low, high = ((int(np.iinfo(target).min), int(np.iinfo(target).max)) if target.kind in "iu" else (0, 1) if target.kind == "b"
                 else (-float(np.finfo(target).max), float(np.finfo(target).max)))
    for c in parts:
        fractional = _total(stats, c.name, "fractional") if target.kind != "f" else 0
        lows, highs = _values(stats, c.name, "min"), _values(stats, c.name, "max")
        outside = bool(lows) and (min(lows) < low or max(highs) > high)
        if fractional or outside:
            found = f"values from {min(lows):g} to {max(highs):g}" if lows else "no values"
            raise SchemaError(
                f"features column {c.source!r} feeds model input {name!r} of dtype {dtype}: its values must be "
                + ("whole numbers " if target.kind != "f" else "") + f"in [{low}, {high}]. Received: {found}"
                + (f", {fractional} of them not whole numbers" if fractional else "")
            )


def _input_tensor(stats, name: str, shape: tuple, dtype: str, parts: list[ColumnSpec], total: int) -> TensorSpec:
    if not parts[0].decoder:
        _check_range(stats, name, dtype, parts)
    if parts[0].decoder:
        return TensorSpec(name, shape, dtype, tuple(parts))
    if parts[0].ragged:
        c = parts[0]
        widths = _values(stats, c.name, "inner_min") | _values(stats, c.name, "inner_max")
        if len(shape) == 2 and widths - {shape[1]}:
            raise SchemaError(
                f"column {c.source!r} must hold {shape[1]} values per step for model input {name!r} of shape {shape}. "
                f"Received steps of {sorted(widths)} values"
            )
        steps = max(_values(stats, c.name, "max_len") or {1})
        padded = (max(1, steps), *shape[1:])
        return TensorSpec(name, padded, dtype, (dataclasses.replace(c, shape=padded),))
    size = int(np.prod(shape, dtype=np.int64))
    widths = []
    for c in parts:
        lengths = _values(stats, c.name, "min_len") | _values(stats, c.name, "max_len")
        if len(parts) == 1 and total and lengths != {size}:
            raise SchemaError(features_width_message(c.source, shape, size, sorted(lengths - {size}) or sorted(lengths),
                                                     _total(stats, c.name, "wrong_width") or total, total))
        if len(lengths) > 1:
            raise SchemaError(f"features column {c.source!r} must hold the same number of values in every row. Received lengths {sorted(lengths)}")
        widths.append(lengths.pop() if lengths else 0)
    if len(parts) > 1 and total and sum(widths) != size:
        found = ", ".join(f"{c.source!r}: {w}" for c, w in zip(parts, widths, strict=True))
        raise SchemaError(
            f"featuresCols for model input {name!r} must hold {size} values per row in all (the input shape {shape}). "
            f"Received {sum(widths)}: {found}"
        )
    specs = tuple(dataclasses.replace(c, shape=(w,)) for c, w in zip(parts, widths, strict=True)) if len(parts) > 1 else (dataclasses.replace(parts[0], shape=shape),)
    return TensorSpec(name, shape, dtype, specs)


def class_index_message(label_col: str, classes: int, loss, low: float, high: float, fractional: int) -> str:
    """The error of class-index labels outside ``[0, classes)`` (or ``fractional`` of them not
    integers) for a model output of ``classes`` values under the sparse categorical ``loss``: the
    fix is a softmax output of k units for k classes, or a binary loss for 0/1 labels."""
    ignored = f" (or ignore_class={loss.ignore_class})" if loss.ignore_class is not None else ""
    units = "1 value" if classes == 1 else f"{classes} values"
    return (
        f"label column {label_col!r} must hold integer class indices in [0, {classes - 1}]{ignored} for a model output of "
        f"{units} under loss {loss.name!r}: for k classes give the model a softmax output of k units "
        f"(keras.layers.Dense(k, activation='softmax')), or for 0/1 labels and one output unit use a binary loss such as "
        f"binary_crossentropy. Received: values from {low:g} to {high:g}"
        + (f", {fractional} of them not integers" if fractional else "")
    )


def features_width_message(source: str, shape: tuple, size: int, bad: list[int], wrong: int, total: int) -> str:
    """The error of a features column whose ``wrong`` rows of ``total`` hold other than ``size``
    values (``bad``: their lengths, sorted): when some rows do, ``handleInvalid="skip"`` drops them;
    when every row does, the column or the model input is the one to change (the model's
    ``keras.Input(shape=...)`` when the rows all hold one other width and the data is right)."""
    held = f"{bad[0]}" if bad[0] == bad[-1] else f"{bad[0]} to {bad[-1]}"
    rule = f"features column {source!r} must hold {size} values per row (the model input shape {shape} has {size})"
    if wrong < total:
        return f"{rule}; handleInvalid='skip' drops the rows that do not. Received: {wrong} of {total} rows hold {held} values"
    model_fix = (f"; when the data is right, change the model's input to {bad[0]} values per row, e.g. "
                 f"keras.Input(shape=({bad[0]},))" if bad[0] == bad[-1] else "")
    return (f"{rule}: when no row does, the column or the model input is not the one meant{model_fix}. "
            f"Received: all {total} rows hold {held} values")


def _output_tensor(stats, name: str, output_shape: tuple, y: ColumnSpec, loss) -> TensorSpec:
    label_col = y.source
    lengths = _values(stats, y.name, "min_len") | _values(stats, y.name, "max_len")
    if len(lengths) > 1:
        raise SchemaError(f"label column {label_col!r} must hold the same number of values in every row. Received lengths {sorted(lengths)}")
    label_shape = (lengths.pop(),) if y.shape == (1,) and lengths else (() if y.shape == () else (1,))
    loss.check_label_shape(label_col, label_shape, output_shape)
    lows, highs = _values(stats, y.name, "min"), _values(stats, y.name, "max")
    spec = TensorSpec(name, label_shape, y.dtype, (dataclasses.replace(y, shape=label_shape),))
    if not lows:  # no rows, or every label is the loss's ignore_class
        return spec
    low, high = min(lows), max(highs)
    fractional = _total(stats, y.name, "fractional")
    if loss.expects_class_index:
        classes = int(output_shape[-1]) if output_shape else 1
        if fractional or low < 0 or high > classes - 1:
            raise SchemaError(class_index_message(label_col, classes, loss, low, high, fractional))
    elif loss.family == "hinge" and (low < -1 or high > 1 or fractional):
        raise SchemaError(
            f"label column {label_col!r} must hold -1/1 (or 0/1) labels under loss {loss.name!r}. "
            f"Received: values from {low:g} to {high:g}" + (f", {fractional} of them not integers" if fractional else "")
        )
    elif loss.family in ("binary", "categorical", "categorical_hinge", "kl_divergence") and (low < 0 or high > 1):
        raise SchemaError(
            f"label column {label_col!r} must hold values in [0, 1] under loss {loss.name!r} (one-hot or 0/1 labels; "
            f"for class indices use sparse_categorical_crossentropy). Received: values from {low:g} to {high:g}"
        )
    return spec
