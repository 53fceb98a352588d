"""``KerasModel.transform``: batched inference on the executors through ``mapInArrow``.

Each task converts each incoming Arrow batch to numpy, predicts in batches of ``batchSize``
rows with a model built once per Python worker, and appends ``prediction`` (and
``probability``) to the same batch. Rows never leave their batch, so row order, row count
and the row-to-prediction pairing are exact for any input: no ``zip``, no repartition,
no collect to the driver.
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
    """Plain values an inference task needs."""

    spec: ModelSpec
    features: ColumnSpec
    batch_size: int
    task: str
    prediction_col: str
    probability_col: str | None
    output_fields: tuple[str, ...]


def predict_partition(job: PredictSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Append predictions to every record batch of a partition, rows in input order."""
    from sparkdl.keras import runtime

    runtime.configure(TaskContext.get().cpus())
    from sparkdl.keras.predict import cached_model, predict_array, to_spark_outputs

    model = cached_model(job.spec)
    for batch in batches:
        x = column_to_numpy(batch.column(_TMP_FEATURES), job.features.name, job.features.shape, job.features.dtype)
        prediction, probability = to_spark_outputs(predict_array(model, x, job.batch_size), job.task)
        columns = [batch.column(name) for name in job.output_fields]
        names = list(job.output_fields)
        if prediction.ndim == 2:
            columns.append(pa.FixedSizeListArray.from_arrays(pa.array(prediction.reshape(-1)), prediction.shape[1]).cast(pa.list_(pa.float64())))
        else:
            columns.append(pa.array(prediction, pa.float64()))
        names.append(job.prediction_col)
        if job.probability_col is not None:
            columns.append(pa.FixedSizeListArray.from_arrays(pa.array(probability.reshape(-1)), probability.shape[1]).cast(pa.list_(pa.float32())))
            names.append(job.probability_col)
        yield pa.RecordBatch.from_arrays(columns, names=names)


def transform(df: DataFrame, spec: ModelSpec, features_col: str, prediction_col: str, probability_col: str, batch_size: int, task: str) -> DataFrame:
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
    job = PredictSpec(
        spec=spec,
        features=ColumnSpec(features_col, tuple(spec.input_shape), spec.input_dtype),
        batch_size=batch_size,
        task=task,
        prediction_col=prediction_col,
        probability_col=probability_col if classifier else None,
        output_fields=tuple(df.columns),
    )
    with_features = df.withColumn(_TMP_FEATURES, as_array(df, features_col, spec.input_dtype))
    return with_features.mapInArrow(lambda batches: predict_partition(job, batches), T.StructType(fields))
