"""DataFrame checks and column preparation on the driver, before any training job.

Feature columns may be a numeric scalar, ``array<numeric>`` or an ml/mllib vector (dense
or sparse); they are cast to ``array<T>`` of the model input's dtype, so tasks read plain
Arrow lists. Label columns may be a numeric scalar or an array/vector of numbers.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.mllib.linalg import VectorUDT as MLlibVectorUDT
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdl.errors import InvariantError, SchemaError

_SPARK_TYPES = {
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
class ColumnSpec:
    """How a task reads one column: its name in the task's DataFrame, the per-row shape, the
    numpy dtype, and the user's column name (``source``) for error messages."""

    name: str
    shape: tuple
    dtype: str
    source: str


@dataclass(frozen=True)
class PreparedData:
    """The training DataFrame as tasks see it: two columns, one partition per worker, cached.

    Attributes:
        df: persisted DataFrame with the feature column as ``array<T>`` and the label column.
        partition_rows: rows of each partition, by partition id, counted by a job over ``df``
            itself: ``len(partition_rows)`` is the number of partitions (workers) that train.
        features: how tasks read the feature column.
        label: how tasks read the label column.
    """

    df: DataFrame
    partition_rows: tuple[int, ...]
    features: ColumnSpec
    label: ColumnSpec

    @property
    def total_rows(self) -> int:
        return sum(self.partition_rows)


FEATURES, LABEL = "features", "label"  # column names inside the prepared training DataFrame


def col(name: str) -> Column:
    """A column by its exact name, dots and spaces included (backtick-quoted)."""
    return F.col("`" + name.replace("`", "``") + "`")


def _is_vector(data_type) -> bool:
    return isinstance(data_type, (VectorUDT, MLlibVectorUDT))


def _is_numeric_array(data_type) -> bool:
    return isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, (T.NumericType, T.BooleanType))


def _field(df: DataFrame, name: str, role: str) -> T.StructField:
    if name not in df.columns:
        raise SchemaError(f"{role} column {name!r} must exist in the DataFrame. Received columns: {df.columns}")
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
    element = _SPARK_TYPES.get(dtype, T.FloatType())
    if _is_vector(data_type):
        return vector_to_array(col(name), "float64" if dtype == "float64" else "float32").cast(T.ArrayType(element))
    if isinstance(data_type, T.ArrayType):
        return col(name).cast(T.ArrayType(element))
    return F.array(col(name).cast(element))


def expected_label(df: DataFrame, name: str, output_shape: tuple, loss) -> tuple[tuple, str]:
    """The per-row shape and numpy dtype tasks will read from label column ``name`` when it passes
    the check job, from the schema alone: for a dry run of the loss and metrics before any job.

    Returns:
        dtype ``"int64"`` for an integer column, else ``"float32"``; shape ``()`` for a scalar column,
        ``(1,)`` for an array under a sparse loss, ``output_shape`` for another array or vector.
    """
    data_type = df.schema[name].dataType
    scalar = isinstance(data_type, (T.NumericType, T.BooleanType))
    dtype = "int64" if isinstance(data_type, (T.IntegerType, T.LongType, T.ShortType, T.ByteType)) else "float32"
    if scalar:
        return (), dtype
    return ((1,) if loss.expects_class_index else tuple(output_shape)), dtype


def _label_expr(df: DataFrame, name: str) -> Column:
    data_type = df.schema[name].dataType
    if isinstance(data_type, (T.IntegerType, T.LongType, T.ShortType, T.ByteType)):
        return col(name).cast(T.LongType())
    if isinstance(data_type, (T.NumericType, T.BooleanType)):
        return col(name).cast(T.FloatType())
    return as_array(df, name, "float32")


STATS_DDL = (
    "partition int, rows bigint, feature_nulls bigint, feature_element_nulls bigint, feature_nans bigint, "
    "feature_min_len bigint, feature_max_len bigint, label_nulls bigint, label_element_nulls bigint, label_nans bigint, "
    "label_min_len bigint, label_max_len bigint, label_min double, label_max double, label_fractional bigint"
)
_STATS_SCHEMA = pa.schema(
    [("partition", pa.int32())]
    + [(name, pa.int64()) for name in ("rows", "feature_nulls", "feature_element_nulls", "feature_nans", "feature_min_len", "feature_max_len")]
    + [(name, pa.int64()) for name in ("label_nulls", "label_element_nulls", "label_nans", "label_min_len", "label_max_len")]
    + [("label_min", pa.float64()), ("label_max", pa.float64()), ("label_fractional", pa.int64())]
)


class _ColumnStats:
    """Running per-partition statistics of one model column, batch by batch (no concatenation,
    so a partition of more than 2**31 values is fine)."""

    def __init__(self, exclude: float | None = None) -> None:
        self.exclude = exclude  # a value left out of min, max and fractional (a loss's ignore_class)
        self.nulls = self.element_nulls = self.nans = self.fractional = 0
        self.min_len = self.max_len = None
        self.min = self.max = None

    def add(self, column: pa.Array) -> None:
        self.nulls += column.null_count
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            lengths = pc.min_max(pc.list_value_length(column))
            values = pc.list_flatten(column)
            self.element_nulls += values.null_count
            low, high = lengths["min"].as_py(), lengths["max"].as_py()
        else:
            values = column.drop_null()
            low = high = 1 if len(values) else None
        if low is not None:
            self.min_len = low if self.min_len is None else min(self.min_len, low)
            self.max_len = high if self.max_len is None else max(self.max_len, high)
        if pa.types.is_floating(values.type):
            bad = pc.or_(pc.is_nan(values), pc.is_inf(values))
            self.nans += pc.sum(bad).as_py() or 0
            values = pc.drop_null(pc.if_else(bad, None, values))
        if self.exclude is not None:
            values = values.filter(pc.not_equal(values, pa.scalar(self.exclude).cast(values.type)))
        if pa.types.is_floating(values.type):
            self.fractional += pc.sum(pc.not_equal(pc.floor(values), values)).as_py() or 0
        bounds = pc.min_max(values)
        for name, pick in (("min", min), ("max", max)):
            value = bounds[name].as_py()
            if value is not None:
                current = getattr(self, name)
                setattr(self, name, float(value) if current is None else pick(current, float(value)))


def _partition_stats(batches, ignore_label: float | None = None) -> Iterator[pa.RecordBatch]:
    """One row of statistics of the task's partition (one row even when it is empty);
    ``ignore_label`` is left out of the label's min, max and fractional count."""
    from pyspark import TaskContext

    rows = 0
    features, label = _ColumnStats(), _ColumnStats(ignore_label)
    for batch in batches:
        rows += batch.num_rows
        features.add(batch.column(0))
        label.add(batch.column(1))
    row = {
        "partition": TaskContext.get().partitionId(),
        "rows": rows,
        "feature_nulls": features.nulls,
        "feature_element_nulls": features.element_nulls,
        "feature_nans": features.nans,
        "feature_min_len": features.min_len,
        "feature_max_len": features.max_len,
        "label_nulls": label.nulls,
        "label_element_nulls": label.element_nulls,
        "label_nans": label.nans,
        "label_min_len": label.min_len,
        "label_max_len": label.max_len,
        "label_min": label.min,
        "label_max": label.max,
        "label_fractional": label.fractional,
    }
    yield pa.RecordBatch.from_pylist([row], schema=_STATS_SCHEMA)


def prepare_training_data(
    df: DataFrame,
    features_col: str,
    label_col: str,
    input_shape: tuple,
    input_dtype: str,
    output_shape: tuple,
    loss,
    num_workers: int,
    keep_partitioning: bool = False,
    run_job: Callable | None = None,
) -> PreparedData:
    """Check, cast, partition and cache the training data; count the rows of every partition.

    Schema checks run first, without a Spark job. The two model columns are then cast and, by
    default, spread round-robin over ``num_workers`` partitions (``repartition(n)``, which adaptive
    query execution never coalesces), so that workers are balanced and every worker gets rows from
    every input partition (label-sorted files do not make label-sorted shards). With ``keep_partitioning``
    the input's partitions are trained as they are, one worker each, however many there turn
    out to be at run time. The result is cached, and one job over the cached data itself counts
    rows per partition and checks nulls, NaNs, lengths and label values: the partition count and
    the rows per partition of the data that is trained are facts measured on it, never assumed.
    Errors are raised before any training job; the cache is released on every error path.

    Args:
        df: the user's DataFrame.
        features_col: feature column name.
        label_col: label column name.
        input_shape: the model input's per-row shape, e.g. ``(28, 28, 1)``.
        input_dtype: the model input's numpy dtype name, e.g. ``"float32"``.
        output_shape: the model output's per-row shape, e.g. ``(10,)``.
        loss: the loss descriptor (:class:`sparkdl.keras.losses.LossInfo`): its label rule.
        num_workers: partitions (workers) to train on, unless ``keep_partitioning``.
        keep_partitioning: train on the input's own partitions instead of repartitioning.
        run_job: ``run_job(action, description)`` runs the check job (see :mod:`sparkdl.spark.jobs`);
            ``None`` calls the action directly.

    Returns:
        :class:`PreparedData` (the caller unpersists ``df`` when the fit ends).

    Raises:
        SchemaError: a missing or mistyped column, nulls or NaNs (rows or elements), a feature length
            that does not match ``prod(input_shape)``, labels of unequal length, not fitting the model
            output, or outside the loss's range (class indices not integers in [0, classes)), or an
            empty DataFrame.
        InvariantError: the counted partitions are not the ``num_workers`` asked for.
    """
    check_feature_column(df, features_col)
    check_label_column(df, label_col)
    if features_col == label_col:
        raise SchemaError(f"featuresCol and labelCol must differ. Received: both {features_col!r}")
    size = int(np.prod(input_shape, dtype=np.int64))
    selected = df.select(as_array(df, features_col, input_dtype).alias(FEATURES), _label_expr(df, label_col).alias(LABEL))
    if not keep_partitioning:
        # Round-robin: balanced workers, each with rows from every input partition. (A hash of the
        # features would make the split independent of the input's partitioning, but puts equal
        # feature rows on one worker: 7 distinct rows gave one worker 3 times the other's rows.)
        selected = selected.repartition(num_workers)
    # The fit's own literal makes the cached plan unique to this fit: Spark's cache is keyed by plan,
    # so two concurrent fits on one DataFrame (CrossValidator(parallelism=2)) would otherwise share
    # one cache entry, and the first to finish would unpersist it under the other.
    selected = selected.withColumn("__sparkdl_fit", F.lit(secrets.randbits(63)))
    selected = selected.persist()
    try:
        ignore = getattr(loss, "ignore_class", None)
        counting = selected.mapInArrow(lambda batches: _partition_stats(batches, ignore), STATS_DDL)
        stats = sorted((run_job(counting.collect, "sparkdl: check and count training rows") if run_job else counting.collect()), key=lambda s: s["partition"])
        if [s["partition"] for s in stats] != list(range(len(stats))):
            raise InvariantError(f"the check job must report each partition once. Received partitions {[s['partition'] for s in stats]}")
        if not keep_partitioning and len(stats) != num_workers:
            raise InvariantError(f"the training data must have numWorkers={num_workers} partitions. Received: {len(stats)}")
        label_is_array = isinstance(selected.schema[LABEL].dataType, T.ArrayType)
        label_shape = _check_stats(stats, features_col, label_col, size, input_shape, output_shape, loss, label_is_array)
    except BaseException:
        selected.unpersist()
        raise
    label_dtype = "int64" if isinstance(selected.schema[LABEL].dataType, T.LongType) else "float32"
    return PreparedData(
        df=selected,
        partition_rows=tuple(int(s["rows"]) for s in stats),
        features=ColumnSpec(FEATURES, tuple(input_shape), input_dtype, features_col),
        label=ColumnSpec(LABEL, label_shape, label_dtype, label_col),
    )


def _total(stats, key: str) -> int:
    return sum(s[key] or 0 for s in stats)


def _check_stats(stats, features_col, label_col, size, input_shape, output_shape, loss, label_is_array: bool) -> tuple:
    """Raise on what the check job found wrong; return the label's per-row shape."""
    total = _total(stats, "rows")
    if total == 0:
        raise SchemaError(f"the DataFrame must have at least one row to fit on. Received: 0 rows in column {features_col!r}")
    for column, prefix in ((features_col, "feature"), (label_col, "label")):
        nulls = _total(stats, f"{prefix}_nulls")
        if nulls:
            raise SchemaError(f"column {column!r} must have no null values. Received: {nulls} null rows of {total}")
        element_nulls = _total(stats, f"{prefix}_element_nulls")
        if element_nulls:
            raise SchemaError(f"column {column!r} must have no null elements. Received: {element_nulls} null elements in {total} rows")
        nans = _total(stats, f"{prefix}_nans")
        if nans:
            raise SchemaError(f"column {column!r} must hold finite values. Received: {nans} NaN or infinite values in {total} rows")
    sizes = {s[k] for s in stats for k in ("feature_min_len", "feature_max_len") if s[k] is not None}
    if sizes != {size}:
        bad = sorted(sizes - {size})
        raise SchemaError(
            f"features column {features_col!r} must hold {size} values per row (the model input shape "
            f"{tuple(input_shape)} has {size}). Received rows of {bad[0] if bad else sorted(sizes)} values"
        )
    label_sizes = {s[k] for s in stats for k in ("label_min_len", "label_max_len") if s[k] is not None}
    if len(label_sizes) != 1:
        raise SchemaError(f"label column {label_col!r} must hold the same number of values in every row. Received lengths {sorted(label_sizes)}")
    label_shape = (label_sizes.pop(),) if label_is_array else ()
    loss.check_label_shape(label_col, label_shape, tuple(output_shape))
    lows = [s["label_min"] for s in stats if s["label_min"] is not None]
    highs = [s["label_max"] for s in stats if s["label_max"] is not None]
    if not lows:  # every label is the loss's ignore_class
        return label_shape
    low, high = min(lows), max(highs)
    fractional = _total(stats, "label_fractional")
    if loss.expects_class_index:
        classes = int(output_shape[-1]) if output_shape else 1
        if fractional or low < 0 or high > classes - 1:
            ignored = f" (or ignore_class={loss.ignore_class})" if loss.ignore_class is not None else ""
            raise SchemaError(
                f"label column {label_col!r} must hold integer class indices in [0, {classes - 1}]{ignored} for a model "
                f"with {classes} outputs under loss {loss.name!r}. Received: values from {low:g} to {high:g}"
                + (f", {fractional} of them not integers" if fractional else "")
            )
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
    return label_shape
