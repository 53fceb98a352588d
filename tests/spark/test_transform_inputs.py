"""transform with the inputs fit takes: assembled columns, named inputs, several outputs, sequences (issue 8)."""

import numpy as np
import pytest

from sparkdl import KerasEstimator
from sparkdl.errors import SchemaError

import keras  # noqa: E402


def test_assembled_scalar_columns_score_as_the_assembled_input(spark):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    rows = [(float(i), float(-i) / 3, float(i % 2), i % 2) for i in range(12)]
    df = spark.createDataFrame(rows, "a double, b double, c double, y int")
    fitted = KerasEstimator(model=model, loss="sparse_categorical_crossentropy", featuresCols=["a", "b", "c"], labelCol="y",
                            numWorkers=2, verbose=0).fit(df)
    sc = spark.sparkContext
    sc.setJobGroup("transform-checks", "transform's feature checks")
    try:
        lazy = fitted.transform(df.withColumn("a", df["a"] * 1.0))  # the default: the scoring pass checks the rows, no job now
        assert len(sc.statusTracker().getJobIdsForGroup("transform-checks")) == 0
        scored = fitted.copy({fitted.checkFeatures: True}).transform(df.withColumn("a", df["a"] * 1.0))  # nullable columns: each needs its count
        checks = len(sc.statusTracker().getJobIdsForGroup("transform-checks"))
    finally:
        sc.setJobGroup("", "")
    assert 1 <= checks <= 2  # one aggregate for every feature column (AQE runs its shuffle as a job of its own); one per column ran 6
    assert sorted(r["prediction"] for r in lazy.collect()) == sorted(r["prediction"] for r in scored.collect())
    got = scored.orderBy("a").collect()
    x = np.array([[r["a"], r["b"], r["c"]] for r in got], np.float32)
    np.testing.assert_allclose([r["probability"].toArray() for r in got], fitted.getKerasModel().predict(x, verbose=0), rtol=1e-5, atol=1e-6)


def _two_towers():
    keras.utils.set_random_seed(2)
    user = keras.Input((1,), name="user", dtype="int32")
    stats = keras.Input((3,), name="stats")
    joined = keras.layers.Concatenate()([keras.layers.Flatten()(keras.layers.Embedding(5, 2)(user)), stats])
    return keras.Model([user, stats], [keras.layers.Dense(1, name="rating")(joined), keras.layers.Dense(2, name="scores")(joined)])


def test_named_inputs_and_outputs_score_one_column_per_output(spark, tmp_path):
    rng = np.random.default_rng(0)
    rows = [(int(i % 5), rng.normal(size=3).astype(float).tolist(), float(i % 3), [float(i % 2), 1.0]) for i in range(20)]
    df = spark.createDataFrame(rows, "uid int, s array<double>, r double, t array<double>")
    est = KerasEstimator(model=_two_towers(), loss="mse", featuresCols={"user": "uid", "stats": "s"}, labelCols={"rating": "r", "scores": "t"},
                         numWorkers=2, epochs=1, verbose=0)
    fitted = est.fit(df)
    out = fitted.transform(df)
    assert out.columns == ["uid", "s", "r", "t", "rating", "scores"]
    assert dict(out.dtypes)["rating"] == "double" and dict(out.dtypes)["scores"] == "array<double>"
    got = out.collect()
    want = fitted.getKerasModel().predict([np.array([[r["uid"]] for r in got], np.int32), np.array([r["s"] for r in got], np.float32)], verbose=0)
    np.testing.assert_allclose([r["rating"] for r in got], want[0][:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([r["scores"] for r in got], want[1], rtol=1e-5, atol=1e-6)
    from sparkdl import KerasModel

    fitted.save(str(tmp_path / "m"))
    again = KerasModel.load(str(tmp_path / "m"))
    assert again.getFeaturesCols() == {"user": ["uid"], "stats": ["s"]}
    assert [r["scores"] for r in again.transform(df).collect()] == [r["scores"] for r in got]
    est.setClassWeight({0: 1.0, 1: 2.5}).write().overwrite().save(str(tmp_path / "e"))
    assert KerasEstimator.load(str(tmp_path / "e")).getClassWeight() == {0: 1.0, 1: 2.5}
    with pytest.raises(SchemaError, match=r"featuresCols must map every model input by name.*no column for \['stats'\]"):
        fitted.setFeaturesCols({"user": "uid"}).transform(df)


def test_sequences_are_padded_and_masked(spark):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((None, 2)), keras.layers.Masking(), keras.layers.LSTM(3), keras.layers.Dense(1)])
    rng = np.random.default_rng(1)
    seqs = [rng.normal(size=(n, 2)).round(3).tolist() for n in (2, 5, 3, 1, 4, 2)]
    df = spark.createDataFrame([(i, s, float(len(s))) for i, s in enumerate(seqs)], "id int, seq array<array<double>>, y double")
    fitted = KerasEstimator(model=model, loss="mse", featuresCol="seq", labelCol="y", numWorkers=2, epochs=1, verbose=0).fit(df)
    got = fitted.transform(df.repartition(2)).orderBy("id").collect()
    plain = fitted.getKerasModel()
    want = [float(plain.predict(np.array([s], np.float32), verbose=0)[0, 0]) for s in seqs]  # each row alone, unpadded
    np.testing.assert_allclose([r["prediction"] for r in got], want, rtol=1e-5, atol=1e-6)


def test_a_model_with_a_dict_of_outputs_trains_and_scores_by_output_name(spark):
    keras.utils.set_random_seed(4)
    x = keras.Input((2,), name="x")
    model = keras.Model(x, {"b_out": keras.layers.Dense(1, name="b_out")(x), "a_out": keras.layers.Dense(2, name="a_out")(x)})
    rows = [([float(i), float(-i)], float(i), [float(i), 1.0]) for i in range(10)]
    df = spark.createDataFrame(rows, "f array<double>, b double, a array<double>")
    fitted = KerasEstimator(model=model, loss="mse", featuresCol="f", labelCols={"a_out": "a", "b_out": "b"}, numWorkers=2,
                            verbose=0).fit(df)
    got = fitted.transform(df).collect()
    want = fitted.getKerasModel().predict(np.array([r["f"] for r in got], np.float32), verbose=0)
    np.testing.assert_allclose([r["a_out"] for r in got], want["a_out"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([r["b_out"] for r in got], want["b_out"][:, 0], rtol=1e-5, atol=1e-6)


def test_output_columns_of_a_multi_output_model_can_be_renamed(spark):
    """Outputs named like their label columns (C15's recommender) score their training data through outputCols."""
    keras.utils.set_random_seed(5)
    x = keras.Input((2,))
    model = keras.Model(x, [keras.layers.Dense(1, name="rating")(x), keras.layers.Dense(1, name="click")(x)])
    df = spark.createDataFrame([([float(i), 1.0], float(i), float(i % 2)) for i in range(8)], "f array<double>, rating double, click double")
    fitted = KerasEstimator(model=model, loss="mse", featuresCol="f", labelCols={"rating": "rating", "click": "click"}, numWorkers=2,
                            verbose=0).fit(df)
    with pytest.raises(SchemaError, match=r"output column 'rating' must not exist .*set outputCols"):
        fitted.transform(df)
    with pytest.raises(SchemaError, match=r"outputCols must name one column per model output \['rating', 'click'\]"):
        fitted.setOutputCols(["only_one"]).transform(df)
    out = fitted.setOutputCols({"rating": "rating_hat", "click": "click_hat"}).transform(df)
    assert out.columns == ["f", "rating", "click", "rating_hat", "click_hat"]
    got = out.collect()
    want = fitted.getKerasModel().predict(np.array([r["f"] for r in got], np.float32), verbose=0)
    np.testing.assert_allclose([r["click_hat"] for r in got], want[1][:, 0], rtol=1e-5, atol=1e-6)
