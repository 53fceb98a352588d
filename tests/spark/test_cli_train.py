"""sparkdl-train in-process on the test session (local[2]) for the label forms and output counts that
have no ``prediction == label``: one-hot labels, a model with two outputs, a regressor. Each run ends
with a saved model that ``KerasModel.load`` reads and ``metrics.json`` holding ``KerasModel.evaluate``'s
metrics, checked against plain Keras' ``evaluate`` of the saved model on the same test rows."""

import json

import numpy as np
import pytest
import yaml

from sparkdl import KerasModel
from tests.cli_models import write_rows

import keras  # noqa: E402


def run_job(tmp_path, capsys, model, fit, **data):
    """``sparkdl-train --config <config> --output <tmp>/run`` on 48 train rows and 20 test rows;
    returns (metrics.json, the last stdout line, the test columns, the output folder)."""
    write_rows(tmp_path / "train.parquet", 48, seed=0)
    test = write_rows(tmp_path / "test.parquet", 20, seed=1)
    config = {
        "name": "cli",
        "data": {"train": str(tmp_path / "train.parquet"), "test": str(tmp_path / "test.parquet"), "features_col": "x", **data},
        "model": {"factory": f"tests.cli_models:{model}"},
        "fit": {"optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.1}}, "num_workers": 2, "epochs": 1,
                "batch_size": 8, "verbose": 0, "seed": 1, **fit},
        "output": {"plot": False},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    from sparkdl.cli.train import main

    out = tmp_path / "run"
    assert main(["--config", str(path), "--output", str(out)]) == 0, capsys.readouterr().err
    last = capsys.readouterr().out.strip().splitlines()[-1]
    return json.loads((out / "metrics.json").read_text()), last, test, out


def keras_evaluate(out, x, y):
    """Plain Keras' evaluate of the saved model (compiled as the fit compiled it) on the test rows."""
    model = KerasModel.load(str(out / "model")).getKerasModel()
    return model.evaluate(x, y, batch_size=len(x), verbose=0, return_dict=True)


def test_one_hot_labels_save_the_model_and_report_evaluate_metrics(spark, tmp_path, capsys):
    metrics, last, test, out = run_job(tmp_path, capsys, "softmax", {"loss": "categorical_crossentropy", "metrics": ["accuracy"]},
                                       label_col="onehot")
    want = keras_evaluate(out, test["x"], test["onehot"])
    assert sorted(metrics["test_metrics"]) == ["accuracy", "loss"]
    assert metrics["test_metrics"]["loss"] == pytest.approx(want["loss"], abs=1e-5)
    assert metrics["test_metrics"]["accuracy"] == pytest.approx(want["accuracy"], abs=1e-6)
    assert metrics["test_accuracy"] == metrics["test_metrics"]["accuracy"]  # one-hot: the compiled accuracy
    assert last.startswith(f"sparkdl: test accuracy {metrics['test_accuracy']:.4f}, loss {want['loss']:.4f}, fit ")
    assert metrics["train_rows"] == 48


def test_class_index_labels_count_prediction_equal_to_label(spark, tmp_path, capsys):
    metrics, last, test, out = run_job(tmp_path, capsys, "softmax", {"loss": "sparse_categorical_crossentropy", "metrics": []})
    model = KerasModel.load(str(out / "model")).getKerasModel()
    predicted = model.predict(test["x"], verbose=0).argmax(axis=1)
    assert metrics["test_accuracy"] == pytest.approx(float((predicted == test["label"]).mean()), abs=1e-12)  # k/20
    assert sorted(metrics["test_metrics"]) == ["loss"]
    assert metrics["test_metrics"]["loss"] == pytest.approx(keras_evaluate(out, test["x"], test["label"])["loss"], abs=1e-5)
    assert last.startswith(f"sparkdl: test accuracy {metrics['test_accuracy']:.4f}, loss ")


def test_regression_reports_loss_and_metrics_without_an_accuracy(spark, tmp_path, capsys):
    metrics, last, test, out = run_job(tmp_path, capsys, "linear", {"loss": "mse", "metrics": ["mae"]}, label_col="y")
    model = KerasModel.load(str(out / "model")).getKerasModel()
    error = model.predict(test["x"], verbose=0)[:, 0] - test["y"]
    assert "test_accuracy" not in metrics
    assert metrics["test_metrics"]["loss"] == pytest.approx(float(np.mean(error**2)), rel=1e-5)
    assert metrics["test_metrics"]["mae"] == pytest.approx(float(np.mean(np.abs(error))), rel=1e-5)
    assert last.startswith(f"sparkdl: test loss {metrics['test_metrics']['loss']:.4f}, mae {metrics['test_metrics']['mae']:.4f}, fit ")


def test_two_outputs_with_label_cols_report_each_outputs_loss(spark, tmp_path, capsys):
    metrics, last, test, out = run_job(tmp_path, capsys, "two_outputs", {"loss": "mse"}, label_cols={"a": "ya", "b": "yb"})
    model = KerasModel.load(str(out / "model")).getKerasModel()
    predicted = model.predict(test["x"], verbose=0)
    mse = {name: float(np.mean((predicted[name][:, 0] - test[column]) ** 2)) for name, column in (("a", "ya"), ("b", "yb"))}
    assert "test_accuracy" not in metrics
    assert metrics["test_metrics"]["loss"] == pytest.approx(mse["a"] + mse["b"], rel=1e-5)
    # one batch per partition: each output's loss is a mean of partition means, so only the sum is exact
    assert set(metrics["test_metrics"]) == {"loss", "a_loss", "b_loss"}
    assert last.startswith(f"sparkdl: test loss {metrics['test_metrics']['loss']:.4f}, a_loss ")


@pytest.mark.slow
def test_a_yaml_loss_and_metrics_per_output_train_and_report_keras_names(spark, tmp_path, capsys):
    fit = {"loss": {"a": "mse", "b": "mae"}, "metrics": {"b": ["mse"]}}
    metrics, _, test, out = run_job(tmp_path, capsys, "two_outputs", fit, label_cols={"a": "ya", "b": "yb"})
    assert KerasModel.load(str(out / "model")).getLoss() == fit["loss"]
    want = keras_evaluate(out, test["x"], {"a": test["ya"], "b": test["yb"]})
    assert set(metrics["test_metrics"]) == set(want) == {"loss", "a_loss", "b_loss", "b_mse"}
    assert metrics["test_metrics"]["b_mse"] == pytest.approx(want["b_mse"], rel=1e-5)


def test_a_shipped_config_copied_out_with_its_data_runs_from_another_directory(spark, tmp_path, monkeypatch, capsys):
    """conf/mnist_quick.yaml copied with a 96-row slice of its data beside it (conf/, data/mnist10k/) runs from
    another working directory: its factory comes with the package, its data paths are its folder's, the default
    output is the working directory's runs/<name>, and fit.learning_rate is the saved optimizer's rate."""
    import shutil

    import pyarrow.parquet as pq

    from sparkdl.cli.train import main
    from tests.conftest import ROOT

    (tmp_path / "conf").mkdir()
    shutil.copy(f"{ROOT}/conf/mnist_quick.yaml", tmp_path / "conf")
    (tmp_path / "data" / "mnist10k").mkdir(parents=True)
    for name, rows in (("train", 64), ("test", 32)):
        table = pq.read_table(f"{ROOT}/data/mnist10k/{name}.parquet").slice(0, rows)
        pq.write_table(table, tmp_path / "data" / "mnist10k" / f"{name}.parquet")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")

    args = ["--config", "../conf/mnist_quick.yaml", "--set", "fit.verbose=0", "--set", "output.plot=false",
            "--set", "fit.validation_split=0.0", "--set", "fit.local_steps=null", "--set", "fit.learning_rate=0.01"]
    assert main(args) == 0, capsys.readouterr().err
    run = tmp_path / "elsewhere" / "runs" / "mnist_quick"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["train_rows"] == 64 and metrics["rounds"] == 1
    loaded = KerasModel.load(str(run / "model"))
    optimizer = loaded.getOptimizer()
    assert optimizer["class_name"].lower() == "adam" and optimizer["config"]["learning_rate"] == pytest.approx(0.01)
    assert loaded.getLearningRate() == pytest.approx(0.01)  # the learningRate Param, saved with the model


def test_py_files_reach_the_executors_of_an_existing_session_whose_settings_stay(spark, tmp_path, caplog):
    """``--py-files`` on a session that exists already (a notebook's): ``addPyFile``, so a task imports the
    module; ``--conf`` is not applied to it, and a warning says so."""
    import logging

    from sparkdl.cli import spark_session

    module = tmp_path / "shipped_by_cli_44.py"
    module.write_text("VALUE = 44\n")
    with caplog.at_level(logging.WARNING, logger="sparkdl.cli"):
        session, started_here = spark_session("sparkdl test", conf={"spark.sql.shuffle.partitions": "7"}, py_files=[str(module)])
    assert session is spark and started_here is False
    values = spark.sparkContext.parallelize([0, 1], 2).map(lambda _: __import__("shipped_by_cli_44").VALUE).collect()
    assert values == [44, 44]
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"  # the fixture's, kept
    assert "--conf spark.sql.shuffle.partitions=7 not applied" in caplog.text


def test_spark_submit_of_a_job_is_quiet_from_the_sessions_start(tmp_path):
    """``spark-submit`` of a script that starts its session as jobs/train.py does (``sparkdl.cli.spark_session``), with
    Spark's default log4j profile: ``spark.log.level=WARN`` from the context's start, so at most the three INFO lines
    Spark prints before it reads the setting (version, OS, Java), where a plain session prints about eighty."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    script = tmp_path / "job.py"
    script.write_text("from sparkdl.cli import spark_session\n"
                      "spark, started_here = spark_session('quiet', 'local[1]')\n"
                      "print('level', spark.conf.get('spark.log.level'), started_here, spark.range(5).count())\n"
                      "spark.stop()\n")
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("SPARK_CONF_DIR", None)
    result = subprocess.run([submit, "--conf", "spark.ui.enabled=false", str(script)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "level WARN True 5" in result.stdout
    info = [line for line in result.stderr.splitlines() if " INFO " in line]
    assert len(info) <= 3, info[:10]
