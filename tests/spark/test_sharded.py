"""Backend ``sharded`` on real Spark (local[2]): the same seeded fit as ``ps`` and ``rounds`` (sync and
bmuf), workers that keep their optimizer (4 bytes a parameter pushed instead of 12), fp16, DiLoCo
(η = 1, μ = 0 is model averaging of workers that keep their optimizer), the driver out of the data
path (a few hundred bytes a round), input out of a shuffle, nothing left behind, and what it
refuses before any job."""

import threading
import time

import keras
import numpy as np
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError
from tests.conftest import jobs_started, partitioned_df
from tests.spark.test_fit import _mlp, _rows, _toy

XY = T.StructType([T.StructField("x", T.ArrayType(T.FloatType())), T.StructField("y", T.DoubleType())])


def _estimator(**kwargs):
    args = dict(model=_mlp(), optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                featuresCol="x", labelCol="y", batchSize=10, keepPartitioning=True, verbose=0)
    args.update(kwargs)
    return KerasEstimator(**args)


def _unequal_df(spark):
    xa, ya = _toy(48, seed=1)
    xb, yb = _toy(30, seed=2)
    return partitioned_df(spark, [_rows(xa, ya), _rows(xb, yb)], XY)


def _close(a, b, atol=1e-5):
    for got, want in zip(a.getKerasModel().get_weights(), b.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=atol)


@pytest.mark.backends
@pytest.mark.parametrize("mode", ["sync", "bmuf"])
def test_the_same_seeded_fit_on_sharded_ps_and_rounds_gives_the_same_model(spark, mode):
    # 48 and 30 rows, batch 10, τ = 2: 3 rounds an epoch, partition 1 has no rows in the third
    df = _unequal_df(spark)
    common = dict(numWorkers=2, epochs=2, localSteps=2, shuffle=True, seed=7, mode=mode)
    fits = {backend: _estimator(backend=backend, **common).fit(df) for backend in ("sharded", "ps", "rounds")}
    sharded = fits["sharded"]
    for other in ("ps", "rounds"):
        _close(sharded, fits[other])
        for got, want in zip(sharded._optimizer_state, fits[other]._optimizer_state, strict=True):
            np.testing.assert_allclose(got, want, atol=1e-5)
        np.testing.assert_allclose(sharded.history["loss"], fits[other].history["loss"], rtol=1e-5)
    info = sharded.fitInfo
    assert info["backend"] == "sharded" and info["rounds"] == 6 and info["slices"] == 2
    # each worker puts one piece to each owner per round it trained in: 6 and 4 rounds, 2 owners
    assert info["worker_pushes"] == [12, 8] and info["worker_dropped"] == [0, 0]
    # the driver served each slice's start once and read the final master once: the state's bytes, no more
    state = sum(w.nbytes for w in sharded.getKerasModel().get_weights()) + sum(np.asarray(a).nbytes for a in sharded._optimizer_state)
    assert info["driver_bytes_fetched"] == state
    assert info["coordinator"]["bytes_out"] <= state + 4096 and info["coordinator"]["reports"] == 10


def test_keep_local_optimizer_puts_the_weights_alone_and_diloco_at_rate_one_without_momentum_is_their_average(spark):
    df = _unequal_df(spark)
    common = dict(numWorkers=2, epochs=2, localSteps=2, shuffle=True, seed=3, backend="sharded")
    full = _estimator(**common).fit(df)
    local = _estimator(keepLocalOptimizer=True, **common).fit(df)
    diloco = _estimator(mode="diloco", outerLearningRate=1.0, outerMomentum=0.0, **common).fit(df)
    _close(diloco, local, atol=1e-6)  # η = 1, μ = 0: W − (W − W̄) = W̄
    weights = sum(w.nbytes for w in full.getKerasModel().get_weights())
    state = weights + sum(np.asarray(a).nbytes for a in full._optimizer_state)
    # a worker puts N−1 of its N pieces over the network: the weights alone with keepLocalOptimizer (Adam: a third)
    for fitted, per_round in ((full, state), (local, weights)):
        pushed = fitted.fitInfo["worker_bytes_pushed"]
        assert abs(pushed[0] - 6 * per_round / 2) <= 6 * 64 and abs(pushed[1] - 4 * per_round / 2) <= 4 * 64, (pushed, per_round)
    assert local.fitInfo["keep_local_optimizer"] and local.fitInfo["local_state_resets"] == 0
    assert np.isfinite(diloco.history["loss"]).all()
    default = _estimator(mode="diloco", **common).fit(df)  # η = 0.7, μ = 0.9: another model
    assert max(float(np.abs(a - b).max()) for a, b in zip(default.getKerasModel().get_weights(), diloco.getKerasModel().get_weights())) > 1e-4


def test_fp16_contributions_on_sharded_end_close_to_full_precision_and_halve_the_bytes(spark):
    df = _unequal_df(spark)
    common = dict(numWorkers=2, epochs=2, localSteps=2, shuffle=True, seed=3, backend="sharded", keepLocalOptimizer=True)
    full = _estimator(**common).fit(df)
    half = _estimator(compression="fp16", **common).fit(df)
    _close(half, full, atol=5e-3)
    assert half.fitInfo["worker_bytes_pushed"][0] * 2 == pytest.approx(full.fitInfo["worker_bytes_pushed"][0], rel=0.05)


@pytest.mark.parametrize(("method", "bytes_per_value", "most", "atol"), [("int8", 1 + 4 / 256, 0.40, 1e-3),
                                                                         ("int4", 0.5 + 4 / 256, 0.30, 3e-3)])
def test_int8_and_int4_contributions_on_sharded_learn_as_full_precision_with_a_quarter_or_an_eighth_of_the_bytes(
        spark, method, bytes_per_value, most, atol):
    """Blockwise integer differences with error feedback (``sparkdl.core.blockwise``): the model lands
    near the full-precision fit's and the workers put about 1.02 (int8) or 0.52 (int4) bytes a float
    value against 4 (this MLP's arrays are smaller than a block, so their scales weigh more: measured
    0.338 and 0.221 of full precision's bytes; the model within 1e-5 and 2e-4 of it)."""
    df = _unequal_df(spark)
    common = dict(numWorkers=2, epochs=3, localSteps=2, shuffle=True, seed=3, backend="sharded", keepLocalOptimizer=True)
    full = _estimator(**common).fit(df)
    few = _estimator(compression=method, **{k: v for k, v in common.items() if k != "keepLocalOptimizer"}).fit(df)
    _close(few, full, atol=atol)
    assert few.fitInfo["keep_local_optimizer"]  # implied: the optimizer state never travels quantized
    assert few.fitInfo["compression"] == method and all(np.isfinite(few.history["loss"]))
    assert few.history["loss"][-1] < few.history["loss"][0]
    ratio = few.fitInfo["worker_bytes_pushed"][0] / full.fitInfo["worker_bytes_pushed"][0]  # the same puts, in bytes
    assert bytes_per_value / 4 <= ratio <= most


@pytest.mark.parametrize(("method", "most"), [("1bit", 0.2), ("threshold", 0.3)])
def test_1bit_and_threshold_on_sharded_quantize_each_piece_with_error_feedback_and_learn(spark, method, most):
    """The quantizers of ``ps`` and ``rounds`` through the same seam as int8 / int4
    (``sparkdl.core.piece_codec``): each worker's piece of each slice quantized against its start
    with a residual of its own, the weights alone on the wire (the workers keep their optimizer).
    Measured on this 17,923-parameter MLP: 0.124 (1bit) and 0.147 (threshold, t = 0.01) of the
    full-precision weights' bytes, the model within 0.003 and 0.012 of that fit's."""
    df = _unequal_df(spark)

    def wide():  # 17,923 parameters: each payload's Arrow IPC header (about 2 KB) weighs little beside its bits
        keras.utils.set_random_seed(3)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(256, activation="tanh"), keras.layers.Dense(64, activation="tanh"),
                                 keras.layers.Dense(3, activation="softmax")])

    common = dict(numWorkers=2, epochs=3, localSteps=2, shuffle=True, seed=3, backend="sharded")
    full = _estimator(model=wide(), keepLocalOptimizer=True, **common).fit(df)
    few = _estimator(model=wide(), compression=method, compressionThreshold=0.01, **common).fit(df)
    assert few.fitInfo["keep_local_optimizer"] and few.fitInfo["compression"] == method
    assert all(np.isfinite(few.history["loss"])) and few.history["loss"][-1] < few.history["loss"][0]
    ratio = few.fitInfo["worker_bytes_pushed"][0] / full.fitInfo["worker_bytes_pushed"][0]  # the same puts, in bytes
    assert ratio <= most, ratio
    moved = max(float(np.abs(a - b).max()) for a, b in zip(few.getKerasModel().get_weights(), full.getKerasModel().get_weights()))
    assert 1e-4 < moved < 0.05, moved  # lossy, yet near the full-precision fit


def test_sharded_trains_on_input_out_of_a_shuffle_and_leaves_no_thread(spark):
    x, y = _toy(64, seed=5)
    df = spark.createDataFrame(_rows(x, y), XY).withColumn("k", F.rand(3)).orderBy("k").drop("k")
    threads_before = {t.ident for t in threading.enumerate()}
    fitted = _estimator(numWorkers=2, epochs=1, localSteps=2, backend="sharded", keepPartitioning=False).fit(df)
    assert fitted.fitInfo["rows"] == 64 and sum(fitted.fitInfo["partition_rows"]) == 64
    assert fitted.fitInfo["task_attempts"] == {"0": 1, "1": 1}
    time.sleep(0.5)
    left = [t.name for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()]
    assert left == []


@pytest.mark.parametrize("settings, words", [
    (dict(mode="async"), "cannot be sliced"),
    (dict(mode="gossip"), "cannot be sliced"),
    (dict(minWorkersPerRound=1), "minWorkersPerRound"),
])
def test_what_sharded_cannot_slice_is_refused_before_any_job(spark, settings, words):
    df = _unequal_df(spark)

    def fit():
        with pytest.raises(ConfigError, match=words):
            _estimator(numWorkers=2, backend="sharded", **settings).fit(df)

    assert jobs_started(spark, fit) == 0


def test_diloco_and_keep_local_optimizer_refuse_the_other_backends_and_auto_picks_sharded(spark):
    with pytest.raises(ConfigError, match="mode 'diloco' keeps each worker's optimizer"):
        _estimator(mode="diloco", backend="ps")._fit_config()
    with pytest.raises(ConfigError, match="keepLocalOptimizer is a setting of backend 'sharded'"):
        _estimator(keepLocalOptimizer=True, backend="rounds")._fit_config()
    fitted = _estimator(numWorkers=2, epochs=1, mode="diloco").fit(_unequal_df(spark))
    assert fitted.fitInfo["backend"] == "sharded" and "diloco" in fitted.fitInfo["backend_reason"]


def test_overlap_trains_each_round_from_the_start_before_it_and_blocks_only_after_a_snapshot(spark, tmp_path):
    """``overlap`` (the one-round-delayed rule, ``sparkdl.core.modes.overlap``): with a snapshot after
    every round (one round an epoch, checkpointDir set) every round is a sync point, so the fit is the
    blocking one; without snapshots, every round but the first trains from the start before its own:
    another model, seeded (the same twice), that learns as well, with the same puts, and each
    worker's own slice's piece put to its backup holder besides; the workers' training is counted."""
    df = _unequal_df(spark)
    common = dict(numWorkers=2, shuffle=True, seed=7, backend="sharded")
    one_round = dict(epochs=2, localSteps=5, **common)  # 48 and 30 rows, batch 10: one round an epoch
    _close(_estimator(overlap=True, checkpointDir=str(tmp_path / "snapshots"), **one_round).fit(df),
           _estimator(**one_round).fit(df), atol=1e-6)
    three = dict(epochs=3, localSteps=1, **common)  # 5 rounds an epoch (partition 1 trains in 3 of them)
    blocking = _estimator(**three).fit(df)
    overlapped = _estimator(overlap=True, **three).fit(df)
    again = _estimator(overlap=True, **three).fit(df)
    _close(again, overlapped, atol=0.0)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(overlapped.getKerasModel().get_weights(), blocking.getKerasModel().get_weights()))
    assert 1e-4 < moved < 0.05, moved
    info = overlapped.fitInfo
    assert info["overlap"] is True and not blocking.fitInfo["overlap"]
    assert info["worker_pushes"] == blocking.fitInfo["worker_pushes"] == [30, 18] and info["worker_dropped"] == [0, 0]
    # the same puts, and each round's own-slice piece to the backup holder (what a retry on another executor assembles its start from)
    extra = [o - b for o, b in zip(info["worker_bytes_pushed"], blocking.fitInfo["worker_bytes_pushed"], strict=True)]
    assert extra[0] % 15 == 0 and extra[1] % 9 == 0  # 15 and 9 rounds trained, one piece each
    assert extra[0] // 15 + extra[1] // 9 == pytest.approx(2 * info["slice_bytes"], abs=2)  # slice 0 and slice 1: the whole state
    assert all(ms > 0 for ms in info["worker_train_ms"])
    losses = overlapped.history["loss"]
    assert losses[-1] < losses[0] and abs(losses[-1] - blocking.history["loss"][-1]) < 0.01


def test_overlap_is_refused_on_the_backends_that_do_not_run_it_and_auto_picks_sharded(spark):
    df = _unequal_df(spark)
    for backend in ("ps", "rounds"):
        errors = []

        def fit(backend=backend):
            try:
                _estimator(numWorkers=2, epochs=1, overlap=True, backend=backend).fit(df)
            except ConfigError as exc:
                errors.append(str(exc))

        assert jobs_started(spark, fit) == 0
        assert errors == [f"overlap (rounds that never block training) is a setting of backend 'sharded'. Received: overlap=True, "
                          f"backend={backend!r}"]
    fitted = _estimator(numWorkers=2, epochs=1, localSteps=2, overlap=True).fit(df)
    assert fitted.fitInfo["backend"] == "sharded" and "overlap=True runs only on backend 'sharded'" in fitted.fitInfo["backend_reason"]
