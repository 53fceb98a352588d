"""Issue 5, item 17: compile arguments kept, and a fit continued from a KerasModel's optimizer state.

Reference values come from plain Keras on the same batches, or from closed forms (steps per epoch).
"""

import numpy as np
import pytest

from sparkdl import KerasEstimator, KerasModel
from sparkdl.errors import ConfigError

import keras  # noqa: E402

ROWS, BATCH = 24, 8  # 3 steps per epoch
COMPILE = {"weighted_metrics": ["mae"], "loss_weights": [0.5], "jit_compile": False}
COLUMNS = {"featuresCol": "x", "labelCol": "y", "verbose": 0, "numWorkers": 1, "shuffle": False, "batchSize": BATCH,
           "keepPartitioning": True}  # one worker on the rows in input order, as plain Keras sees them


def _model(units=4, seed=3):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(units, activation="tanh"), keras.layers.Dense(1)])


def _data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(ROWS, 3)).astype("float32")
    y = (x @ np.array([1.5, -2.0, 0.5], "float32") + 0.3).astype("float32")
    return x, y


@pytest.fixture(scope="module")
def df(spark):
    x, y = _data()
    return spark.createDataFrame([(i, x[i].tolist(), float(y[i])) for i in range(ROWS)], "id long, x array<float>, y float").coalesce(1)


def _plain_fit_model(epochs=1):
    """A KerasModel holding what plain Keras ``fit`` left (weights and Adam state), built as ``fit`` builds one."""
    from sparkdl.keras.spec import ModelSpec

    x, y = _data()
    model = _model()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    fitted = KerasModel._from_fit(ModelSpec.from_model(model), {}, {}, optimizer_state=[v.numpy() for v in model.optimizer.variables])
    fitted._set(optimizer=keras.optimizers.Adam(0.05), loss="mse", featuresCol="x")
    return model, fitted


def test_set_model_adopts_a_compiled_models_arguments_like_the_constructor(spark, tmp_path):
    model = _model()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mae", metrics=["mse"], **COMPILE)
    by_constructor = KerasEstimator(model=model)
    by_setter = KerasEstimator().setModel(model)
    config = model.get_compile_config()
    for est in (by_constructor, by_setter):
        assert est.getWeightedMetrics() == ["mae"] and est.getLossWeights() == [0.5]
        assert est.getJitCompile() == "auto"  # not adopted: Keras keeps only the driver's resolved value
        assert est.getLoss() == "mae" and est.getMetrics() == ["mse"]
        assert est.getOptimizer()["config"]["learning_rate"] == pytest.approx(0.05)
        rebuilt = est._compile_spec().compile(_model()).get_compile_config()  # what the executors compile
        for key in ("loss", "metrics", "weighted_metrics", "loss_weights", "jit_compile"):
            assert rebuilt[key] == config[key], key
    explicit = KerasEstimator(loss="mse", lossWeights=2.0).setModel(model)  # Params already set are kept
    assert explicit.getLoss() == "mse" and explicit.getLossWeights() == 2.0 and explicit.getWeightedMetrics() == ["mae"]
    by_setter.save(str(tmp_path / "est"))
    loaded = KerasEstimator.load(str(tmp_path / "est"))
    assert (loaded.getWeightedMetrics(), loaded.getLossWeights(), loaded.getJitCompile()) == (["mae"], [0.5], "auto")


def test_bad_compile_arguments_fail_as_config_errors():
    with pytest.raises(ConfigError, match="loss_weights must hold finite numbers. Received: 'heavy'"):
        KerasEstimator(lossWeights="heavy")
    with pytest.raises(ConfigError, match="finite"):
        KerasEstimator(lossWeights=[float("nan")])
    with pytest.raises(ConfigError, match=r"jit_compile must be True, False or 'auto'. Received: 'yes'"):
        KerasEstimator(jitCompile="yes")


def test_compile_arguments_reach_the_executors(df):
    """``loss_weights`` halves the loss, ``weighted_metrics`` adds ``mae``: as in plain Keras ``fit``. Needs
    ``_fit`` to send ``self._compile_spec()`` to the executors."""
    x, y = _data()
    plain = _model()
    plain.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", **COMPILE)
    history = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    source = _model()
    source.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", **COMPILE)
    fitted = KerasEstimator(model=source, epochs=2, **COLUMNS).fit(df)
    assert set(fitted.history) == set(history) == {"loss", "mae"}
    np.testing.assert_allclose(fitted.history["loss"], history["loss"], rtol=1e-5)
    np.testing.assert_allclose(fitted.history["mae"], history["mae"], rtol=1e-5)
    for a, b in zip(fitted.getKerasModel().get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_get_keras_model_holds_the_optimizer_state_and_save_load_keeps_it(tmp_path):
    """Against plain Keras: the restored Adam state continues exactly as the original optimizer does."""
    x, y = _data()
    plain, fitted = _plain_fit_model(epochs=1)
    fitted.save(str(tmp_path / "m"))
    loaded = KerasModel.load(str(tmp_path / "m"))
    for a, b in zip(loaded.optimizerState, fitted.optimizerState, strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    restored = loaded.getKerasModel()
    assert int(restored.optimizer.iterations) == int(plain.optimizer.iterations) == ROWS // BATCH
    plain.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    restored.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(restored.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    copied = loaded.copy()
    assert len(copied.optimizerState) == len(loaded.optimizerState) == 10  # iteration, learning rate, 2 moments x 4 weights


def test_an_initial_model_of_another_architecture_or_optimizer_class_is_refused():
    _, fitted = _plain_fit_model()
    with pytest.raises(ConfigError, match=r"initialModel must have the architecture of the estimator's model"):
        KerasEstimator(model=_model(units=5), loss="mse", initialModel=fitted)
    with pytest.raises(ConfigError, match=r"same optimizer class .*\(Adamax\)\. Received: the state of a Adam"):
        KerasEstimator(optimizer="adamax", initialModel=fitted)  # Adamax has Adam's variable shapes: only the class tells
    with pytest.raises(ConfigError, match=r"initialModel must be a KerasModel"):
        KerasEstimator(initialModel=_model())
    est = KerasEstimator(initialModel=fitted)  # takes architecture, weights, state and compile Params
    assert est.getLoss() == "mse" and est._optimizer_state is not None
    for a, b in zip(est.getKerasModel().get_weights(), fitted.getKerasModel().get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # the default run's 25-minute budget: tests/spark/test_resume.py runs a continued fit equal to one longer fit
def test_continuing_a_fit_from_its_model_equals_one_longer_fit(df, tmp_path):
    """2 epochs in one fit == 1 epoch, then 1 more from the first KerasModel (Adam moments and
    iteration counter carried), directly and through save/load. Needs ``_fit`` to start from
    ``self._initial_state(...)`` and pass ``optimizer_state=result.state.optimizer`` to ``_from_fit``."""
    source = _model()

    def estimator(epochs):
        return KerasEstimator(model=source, optimizer=keras.optimizers.Adam(0.05), loss="mse", epochs=epochs, **COLUMNS)

    two = estimator(2).fit(df)
    one = estimator(1).fit(df)
    assert one.optimizerState is not None and int(one.getKerasModel().optimizer.iterations) == ROWS // BATCH
    continued = KerasEstimator(initialModel=one, epochs=1, **COLUMNS).fit(df)
    one.save(str(tmp_path / "one"))
    reloaded = estimator(1).setInitialModel(KerasModel.load(str(tmp_path / "one"))).fit(df)
    expected = two.getKerasModel()
    assert int(expected.optimizer.iterations) == 2 * ROWS // BATCH
    for result in (continued, reloaded):
        keras_model = result.getKerasModel()
        assert int(keras_model.optimizer.iterations) == 2 * ROWS // BATCH
        for a, b in zip(keras_model.get_weights(), expected.get_weights(), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)
        for a, b in zip(result.optimizerState, two.optimizerState, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)
