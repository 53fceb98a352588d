"""Issue 23, item 1: per-output losses, loss weights and metrics of a multi-output model, against plain Keras.

A two-headed model: "progression" (Dense 1, mse) and "high" (Dense 1 sigmoid, binary_crossentropy).
One worker trains the rows in input order (one partition, ``keepPartitioning``, ``shuffle=False``), so the
batches are plain Keras' ``fit(shuffle=False)`` batches and history, ``val_*``, ``evaluate`` and
``transform`` equal Keras' to float32 rounding.
"""

import numpy as np
import pytest

from sparkdl import KerasEstimator, KerasModel
from sparkdl.errors import ConfigError
from tests.conftest import jobs_started

import keras  # noqa: E402

ROWS, VAL_ROWS, BATCH, EPOCHS = 24, 8, 8, 2
LOSS = {"progression": "mse", "high": "binary_crossentropy"}
LOSS_WEIGHTS = {"progression": 1.0, "high": 0.5}
METRICS = {"high": ["accuracy"], "progression": ["mae"]}
COLUMNS = {"featuresCol": "x", "labelCols": {"progression": "p", "high": "h"}, "numWorkers": 1, "shuffle": False,
           "batchSize": BATCH, "keepPartitioning": True, "epochs": EPOCHS, "verbose": 0}


def _model(seed=23):
    keras.utils.set_random_seed(seed)
    x = keras.Input((3,), name="x")
    h = keras.layers.Dense(4, activation="tanh")(x)
    return keras.Model(x, [keras.layers.Dense(1, name="progression")(h), keras.layers.Dense(1, activation="sigmoid", name="high")(h)])


def _data(rows, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3)).astype("float32")
    p = (x @ np.array([1.0, -0.5, 0.25], "float32") + 0.1 * rng.normal(size=rows)).astype("float32")
    h = (p > 0).astype("float32")
    return x, p, h


def _df(spark, rows, seed):
    x, p, h = _data(rows, seed)
    return spark.createDataFrame([(x[i].tolist(), float(p[i]), float(h[i])) for i in range(rows)],
                                 "x array<float>, p double, h double").coalesce(1)


def _plain(**compile_args):
    """Plain Keras on the same initial weights and batches: the fitted model and its History."""
    x, p, h = _data(ROWS, 1)
    xv, pv, hv = _data(VAL_ROWS, 2)
    model = _model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), **compile_args)
    history = model.fit(x, {"progression": p, "high": h}, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        validation_data=(xv, {"progression": pv, "high": hv}))
    return model, history.history


def _fit(spark, backend="rounds", **compile_args):
    est = KerasEstimator(model=_model(), optimizer=keras.optimizers.SGD(0.1), backend=backend, **compile_args, **COLUMNS)
    return est, est.fit(_df(spark, ROWS, 1), validationData=_df(spark, VAL_ROWS, 2))


def _assert_history_equal(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)  # Keras' names: high_accuracy, progression_mae, progression_loss, val_* ...
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_per_output_loss_weights_and_metrics_train_validate_evaluate_and_transform_as_keras(spark, tmp_path):
    est, fitted = _fit(spark, loss=LOSS, lossWeights=LOSS_WEIGHTS, metrics=METRICS)
    plain, want = _plain(loss=LOSS, loss_weights=LOSS_WEIGHTS, metrics=METRICS)
    assert {"high_accuracy", "progression_mae", "high_loss", "progression_loss", "val_high_accuracy", "val_progression_mae"} <= set(want)
    _assert_history_equal(fitted.history, want)
    for got_w, want_w in zip(fitted.getKerasModel().get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)

    val = _df(spark, VAL_ROWS, 2)
    xv, pv, hv = _data(VAL_ROWS, 2)
    want_eval = plain.evaluate(xv, {"progression": pv, "high": hv}, batch_size=BATCH, return_dict=True, verbose=0)
    got_eval = fitted.evaluate(val)
    assert sorted(got_eval) == sorted(want_eval)
    for name in want_eval:
        assert got_eval[name] == pytest.approx(want_eval[name], rel=1e-5, abs=1e-6), name

    # transform: each output's own loss decides: "high" (binary cross-entropy) gets its probability column, "progression" none
    assert fitted.getTask() == "auto"
    out = fitted.transform(val)
    assert out.columns == ["x", "p", "h", "progression", "high", "high_probability"]
    rows = out.collect()
    pred_p, pred_h = plain.predict(xv, verbose=0)
    np.testing.assert_allclose([r["progression"] for r in rows], pred_p[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([r["high"] for r in rows], pred_h[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([r["high_probability"].toArray() for r in rows], np.stack([1 - pred_h[:, 0], pred_h[:, 0]], 1),
                               rtol=1e-5, atol=1e-6)

    # persistence keeps the dict forms (the Params are JSON in the metadata), for the estimator and the model
    fitted.save(str(tmp_path / "model"))
    est.save(str(tmp_path / "est"))
    loaded, loaded_est = KerasModel.load(str(tmp_path / "model")), KerasEstimator.load(str(tmp_path / "est"))
    for stage in (loaded, loaded_est):
        assert stage.getLoss() == LOSS and stage.getMetrics() == METRICS and stage.getLossWeights() == LOSS_WEIGHTS
    compiled = loaded.getKerasModel()
    assert compiled.get_compile_config()["loss"] == LOSS and compiled.get_compile_config()["metrics"] == METRICS
    assert compiled.evaluate(xv, [pv, hv], batch_size=BATCH, return_dict=True, verbose=0)["high_accuracy"] == pytest.approx(
        want_eval["high_accuracy"])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["rounds", "ps"])
def test_list_forms_train_as_keras_on_both_backends(spark, backend):
    """Losses and loss weights as lists in output order, metrics as a list of lists and weighted metrics as a dict."""
    forms = {"loss": ["mse", "binary_crossentropy"], "metrics": [["mae"], ["accuracy", "auc"]], "weighted_metrics": {"high": "accuracy"}}
    _, fitted = _fit(spark, backend=backend, loss=forms["loss"], lossWeights=[1.0, 0.5], metrics=forms["metrics"],
                     weightedMetrics=forms["weighted_metrics"])
    _, want = _plain(loss=forms["loss"], loss_weights=[1.0, 0.5], metrics=forms["metrics"], weighted_metrics=forms["weighted_metrics"])
    assert "high_auc" in want and "val_high_weighted_accuracy" in want
    _assert_history_equal(fitted.history, want)


@pytest.mark.slow
def test_a_weights_dict_with_a_loss_list_weighs_each_output_by_name(spark):
    """Keras pairs a loss_weights dict with a loss list by sorted key ("high" first); sparkdl by output name."""
    _, fitted = _fit(spark, loss=["mse", "binary_crossentropy"], lossWeights={"progression": 1.0, "high": 0.5}, metrics=METRICS)
    _, want = _plain(loss=LOSS, loss_weights=LOSS_WEIGHTS, metrics=METRICS)  # the dict forms: weights by name
    _assert_history_equal(fitted.history, want)


def test_per_output_forms_that_do_not_fit_the_outputs_fail_before_any_job(spark):
    df = _df(spark, ROWS, 1)
    cases = [
        ({"loss": "mse", "metrics": ["mae"]}, r"metrics must be .* a dict output name -> metric.*outputs are \['progression', 'high'\]"
                                              r".*Received: metrics=\['mae'\]"),
        ({"loss": {"progression": "mse", "hi": "binary_crossentropy"}},
         r"loss as a dict must name every model output.*outputs are \['progression', 'high'\]. Received: loss=\{'progression'"),
        ({"loss": ["mse"]}, r"loss as a list must give one loss per output \(2\).*Received: loss=\['mse'\]"),
        ({"loss": "mse", "lossWeights": [1.0, 0.5]}, r"lossWeights \(Keras' loss_weights\) per output weigh per-output losses"),
        ({"loss": LOSS, "lossWeights": {"progression": 1.0}}, r"lossWeights .* as a dict must name every model output"),
        ({"loss": LOSS, "metrics": {"nope": ["mae"]}}, r"metrics as a dict must name model outputs; \['nope'\] are not outputs"),
        ({"loss": LOSS, "weightedMetrics": [["mae"], ["mae"], ["mae"]]}, r"weightedMetrics \(Keras' weighted_metrics\) must be"),
    ]
    for params, message in cases:
        est = KerasEstimator(model=_model(), **params, **COLUMNS)
        with pytest.raises(ConfigError, match=message):
            est.fit(df)
        assert jobs_started(spark, lambda e=est: pytest.raises(ConfigError, e.fit, df)) == 0


def test_from_keras_adopts_a_compiled_models_per_output_arguments():
    import warnings

    model = _model()
    model.compile(optimizer="sgd", loss=LOSS, loss_weights=LOSS_WEIGHTS, metrics=METRICS, weighted_metrics=[["mae"], None])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fromKeras warns for each compile argument it leaves out: none here
        wrapped = KerasModel.fromKeras(model, featuresCol="x")
    assert wrapped.getLoss() == LOSS and wrapped.getMetrics() == METRICS and wrapped.getLossWeights() == LOSS_WEIGHTS
    assert wrapped.getWeightedMetrics() == [["mae"], None]
    with pytest.raises(ConfigError, match=r"numClasses reads a single-output classifier.*outputs \['progression', 'high'\]"):
        wrapped.numClasses
