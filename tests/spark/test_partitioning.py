"""Issue 5 items 0 and 12: every row of a shuffled input is trained, once per epoch, whatever
the input's shape, adaptive query execution and the number of workers; partitions are measured,
not assumed; rows are spread over workers by default; the driver's invariants fail loudly."""

import warnings

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import keras
from sparkdl import KerasEstimator
from sparkdl.core.schedule import RoundPlan
from sparkdl.errors import InvariantError
from sparkdl.spark.backends.rounds.results import META, RESULT_SCHEMA, read_round
from sparkdl.keras.spec import ModelSpec
from sparkdl.spark.data import prepare_training_data, request_columns
from sparkdl.keras.losses import describe_loss
from tests.conftest import partitioned_df

N = 120
LR = 0.05


def _linear():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.set_weights([np.zeros((1, 1), np.float32), np.zeros(1, np.float32)])
    return model


def _base(spark):
    x = np.linspace(-1.0, 1.0, N)
    return spark.createDataFrame([(i, float(v), float(2 * v + 1)) for i, v in enumerate(x)], "k long, x double, y double")


def _full_batch_step():
    """One full-batch SGD step on all N rows in plain Keras: what any split into full-batch workers averages to."""
    x = np.linspace(-1.0, 1.0, N).astype(np.float32)[:, None]
    model = _linear()
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    model.fit(x, 2 * x[:, 0] + 1, batch_size=N, epochs=1, shuffle=False, verbose=0)
    return [w.ravel() for w in model.get_weights()]


SHAPES = {
    "orderBy": lambda b: b.orderBy(F.rand(1)),
    "groupBy.agg": lambda b: b.groupBy("k").agg(F.max("x").alias("x"), F.max("y").alias("y")),
    "distinct": lambda b: b.union(b).distinct(),
    "join": lambda b: b.join(b.select("k", F.lit(1).alias("one")).orderBy(F.rand(2)), "k"),
    "union": lambda b: b.filter("k < 50").union(b.filter("k >= 50").orderBy(F.rand(3))),
}


@pytest.fixture(params=["true", pytest.param("false", marks=pytest.mark.slow)], ids=["aqe-on", "aqe-off"])
def aqe(spark, request):
    before = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", request.param)
    yield request.param
    spark.conf.set("spark.sql.adaptive.enabled", before)


@pytest.mark.parametrize("shape", [s if s in ("orderBy", "groupBy.agg") else pytest.param(s, marks=pytest.mark.slow) for s in sorted(SHAPES)])
def test_every_row_of_a_shuffled_input_is_trained(spark, aqe, shape):
    """A 1,000-row orderBy input once trained on 5 rows. Now, for every input shape, AQE on and off,
    1-3 workers: rows trained == rows given, and one full-batch step per worker averages to the same
    weights as plain Keras's full-batch step on the unshuffled rows (row order and split cannot matter)."""
    df = SHAPES[shape](_base(spark))
    expected = _full_batch_step()
    for workers in (1, 2, 3):
        est = KerasEstimator(model=_linear(), optimizer=keras.optimizers.SGD(LR), loss="mse", featuresCol="x", labelCol="y",
                             numWorkers=workers, epochs=1, batchSize=N, verbose=0)
        fitted = est.fit(df)
        assert fitted.fitInfo["rows"] == N and sum(fitted.fitInfo["partition_rows"]) == N
        assert len(fitted.fitInfo["partition_rows"]) == workers
        got = [w.ravel() for w in fitted.getKerasModel().get_weights()]
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(g, e, atol=1e-6)


def test_keep_partitioning_trains_the_partitions_as_executed(spark):
    """With keepPartitioning the workers are the input's partitions as executed (AQE may coalesce them):
    their count is measured by the job over the cached data, and every row is trained."""
    df = _base(spark).orderBy(F.rand(4))
    est = KerasEstimator(model=_linear(), optimizer=keras.optimizers.SGD(LR), loss="mse", featuresCol="x", labelCol="y",
                         numWorkers=2, epochs=2, batchSize=N, keepPartitioning=True, verbose=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fitted = est.fit(df)
    workers = len(fitted.fitInfo["partition_rows"])  # AQE decides: 4 shuffle partitions, or fewer
    assert sum(fitted.fitInfo["partition_rows"]) == N and 1 <= workers <= 4
    assert any("keepPartitioning=True: training with" in str(w.message) for w in caught) == (workers != 2)


def test_rows_are_spread_over_workers_by_default(spark):
    """Label-sorted input partitions (all 0s, then all 1s) give each worker both labels by default,
    and keep their label-sorted shards only with keepPartitioning=True."""
    rows0 = [([float(i)], 0.0) for i in range(20)]
    rows1 = [([float(i)], 1.0) for i in range(20)]
    df = partitioned_df(spark, [rows0, rows1], "x array<float>, y double")
    loss = [describe_loss("binary_crossentropy")]  # one per output
    spec = ModelSpec.from_model(keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]))
    request = request_columns(df, spec, loss, "x", None, "y")
    for keep, mixed in ((False, True), (True, False)):
        data = prepare_training_data(df, request, loss, 2, keep_partitioning=keep)
        try:
            labels = data.df.groupBy(F.spark_partition_id().alias("p")).agg(F.countDistinct("y0").alias("n")).collect()
            assert all((r["n"] == 2) == mixed for r in labels), labels
            assert data.partition_rows == (20, 20)
        finally:
            data.df.unpersist()


def test_driver_refuses_a_round_that_lost_or_changed_a_partition():
    plan = RoundPlan((3, 2), batch_size=2)
    ok = {"piece": META, "rows": 0, "steps": 0, "missing": False}
    missing = pa.Table.from_pylist([{"partition": 0, "partition_rows": 3, **ok}], schema=RESULT_SCHEMA)
    with pytest.raises(InvariantError, match=r"one update per partition 0..1. Received partitions \[0\]"):
        read_round(missing, plan, "round 1", reduced=False)
    changed = pa.Table.from_pylist([{"partition": 0, "partition_rows": 3, **ok}, {"partition": 1, "partition_rows": 5, **ok}], schema=RESULT_SCHEMA)
    with pytest.raises(InvariantError, match="partition 1 must hold the 2 rows counted before training. Received: 5"):
        read_round(changed, plan, "round 1", reduced=False)


def test_diverging_training_fails_loudly_instead_of_returning_nan_weights(spark):
    df = _base(spark).withColumn("y", F.col("y") * 1e20)
    est = KerasEstimator(model=_linear(), optimizer=keras.optimizers.SGD(1e10), loss="mse", featuresCol="x", labelCol="y",
                         numWorkers=2, epochs=3, batchSize=8, verbose=0)
    with pytest.raises(InvariantError, match="master weights must stay finite"):
        est.fit(df)


def test_more_workers_than_rows_and_zero_one_labels_under_mse_warn_with_the_fits_own_counts(spark):
    """Issue 31: the empty workers are counted on the partitions trained (round-robin over 4 partitions
    from 2 input partitions left 2 of 4 empty where "workers - rows" said 1); labels all 0/1 under a
    regression loss warn, after the check job counted them, that a classifier's loss is probably meant."""
    df = spark.createDataFrame([([1.0], 0.0), ([2.0], 1.0), ([3.0], 1.0)], "x array<float>, y double")
    est = KerasEstimator(model=_linear(), optimizer=keras.optimizers.SGD(LR), loss="mse", featuresCol="x", labelCol="y",
                         numWorkers=4, epochs=1, batchSize=4, verbose=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fitted = est.fit(df)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    rows = fitted.fitInfo["partition_rows"]
    assert len(rows) == 4 and sum(rows) == 3 and rows.count(0) >= 1
    empty = [m for m in messages if "no rows to train on" in m]
    assert empty == [f"{rows.count(0)} of numWorkers=4 workers will have no rows to train on (the input's 3 rows went to "
                     f"{4 - rows.count(0)} partitions): lower numWorkers"]
    zero_one = [m for m in messages if "holds only 0 and 1" in m]
    assert len(zero_one) == 1 and zero_one[0].startswith("label column 'y' holds only 0 and 1, and loss 'mean_squared_error' "
                                                         "is a regression loss: a classifier's loss is probably meant")
    assert "BinaryClassificationEvaluator needs" in zero_one[0] and "rawPrediction" in zero_one[0]
    assert "rawPrediction" not in fitted.transform(df).columns  # what the warning says


def test_a_seeded_fit_on_a_shuffled_input_repeats_exactly(spark):
    """Rows reach each worker in shuffle-fetch order, which varies between runs; the partition is
    put in a content-defined order first, so two runs of one seeded fit (Dropout included) agree."""
    df = _base(spark).orderBy(F.rand(8))

    def fit():
        keras.utils.set_random_seed(4)
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dropout(0.3),
                                  keras.layers.Dense(1)])
        est = KerasEstimator(model=model, optimizer="adam", loss="mse", featuresCol="x", labelCol="y", numWorkers=2,
                             epochs=2, batchSize=8, localSteps=3, seed=9, verbose=0)
        return est.fit(df).getKerasModel().get_weights()

    first, second = fit(), fit()
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # the default run's 25-minute budget: tests/spark/test_data_labels.py::test_c03_int_one_hot_and_one_hot_encoder_labels_train_alike runs its kind
def test_c03_the_label_encoding_does_not_change_the_trained_model(spark):
    """C03: with one worker, int, double and one-hot labels of the same rows, and the same rows in another
    input partitioning, train the same model for the same seed (the worker orders its rows by their
    features, not by the label's bytes nor by their arrival order)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    y = rng.integers(0, 3, 64)
    rows = [([float(v) for v in xi], int(yi), float(yi), [float(yi == k) for k in range(3)]) for xi, yi in zip(x, y)]
    df = spark.createDataFrame(rows, "x array<float>, yi int, yd double, yoh array<double>")

    def fit(frame, label, loss):
        keras.utils.set_random_seed(6)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, activation="softmax")])
        est = KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.5), loss=loss, featuresCol="x", labelCol=label,
                             numWorkers=1, epochs=2, batchSize=8, seed=1, verbose=0)
        return est.fit(frame).getKerasModel().get_weights()

    reference = fit(df, "yi", "sparse_categorical_crossentropy")
    for frame, label, loss in ((df, "yd", "sparse_categorical_crossentropy"), (df, "yoh", "categorical_crossentropy"),
                               (df.repartition(5), "yi", "sparse_categorical_crossentropy")):
        for a, b in zip(fit(frame, label, loss), reference, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)
