"""DataFrame checks and column preparation on the driver, before any training job.

Feature columns may be a numeric scalar, ``array<numeric>`` or an ml/mllib vector (dense
or sparse); they are cast to ``array<T>`` of the model input's dtype, so tasks read plain
Arrow lists. Label columns may be a numeric scalar or an array/vector of numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.mllib.linalg import VectorUDT as MLlibVectorUDT
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdl.errors import SchemaError

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
    """The training DataFrame as tasks see it: two columns, ``num_workers`` partitions, cached.

    Attributes:
        df: persisted DataFrame with the feature column as ``array<T>`` and the label column.
        partition_rows: rows of each partition, by partition id.
        features: how tasks read the feature column.
        label: how tasks read the label column.
    """

    df: DataFrame
    partition_rows: tuple[int, ...]
    features: ColumnSpec
    label: ColumnSpec


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


def _label_expr(df: DataFrame, name: str) -> Column:
    data_type = df.schema[name].dataType
    if isinstance(data_type, (T.IntegerType, T.LongType, T.ShortType, T.ByteType)):
        return col(name).cast(T.LongType())
    if isinstance(data_type, (T.NumericType, T.BooleanType)):
        return col(name).cast(T.FloatType())
    return as_array(df, name, "float32")


def prepare_training_data(
    df: DataFrame,
    features_col: str,
    label_col: str,
    input_shape: tuple,
    input_dtype: str,
    output_shape: tuple,
    loss_name: str,
    num_workers: int,
) -> PreparedData:
    """Check, cast, partition and cache the training data.

    Schema checks run first, without a Spark job. Then one aggregate job counts rows per
    partition and checks nulls and feature lengths; errors are raised before any training.
    A DataFrame that already has ``num_workers`` partitions keeps its partitioning; any
    other is repartitioned round-robin.

    Args:
        df: the user's DataFrame.
        features_col: feature column name.
        label_col: label column name.
        input_shape: the model input's per-row shape, e.g. ``(28, 28, 1)``.
        input_dtype: the model input's numpy dtype name, e.g. ``"float32"``.
        output_shape: the model output's per-row shape, e.g. ``(10,)``.
        loss_name: canonical Keras loss name, for the label rule of :func:`check_label_shape`.
        num_workers: partitions (tasks) to train on.

    Returns:
        :class:`PreparedData` (the caller unpersists ``df`` when the fit ends).

    Raises:
        SchemaError: a missing or mistyped column, nulls (rows or elements), a feature length that
            does not match ``prod(input_shape)``, labels of unequal length or not fitting the model
            output, or an empty DataFrame.
    """
    check_feature_column(df, features_col)
    check_label_column(df, label_col)
    if features_col == label_col:
        raise SchemaError(f"featuresCol and labelCol must differ. Received: both {features_col!r}")
    size = int(np.prod(input_shape, dtype=np.int64))
    selected = df.select(as_array(df, features_col, input_dtype).alias(FEATURES), _label_expr(df, label_col).alias(LABEL))
    if df.rdd.getNumPartitions() != num_workers:
        selected = selected.repartition(num_workers)
    selected = selected.persist()
    label_is_array = isinstance(selected.schema[LABEL].dataType, T.ArrayType)
    label_size = F.size(LABEL) if label_is_array else F.lit(1)
    stats = (
        selected.groupBy(F.spark_partition_id().alias("p"))
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.sum(F.col(FEATURES).isNull().cast("long")).alias("feature_nulls"),
            F.sum(F.col(LABEL).isNull().cast("long")).alias("label_nulls"),
            F.sum(F.exists(FEATURES, lambda v: v.isNull()).cast("long")).alias("element_nulls"),
            F.min(F.size(FEATURES)).alias("min_size"),
            F.max(F.size(FEATURES)).alias("max_size"),
            F.min(label_size).alias("min_label"),
            F.max(label_size).alias("max_label"),
        )
        .collect()
    )
    try:
        rows = dict.fromkeys(range(num_workers), 0)
        for s in stats:
            rows[s["p"]] = s["rows"]
        total = sum(rows.values())
        if total == 0:
            raise SchemaError(f"the DataFrame must have at least one row to fit on. Received: 0 rows in column {features_col!r}")
        for column, key in ((features_col, "feature_nulls"), (label_col, "label_nulls")):
            nulls = sum(s[key] or 0 for s in stats)
            if nulls:
                raise SchemaError(f"column {column!r} must have no null values. Received: {nulls} null rows of {total}")
        element_nulls = sum(s["element_nulls"] or 0 for s in stats)
        if element_nulls:
            raise SchemaError(f"column {features_col!r} must have no null elements. Received: {element_nulls} rows with nulls inside")
        sizes = {s["min_size"] for s in stats} | {s["max_size"] for s in stats}
        if sizes != {size}:
            bad = sorted(sizes - {size})
            raise SchemaError(
                f"features column {features_col!r} must hold {size} values per row (the model input shape "
                f"{tuple(input_shape)} has {size}). Received rows of {bad[0] if bad else sorted(sizes)} values"
            )
        label_sizes = {s["min_label"] for s in stats} | {s["max_label"] for s in stats}
        if len(label_sizes) != 1:
            raise SchemaError(f"label column {label_col!r} must hold the same number of values in every row. Received lengths {sorted(label_sizes)}")
        label_shape = (label_sizes.pop(),) if label_is_array else ()
        check_label_shape(label_col, label_shape, output_shape, loss_name)
    except SchemaError:
        selected.unpersist()
        raise
    label_dtype = "int64" if isinstance(selected.schema[LABEL].dataType, T.LongType) else "float32"
    return PreparedData(
        df=selected,
        partition_rows=tuple(rows[p] for p in range(num_workers)),
        features=ColumnSpec(FEATURES, tuple(input_shape), input_dtype, features_col),
        label=ColumnSpec(LABEL, label_shape, label_dtype, label_col),
    )


def check_label_shape(label_col: str, label_shape: tuple, output_shape: tuple, loss_name: str) -> None:
    """Labels must fit the model output under the loss, checked before training.

    ``sparse_categorical_crossentropy`` takes one class index per row; other losses take
    ``prod(output_shape)`` values per row (a scalar when the model has one output).

    Raises:
        SchemaError: naming the column, the rule and the lengths found.
    """
    outputs = int(np.prod(output_shape, dtype=np.int64))
    values = int(np.prod(label_shape, dtype=np.int64))
    if loss_name == "sparse_categorical_crossentropy":
        if label_shape not in ((), (1,)):
            raise SchemaError(
                f"label column {label_col!r} must hold one class index per row for sparse_categorical_crossentropy "
                f"(use categorical_crossentropy for one-hot labels). Received {values} values per row"
            )
    elif values != outputs:
        raise SchemaError(
            f"label column {label_col!r} must hold {outputs} value(s) per row to match the model output shape "
            f"{tuple(output_shape)} under loss {loss_name!r}. Received {values} per row"
            + ("; for class indices use sparse_categorical_crossentropy" if values == 1 else "")
        )
