"""Loss families without Spark: read by Keras class (never by instance name), label rules,
output rules against numpy closed forms, metric names checked as ``compile`` resolves them."""

import numpy as np
import pytest

from sparkdl.errors import ConfigError, SchemaError
from sparkdl.keras.losses import LossInfo, OutputLayout, describe_loss
from sparkdl.keras.spec import CompileSpec, infer_task, normalize_metrics

import keras  # noqa: E402


@keras.saving.register_keras_serializable(package="sparkdl_tests")
def doubled_mae(y_true, y_pred):
    return 2.0 * keras.ops.mean(keras.ops.abs(y_true - y_pred), axis=-1)


@keras.saving.register_keras_serializable(package="sparkdl_tests")
class SmoothedBCE(keras.losses.BinaryCrossentropy):
    pass


@pytest.mark.parametrize(
    "loss, family, from_logits, name",
    [
        (keras.losses.SparseCategoricalCrossentropy(name="scce"), "sparse_categorical", False, "sparse_categorical_crossentropy"),
        ("SparseCategoricalCrossentropy", "sparse_categorical", False, "sparse_categorical_crossentropy"),
        ("sparse_categorical_crossentropy", "sparse_categorical", False, "sparse_categorical_crossentropy"),
        (keras.losses.SparseCategoricalCrossentropy(from_logits=True, name="x"), "sparse_categorical", True, "sparse_categorical_crossentropy"),
        (keras.losses.BinaryCrossentropy(name="bce_loss"), "binary", False, "binary_crossentropy"),
        ("bce", "binary", False, "binary_crossentropy"),
        ("BinaryCrossentropy", "binary", False, "binary_crossentropy"),
        (keras.losses.BinaryFocalCrossentropy(from_logits=True), "binary", True, "binary_focal_crossentropy"),
        (keras.losses.CategoricalCrossentropy(name="mse"), "categorical", False, "categorical_crossentropy"),
        ("categorical_focal_crossentropy", "categorical", False, "categorical_focal_crossentropy"),
        (keras.losses.Hinge(name="h"), "hinge", False, "hinge"),
        ("squared_hinge", "hinge", False, "squared_hinge"),
        (keras.losses.CategoricalHinge(), "categorical_hinge", False, "categorical_hinge"),
        (keras.losses.KLDivergence(name="binary_crossentropy"), "kl_divergence", False, "kl_divergence"),
        ("kld", "kl_divergence", False, "kl_divergence"),
        (keras.losses.MeanSquaredError(name="categorical_crossentropy"), "regression", False, "mean_squared_error"),
        ("huber", "regression", False, "huber"),
        ("mae", "regression", False, "mean_absolute_error"),
    ],
)
def test_family_is_read_from_the_keras_class_not_the_instance_name(loss, family, from_logits, name):
    info = CompileSpec.create("adam", loss, None).loss_info  # through the normalised config, as fit sees it
    assert (info.family, info.from_logits, info.name) == (family, from_logits, name)
    assert infer_task("auto", CompileSpec.create("adam", loss, None)) == ("regression" if family == "regression" else "classification")
    assert describe_loss(loss) == info  # the object itself gives the same answer


def test_custom_losses_are_regression_and_subclasses_keep_their_family():
    assert describe_loss(doubled_mae).family == "regression"
    assert describe_loss(CompileSpec.create("adam", doubled_mae, None).loss).name == "sparkdl_tests>doubled_mae"
    subclass = describe_loss(CompileSpec.create("adam", SmoothedBCE(from_logits=True), None).loss)
    assert (subclass.family, subclass.from_logits) == ("binary", True)
    assert LossInfo("regression").infer_task("classification") == "classification"
    with pytest.raises(ConfigError, match="Received: 'nope'"):
        describe_loss("nope")


def test_label_rule_follows_the_family():
    scce = describe_loss(keras.losses.SparseCategoricalCrossentropy(name="scce"))
    scce.check_label_shape("y", (), (3,))
    scce.check_label_shape("y", (1,), (3,))
    with pytest.raises(SchemaError, match=r"one class index per row for sparse_categorical_crossentropy.*Received: 3 values"):
        scce.check_label_shape("y", (3,), (3,))
    with pytest.raises(SchemaError, match=r"use sparse_categorical_crossentropy\. Received: 1 per row"):
        describe_loss("categorical_crossentropy").check_label_shape("y", (), (3,))
    with pytest.raises(SchemaError, match=r"single output takes one label per row.*Received: 2 per row"):
        describe_loss(keras.losses.BinaryCrossentropy(name="bce_loss")).check_label_shape("y", (2,), (1,))
    describe_loss("hinge").check_label_shape("y", (), (1,))
    describe_loss("bce").check_label_shape("y", (4,), (4,))  # multi-label


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def test_hinge_margins_give_sign_decisions_and_no_probability():
    m = np.array([[-2.0], [0.0], [1e-3], [3.5]], np.float32)
    out = describe_loss("hinge").spark_outputs(m, "classification")
    assert out.prediction.tolist() == [0.0, 0.0, 1.0, 1.0]
    np.testing.assert_array_equal(out.raw, np.stack([-m[:, 0], m[:, 0]], axis=1).astype(np.float64))
    assert out.probability is None
    assert describe_loss("squared_hinge").layout("classification", 1).probability_width == 0
    scores = np.array([[0.1, 2.0, -1.0], [5.0, 4.0, 3.0]], np.float32)
    cat = describe_loss("categorical_hinge").spark_outputs(scores, "classification")
    assert cat.prediction.tolist() == [1.0, 0.0] and cat.probability is None
    np.testing.assert_array_equal(cat.raw, scores.astype(np.float64))


def test_multi_label_logits_get_a_sigmoid_per_label_not_a_softmax():
    z = np.array([[2.0, -1.0, 0.5], [-3.0, 0.0, 4.0]], np.float32)
    out = describe_loss(keras.losses.BinaryCrossentropy(from_logits=True)).spark_outputs(z, "classification")
    np.testing.assert_allclose(out.probability, _sigmoid(z.astype(np.float64)), rtol=1e-12)
    assert out.prediction.tolist() == [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]
    np.testing.assert_array_equal(out.raw, z.astype(np.float64))
    assert describe_loss("bce").layout("classification", 3) == OutputLayout(prediction_width=3, raw_width=3, probability_width=3)


def test_single_output_and_softmax_rules():
    z = np.array([[-2.0], [0.0], [3.0]], np.float32)
    logits = describe_loss(keras.losses.BinaryCrossentropy(from_logits=True)).spark_outputs(z, "classification")
    p = _sigmoid(z[:, 0].astype(np.float64))
    np.testing.assert_allclose(logits.probability, np.stack([1 - p, p], axis=1), rtol=1e-12)
    np.testing.assert_array_equal(logits.raw, np.stack([-z[:, 0], z[:, 0]], axis=1).astype(np.float64))
    assert logits.prediction.tolist() == [0.0, 1.0, 1.0]
    k = np.array([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
    soft = describe_loss(keras.losses.SparseCategoricalCrossentropy(from_logits=True)).spark_outputs(k, "classification")
    e = np.exp(k - k.max(axis=1, keepdims=True))
    np.testing.assert_allclose(soft.probability, e / e.sum(axis=1, keepdims=True), rtol=1e-12)
    assert soft.prediction.tolist() == [1.0, 2.0]


def test_regression_loss_read_as_classifier_keeps_probabilities_in_unit_interval():
    o = np.array([[-2.0], [0.3], [0.5], [3.0]], np.float32)
    out = describe_loss("mse").spark_outputs(o, "classification")
    p = np.clip(o[:, 0].astype(np.float64), 0, 1)
    np.testing.assert_allclose(out.probability, np.stack([1 - p, p], axis=1))
    assert out.prediction.tolist() == [0.0, 0.0, 1.0, 1.0]
    wide = describe_loss("mse").spark_outputs(np.array([[-1.0, 2.0, 2.0], [0.0, 0.0, 0.0]]), "classification")
    np.testing.assert_allclose(wide.probability, [[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    assert wide.probability.min() >= 0.0 and wide.probability.max() <= 1.0
    regression = describe_loss("hinge").spark_outputs(o, "regression")
    assert regression.raw is None and regression.probability is None
    np.testing.assert_array_equal(regression.prediction, o[:, 0].astype(np.float64))


@pytest.mark.parametrize("name", ["accuracy", "acc", "ACC", "mae", "AUC", "auc", "binary_accuracy", "F1Score"])
def test_metric_names_compile_accepts_are_accepted(name):
    assert normalize_metrics([name]) == [name]


def test_misspelled_metric_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"metrics must be Keras metric names.*Did you mean 'accuracy'\?.*Received: metrics='acuracy'$"):
        normalize_metrics(["accuracy", "acuracy"])
    with pytest.raises(ConfigError, match="Received: None"):
        normalize_metrics([None])
    assert normalize_metrics([keras.metrics.AUC(name="my_auc")])[0]["config"]["name"] == "my_auc"


def test_an_empty_batch_gives_empty_columns_of_the_layout_width():
    out = describe_loss("sparse_categorical_crossentropy").spark_outputs(np.zeros((0, 4), np.float32), "classification")
    assert out.prediction.shape == (0,) and out.raw.shape == (0, 4) and out.probability.shape == (0, 4)


@pytest.mark.parametrize("name", ["crossentropy", "ce"])
def test_shape_resolved_crossentropy_names_ask_for_an_explicit_loss(name):
    from sparkdl.keras.spec import normalize_loss

    with pytest.raises(ConfigError, match="Use 'sparse_categorical_crossentropy'.*Received: '" + name + "'"):
        normalize_loss(name)


@pytest.mark.parametrize("loss", [
    "sparse_categorical_crossentropy", keras.losses.SparseCategoricalCrossentropy(from_logits=True), "categorical_crossentropy",
    "binary_crossentropy", keras.losses.BinaryCrossentropy(from_logits=True), "hinge", "categorical_hinge", "kl_divergence", "mse",
], ids=lambda loss: loss if isinstance(loss, str) else f"{type(loss).__name__}-from-logits")
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_a_nan_output_stays_nan_in_every_column(loss, k, task):
    """No rule turns a NaN into a number: not a comparison (NaN >= 0.5 is False, class 0), not an
    argmax (the NaN's index), not the uniform fill of a row whose total is not > 0."""
    info = describe_loss(loss)
    good = np.array([[0.2, 0.7, 0.1][:k], [0.9, -0.3, 0.4][:k]], np.float32)
    z = np.concatenate([good[:1], np.full((1, k), np.nan, np.float32), good[1:]])
    if k == 3:  # a row with one NaN among numbers
        z = np.concatenate([z, np.array([[0.5, np.nan, 0.1]], np.float32)])
    out, clean = info.spark_outputs(z, task), info.spark_outputs(good, task)
    elementwise = k > 1 and (info.family in ("binary", "hinge")) and task == "classification"  # per-label decisions
    bad_rows = [1] + ([3] if k == 3 else [])
    good_rows = [0, 2]
    nan_in_z = np.isnan(z[bad_rows])
    for name, column, clean_column in (("prediction", out.prediction, clean.prediction), ("raw", out.raw, clean.raw),
                                       ("probability", out.probability, clean.probability)):
        if column is None:
            assert clean_column is None
            continue
        np.testing.assert_array_equal(column[good_rows], clean_column)  # the good rows are untouched
        values = column[bad_rows].reshape(len(bad_rows), -1)
        per_value = k > 1 and (elementwise or name == "raw" or task == "regression")  # the outputs themselves, or per label
        if per_value:  # NaN exactly where the row's output is NaN
            np.testing.assert_array_equal(np.isnan(values), nan_in_z, err_msg=name)
        else:  # a row rule (argmax, a distribution, a one-output pair): the whole row is NaN
            assert np.isnan(values).all(), (name, values)
    assert out.prediction.dtype == np.float64


def test_infinite_scores_give_nan_probabilities_not_a_uniform_row():
    info = describe_loss("categorical_crossentropy")
    out = info.spark_outputs(np.array([[np.inf, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 1.0, 1.0]]), "classification")
    assert np.isnan(out.probability[0]).all() and out.prediction[0] == 0.0  # an infinite score: its argmax, no probabilities
    np.testing.assert_allclose(out.probability[1], [1 / 3] * 3)  # an all-zero row stays uniform, as before
    np.testing.assert_allclose(out.probability[2], [0.5, 0.25, 0.25])
