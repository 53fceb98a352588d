"""C25 and Spark ML persistence: save -> load in a fresh Python process -> identical predictions."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel

from sparkdl import KerasEstimator, KerasModel

import keras  # noqa: E402

from tests.conftest import ROOT

FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    from sparkdl import KerasModel
    path, data, out = sys.argv[1:4]
    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    df = spark.read.parquet(data)
    model = KerasModel.load(path)
    first = [r["score"] for r in model.transform(df).orderBy("id").collect()]
    model.write().overwrite().save(path + "_again")          # save the loaded model again ...
    again = KerasModel.load(path + "_again")                  # ... and load it once more
    second = [r["score"] for r in again.transform(df).orderBy("id").collect()]
    weights = again.getKerasModel().get_weights()
    json.dump({"first": first, "second": second, "featuresCol": again.getFeaturesCol(), "batchSize": again.getBatchSize(),
               "history": again.history, "dtypes": [str(w.dtype) for w in weights], "shapes": [list(w.shape) for w in weights]},
              open(out, "w"))
    spark.stop()
    """
)


@pytest.fixture(scope="module")
def fitted(spark):
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(1)])
    rng = np.random.default_rng(0)
    rows = [(i, rng.normal(size=3).tolist(), float(rng.normal())) for i in range(20)]
    df = spark.createDataFrame(rows, "id long, inputs array<double>, target double")
    est = KerasEstimator(model=model, optimizer="adam", loss="mse", featuresCol="inputs", labelCol="target",
                         predictionCol="score", numWorkers=2, epochs=2, batchSize=6, verbose=0)
    return est, est.fit(df), df


@pytest.mark.slow  # the default run's 25-minute budget: test_pipeline_with_the_estimator_saves_and_loads runs its kind in process
@pytest.mark.backends  # also run under KERAS_BACKEND=jax and torch (make test, make test-all)
def test_c25_save_then_load_in_a_fresh_process_predicts_identically(spark, fitted, tmp_path):
    _, model, df = fitted
    before = [r["score"] for r in model.transform(df).orderBy("id").collect()]
    path, data, out = str(tmp_path / "model"), str(tmp_path / "data.parquet"), str(tmp_path / "out.json")
    model.save(path)
    df.write.parquet(data)
    assert os.path.isfile(os.path.join(path, "model.keras"))
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, "-c", FRESH_PROCESS, path, data, out], check=True, env=env, timeout=600, capture_output=True)
    result = json.load(open(out))
    # Bit for bit on TensorFlow; XLA (JAX, torch) may compile the fresh process's graph otherwise: 1 float32 ulp seen.
    atol = 0 if keras.backend.backend() == "tensorflow" else 1e-6
    np.testing.assert_allclose(result["first"], before, rtol=0, atol=atol)
    np.testing.assert_allclose(result["second"], before, rtol=0, atol=atol)
    assert result["featuresCol"] == "inputs" and result["batchSize"] == 6
    assert result["history"] == model.history
    original = model.getKerasModel().get_weights()
    assert result["dtypes"] == [str(w.dtype) for w in original] == ["float32"] * 4
    assert result["shapes"] == [list(w.shape) for w in original]


def test_estimator_save_load_keeps_params_and_initial_model(fitted, tmp_path):
    est, _, _ = fitted
    est.save(str(tmp_path / "est"))
    loaded = KerasEstimator.load(str(tmp_path / "est"))
    assert loaded.uid == est.uid
    for name in ("featuresCol", "labelCol", "predictionCol", "numWorkers", "epochs", "batchSize", "optimizer", "loss"):
        assert loaded.getOrDefault(name) == est.getOrDefault(name), name
    for a, b in zip(loaded.getKerasModel().get_weights(), est.getKerasModel().get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_pipeline_with_the_estimator_saves_and_loads(spark, fitted, tmp_path):
    """C26 kind: unfitted Pipeline and fitted PipelineModel both round-trip with identical predictions."""
    from pyspark.ml.feature import VectorAssembler

    est, _, df = fitted
    flat = df.selectExpr("id", "inputs[0] as a", "inputs[1] as b", "inputs[2] as c", "target")
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["a", "b", "c"], outputCol="inputs"), est.copy()])
    pipeline.write().overwrite().save(str(tmp_path / "pipeline"))
    reloaded = Pipeline.load(str(tmp_path / "pipeline"))
    assert isinstance(reloaded.getStages()[1], KerasEstimator)
    fitted_pipeline = reloaded.fit(flat)
    before = [r["score"] for r in fitted_pipeline.transform(flat).orderBy("id").collect()]
    fitted_pipeline.write().overwrite().save(str(tmp_path / "pipeline_model"))
    after = [r["score"] for r in PipelineModel.load(str(tmp_path / "pipeline_model")).transform(flat).orderBy("id").collect()]
    assert before == after and len(after) == 20


def test_loading_a_model_without_its_keras_file_fails_clearly(fitted, tmp_path):
    _, model, _ = fitted
    path = tmp_path / "broken"
    model.save(str(path))
    os.remove(path / "model.keras")
    with pytest.raises(FileNotFoundError, match="a saved KerasModel must contain model.keras"):
        KerasModel.load(str(path))


# --- cluster filesystems (issue 5, item 7) and persistence guards (item 14) ---


def _scores(model, df):
    return [r["score"] for r in model.transform(df).orderBy("id").collect()]


def test_a_file_uri_and_a_hadoop_only_scheme_round_trip_through_the_hadoop_filesystem(spark, fitted, tmp_path):
    """``file://``, a path without scheme, and ``viewfs://`` (a Hadoop filesystem pyarrow cannot open, as it
    cannot open ``s3a://`` or ``dbfs:/``) all save and load with identical predictions."""
    _, model, df = fitted
    before = _scores(model, df)
    local = tmp_path / "uri_model"
    model.save(f"file://{local}")
    assert {"metadata", "model.keras"} <= set(os.listdir(local))
    assert _scores(KerasModel.load(f"file://{local}"), df) == before
    assert _scores(KerasModel.load(str(local)), df) == before  # the same directory as a path without scheme
    key = "fs.viewfs.mounttable.sparkdltest.link./models"
    (tmp_path / "mounted").mkdir()
    spark.sparkContext._jsc.hadoopConfiguration().set(key, (tmp_path / "mounted").as_uri())
    try:
        model.save("viewfs://sparkdltest/models/m")
        assert {"metadata", "model.keras"} <= set(os.listdir(tmp_path / "mounted" / "m"))
        assert _scores(KerasModel.load("viewfs://sparkdltest/models/m"), df) == before
    finally:
        spark.sparkContext._jsc.hadoopConfiguration().unset(key)


def test_a_save_that_stopped_before_its_metadata_fails_to_load_clearly_and_re_saves_with_overwrite(fitted, tmp_path):
    from sparkdl.errors import IncompleteSaveError, SavePathExistsError

    _, model, df = fitted
    path = str(tmp_path / "half")
    model.write()._write_files(path)  # step 1 of a save, then a crash before step 2 (the metadata)
    assert "model.keras" in os.listdir(path) and "metadata" not in os.listdir(path)
    with pytest.raises(IncompleteSaveError, match=r"must contain metadata/.*write\(\)\.overwrite\(\)\.save\(path\).*'model.keras'"):
        KerasModel.load(path)
    with pytest.raises(FileNotFoundError):  # IncompleteSaveError is a FileNotFoundError
        KerasModel.load(path)
    with pytest.raises(SavePathExistsError):
        model.save(path)
    model.write().overwrite().save(path)
    assert _scores(KerasModel.load(path), df) == _scores(model, df)


def test_a_failing_metadata_write_leaves_the_model_file_and_overwrite_repairs_it(fitted, tmp_path):
    """A plain file where the metadata folder goes makes the metadata write fail: the model file is
    already there (written first), the directory does not load, and an overwrite replaces it."""
    from sparkdl.errors import IncompleteSaveError

    _, model, df = fitted
    path = tmp_path / "blocked"
    path.mkdir()
    (path / "metadata").write_text("not a metadata folder")
    with pytest.raises(Exception, match="metadata"):
        model.write().saveImpl(str(path))
    assert (path / "model.keras").is_file()
    with pytest.raises(IncompleteSaveError, match="must contain metadata/"):
        KerasModel.load(str(path))
    model.write().overwrite().save(str(path))
    assert _scores(KerasModel.load(str(path)), df) == _scores(model, df)


def test_overwriting_the_path_a_model_was_loaded_from_keeps_it(fitted, tmp_path):
    _, model, df = fitted
    path = str(tmp_path / "same")
    model.save(path)
    loaded = KerasModel.load(path)
    loaded.write().overwrite().save(path)  # the loaded model lives in memory, not in the files it replaces
    assert _scores(KerasModel.load(path), df) == _scores(model, df)


def test_save_over_an_existing_path_says_write_overwrite_and_keeps_the_first_save(fitted, tmp_path):
    from sparkdl.errors import SavePathExistsError

    est, model, df = fitted
    path = str(tmp_path / "twice")
    model.save(path)
    stamp = os.path.getmtime(os.path.join(path, "model.keras"))
    with pytest.raises(SavePathExistsError, match=r"model\.write\(\)\.overwrite\(\)\.save\(path\)\. Received: path") as info:
        model.save(path)
    assert "Set mode" not in str(info.value)  # not the DataFrame writer's advice
    assert os.path.getmtime(os.path.join(path, "model.keras")) == stamp  # nothing was written
    assert _scores(KerasModel.load(path), df) == _scores(model, df)
    est.save(str(tmp_path / "est"))
    with pytest.raises(SavePathExistsError, match=r"stage\.write\(\)\.overwrite\(\)\.save\(path\)"):
        est.save(str(tmp_path / "est"))


def test_loading_with_the_wrong_class_names_the_right_reader(spark, fitted, tmp_path):
    from pyspark.ml.feature import StringIndexer

    from sparkdl.errors import IncompleteSaveError, StageClassError

    est, model, _ = fitted
    model.save(str(tmp_path / "model"))
    est.save(str(tmp_path / "est"))
    with pytest.raises(StageClassError, match=r"holds a KerasModel: load it with KerasModel\.load\(path\)"):
        KerasEstimator.load(str(tmp_path / "model"))
    with pytest.raises(StageClassError, match=r"holds a KerasEstimator: load it with KerasEstimator\.load\(path\)"):
        KerasModel.load(str(tmp_path / "est"))
    indexer = StringIndexer(inputCol="s", outputCol="i").fit(spark.createDataFrame([("a",), ("b",)], "s string"))
    indexer.save(str(tmp_path / "indexer"))
    with pytest.raises(StageClassError, match=r"load it with pyspark\.ml\.feature\.StringIndexerModel\.load\(path\)"):
        KerasModel.load(str(tmp_path / "indexer"))
    with pytest.raises(IncompleteSaveError, match="Received: nothing at file:"):
        KerasModel.load(str(tmp_path / "nowhere"))
