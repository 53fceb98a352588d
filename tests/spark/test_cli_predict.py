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


def test_predict_reports_a_missing_column_in_one_line(spark, saved, capsys):
    from sparkdl.cli.predict import main

    _, _, tmp_path = saved
    spark.read.parquet(str(tmp_path / "in")).withColumnRenamed("x", "y").write.parquet(str(tmp_path / "renamed"))
    assert main(["--model", str(tmp_path / "model"), "--input", str(tmp_path / "renamed"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparkdl-predict: error: SchemaError:") and "'x'" in err
    assert not os.path.exists(tmp_path / "o")
