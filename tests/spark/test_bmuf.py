"""Mode bmuf and fp16 updates on backend rounds (issue 9): η = 0, ζ = 1 equals sync; the filter changes the path;
fp16 updates train close to full precision with half the bytes; ps refused."""

import numpy as np
import pytest

from sparkdl import KerasEstimator

import keras  # noqa: E402


def _fit(spark, **params):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.BatchNormalization(),
                              keras.layers.Dense(3, activation="softmax")])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 4)).astype(np.float32)
    df = spark.createDataFrame([(x[i].tolist(), int(np.argmax(x[i, :3]))) for i in range(96)], "x array<float>, y int")
    settings = dict(model=model, optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                    featuresCol="x", labelCol="y", numWorkers=2, epochs=2, batchSize=8, localSteps=2, verbose=0,
                    backend="rounds")
    settings.update(params)
    return KerasEstimator(**settings).fit(df)


@pytest.mark.slow  # the identity runs by default in tests/unit/test_bmuf.py, bmuf through Spark in test_resume.py and test_ps_round_modes.py
def test_bmuf_without_momentum_equals_sync_and_with_momentum_differs(spark):
    sync = _fit(spark)
    plain = _fit(spark, mode="bmuf", blockMomentum=0.0, blockLearningRate=1.0)
    filtered = _fit(spark, mode="bmuf")  # η = 1 − 1/2, Nesterov
    assert plain.fitInfo["mode"] == "bmuf" and plain.fitInfo["backend"] == "rounds" and plain.fitInfo["rounds"] == 6
    for a, b in zip(sync.getKerasModel().get_weights(), plain.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(plain.history["loss"], sync.history["loss"], atol=1e-6)
    moved = [not np.allclose(a, b, atol=1e-4) for a, b in zip(sync.getKerasModel().get_weights(), filtered.getKerasModel().get_weights(), strict=True)]
    assert any(moved) and np.isfinite(filtered.history["loss"]).all()


@pytest.mark.slow  # the default run's 25-minute budget: tests/spark/test_sharded.py's fp16 test and tests/unit/test_compression.py run its kind
@pytest.mark.parametrize("mode", ["sync", pytest.param("bmuf", marks=pytest.mark.slow)])
def test_fp16_updates_train_close_to_full_precision_and_send_half_the_bytes(spark, mode):
    full = _fit(spark, mode=mode)
    half = _fit(spark, mode=mode, compression="fp16")
    assert half.fitInfo["compression"] == "fp16" and full.fitInfo["compression"] is None
    for a, b in zip(full.getKerasModel().get_weights(), half.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-3)
    # float32 weights and SGD's float32 state: half the bytes (the iteration counter stays int64)
    assert half.fitInfo["update_bytes"] < 0.52 * full.fitInfo["update_bytes"]
    assert sum(half.fitInfo["update_bytes_per_epoch"]) == half.fitInfo["update_bytes"]
