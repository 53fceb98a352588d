"""Issue 23, item 1: the per-output forms of ``keras.Model.compile``'s loss, loss_weights, metrics and
weighted_metrics as CompileSpec keeps them (JSON), checks them against the outputs and compiles them (no Spark)."""

import json

import numpy as np
import pytest

from sparkdl.errors import ConfigError
from sparkdl.keras.spec import CompileSpec, infer_task, normalize_loss, normalize_metrics

import keras  # noqa: E402

NAMES = ["progression", "high"]


def _model():
    keras.utils.set_random_seed(5)
    x = keras.Input((3,))
    h = keras.layers.Dense(4, activation="tanh")(x)
    return keras.Model(x, [keras.layers.Dense(1, name="progression")(h), keras.layers.Dense(1, activation="sigmoid", name="high")(h)])


def _batch():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 3)).astype("float32")
    return x, [x[:, :1] * 2.0, (x[:, 1:2] > 0).astype("float32")]


@pytest.mark.parametrize("value, normalized", [
    ({"progression": "mse", "high": "binary_crossentropy"}, {"progression": "mse", "high": "binary_crossentropy"}),
    (["mse", "binary_crossentropy"], ["mse", "binary_crossentropy"]),
    (("mse", None), ["mse", None]),  # an output trained without a loss, as Keras allows
])
def test_per_output_losses_are_kept_as_json_and_normalize_again_to_themselves(value, normalized):
    assert normalize_loss(value) == normalized
    assert normalize_loss(json.loads(json.dumps(normalize_loss(value)))) == normalized  # a saved Param loads back the same


def test_a_keras_loss_object_per_output_becomes_its_config_and_keeps_its_family():
    loss = normalize_loss({"progression": keras.losses.Huber(), "high": keras.losses.BinaryCrossentropy(from_logits=True)})
    assert loss["high"]["class_name"] == "BinaryCrossentropy"
    spec = CompileSpec("adam", loss)
    high = spec.output_losses(NAMES)[1]
    assert (high.family, high.from_logits) == ("binary", True) and spec.output_losses(NAMES)[0].family == "regression"
    assert CompileSpec("adam", ["mse", None]).output_losses(NAMES)[1].family == "regression"  # no loss: read as a regressor


@pytest.mark.parametrize("value, normalized", [
    (["mae"], ["mae"]),
    ("mae", ["mae"]),
    ({"high": "accuracy", "progression": ["mae", "mse"]}, {"high": ["accuracy"], "progression": ["mae", "mse"]}),
    ({"high": ["accuracy"], "progression": None}, {"high": ["accuracy"]}),
    ([["mae"], ["accuracy", "auc"]], [["mae"], ["accuracy", "auc"]]),
    ([None, "accuracy"], [None, ["accuracy"]]),
])
def test_metric_forms_are_kept_as_json(value, normalized):
    assert normalize_metrics(value) == normalized
    assert normalize_metrics(json.loads(json.dumps(normalized))) == normalized


@pytest.mark.parametrize("value, message", [
    ({"high": [["accuracy"]]}, r"must not nest deeper than one list per output"),
    ([[["mae"]]], r"must not nest deeper than one list per output"),
    ({"high": ["acuracy"]}, r"metrics must be Keras metric names.*Received: metrics='acuracy'$"),
    ([None, None], r"Received: None in \[None, None\]"),
])
def test_bad_metric_forms_fail_naming_what_was_received(value, message):
    with pytest.raises(ConfigError, match=message):
        normalize_metrics(value)


@pytest.mark.parametrize("value, message", [
    ({"progression": ["mse"]}, r"loss of output 'progression' must be one loss .* not nested"),
    ([], r"loss must give at least one output a loss"),
    ({"progression": None, "high": None}, r"loss must give at least one output a loss"),
    ({"high": "crossentropy", "progression": "mse"}, r"Use 'sparse_categorical_crossentropy'"),
])
def test_bad_loss_forms_fail_naming_what_was_received(value, message):
    with pytest.raises(ConfigError, match=message):
        normalize_loss(value)


@pytest.mark.parametrize("args, message", [
    ({"loss": "mse", "metrics": ["mae"]},  # Keras 3: "tuple arity mismatch"
     r"metrics must be a list of metrics for a single-output model; for several outputs a dict output name .*"
     r"outputs are \['progression', 'high'\]. Received: metrics=\['mae'\]"),
    ({"loss": "mse", "metrics": ["mae", "mse", "mape"]}, r"Received: metrics=\['mae', 'mse', 'mape'\]"),
    ({"loss": {"progression": "mse"}}, r"loss as a dict must name every model output.*Received: loss=\{'progression': 'mse'\}"),
    ({"loss": ["mse", "mse", "mse"]}, r"loss as a list must give one loss per output \(2\)"),
    ({"loss": "mse", "loss_weights": {"progression": 1.0, "high": 0.5}}, r"lossWeights \(Keras' loss_weights\) per output weigh"),
    ({"loss": ["mse", "mse"], "loss_weights": 0.5}, r"lossWeights .* with per-output losses must be per output too"),
    ({"loss": ["mse", "mse"], "loss_weights": [1.0]}, r"lossWeights .* as a list must give one weight per output \(2\)"),
    ({"loss": ["mse", "mse"], "loss_weights": {"high": 1.0, "low": 2.0}}, r"lossWeights .* as a dict must name every model output"),
    ({"loss": "mse", "metrics": {"hi": ["accuracy"]}}, r"metrics as a dict must name model outputs; \['hi'\] are not outputs"),
    ({"loss": "mse", "weighted_metrics": [["mae"]]}, r"weightedMetrics \(Keras' weighted_metrics\) must be"),
])
def test_forms_that_do_not_fit_the_outputs_name_the_param_the_outputs_and_the_value(args, message):
    spec = CompileSpec.create("adam", args["loss"], args.get("metrics"), args.get("weighted_metrics"), args.get("loss_weights"))
    with pytest.raises(ConfigError, match=message):
        spec.check_outputs(NAMES)


def test_a_single_output_model_takes_a_flat_list_and_a_one_entry_form():
    CompileSpec.create("adam", "mse", ["mae", "mse", "mape"], None, [0.5]).check_outputs(["y"])
    CompileSpec.create("adam", {"y": "mse"}, {"y": "mae"}, None, {"y": 2.0}).check_outputs(["y"])
    assert infer_task("auto", CompileSpec.create("adam", {"y": "binary_crossentropy"}, None)) == "classification"
    assert infer_task("auto", CompileSpec.create("adam", {"a": "binary_crossentropy", "b": "mse"}, None)) == "auto"
    with pytest.raises(ConfigError, match=r"metrics of a single-output model must be metrics, not None"):
        CompileSpec.create("adam", "mse", [None, "mae"]).check_outputs(["y"])


def _eager_results(model, x, y) -> dict:
    """The loss and metrics of one batch, computed eagerly as a train step computes them (no tracing)."""
    y_pred = model(x)
    model.compute_loss(x, y, y_pred)
    return {k: float(v) for k, v in model.compute_metrics(x, y, y_pred).items()}


@pytest.mark.parametrize("metrics", [["mae", "accuracy"], [["mae"], ["accuracy"]], {"high": "accuracy", "progression": ["mae"]}])
def test_compiled_metrics_have_keras_names_and_values(metrics):
    x, y = _batch()
    model = CompileSpec.create("sgd", ["mse", "binary_crossentropy"], metrics).compile(_model())
    plain = _model()
    plain.compile(optimizer="sgd", loss=["mse", "binary_crossentropy"], metrics=metrics)
    got, want = _eager_results(model, x, y), _eager_results(plain, x, y)
    assert sorted(got) == sorted(want) and "high_accuracy" in got and "progression_mae" in got
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-6), name


def test_a_weights_dict_with_a_loss_list_weighs_each_output_by_its_name():
    """Keras pairs ``loss_weights={"progression": 1, "high": 0}`` with a loss list by sorted key; sparkdl by name."""
    x, y = _batch()
    weights = {"progression": 1.0, "high": 0.0}
    listed = CompileSpec.create("sgd", ["mse", "binary_crossentropy"], None, None, weights).compile(_model())
    named = _model()
    named.compile(optimizer="sgd", loss={"progression": "mse", "high": "binary_crossentropy"}, loss_weights=weights)
    got, want = (float(m.compute_loss(x, y, m(x))) for m in (listed, named))
    assert got == pytest.approx(want, rel=1e-6)
    assert got == pytest.approx(_eager_results(named, x, y)["progression_loss"], rel=1e-6)  # the "high" loss weighs 0
