"""The rounds transport at cluster scale: updates combined on the executors, rounds that do not
re-read the data, updates cut into pieces, and limits checked before any job (C27)."""

import os

import numpy as np
import pytest
from pyspark import SparkFiles
from pyspark.sql import functions as F

import sparkdl.spark.training.job as job_module
import sparkdl.spark.backends.rounds.reduce as reduce_module
from sparkdl import KerasEstimator
from sparkdl.core.state import FitState, ModelState
from tests.conftest import run_spark_script

import keras  # noqa: E402  (conftest selected the backend)


def _mlp():
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1)])


def _df(spark, n=90):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    return spark.createDataFrame([(row.tolist(), float(v)) for row, v in zip(x, y)], "x array<float>, y double").orderBy("y")


def _fit(spark, **params):
    params = {"numWorkers": 3, "epochs": 2, "batchSize": 8, "localSteps": 2, "verbose": 0, **params}
    est = KerasEstimator(model=_mlp(), optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"], featuresCol="x",
                         labelCol="y", **params)
    return est.fit(_df(spark))


@pytest.mark.slow  # the executors' combination runs by default in the C27 and one-worker tests below
def test_updates_combined_on_the_executors_in_small_pieces_equal_the_driver_combination(spark, monkeypatch):
    on_driver = _fit(spark)
    monkeypatch.setattr(reduce_module, "EXECUTOR_REDUCE_MIN_BYTES", 0)
    monkeypatch.setattr(job_module, "PIECE_BYTES", 40)  # every kernel in several pieces
    on_executors = _fit(spark)
    assert on_driver.fitInfo["reduced_on_executors"] is False
    assert on_executors.fitInfo["reduced_on_executors"] is True
    for a, b in zip(on_driver.getKerasModel().get_weights(), on_executors.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(on_driver.history["loss"], on_executors.history["loss"], rtol=1e-6)
    np.testing.assert_allclose(on_driver.optimizerState[0], on_executors.optimizerState[0])  # Adam's iteration count
    assert on_driver.fitInfo["rounds"] == 2 * 2  # 30 rows per worker: 4 steps of 8, τ = 2


def test_rounds_after_the_first_read_no_data_and_the_fit_leaves_nothing_behind(spark):
    fitted = _fit(spark)
    assert fitted.fitInfo["rounds"] == 4
    assert fitted.fitInfo["rounds_reading_data"] == 1  # the first round; the other three read no rows
    spill = os.path.join(SparkFiles.getRootDirectory(), f"sparkdl-{fitted.fitInfo['fit_id']}")
    assert not os.path.exists(spill)  # local mode: the executors' disk is this one


def test_a_round_whose_partitions_are_in_no_cache_reads_the_data_again_with_the_same_result(spark):
    """A fresh fit id is in no Python worker's cache and on no executor's disk: the job without rows
    reports every partition missing, and the round runs again over the cached data."""
    from sparkdl.core.modes import get_policy
    from sparkdl.spark.training.contract import RoundOrders
    from sparkdl.spark.backends.rounds.driver import RoundsTransport

    first = _fit(spark, epochs=1)  # a reference: its first round read the data
    est = KerasEstimator(model=_mlp(), optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"], featuresCol="x",
                         labelCol="y", numWorkers=3, epochs=1, batchSize=8, localSteps=2, verbose=0)
    job, state = _train_job(spark, est)
    policy = get_policy("sync")
    transport = RoundsTransport(job, policy)
    fit = FitState({}, state)
    try:
        transport.start(fit)
        transport._rounds_run = 1  # as if mid-fit: the round starts with the job without rows
        for r in range(2):
            orders = RoundOrders(0, r, r, r == 1, policy.starts(fit), None, False, f"test round {r + 1}")
            report = transport.run_round(orders)
            assert transport.info()["rounds_reading_data"] == 1  # now cached: the second job without rows found them
            assert [n for _, n in report.workers] == [16, 14][r:r + 1] * 3  # 30 rows a partition: 16 (2 steps of 8), then 14
            fit.master = policy.apply(fit, report.updates).master
    finally:
        transport.close()
        job.data.df.unpersist()
    for a, b in zip(first.getKerasModel().get_weights(), fit.master.weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def _train_job(spark, est):
    import uuid

    from sparkdl.config import FitConfig
    from sparkdl.core.schedule import RoundPlan
    from sparkdl.keras.losses import describe_loss
    from sparkdl.keras.metrics import MetricReader
    from sparkdl.keras.replica import initial_optimizer, trainable_mask
    from sparkdl.serialization.arrow_codec import decode_arrays
    from sparkdl.spark.data import prepare_training_data, request_columns
    from sparkdl.spark.training.job import TrainJob

    spec, compile_spec = est._spec, est._compile_spec()
    df, loss = _df(spark), [describe_loss("mse")]  # one per output
    request = request_columns(df, spec, loss, "x", None, "y")
    data = prepare_training_data(df, request, loss, 3)
    config = FitConfig(num_workers=3, epochs=1, batch_size=8, local_steps=2, verbose=0)
    plan = RoundPlan(data.partition_rows, 8, 2)
    reader = MetricReader.for_columns(spec, compile_spec, data.columns)
    job = TrainJob(uuid.uuid4().hex, spec, compile_spec, data, plan, config, reader, tuple(decode_arrays(spec.weights).names),
                   tuple(trainable_mask(reader.model)))
    return job, ModelState(spec.weight_arrays(), initial_optimizer(reader.model))


C27_SCRIPT = """
import json, sys
import numpy as np
import keras
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.maxResultSize", "1m").getOrCreate())
from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError
df = spark.createDataFrame([([float(i % 7)] * 8, float(i % 3)) for i in range(24)], "x array<float>, y double")
out = {}
def fit(units, workers):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(units), keras.layers.Dense(1)])
    est = KerasEstimator(model=model, optimizer="adam", loss="mse", featuresCol="x", labelCol="y", numWorkers=workers,
                         epochs=1, batchSize=4, verbose=0, backend="rounds")  # rounds' updates come back as task results
    return est.fit(df)
jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
try:
    fit(12000, 2)  # (8 + 1 + 1) x 12000 + 1 = 120,001 weights; with Adam's two moments 1.44 MB per worker
except ConfigError as exc:
    out["error"] = str(exc)
out["jobs"] = len(spark.sparkContext.statusTracker().getJobIdsForGroup()) - jobs_before
# 3 workers x 0.48 MB does not fit 1 MiB on the driver, one combined update does: the executors combine
fitted = fit(4000, 3)
out["reduced_on_executors"] = fitted.fitInfo["reduced_on_executors"]
out["rows"] = fitted.fitInfo["rows"]
json.dump(out, open(sys.argv[1], "w"))
"""


@pytest.mark.slow  # the default run's 25-minute budget: a 2-stage reduce of a large model (35 s)
def test_c27_a_model_above_the_result_limit_fails_before_any_job_and_one_below_is_combined_on_the_executors(tmp_path):
    out = run_spark_script(C27_SCRIPT, tmp_path)
    assert out["jobs"] == 0, out
    assert "spark.driver.maxResultSize" in out["error"] and "1440" in out["error"], out["error"]
    assert "--conf spark.driver.maxResultSize=66m" in out["error"], out["error"]
    assert out["reduced_on_executors"] is True and out["rows"] == 24


@pytest.mark.slow  # the executors' combination runs by default in C27
def test_rounds_where_one_worker_trains_alone_combine_on_the_executors_as_on_the_driver(spark, monkeypatch):
    """Partitions of 40, 8 and 8 rows, batch 8, τ = 2: rounds 2 and 3 of each epoch have one worker."""
    from tests.conftest import partitioned_df

    rng = np.random.default_rng(5)
    rows = [([float(v) for v in rng.normal(size=4)], float(rng.normal())) for _ in range(56)]
    df = partitioned_df(spark, [rows[:40], rows[40:48], rows[48:]], "x array<float>, y double")

    def fit():
        est = KerasEstimator(model=_mlp(), optimizer=keras.optimizers.Adam(0.01), loss="mse", featuresCol="x", labelCol="y",
                             numWorkers=3, epochs=2, batchSize=8, localSteps=2, keepPartitioning=True, verbose=0)
        return est.fit(df)

    on_driver = fit()
    monkeypatch.setattr(reduce_module, "EXECUTOR_REDUCE_MIN_BYTES", 0)
    monkeypatch.setattr(job_module, "PIECE_BYTES", 40)
    on_executors = fit()
    assert on_executors.fitInfo["reduced_on_executors"] and on_executors.fitInfo["rounds"] == 2 * 3
    for a, b in zip(on_driver.getKerasModel().get_weights(), on_executors.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
