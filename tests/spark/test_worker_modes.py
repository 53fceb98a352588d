"""Modes easgd and gossip, 1bit and threshold updates, and straggler-tolerant rounds on backend rounds (issue 9)."""

import time

import numpy as np
import pytest

from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError
from sparkdl.spark.training import faults
from tests.conftest import jobs_started

import keras  # noqa: E402


def _data(spark, rows=96):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    return spark.createDataFrame([(x[i].tolist(), int(np.argmax(x[i, :3]))) for i in range(rows)], "x array<float>, y int")


def _model(hidden=None):
    keras.utils.set_random_seed(0)
    extra = [keras.layers.Dense(hidden, activation="relu")] if hidden else []  # a (hidden, hidden) kernel
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(hidden or 8, activation="relu"), keras.layers.BatchNormalization(),
                             *extra, keras.layers.Dense(3, activation="softmax")])


def _fit(spark, df=None, hidden=None, **params):
    settings = dict(model=_model(hidden), optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                    featuresCol="x", labelCol="y", numWorkers=2, epochs=2, batchSize=8, localSteps=2, verbose=0,
                    backend="rounds")
    settings.update(params)
    return KerasEstimator(**settings).fit(df if df is not None else _data(spark))


def _weights(model):
    return model.getKerasModel().get_weights()


@pytest.mark.slow  # the default run's 25-minute budget: tests/unit/test_worker_modes.py runs the rules; tests/spark/test_ps_round_modes.py runs bmuf end to end
def test_gossip_with_two_workers_equals_sync_and_easgd_one_round_is_the_closed_form(spark):
    """Two workers of 48 rows each: every gossip round pairs them, so it is sync's equal-weight
    average. One round of easgd from x̃₀: x̃ = x̃₀ + α·Σᵢ(xᵢ − x̃₀) = x̃₀ + 2α·(sync − x̃₀)."""
    sync = _fit(spark)
    gossip = _fit(spark, mode="gossip")
    assert gossip.fitInfo["mode"] == "gossip" and gossip.fitInfo["backend"] == "rounds" and gossip.fitInfo["rounds"] == 6
    for a, b in zip(_weights(sync), _weights(gossip), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(gossip.history["loss"], sync.history["loss"], atol=1e-6)

    one_round = dict(epochs=1, localSteps=None)
    sync1 = _fit(spark, **one_round)
    easgd = _fit(spark, mode="easgd", elasticForce=0.3, **one_round)
    keras.utils.set_random_seed(0)
    start = _model().get_weights()
    for x0, s, e in zip(start, _weights(sync1), _weights(easgd), strict=True):
        np.testing.assert_allclose(e, x0 + 0.6 * (s - x0), atol=1e-6)


@pytest.mark.slow
def test_easgd_and_gossip_with_three_workers_learn(spark):
    df = _data(spark, 192).orderBy("y")  # out of a shuffle: AQE picks the partition count at run time
    for mode in ("easgd", "gossip"):
        fitted = _fit(spark, df, mode=mode, numWorkers=3, epochs=4, optimizer=keras.optimizers.Adam(0.02))
        assert np.isfinite(fitted.history["loss"]).all()
        assert fitted.history["loss"][-1] < 0.75 * fitted.history["loss"][0], (mode, fitted.history["loss"])


# In make test-all: the bytes a quantized update saves are asserted by default in
# test_asynchronous_pushes_quantized_with_fewer_bytes (1bit) and test_bmuf.py (fp16), 1bit rounds by test_c12 and test_resume.py.
@pytest.mark.parametrize("compression,ratio", [pytest.param("1bit", 16, marks=pytest.mark.slow), pytest.param("threshold", 8, marks=pytest.mark.slow)])
def test_quantized_updates_learn_with_far_fewer_bytes(spark, compression, ratio):
    """Bytes counted from what the tasks sent: Adam's weights and moments for the full update; the
    quantized payload only (the optimizer state stays on the workers). The residual and optimizer
    state are found by every worker in every round (local[2]: one executor's disk). Learning is
    judged on the fitted model's loss over the rows, against the untrained model's: an epoch's
    running loss on this toy is noisy in full precision too (1.47, 0.71, 0.67, 0.43)."""
    df = _data(spark, 192)
    settings = dict(optimizer=keras.optimizers.Adam(0.01), epochs=4, hidden=256)  # 68k weights: Arrow's framing is small beside them
    full = _fit(spark, df, **settings)
    small = _fit(spark, df, compression=compression, compressionThreshold=0.01, **settings)
    assert small.fitInfo["compression"] == compression and small.fitInfo["local_state_resets"] == 0
    assert full.fitInfo["update_bytes"] >= ratio * small.fitInfo["update_bytes"], (full.fitInfo["update_bytes"], small.fitInfo["update_bytes"])
    assert np.isfinite(small.history["loss"]).all()
    rows = df.toPandas()
    x, y = np.stack(rows["x"]).astype(np.float32), rows["y"].to_numpy()
    untrained, fitted = _model(256), small.getKerasModel()
    for model in (untrained, fitted):
        model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    before, (after, accuracy) = untrained.evaluate(x, y, verbose=0)[0], fitted.evaluate(x, y, verbose=0)
    assert after < 0.6 * before and accuracy > 0.8, (before, after, accuracy, small.history["loss"])  # 1.1 -> 0.43..0.53 on 4 data seeds


@pytest.mark.slow  # the default run's 25-minute budget: tests/unit/test_compression_quantized.py and test_faults.py's ssp fit run its parts
def test_asynchronous_pushes_quantized_with_fewer_bytes(spark):
    """hogwild on ps with 1bit pushes: every push but each worker's last is a quantized Δ (the last
    goes in full precision with the residual and the optimizer state, so nothing is left behind)."""
    df = _data(spark, 192)
    settings = dict(mode="hogwild", backend="ps", optimizer=keras.optimizers.Adam(0.01), epochs=4, hidden=256)
    full = _fit(spark, df, **settings)
    small = _fit(spark, df, compression="1bit", **settings)
    assert small.fitInfo["compression"] == "1bit" and small.fitInfo["update_bytes"] == small.fitInfo["bytes_pushed"]
    assert full.fitInfo["bytes_pushed"] >= 4 * small.fitInfo["bytes_pushed"], (full.fitInfo["bytes_pushed"], small.fitInfo["bytes_pushed"])
    # asynchronous Adam(0.01) on this toy is noisy even in full precision (loss 1.9, 2.0, 2.5, 1.2): check it learned
    assert np.isfinite(small.history["loss"]).all() and small.history["accuracy"][-1] > 0.7, small.history


@pytest.mark.parametrize("backend", [pytest.param("rounds", marks=pytest.mark.slow), "ps"])  # rounds: test_resume.py runs its straggler path
def test_a_straggler_is_dropped_when_the_minimum_has_arrived(spark, backend):
    """Partition 1 sleeps 2 s before its local steps in every round (a fault-injection hook): waiting
    for it costs 3 × 2 s; with minWorkersPerRound=1 each round closes with partition 0 alone,
    partition 1's late update is dropped and it sits out (rounds) or skips (ps) the rounds that
    closed meanwhile. On rounds, each straggler job runs one task: the tasks of the fit's rounds
    equal its workers' jobs, not workers² (issue 22)."""
    df = _data(spark).cache()
    df.count()
    settings = dict(epochs=1, localSteps=2, backend=backend)  # 3 rounds
    _fit(spark, df, **settings)  # warm Python workers
    group = f"straggler-tasks-{backend}"
    fitted = []
    with faults.inject(faults.Delay(partition=1, seconds=2)):
        started = time.perf_counter()
        waiting = _fit(spark, df, **settings)
        waited_s = time.perf_counter() - started
        started = time.perf_counter()
        jobs_started(spark, lambda: fitted.append(_fit(spark, df, minWorkersPerRound=1, **settings)), group)
        tolerant_s = time.perf_counter() - started
    assert "updates_dropped" not in waiting.fitInfo and waited_s > 6  # 3 rounds x 2 s of sleep: a lower bound
    del tolerant_s  # its time depends on the machine's load; what it dropped does not (below)
    tolerant = fitted[0]
    if backend == "rounds":  # after the first round (over the data), each straggler job runs one task
        tracker = spark.sparkContext.statusTracker()
        jobs = [tracker.getJobInfo(j) for j in sorted(tracker.getJobIdsForGroup(group))]
        tasks = [tracker.getStageInfo(max(job.stageIds)).numTasks for job in jobs]  # each job's result stage (its own)
        later = tasks[max(i for i, n in enumerate(tasks) if n > 1) + 1:]
        assert len(later) >= 2 and set(later) == {1}, tasks
    info = tolerant.fitInfo
    assert info["min_workers_per_round"] == 1 and info["updates_dropped"] == 3 and info["dropped_per_round"] == [[1]] * 3
    assert info["rows_dropped"] == 48 and np.isfinite(tolerant.history["loss"]).all()


def test_straggler_settings_are_checked():
    with pytest.raises(ConfigError, match="minWorkersPerRound must be"):
        KerasEstimator(minWorkersPerRound=0)._fit_config()
    with pytest.raises(ConfigError, match="minWorkersPerRound must be"):
        KerasEstimator(minWorkersPerRound=1.5)._fit_config()
    with pytest.raises(ConfigError, match="roundDeadline"):
        KerasEstimator(minWorkersPerRound=1, roundDeadline=-1.0)._fit_config()
    assert KerasEstimator(minWorkersPerRound=0.5)._fit_config().min_workers(3) == 2
    with pytest.raises(ConfigError, match="compressionThreshold"):
        KerasEstimator(compression="threshold", compressionThreshold=0.0)._fit_config()
    with pytest.raises(ConfigError, match="asynchronous modes have no rounds"):
        KerasEstimator(mode="async", minWorkersPerRound=1)._fit_config()


@pytest.mark.slow  # the default run's 25-minute budget: tests/spark/test_fit.py::test_c12_batchnorm_moving_statistics_are_row_weighted_averages runs its kind
@pytest.mark.parametrize("compression", ["1bit", pytest.param("threshold", marks=pytest.mark.slow)])
def test_c12_batchnorm_statistics_travel_exactly_with_quantized_updates(spark, compression):
    """C12 with quantized updates: partition feature scales 30 and 0.01 (the moving variance of
    feature 1 is ~900 on one worker and ~1e-4 on the other). A shared 1-bit reconstruction value
    per vector turned the small variance negative and every prediction NaN; the non-trainable
    weights now travel in full precision, so the statistics equal an uncompressed fit's."""
    from tests.conftest import partitioned_df

    rng = np.random.default_rng(1)

    def rows(n, s0):
        x = np.stack([rng.normal(size=n) * s0, rng.normal(size=n) * 0.01, rng.normal(size=n), rng.normal(size=n)], 1)
        return [(x[i].astype(np.float32).tolist(), float(x[i, 2] > 0)) for i in range(n)]

    df = partitioned_df(spark, [rows(60, 30.0), rows(60, 0.01)], "x array<float>, y double")

    def fit(comp):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(momentum=0.5),
                                  keras.layers.Dense(1, activation="sigmoid")])
        return KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy", featuresCol="x",
                              labelCol="y", batchSize=10, keepPartitioning=True, verbose=0, numWorkers=2, epochs=2, localSteps=1,
                              seed=7, compression=comp).fit(df)

    plain, small = fit(None), fit(compression)
    bn, bn_plain = small.getKerasModel().layers[0], plain.getKerasModel().layers[0]
    assert (bn.moving_variance.numpy() > 0).all()
    np.testing.assert_allclose(bn.moving_mean.numpy(), bn_plain.moving_mean.numpy(), rtol=0.05, atol=1e-3)
    np.testing.assert_allclose(bn.moving_variance.numpy(), bn_plain.moving_variance.numpy(), rtol=0.05, atol=1e-3)
    predictions = np.array([r["prediction"] for r in small.transform(df).select("prediction").collect()])
    assert np.isfinite(predictions).all() and set(np.unique(predictions)) <= {0.0, 1.0}


@pytest.mark.parametrize("backend", [pytest.param("rounds", marks=pytest.mark.slow), "ps"])
def test_a_round_waits_for_the_minimum_of_workers_with_rows(spark, backend):
    """Partitions of 48 and 10 rows, batch 8, τ = 1: partition 1 has rows in rounds 1-2 only. A
    round whose only worker with rows is still busy with a late job (rounds) waits for it, and a
    push of no rows (ps) is no update: from round 3 on partition 0 trains in every round."""
    from tests.conftest import partitioned_df

    rng = np.random.default_rng(0)
    parts = [[(rng.normal(size=4).astype(np.float32).tolist(), int(i % 3)) for i in range(n)] for n in (48, 10)]
    df = partitioned_df(spark, parts, "x array<float>, y int")
    fitted = _fit(spark, df, backend=backend, keepPartitioning=True, localSteps=1, epochs=1, minWorkersPerRound=1)
    info = fitted.fitInfo
    assert info["rounds"] == 6 and all(d == [] for d in info["dropped_per_round"][2:]), info["dropped_per_round"]
    assert info["updates_dropped"] <= 2 and info["rows_dropped"] <= 16
