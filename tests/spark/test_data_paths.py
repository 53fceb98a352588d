"""Partitions over the task memory budget are memory-mapped and train to the same weights (issue 8, item 7);
validation on the parameter server (issue 8, item 5)."""

import os

import numpy as np
import pytest

from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError
from sparkdl.spark.partitions import row_bytes, spill_dir

import keras  # noqa: E402


def _df(spark, n=120):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = (x[:, 0] - x[:, 1] > 0).astype(int)
    rows = [(x[i].tolist(), int(y[i]), float(1 + i % 3)) for i in range(n)]
    return spark.createDataFrame(rows, "x array<float>, y int, w double").repartition(3)  # a shuffle: rows arrive in fetch order


def _fit(spark, budget_mb, **params):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2, activation="softmax")])
    settings = dict(model=model, optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                    featuresCol="x", labelCol="y", sampleWeightCol="w", numWorkers=2, epochs=2, batchSize=8, localSteps=3,
                    verbose=0, maxTaskMemoryMB=budget_mb)
    settings.update(params)
    return KerasEstimator(**settings).fit(_df(spark))


@pytest.mark.parametrize("backend", ["rounds", pytest.param("ps", marks=pytest.mark.slow)])
def test_partitions_on_disk_train_to_the_same_weights(spark, backend):
    extra = {} if backend == "rounds" else {"backend": "ps"}
    in_memory = _fit(spark, None, **extra)
    mapped = _fit(spark, 0.0005, **extra)  # 524 bytes: every partition of ~60 rows × 32 bytes is over it
    assert in_memory.fitInfo["partitions_on_disk"] == 0
    assert mapped.fitInfo["partitions_on_disk"] == 2 and mapped.fitInfo["task_budget_bytes"] == 524
    for a, b in zip(in_memory.getKerasModel().get_weights(), mapped.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert sorted(in_memory.history) == sorted(mapped.history)
    for name, values in in_memory.history.items():
        np.testing.assert_allclose(mapped.history[name], values, atol=1e-6)
    assert not os.path.exists(spill_dir(mapped.fitInfo["fit_id"]))  # the files are gone with the fit


def test_default_budget_comes_from_the_driver_memory_in_local_mode(spark):
    fitted = _fit(spark, None, epochs=1)
    memory = spark.sparkContext._jsc.sc().conf().getSizeAsMb("spark.driver.memory", "1024m")
    assert fitted.fitInfo["task_budget_bytes"] == memory * 2**20 // spark.sparkContext.defaultParallelism


def test_row_bytes_counts_every_converted_column():
    from sparkdl.serialization.columns import ColumnSpec, ModelColumns, TensorSpec

    x = TensorSpec("in", (28, 28, 1), "float32", (ColumnSpec("x0_0", (28, 28, 1), "float32", "pixels"),))
    y = TensorSpec("out", (), "int64", (ColumnSpec("y0", (), "int64", "label"),))
    assert row_bytes(ModelColumns((x,), (y,))) == 784 * 4 + 8
    assert row_bytes(ModelColumns((x,), (y,), weight=ColumnSpec("w", (), "float32", "w"))) == 784 * 4 + 8 + 4


def test_budget_must_be_positive():
    with pytest.raises(ConfigError, match=r"maxTaskMemoryMB must be None or a number of MB > 0"):
        KerasEstimator(maxTaskMemoryMB=0)


@pytest.mark.slow  # validation on ps runs by default in test_ps_epochs.py
def test_validation_on_the_parameter_server_equals_rounds_in_sync(spark):
    """Backend ps keeps each epoch's master weights and validates them after the barrier stage:
    in sync mode (same seed) the val_* history equals backend rounds'."""
    fits = [_fit(spark, None, backend=backend, validationSplit=0.25) for backend in ("rounds", "ps")]
    assert fits[0].fitInfo["validation_rows"] == fits[1].fitInfo["validation_rows"] > 0
    for name in ("val_loss", "val_accuracy"):
        assert len(fits[1].history[name]) == 2
        np.testing.assert_allclose(fits[1].history[name], fits[0].history[name], atol=1e-5)
    downpour = _fit(spark, None, mode="async", epochs=1, validationSplit=0.25)
    assert downpour.fitInfo["backend"] == "ps" and np.isfinite(downpour.history["val_loss"][0])
    assert 0.0 <= downpour.history["val_accuracy"][0] <= 1.0
