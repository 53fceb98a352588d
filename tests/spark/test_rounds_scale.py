"""The rounds backend at cluster scale: updates combined on the executors, rounds that do not
re-read the data, updates cut into pieces, and limits checked before any job (C27)."""

import os

import numpy as np
from pyspark import SparkFiles
from pyspark.sql import functions as F

import sparkdl.spark.backends.rounds as rounds
from sparkdl import KerasEstimator
from sparkdl.core.state import ModelState
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


def test_updates_combined_on_the_executors_in_small_pieces_equal_the_driver_combination(spark, monkeypatch):
    on_driver = _fit(spark)
    monkeypatch.setattr(rounds, "EXECUTOR_REDUCE_MIN_BYTES", 0)
    monkeypatch.setattr(rounds, "PIECE_BYTES", 40)  # every kernel in several pieces
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
    from sparkdl.core.modes import SyncAveraging
    from sparkdl.spark.backends.base import FitResult

    first = _fit(spark, epochs=1)  # a reference: its first round read the data
    est = KerasEstimator(model=_mlp(), optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"], featuresCol="x",
                         labelCol="y", numWorkers=3, epochs=1, batchSize=8, localSteps=2, verbose=0)
    job, state = _train_job(spark, est)
    backend = rounds.RoundsBackend()
    task = _task(job)
    result = FitResult(state=state, rounds=1)  # as if mid-fit: the round starts with the job without rows
    result.info["rounds_reading_data"] = 0
    try:
        ids = job.data.df.select(F.lit(0).cast("byte").alias("_"))
        outcome = backend._round(spark, ids, job, task, result, rounds.RoundTask(0, 0, False, None), False, "test round")
        assert result.info["rounds_reading_data"] == 1 and not outcome.missing
        assert [w[1] for w in outcome.workers] == [8 * 2] * 3
        second = rounds.RoundTask(0, 1, True, None)
        result.state = SyncAveraging().apply_mean(result.state, outcome.mean, outcome.rows)
        result.rounds = 1
        outcome = backend._round(spark, ids, job, task, result, second, False, "test round 2")
        assert result.info["rounds_reading_data"] == 1  # now cached: the job without rows found them
        final = SyncAveraging().apply_mean(result.state, outcome.mean, outcome.rows)
    finally:
        job.data.df.unpersist()
    for a, b in zip(first.getKerasModel().get_weights(), final.weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def _train_job(spark, est):
    import uuid

    from sparkdl.config import FitConfig
    from sparkdl.core.schedule import RoundPlan
    from sparkdl.keras.losses import describe_loss
    from sparkdl.spark.backends.base import TrainJob
    from sparkdl.spark.data import prepare_training_data, request_columns

    spec, compile_spec = est._spec, est._compile_spec()
    df, loss = _df(spark), describe_loss("mse")
    data = prepare_training_data(df, request_columns(df, spec, loss, "x", None, "y"), loss, 3)
    config = FitConfig(num_workers=3, epochs=1, batch_size=8, local_steps=2, verbose=0)
    plan = RoundPlan(data.partition_rows, 8, 2)
    return TrainJob(uuid.uuid4().hex, spec, compile_spec, data, plan, config), ModelState(spec.weight_arrays(), None)


def _task(job):
    return rounds.TaskSpec(
        fit_id=job.fit_id, spec=job.spec.architecture_only(), compile_spec=job.compile_spec, columns=job.data.columns,
        plan=job.plan, batch_size=8, seed=0, shuffle=True, custom_objects={}, idle_s=3600.0,
        canonical_order=True,
    )


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
                         epochs=1, batchSize=4, verbose=0)
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


def test_c27_a_model_above_the_result_limit_fails_before_any_job_and_one_below_is_combined_on_the_executors(tmp_path):
    out = run_spark_script(C27_SCRIPT, tmp_path)
    assert out["jobs"] == 0, out
    assert "spark.driver.maxResultSize" in out["error"] and "1440" in out["error"], out["error"]
    assert "--conf spark.driver.maxResultSize=66m" in out["error"], out["error"]
    assert out["reduced_on_executors"] is True and out["rows"] == 24


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
    monkeypatch.setattr(rounds, "EXECUTOR_REDUCE_MIN_BYTES", 0)
    monkeypatch.setattr(rounds, "PIECE_BYTES", 40)
    on_executors = fit()
    assert on_executors.fitInfo["reduced_on_executors"] and on_executors.fitInfo["rounds"] == 2 * 3
    for a, b in zip(on_driver.getKerasModel().get_weights(), on_executors.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
