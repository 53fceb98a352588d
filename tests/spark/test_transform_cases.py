"""Handed inference cases: C31 (sparse and dense vectors at transform)."""

import numpy as np
import pytest
from pyspark.ml.linalg import DenseVector, SparseVector, VectorUDT
from pyspark.sql import types as T

import keras
from sparkdl import KerasEstimator
from tests.conftest import jobs_started


def test_c31_sparse_and_dense_vectors_score_alike(spark):
    sparse = [SparseVector(5, {0: 1.0, 3: 2.0}), SparseVector(5, {1: -1.5}), SparseVector(5, {2: 0.5, 4: 3.0})]
    rows = [(v, float(i % 3)) for i, v in enumerate(sparse)] + [(DenseVector(v.toArray()), float(i % 3)) for i, v in enumerate(sparse)]
    schema = T.StructType([T.StructField("features", VectorUDT()), T.StructField("label", T.DoubleType())])
    df = spark.createDataFrame(rows, schema)
    keras.utils.set_random_seed(31)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, activation="softmax")])
    fitted = KerasEstimator(model=model, loss="sparse_categorical_crossentropy", numWorkers=1, epochs=1, batchSize=3,
                            verbose=0, checkFeatures=False).fit(df)
    scored = []
    assert jobs_started(spark, lambda: scored.append(fitted.transform(df.repartition(4)))) == 0  # the schema without a job
    assert [f.name for f in scored[0].schema.fields] == ["features", "label", "prediction", "rawPrediction", "probability"]
    out = scored[0].collect()
    assert len(out) == 6
    local = fitted.getKerasModel().predict(np.stack([v.toArray() for v in sparse]).astype(np.float32), verbose=0)
    by_values = {}
    for r in out:
        probability = r["probability"].toArray()
        assert probability.shape == (3,) and abs(probability.sum() - 1.0) < 1e-5
        by_values.setdefault(tuple(r["features"].toArray()), []).append(probability)
    assert len(by_values) == 3
    for v, want in zip(sparse, local, strict=True):
        twins = by_values[tuple(v.toArray())]
        assert len(twins) == 2 and np.array_equal(twins[0], twins[1])  # sparse row and its dense twin
        np.testing.assert_allclose(twins[0], want, atol=1e-6)
    # empty partitions add nothing and raise nothing
    assert fitted.transform(df.limit(1).repartition(4)).count() == 1
    with pytest.raises(Exception):
        fitted.transform(df.withColumnRenamed("features", "f")).collect()


def test_c41_output_cols_of_the_wrong_length_and_metrics_for_no_output_fail_fit_before_any_job(spark, tmp_path):
    from sparkdl import KerasModel
    from sparkdl.errors import ConfigError, IncompleteSaveError, SchemaError

    inp = keras.Input((3,))
    hidden = keras.layers.Dense(4)(inp)
    model = keras.Model(inp, [keras.layers.Dense(2, activation="softmax", name="cls")(hidden), keras.layers.Dense(1, name="reg")(hidden)])
    df = spark.createDataFrame([([0.1, 0.2, 0.3], 1, 0.5)], "features array<float>, y1 int, y2 float")
    est = KerasEstimator(model=model, loss="mse", labelCols=["y1", "y2"], outputCols=["only"], verbose=0)
    assert jobs_started(spark, lambda: pytest.raises(SchemaError, est.fit, df)) == 0
    # per-output metrics are taken as Keras takes them; a name that is not an output fails before any job
    wrong = KerasEstimator(model=model, loss="mse", metrics={"cls": ["accuracy"], "nope": ["mae"]}, labelCols=["y1", "y2"], verbose=0)
    raised = []
    assert jobs_started(spark, lambda: raised.append(pytest.raises(ConfigError, wrong.fit, df))) == 0
    assert "nope" in str(raised[0].value) and "'cls'" in str(raised[0].value) and "'reg'" in str(raised[0].value)
    fitted = KerasModel.fromKeras(model, loss="mse")
    fitted.save(str(tmp_path / "m"))
    with pytest.raises(IncompleteSaveError, match="names a file of a save: load its folder"):
        KerasModel.load(str(tmp_path / "m" / "model.keras"))
