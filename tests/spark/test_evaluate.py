"""KerasModel.evaluate against keras.Model.evaluate, and multi-output transform columns (issue 10, case C41)."""

import numpy as np
import pytest

from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError, SchemaError
from tests.conftest import jobs_started, partitioned_df

import keras  # noqa: E402


@pytest.fixture(scope="module")
def binary(spark):
    """A sigmoid classifier fitted with sample weights on 12 rows in partitions of 7, 1 and 4 rows."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 3)).astype(np.float32)
    y = (x[:, 0] + 0.3 * rng.normal(size=12) > 0).astype(np.float32)
    w = rng.uniform(0.2, 3.0, size=12).astype(np.float32)
    rows = [(x[i].tolist(), float(y[i]), float(w[i])) for i in range(12)]
    df = partitioned_df(spark, [rows[:7], rows[7:8], rows[8:]], "f array<float>, y double, w double")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])
    fitted = KerasEstimator(model=model, loss="binary_crossentropy", metrics=["accuracy", "auc", "mae"], featuresCol="f",
                            labelCol="y", sampleWeightCol="w", numWorkers=2, epochs=2, batchSize=4, verbose=0).fit(df)
    return fitted, df, x, y, w


@pytest.mark.slow  # evaluate runs by default in the c41 tests
def test_evaluate_equals_keras_over_uneven_partitions_with_sample_weights(binary):
    fitted, df, x, y, w = binary
    assert df.rdd.glom().map(len).collect() == [7, 1, 4]
    assert fitted.getLabelCol() == "y" and fitted.getSampleWeightCol() == "w"  # copied from the estimator by fit
    plain = fitted.getKerasModel()
    want = plain.evaluate(x, y, sample_weight=w, return_dict=True, verbose=0)  # batches of 32: one batch
    got = fitted.evaluate(df, batchSize=2)  # batches of 2 within each partition: 4 + 1 + 2 batches
    assert sorted(got) == ["accuracy", "auc", "loss", "mae"]
    for name in got:
        assert got[name] == pytest.approx(want[name], abs=1e-5), name
    # the weights change the loss (not the unweighted compile metrics): a mean of partition means would differ too
    unweighted = fitted.copy().setSampleWeightCol(None).evaluate(df)
    want_unweighted = plain.evaluate(x, y, return_dict=True, verbose=0)
    for name in unweighted:
        assert unweighted[name] == pytest.approx(want_unweighted[name], abs=1e-5), name
    assert abs(unweighted["loss"] - got["loss"]) > 1e-3
    shuffled = fitted.evaluate(df.orderBy("y", ascending=False))  # an input out of a shuffle (AQE-coalesced partitions)
    for name in want:
        assert shuffled[name] == pytest.approx(want[name], abs=1e-5), name
    per_partition = [plain.evaluate(x[a:b], y[a:b], sample_weight=w[a:b], return_dict=True, verbose=0)["loss"] for a, b in ((0, 7), (7, 8), (8, 12))]
    assert abs(np.mean(per_partition) - got["loss"]) > 1e-3


def test_evaluate_refuses_bad_input_before_any_job(spark, binary):
    fitted, df, *_ = binary
    with pytest.raises(SchemaError, match=r"label column 'label' must exist in the DataFrame"):
        fitted.copy().setLabelCol("label").evaluate(df)
    assert jobs_started(spark, lambda: pytest.raises(SchemaError, fitted.evaluate, df.drop("y"))) == 0
    no_loss = fitted.copy()
    no_loss.clear(no_loss.loss)  # as fromKeras of an uncompiled model: no loss
    with pytest.raises(ConfigError, match=r"evaluate needs the model's loss.*Received: a KerasModel without a loss"):
        no_loss.evaluate(df)
    assert jobs_started(spark, lambda: pytest.raises(ConfigError, no_loss.evaluate, df)) == 0
    with pytest.raises(ConfigError, match=r"batchSize must be a positive integer.*Received: 0"):
        fitted.evaluate(df, batchSize=0)
    with pytest.raises(SchemaError, match=r"sampleWeightCol 'w' must be a numeric column"):
        fitted.evaluate(df.withColumn("w", df["w"].cast("string")))


# ---- C41: a functional model with a softmax head "cls" and a linear head "reg" -------------------------


def _c41_model():
    keras.utils.set_random_seed(41)
    x = keras.Input((3,))
    return keras.Model(x, [keras.layers.Dense(2, activation="softmax", name="cls")(x), keras.layers.Dense(1, name="reg")(x)])


@pytest.fixture(scope="module")
def c41(spark):
    rng = np.random.default_rng(41)
    x = rng.normal(size=(5, 3)).astype(np.float32)
    c = np.eye(2, dtype=np.float32)[[0, 1, 1, 0, 1]]
    r = rng.normal(size=5).astype(np.float32)
    rows = [(x[i].tolist(), c[i].tolist(), float(r[i])) for i in range(5)]
    df = partitioned_df(spark, [rows[:3], [], rows[3:4], rows[4:]], "f array<float>, c array<double>, r double")
    fitted = KerasEstimator(model=_c41_model(), optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse", featuresCol="f",
                            labelCols={"cls": "c", "reg": "r"}, numWorkers=2, verbose=0).fit(df)
    return fitted, df, x, c, r


def test_c41_transform_writes_one_column_per_output_equal_to_keras(spark, c41):
    fitted, df, x, _, _ = c41
    want = fitted.getKerasModel().predict(x, verbose=0)
    np.testing.assert_allclose(want[0], _c41_model().predict(x, verbose=0)[0], atol=1e-7)  # learning rate 0: the initial weights
    out = fitted.transform(df)
    assert out.columns == ["f", "c", "r", "cls", "reg"]  # mse: regression outputs, no probability columns
    assert dict(out.dtypes)["cls"] == "array<double>" and dict(out.dtypes)["reg"] == "double"
    got = out.collect()
    np.testing.assert_allclose([r["cls"] for r in got], want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose([r["reg"] for r in got], want[1][:, 0], rtol=1e-6, atol=1e-6)
    renamed = fitted.copy().setOutputCols(["cls_hat", "reg_hat"]).transform(df)
    assert renamed.columns == ["f", "c", "r", "cls_hat", "reg_hat"]
    np.testing.assert_allclose([r["reg_hat"] for r in renamed.collect()], want[1][:, 0], rtol=1e-6, atol=1e-6)
    wrong = fitted.copy().setOutputCols(["only_one"])
    with pytest.raises(SchemaError, match=r"outputCols must name one column per model output \['cls', 'reg'\]"):
        wrong.transform(df)
    assert jobs_started(spark, lambda: pytest.raises(SchemaError, wrong.transform, df)) == 0


def test_c41_classifier_outputs_get_their_probability_column(c41):
    fitted, df, x, _, _ = c41
    want = fitted.getKerasModel().predict(x, verbose=0)
    # one classifier loss for every output: each output is read by the loss's rule for its width
    classifier = fitted.copy().setLoss("categorical_crossentropy").setTask("auto")  # fit set task="regression" (mse)
    out = classifier.transform(df)
    assert out.columns == ["f", "c", "r", "cls", "cls_probability", "reg", "reg_probability"]
    assert dict(out.dtypes)["cls_probability"] == "vector"
    got = out.collect()
    np.testing.assert_allclose([r["cls"] for r in got], want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose([r["cls_probability"].toArray() for r in got], want[0], rtol=1e-6, atol=1e-6)  # softmax rows
    p = np.clip(want[1][:, 0], 0.0, 1.0)  # one output: p = the output clipped to [0, 1], probability [1 - p, p]
    np.testing.assert_allclose([r["reg_probability"].toArray() for r in got], np.stack([1 - p, p], axis=1), rtol=1e-6, atol=1e-6)
    arrays = classifier.copy().setScoreColumnType("array").setOutputCols({"cls": "a", "reg": "b"}).transform(df)
    assert arrays.columns[3:] == ["a", "a_probability", "b", "b_probability"] and dict(arrays.dtypes)["a_probability"] == "array<double>"
    assert classifier.copy().setProbabilityCol("").transform(df).columns == ["f", "c", "r", "cls", "reg"]


def test_c41_probability_columns_are_decided_per_output_loss(c41):
    """Per-output losses {"cls": sparse_categorical_crossentropy, "reg": mse}: only cls is a classifier output."""
    from sparkdl.keras.losses import describe_loss
    from sparkdl.spark.inference import OutputColumns, transform

    fitted, df, x, _, _ = c41
    want = fitted.getKerasModel().predict(x, verbose=0)
    losses = {"reg": describe_loss("mse"), "cls": describe_loss("sparse_categorical_crossentropy")}
    out = transform(df, fitted._spec, "f", OutputColumns("prediction"), 2, "auto", losses)
    assert out.columns == ["f", "c", "r", "cls", "cls_probability", "reg"]
    got = out.collect()
    np.testing.assert_allclose([r["cls_probability"].toArray() for r in got], want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose([r["reg"] for r in got], want[1][:, 0], rtol=1e-6, atol=1e-6)
    with pytest.raises(SchemaError, match=r"per-output losses must give one loss per model output \['cls', 'reg'\]"):
        transform(df, fitted._spec, "f", OutputColumns("prediction"), 2, "auto", [describe_loss("mse")])


def test_c41_evaluate_reports_each_output_loss_as_keras(c41):
    fitted, df, x, c, r = c41
    want = fitted.getKerasModel().evaluate(x, [c, r], return_dict=True, verbose=0)
    got = fitted.evaluate(df, batchSize=2)  # partitions of 3, 0, 1 and 1 rows
    assert sorted(got) == sorted(want) == ["cls_loss", "loss", "reg_loss"]
    for name in got:
        assert got[name] == pytest.approx(want[name], abs=1e-5), name
