"""Issue 23: where a fit's model and decoders come from. A ``.keras`` path as the estimator's model
(item 4) and a decoder given as a function (item 3), each compared with the in-memory or named form."""

import numpy as np
import pytest

from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError
from tests.conftest import partitioned_df

import keras  # noqa: E402  (conftest selected the backend)


def _mlp(seed=3):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def _rows(n=12, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return [(row.tolist(), float(row.sum())) for row in x]


# ---------------------------------------------------------------- item 4: a model from a .keras file

def test_a_keras_path_fits_as_the_model_it_holds_and_the_estimator_saves(spark, tmp_path):
    df = partitioned_df(spark, [_rows()], "x array<float>, y double")
    common = dict(featuresCol="x", labelCol="y", numWorkers=1, keepPartitioning=True, shuffle=False, epochs=2, batchSize=4, verbose=0)
    model = _mlp()
    path = str(tmp_path / "mlp.keras")
    model.save(path)
    from_memory = KerasEstimator(model=model, **common).fit(df)
    estimator = KerasEstimator(model="file://" + path, **common)  # compile Params come from the file's model
    assert estimator.getOrDefault("loss") == "mse" and estimator.getOrDefault("optimizer")["class_name"] == "SGD"
    from_file = estimator.fit(df)
    for a, b in zip(from_file.getKerasModel().get_weights(), from_memory.getKerasModel().get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert from_file.history["loss"] == from_memory.history["loss"]
    estimator.save(str(tmp_path / "est"))
    loaded = KerasEstimator.load(str(tmp_path / "est"))
    for a, b in zip(loaded.getKerasModel().get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ConfigError, match=r"KerasEstimator model needs a \.keras file .* no file at '.*nowhere\.keras'"):
        KerasEstimator(model=str(tmp_path / "nowhere.keras"))
