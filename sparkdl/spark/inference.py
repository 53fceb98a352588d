"""``KerasModel.transform``: batched inference on the executors through ``mapInArrow``.

Each task converts each incoming Arrow batch to numpy, predicts in batches of ``batchSize``
rows with a model built once per Python worker, and appends ``prediction`` (and
``probability``) to the same batch. Rows never leave their batch, so row order, row count
and the row-to-prediction pairing are exact for any input: no ``zip``, no repartition,
no collect to the driver. Input columns travel by position, so names with dots or
duplicate names (after a join) pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from sparkdl.errors import SchemaError
from sparkdl.keras.spec import ModelSpec
from sparkdl.serialization.columns import column_to_numpy
from sparkdl.spark.data import ColumnSpec, as_array, check_feature_column

_TMP_FEATURES = "__sparkdl_features"


@dataclass(frozen=True)
class PredictSpec:
    """Plain values an inference task needs; ``output_names`` are the (positional) output column names."""

    spec: ModelSpec
    features: ColumnSpec
    batch_size: int
    task: str
    from_logits: bool
    output_names: tuple[str, ...]


def _list_column(values: np.ndarray, value_type: pa.DataType) -> pa.Array:
    flat = pa.array(values.reshape(-1), value_type)
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1]).cast(pa.list_(value_type))


def predict_partition(job: PredictSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Append predictions to every record batch of a partition, rows in input order."""
    from sparkdl.keras import runtime

    runtime.configure(TaskContext.get().cpus())
    from sparkdl.keras.predict import cached_model, predict_array, to_spark_outputs

    model = cached_model(job.spec)
    for batch in batches:
        inputs = batch.num_columns - 1  # the temporary features column comes last
        x = column_to_numpy(batch.column(inputs), job.features.source, job.features.shape, job.features.dtype)
        prediction, probability = to_spark_outputs(predict_array(model, x, job.batch_size), job.task, job.from_logits)
        columns = [batch.column(i) for i in range(inputs)]
        columns.append(_list_column(prediction, pa.float64()) if prediction.ndim == 2 else pa.array(prediction, pa.float64()))
        if probability is not None:
            columns.append(_list_column(probability, pa.float32()))
        yield pa.RecordBatch.from_arrays(columns, names=list(job.output_names))


def transform(
    df: DataFrame,
    spec: ModelSpec,
    features_col: str,
    prediction_col: str,
    probability_col: str,
    batch_size: int,
    task: str,
    from_logits: bool = False,
) -> DataFrame:
    """The lazy DataFrame of ``df`` plus prediction columns; see the module docstring.

    Output columns: every input column, then ``prediction_col`` (double; ``array<double>`` for a
    regressor with several outputs) and, for classifiers, ``probability_col`` (``array<float>``).

    Raises:
        SchemaError: a missing or mistyped features column, or an output column that already exists.
    """
    check_feature_column(df, features_col)
    classifier = task == "classification"
    for name in (prediction_col, probability_col) if classifier else (prediction_col,):
        if name in df.columns:
            raise SchemaError(f"output column {name!r} must not exist in the input DataFrame. Received columns: {df.columns}")
    outputs = int(np.prod(spec.output_shape, dtype=np.int64))
    prediction_type = T.DoubleType() if classifier or outputs == 1 else T.ArrayType(T.DoubleType(), containsNull=False)
    fields = list(df.schema.fields) + [T.StructField(prediction_col, prediction_type, nullable=False)]
    if classifier:
        fields.append(T.StructField(probability_col, T.ArrayType(T.FloatType(), containsNull=False), nullable=False))
    # Columns travel under positional names and get their own names back afterwards: mapInArrow
    # resolves input names as expressions (dots break) and matches output names (duplicates break).
    names = [f"_{i}" for i in range(len(fields))]
    positional = df.toDF(*names[: len(df.columns)])
    job = PredictSpec(
        spec=spec,
        features=ColumnSpec(_TMP_FEATURES, tuple(spec.input_shape), spec.input_dtype, features_col),
        batch_size=batch_size,
        task=task,
        from_logits=from_logits,
        output_names=tuple(names),
    )
    features = names[df.columns.index(features_col)]
    with_features = positional.withColumn(_TMP_FEATURES, as_array(positional, features, spec.input_dtype))
    schema = T.StructType([T.StructField(name, f.dataType, f.nullable) for name, f in zip(names, fields, strict=True)])
    scored = with_features.mapInArrow(lambda batches: predict_partition(job, batches), schema)
    return scored.toDF(*[f.name for f in fields])
