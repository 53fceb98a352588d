"""A replica reused by a later fit of the same model and compile arguments trains as a new one:
two mixed_float16 fits in a row in one session give the same model, though the first fit's
dynamic loss scale fell (its first steps overflowed in float16 and were skipped) and a replica
keeps its LossScaleOptimizer across fits (Replica.reset puts it back to its build-time value)."""

import numpy as np

from sparkdl import KerasEstimator
from tests.conftest import partitioned_df

import keras  # noqa: E402


def _fit(spark, df):
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.Dense(1, name="out")], name="loss_scale_probe")
    # The optimizer as a config: an object's name counts up ("sgd", "sgd_1"), so its fits would not share replicas.
    # One round (one epoch, localSteps None), one task per worker: no task ever follows another in a fit.
    est = KerasEstimator(model=model, optimizer={"class_name": "SGD", "config": {"learning_rate": 1e-3}}, loss="mse",
                         featuresCol="x", labelCol="y", numWorkers=2, keepPartitioning=True, shuffle=False, epochs=1,
                         batchSize=8, seed=3, mixedPrecision="mixed_float16", verbose=0)
    return est.fit(df)


def _fit_start_weights():
    keras.utils.set_random_seed(4)
    return keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(8, activation="relu", name="hidden"),
                             keras.layers.Dense(1, name="out")], name="loss_scale_probe").get_weights()


def test_two_mixed_float16_fits_in_a_row_give_the_same_model(spark):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = 10.0 + x[:, 0] / 3.0  # the scaled float16 gradients overflow: each worker skips 2 of its 4 steps, scale 8192
    rows = [(x[i].tolist(), float(y[i])) for i in range(64)]
    df = partitioned_df(spark, [rows[:32], rows[32:]], "x array<float>, y double")
    first = _fit(spark, df)
    second = _fit(spark, df)  # its two tasks run in the Python workers of the first's, reusing their replicas
    for a, b in zip(first.getKerasModel().get_weights(), second.getKerasModel().get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)  # a replica that kept the scale of 8192 would train 4 steps, not 2
    assert first.history["loss"] == second.history["loss"]
    start = _fit_start_weights()
    moved = max(float(np.abs(a - b).max()) for a, b in zip(first.getKerasModel().get_weights(), start, strict=True))
    assert moved > 1e-4  # it trained, after the skipped steps
