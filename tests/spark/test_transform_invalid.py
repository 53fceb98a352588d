"""KerasModel.transform's handleInvalid: a NaN row, a ±inf row, a null row and a wrongly sized row next
to good rows, under "error" (before scoring, or lazily in the task), "skip" and "keep", for every kind
of output column; the good rows' values equal keras.Model.predict."""

import numpy as np
import pytest

import keras
from sparkdl import KerasEstimator, KerasModel
from sparkdl.errors import SchemaError
from tests.conftest import jobs_started

NAN, INF = float("nan"), float("inf")
ROWS = [(0, [0.5, -1.0]), (1, [NAN, 1.0]), (2, [INF, 1.0]), (3, None), (4, [1.5, 0.25]), (5, [1.0]), (6, [2.0, -INF])]
GOOD, BAD = [0, 4], [1, 2, 3, 5, 6]


@pytest.fixture(scope="module")
def df(spark):
    return spark.createDataFrame(ROWS, "id int, x array<double>").repartition(2)


def _x(ids):
    return np.array([dict(ROWS)[i] for i in ids], np.float32)


def _classifier():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, activation="softmax")])
    return model, KerasModel.fromKeras(model, featuresCol="x", loss="sparse_categorical_crossentropy")


def _by_id(out):
    return {r["id"]: r for r in out.collect()}


def _values(cell):
    return np.asarray(cell.toArray() if hasattr(cell, "toArray") else cell, np.float64)


def test_check_features_fails_before_scoring_naming_the_column_and_every_count(spark, df):
    _, wrapped = _classifier()
    assert wrapped.getHandleInvalid() == "error"
    with pytest.raises(SchemaError) as info:
        wrapped.setCheckFeatures(True).transform(df)  # raised by transform itself (its counting job), before any DataFrame to score exists
    assert str(info.value) == (
        "features column 'x' must hold 2 non-null values per row (the model input shape (2,)), none NaN or ±inf, to be "
        "scored (handleInvalid='error'; 'skip' drops such rows, 'keep' scores them as NaN). Received, of 7 rows: 1 null "
        "rows, 1 rows of 1 values, 1 rows with NaN, 2 rows with ±inf")
    good = wrapped.transform(df.where("id in (0, 4)"))  # the good rows alone pass
    assert sorted(_by_id(good)) == GOOD


def test_error_by_default_fails_the_scoring_task_naming_the_column(spark, df):
    _, wrapped = _classifier()
    scored = []
    assert jobs_started(spark, lambda: scored.append(wrapped.transform(df))) == 0  # fully lazy (checkFeatures=False by default)
    with pytest.raises(Exception) as info:
        scored[0].collect()
    message = str(info.value)
    assert "SchemaError: transform, partition" in message and "column 'x' must hold 2 values per row, none null, NaN or ±inf" in message
    assert "handleInvalid='error'" in message
    # a batch holding only a NaN row fails too: NaN is counted, not scored
    nan_only = spark.createDataFrame([(1, [NAN, 1.0])], "id int, x array<double>")
    with pytest.raises(Exception, match=r"SchemaError: transform, partition \d+, a batch of 1 rows: column 'x' .*Received: 1 rows with NaN"):
        wrapped.transform(nan_only).collect()


def test_skip_leaves_the_bad_rows_out(spark, df):
    model, wrapped = _classifier()
    scored = []
    assert jobs_started(spark, lambda: scored.append(wrapped.setHandleInvalid("skip").transform(df))) == 0  # no counting job
    rows = _by_id(scored[0])
    assert sorted(rows) == GOOD
    expected = model.predict(_x(GOOD), verbose=0)
    for i, want in zip(GOOD, expected, strict=True):
        np.testing.assert_allclose(_values(rows[i]["probability"]), want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(_values(rows[i]["rawPrediction"]), want, rtol=1e-6, atol=1e-7)
        assert rows[i]["prediction"] == float(np.argmax(want))


def test_skip_scores_each_row_once(spark, df, capsys):
    """"skip" filters on the scoring's result: the filter stays above the one scoring pass (pyspark
    4.1+: one Arrow UDF in the plan, not a second one under the filter; 4.0: one mapInArrow)."""
    _, wrapped = _classifier()
    wrapped.setHandleInvalid("skip").transform(df).where("prediction >= 0").explain()
    plan = capsys.readouterr().out
    assert plan.count("ArrowEvalPython") + plan.count("MapInArrow") == 1, plan


@pytest.mark.parametrize("score_type", ["vector", "array"])
def test_keep_scores_the_bad_rows_as_nan_in_every_column(spark, df, score_type):
    model, wrapped = _classifier()
    out = wrapped.setHandleInvalid("keep").setScoreColumnType(score_type).transform(df)
    assert dict(out.dtypes)["probability"] == ("vector" if score_type == "vector" else "array<double>")
    rows = _by_id(out)
    assert sorted(rows) == list(range(7))
    assert rows[3]["x"] is None and rows[1]["x"][1] == 1.0  # the input columns are kept as they were
    expected = model.predict(_x(GOOD), verbose=0)
    for i, want in zip(GOOD, expected, strict=True):
        np.testing.assert_allclose(_values(rows[i]["probability"]), want, rtol=1e-6, atol=1e-7)
        assert rows[i]["prediction"] == float(np.argmax(want))
    for i in BAD:
        assert np.isnan(rows[i]["prediction"]), i  # not class 0
        assert _values(rows[i]["probability"]).shape == (3,) and np.isnan(_values(rows[i]["probability"])).all(), i  # not 1/3 each
        assert np.isnan(_values(rows[i]["rawPrediction"])).all(), i


def test_keep_with_a_binary_classifier_a_regressor_and_a_multi_output_model(spark, df):
    keras.utils.set_random_seed(1)
    sigmoid = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, activation="sigmoid")])
    rows = _by_id(KerasModel.fromKeras(sigmoid, featuresCol="x", loss="binary_crossentropy", handleInvalid="keep").transform(df))
    p = sigmoid.predict(_x(GOOD), verbose=0)[:, 0]
    for i, want in zip(GOOD, p, strict=True):
        np.testing.assert_allclose(_values(rows[i]["probability"]), [1 - want, want], rtol=1e-6, atol=1e-7)
        assert rows[i]["prediction"] == float(want >= 0.5)
    assert all(np.isnan(rows[i]["prediction"]) and np.isnan(_values(rows[i]["probability"])).all() for i in BAD)  # not 0.0

    regressor = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    rows = _by_id(KerasModel.fromKeras(regressor, featuresCol="x", loss="mse", handleInvalid="keep").transform(df))
    np.testing.assert_allclose([rows[i]["prediction"] for i in GOOD], regressor.predict(_x(GOOD), verbose=0), rtol=1e-6)
    assert all(len(rows[i]["prediction"]) == 2 and np.isnan(rows[i]["prediction"]).all() for i in BAD)

    inp = keras.Input((2,), name="x")
    hidden = keras.layers.Dense(4)(inp)
    multi = keras.Model(inp, [keras.layers.Dense(3, activation="softmax", name="cls")(hidden), keras.layers.Dense(1, name="reg")(hidden)])
    wrapped = KerasModel.fromKeras(multi, featuresCol="x", loss="categorical_crossentropy", handleInvalid="keep",
                                   scoreColumnType="array")
    rows = _by_id(wrapped.transform(df))
    cls, reg = multi.predict(_x(GOOD), verbose=0)
    for i, c, r in zip(GOOD, cls, reg, strict=True):
        np.testing.assert_allclose(rows[i]["cls"], c, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(rows[i]["cls_probability"], c, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(rows[i]["reg"], r[0], rtol=1e-6)
    for i in BAD:
        assert np.isnan(rows[i]["cls"]).all() and np.isnan(rows[i]["cls_probability"]).all() and np.isnan(rows[i]["reg"]), i
        assert np.isnan(rows[i]["reg_probability"]).all(), i


def test_assembled_columns_and_a_fitted_models_value(spark):
    """featuresCols: a row is bad when one of its columns is null, NaN or ±inf, or their widths do not add up;
    a model fitted with handleInvalid='skip' skips at transform too (Spark's convention: the estimator's value)."""
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    rows = [(0, 1.0, [0.5, 0.25]), (1, None, [0.5, 0.25]), (2, NAN, [1.0, 2.0]), (3, 2.0, [1.0]), (4, -1.0, [INF, 0.0]),
            (5, 0.5, [1.0, -1.0])]
    df = spark.createDataFrame(rows, "id int, a double, b array<double>").coalesce(1)  # one batch: every fault in one message
    est = KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.0), loss="mse", featuresCols=["a", "b"], labelCol="id",
                         handleInvalid="skip", numWorkers=1, verbose=0)
    with pytest.warns(UserWarning, match="handleInvalid='skip': 3 rows with a null, NaN or infinite value or a wrong number of values were dropped"):
        fitted = est.fit(df.where("id != 3"))  # a wrongly sized row is refused by fit's own check: left out here
    assert fitted.fitInfo["rows_skipped"] == 3 and fitted.getHandleInvalid() == "skip"
    want = model.predict(np.array([[1.0, 0.5, 0.25], [0.5, 1.0, -1.0]], np.float32), verbose=0)[:, 0]
    skipped = _by_id(fitted.transform(df))
    assert sorted(skipped) == [0, 5]
    np.testing.assert_allclose([skipped[0]["prediction"], skipped[5]["prediction"]], want, rtol=1e-6)
    kept = _by_id(fitted.copy().setHandleInvalid("keep").transform(df))
    assert [i for i in sorted(kept) if np.isnan(kept[i]["prediction"])] == [1, 2, 3, 4]
    np.testing.assert_allclose([kept[0]["prediction"], kept[5]["prediction"]], want, rtol=1e-6)
    lazy = fitted.copy().setHandleInvalid("error").setCheckFeatures(False).transform(df)
    with pytest.raises(Exception) as info:
        lazy.collect()
    message = str(info.value)
    assert "column 'a' must hold values none of which is null, NaN or ±inf, to be scored" in message
    assert "Received: 1 null rows, 1 rows with NaN" in message and "column 'b' " in message and "Received: 1 rows with ±inf" in message
    assert "column 'a, b' must hold 3 values per row together to be scored" in message and "Received: 1 wrongly sized rows" in message
