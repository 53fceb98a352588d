"""KerasModel.transform: exact row pairing on any input, Spark ML output columns."""

import numpy as np
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdl import KerasEstimator, KerasModel
from sparkdl.errors import SchemaError
from sparkdl.spark import inference
from tests.conftest import partitioned_df

import keras  # noqa: E402


def _identity_model(spark):
    """A fitted KerasModel whose Keras model is Dense(1) with weight 1, bias 0 (lr = 0 keeps it)."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.set_weights([np.ones((1, 1), np.float32), np.zeros(1, np.float32)])
    df = spark.createDataFrame([(float(i), float(i)) for i in range(8)], "x double, y double")
    est = KerasEstimator(model=model, optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse", featuresCol="x", labelCol="y",
                         numWorkers=2, batchSize=64, verbose=0)
    return est.fit(df)


@pytest.mark.backends  # also run under KERAS_BACKEND=jax and torch (make test, make test-all)
def test_c22_predictions_stay_paired_with_rows_on_shuffled_uncached_input(spark):
    fitted = _identity_model(spark)
    assert fitted.getTask() == "regression"
    # Non-deterministic upstream: shuffle to 7 partitions and a rand() filter; never cached.
    df = spark.range(1000).withColumn("x", F.col("id").cast("double")).repartition(7).filter(F.rand(11) >= 0.0)
    out = fitted.transform(df)
    assert out.columns == ["id", "x", "prediction"]
    rows = out.collect()
    assert len(rows) == 1000
    assert sorted(r["id"] for r in rows) == list(range(1000))
    assert all(r["prediction"] == r["x"] == float(r["id"]) for r in rows)  # batchSize 64: partial last batches too


def test_c22_row_order_within_partitions_is_kept(spark):
    fitted = _identity_model(spark).setBatchSize(7)
    df = partitioned_df(spark, [[(i, float(i)) for i in range(p * 100, p * 100 + 37)] for p in range(3)], "id long, x double")
    out = fitted.transform(df).collect()
    assert [r["id"] for r in out] == [i for p in range(3) for i in range(p * 100, p * 100 + 37)]
    assert [r["prediction"] for r in out] == [float(r["id"]) for r in out]


@pytest.mark.backends  # also run under KERAS_BACKEND=jax and torch (make test, make test-all)
def test_classifier_outputs_class_index_and_probabilities(spark):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="softmax")])
    rows = [([float(i), float(-i), 1.0], i % 4) for i in range(20)]
    df = spark.createDataFrame(rows, "features array<double>, label int")
    fitted = KerasEstimator(model=model, loss="sparse_categorical_crossentropy", numWorkers=2, epochs=1, verbose=0).fit(df)
    out = fitted.transform(df)
    assert dict(out.dtypes)["prediction"] == "double"
    assert dict(out.dtypes)["probability"] == "vector" and dict(out.dtypes)["rawPrediction"] == "vector"
    got = out.collect()
    x = np.array([r["features"] for r in got], np.float32)
    expected = fitted.getKerasModel().predict(x, verbose=0)
    np.testing.assert_allclose(np.array([r["probability"] for r in got]), expected, rtol=1e-5, atol=1e-6)
    assert [r["prediction"] for r in got] == expected.argmax(axis=1).astype(float).tolist()


def test_binary_sigmoid_gives_two_class_probability(spark):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, activation="sigmoid")])
    model.set_weights([np.ones((1, 1), np.float32), np.zeros(1, np.float32)])
    df = spark.createDataFrame([(-2.0, 0.0), (0.0, 1.0), (3.0, 1.0)], "features double, label double")
    fitted = KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.0), loss="binary_crossentropy", numWorkers=1, verbose=0).fit(df)
    got = fitted.transform(df).collect()
    p = 1 / (1 + np.exp(-np.array([-2.0, 0.0, 3.0])))
    np.testing.assert_allclose([r["probability"][1] for r in got], p, rtol=1e-6)
    np.testing.assert_allclose([r["probability"][0] for r in got], 1 - p, rtol=1e-6)
    assert [r["prediction"] for r in got] == [0.0, 1.0, 1.0]


def test_existing_output_column_is_rejected_without_a_job(spark):
    fitted = _identity_model(spark)
    df = spark.createDataFrame([(1.0, 2.0)], "x double, prediction double")
    with pytest.raises(SchemaError, match="output column 'prediction' must not exist"):
        fitted.transform(df)


def test_vector_and_array_feature_columns_predict_alike(spark):
    """C01/C07 kind: ml DenseVector, SparseVector, array<double> and array<float> give identical predictions."""
    from pyspark.ml.linalg import DenseVector, SparseVector, VectorUDT

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    fitted = KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.0), loss="mse", numWorkers=1, verbose=0).fit(
        spark.createDataFrame([([0.1, 0.2, 0.3], [0.0, 1.0])], "features array<double>, label array<double>")
    )
    vectors = spark.createDataFrame(
        [(0, DenseVector([1.0, 0.0, 0.0])), (1, SparseVector(3, {0: 1.0})), (2, DenseVector([0.4, 0.5, 0.6]))],
        T.StructType([T.StructField("id", T.IntegerType()), T.StructField("features", VectorUDT())]),
    )
    arrays = spark.createDataFrame([(0, [1.0, 0.0, 0.0]), (1, [1.0, 0.0, 0.0]), (2, [0.4, 0.5, 0.6])], "id int, features array<float>")
    a = [r["prediction"] for r in fitted.transform(vectors).orderBy("id").collect()]
    b = [r["prediction"] for r in fitted.transform(arrays).orderBy("id").collect()]
    assert a == b
    assert a[0] == a[1]
    assert len(a[0]) == 2  # a regressor with 2 outputs writes array<double>


@pytest.mark.parametrize("units, loss", [(1, keras.losses.BinaryCrossentropy(from_logits=True)),
                                         (3, keras.losses.SparseCategoricalCrossentropy(from_logits=True))])
def test_from_logits_losses_give_probabilities(spark, units, loss):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(units)])
    kernel = np.array([[1.0] * units, [-0.5] * units], np.float32) * np.arange(1, units + 1, dtype=np.float32)
    model.set_weights([kernel, np.full(units, 0.25, np.float32)])
    df = spark.createDataFrame([([0.0, 0.0], 0), ([1.0, 3.0], 1), ([2.0, -1.0], 0)], "features array<double>, label int")
    fitted = KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.0), loss=loss, numWorkers=1, verbose=0).fit(df)
    got = fitted.transform(df).collect()
    logits = np.array([r["features"] for r in got], np.float32) @ kernel + 0.25
    if units == 1:
        p1 = 1 / (1 + np.exp(-logits[:, 0]))
        expected = np.stack([1 - p1, p1], axis=1)
    else:
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        expected = e / e.sum(axis=1, keepdims=True)
    probability = np.array([r["probability"] for r in got])
    np.testing.assert_allclose(probability, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(probability.sum(axis=1), 1.0, rtol=1e-6)
    assert [r["prediction"] for r in got] == expected.argmax(axis=1).astype(float).tolist()


@pytest.mark.skipif(not inference.ARROW_UDF, reason="pyspark 4.0 scores through mapInArrow, which sends every column to Python")
def test_columns_the_model_does_not_read_pass_through_whatever_their_type(spark):
    """Only the model's input columns go to Python (pyspark 4.1+): an interval column, which Arrow
    cannot carry, passes through beside them."""
    fitted = _identity_model(spark)
    df = spark.createDataFrame([(float(i), i) for i in range(4)], "x double, days int")
    df = df.withColumn("gap", F.make_interval(F.lit(0), F.lit(0), F.lit(0), F.col("days")))
    rows = fitted.transform(df).select("days", "prediction", F.col("gap").cast("string").alias("gap")).orderBy("days").collect()
    assert [(r["prediction"], r["gap"]) for r in rows] == [(0.0, "0 seconds"), (1.0, "1 days"), (2.0, "2 days"), (3.0, "3 days")]


def test_dotted_and_duplicate_column_names_pass_through(spark):
    fitted = _identity_model(spark).setFeaturesCol("my.x")
    left = spark.createDataFrame([(i, float(i)) for i in range(10)], "k long, `my.x` double")
    right = spark.createDataFrame([(i, f"r{i}") for i in range(10)], "k long, `a b` string")
    joined = left.join(right, left["k"] == right["k"])  # two columns named k
    out = fitted.transform(joined)
    assert out.columns == ["k", "my.x", "k", "a b", "prediction"]
    rows = out.collect()
    assert len(rows) == 10 and all(r[4] == r[1] == float(r[0]) for r in rows)


@keras.saving.register_keras_serializable(package="sparkdl_tests")
class RowsInCall(keras.layers.Layer):
    """Outputs, for every row, the number of rows of the predict call that scored it."""

    def call(self, x):
        return keras.ops.ones_like(x[:, :1]) * keras.ops.cast(keras.ops.shape(x)[0], "float32")


@pytest.mark.parametrize("params, calls", [
    ({}, [64, 64, 64, 8]),  # None: 16 MiB of the largest per-row tensor (Dense(65536): 256 kB a row) = 64 rows
    ({"batchSize": 100}, [100, 100]),  # never fewer than batchSize
    ({"inferenceBatchSize": 50}, [50, 50, 50, 50]),  # set: as given
])
def test_predict_calls_are_sized_by_the_models_largest_tensor_unless_set(spark, params, calls):
    x = keras.Input((2,))
    model = keras.Model(x, RowsInCall()(keras.layers.Dense(65536)(x)))
    df = spark.createDataFrame([(i, [float(i), 1.0]) for i in range(200)], "id long, x array<float>").coalesce(1)
    scored = KerasModel.fromKeras(model, featuresCol="x", loss="mse", **params).transform(df).orderBy("id").collect()
    assert [r["prediction"] for r in scored] == [float(c) for c in calls for _ in range(c)]
