"""sparkdl-predict in-process on the test session: CSV output (vectors as JSON arrays) and errors as one line."""

import json
import os

import numpy as np
import pytest

from sparkdl import KerasModel
from tests.conftest import partitioned_df

import keras  # noqa: E402


@pytest.fixture
def saved(spark, tmp_path):
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="softmax")])
    model.compile(loss="sparse_categorical_crossentropy")
    KerasModel.fromKeras(model, featuresCol="x").write().save(str(tmp_path / "model"))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 3)).astype(np.float32)
    partitioned_df(spark, [[(i, x[i].tolist()) for i in range(10)]], "id int, x array<float>").write.parquet(str(tmp_path / "in"))
    return model, x, tmp_path


def test_predict_writes_csv_with_score_vectors_as_json_arrays(spark, saved):
    from sparkdl.cli.predict import predict

    model, x, tmp_path = saved
    result = predict(str(tmp_path / "model"), str(tmp_path / "in"), str(tmp_path / "out"), output_format="csv", columns=["id"])
    assert result["rows"] == 10 and result["columns"] == ["id", "prediction", "rawPrediction", "probability"]
    rows = spark.read.option("header", "true").csv(str(tmp_path / "out")).collect()
    assert sorted(int(r["id"]) for r in rows) == list(range(10))
    want = model.predict(x, verbose=0)
    for row in rows:
        probability = np.array(json.loads(row["probability"]))
        np.testing.assert_allclose(probability, want[int(row["id"])], atol=1e-6)
        assert float(row["prediction"]) == np.argmax(want[int(row["id"])])


def test_predict_arrays_writes_score_vectors_that_pandas_reads_as_lists_of_floats(spark, saved, capsys):
    """Issue 31 item 9: Parquet holds Spark ML vectors as structs (``type``, ``size``, ``indices``,
    ``values``) that pandas cannot read as scores; ``--arrays`` writes them as ``array<double>``."""
    import pandas as pd

    from sparkdl.cli.predict import main

    model, x, tmp_path = saved
    assert main(["--model", str(tmp_path / "model"), "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                 "--arrays", "--columns", "id"]) == 0
    assert "wrote 10 rows (id, prediction, rawPrediction, probability)" in capsys.readouterr().out
    table = pd.read_parquet(str(tmp_path / "out")).sort_values("id")
    want = model.predict(x, verbose=0)
    probability = np.stack(table["probability"].to_numpy())
    assert probability.shape == (10, 4) and probability.dtype == np.float64
    np.testing.assert_allclose(probability, want, atol=1e-6)
    np.testing.assert_array_equal(table["prediction"].to_numpy(), np.argmax(want, axis=1))
    default = tmp_path / "vectors"
    assert main(["--model", str(tmp_path / "model"), "--input", str(tmp_path / "in"), "--output", str(default)]) == 0
    assert isinstance(pd.read_parquet(str(default))["probability"].iloc[0], dict)  # a vector struct outside Spark


def test_predict_reports_a_missing_column_in_one_line(spark, saved, capsys):
    from sparkdl.cli.predict import main

    _, _, tmp_path = saved
    spark.read.parquet(str(tmp_path / "in")).withColumnRenamed("x", "y").write.parquet(str(tmp_path / "renamed"))
    assert main(["--model", str(tmp_path / "model"), "--input", str(tmp_path / "renamed"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparkdl-predict: error: SchemaError:") and "'x'" in err
    assert not os.path.exists(tmp_path / "o")


def test_predict_scores_a_saved_pipeline_model_as_tabular_models_are_saved(spark, tmp_path):
    """VectorAssembler + KerasModel saved as one PipelineModel: sparkdl-predict loads it by the class in its
    metadata, sets --batch-size on the KerasModel inside, and writes the model's columns."""
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    from sparkdl.cli.predict import load_stage, main

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(12, 3)).astype(np.float32)
    rows = [(i, *map(float, x[i])) for i in range(12)]
    df = partitioned_df(spark, [rows[:6], rows[6:]], "id int, a double, b double, c double")
    df.write.parquet(str(tmp_path / "in"))
    assembler = VectorAssembler(inputCols=["a", "b", "c"], outputCol="features")
    PipelineModel(stages=[assembler, KerasModel.fromKeras(model, featuresCol="features")]).write().save(str(tmp_path / "pm"))
    Pipeline(stages=[assembler]).fit(df).write().save(str(tmp_path / "jvm_pm"))  # all-JVM stages: saved by the JVM

    assert main(["--model", str(tmp_path / "pm"), "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                 "--columns", "id", "--batch-size", "5"]) == 0
    scored = spark.read.parquet(str(tmp_path / "out"))
    assert scored.columns == ["id", "features", "prediction", "rawPrediction", "probability"]
    want = model.predict(x, verbose=0)
    for row in scored.collect():
        np.testing.assert_allclose(row["probability"].toArray(), want[row["id"]], atol=1e-6)
        assert row["prediction"] == float(np.argmax(want[row["id"]]))

    jvm = load_stage(str(tmp_path / "jvm_pm"), spark)
    assert type(jvm) is PipelineModel and [type(s).__name__ for s in jvm.stages] == ["VectorAssembler"]


def test_predict_refuses_an_unfitted_pipeline_and_batch_size_without_a_keras_model(spark, tmp_path, capsys):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    from sparkdl.cli.predict import main

    assembler = VectorAssembler(inputCols=["a"], outputCol="v")
    Pipeline(stages=[assembler]).write().save(str(tmp_path / "pipeline"))
    df = partitioned_df(spark, [[(1.0,), (2.0,)]], "a double")
    df.write.parquet(str(tmp_path / "in"))
    assert main(["--model", str(tmp_path / "pipeline"), "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o")]) == 2
    assert "a Pipeline, which must be fit first" in capsys.readouterr().err
    Pipeline(stages=[assembler]).fit(df).write().save(str(tmp_path / "pm"))
    assert main(["--model", str(tmp_path / "pm"), "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o"),
                 "--batch-size", "4"]) == 2
    assert "PipelineModel at" in capsys.readouterr().err and not os.path.exists(tmp_path / "o")
