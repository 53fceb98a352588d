"""Backend ``ps`` epoch by epoch (issue 22): validation runs as each epoch ends (no per-epoch copy of
the weights is held for later), the asynchronous modes average BatchNorm's moving statistics
instead of adding them, and each epoch's seconds are its own (not the bunched arrival of late
reports)."""

import numpy as np
import pytest

import keras
from sparkdl import KerasEstimator
from sparkdl.spark.training import faults
from tests.conftest import partitioned_df


def _df(spark, n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.float64)
    rows = [(x[i].tolist(), float(y[i])) for i in range(n)]
    return partitioned_df(spark, [rows[: n // 2], rows[n // 2:]], "x array<float>, y double")


def _estimator(model, **kw):
    params = dict(model=model, optimizer=keras.optimizers.Adam(0.02), loss="sparse_categorical_crossentropy", featuresCol="x",
                  labelCol="y", numWorkers=2, batchSize=8, localSteps=2, keepPartitioning=True, verbose=0, backend="ps")
    params.update(kw)
    return KerasEstimator(**params)


def _dense():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2, activation="softmax")])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_validation_on_ps_runs_as_each_epoch_ends_and_callbacks_see_it(spark, mode):
    """on_epoch_end of every epoch already has val_loss: the driver validated the master of that epoch
    before the next one started (the workers' tasks ended at the epoch's end, freeing the slots),
    so no copy of the weights per epoch is held until the end of the fit."""

    class Seen(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.val = []

        def on_epoch_end(self, epoch, logs=None):
            self.val.append(logs.get("val_loss"))

    seen = Seen()
    fitted = _estimator(_dense(), mode=mode, epochs=4, callbacks=[seen]).fit(_df(spark), validationData=_df(spark, 32, seed=1))
    assert len(seen.val) == 4 and all(v is not None and np.isfinite(v) for v in seen.val)
    assert seen.val == pytest.approx(fitted.history["val_loss"], rel=1e-9)
    assert fitted.fitInfo["validation_rows"] == 32


def test_asynchronous_modes_average_batchnorm_statistics_instead_of_adding_them(spark):
    """BatchNorm with momentum 0.5 (each batch moves the statistics half way), 2 workers, async:
    the moving variance stays >= 0 and the model predicts finite values."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.BatchNormalization(momentum=0.5),
                              keras.layers.Activation("relu"), keras.layers.Dense(2, activation="softmax")])
    df = _df(spark, n=128)
    fitted = _estimator(model, mode="async", epochs=3, localSteps=1).fit(df)
    variance = fitted.getKerasModel().layers[1].moving_variance.numpy()
    assert (variance >= 0).all(), variance
    scored = fitted.transform(df).select("prediction").collect()
    assert all(np.isfinite(row["prediction"]) for row in scored)


def test_asynchronous_epoch_seconds_are_each_epochs_own(spark):
    """Each worker sleeps 0.6 s before each of its 2 slots of an epoch: every epoch takes at least
    1.2 s, which its reported seconds show (reports that arrived late and bunched read near 0)."""
    with faults.inject(faults.Faults((faults.Delay(partition=0, seconds=0.6), faults.Delay(partition=1, seconds=0.6)))):
        fitted = _estimator(_dense(), mode="async", epochs=3).fit(_df(spark))
    seconds = fitted.fitInfo["epoch_seconds"]
    assert len(seconds) == 3 and min(seconds) >= 1.2, seconds
