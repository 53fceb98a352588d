"""The command line end to end (issue 12): the "try it locally as a cluster" block of docs/deploy.md,
run as it is written there, a shell script of ``spark-submit jobs/train.py`` on ``local-cluster[2,1,1024]``
and ``sparkdl-predict`` (the venv's console script, its driver in-process) on the saved model.

Real Spark, real processes, no mocks; only ``$OUT`` (the output folder) comes from the test, as an
environment variable. ``PYSPARK_PYTHON`` is left unset: the job must default it to its own interpreter.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def doc_block(marker: str) -> str:
    with open(os.path.join(ROOT, "docs", "deploy.md")) as f:
        text = f.read()
    match = re.search(rf"<!-- tested: {re.escape(marker)} -->\n```bash\n(.*?)```", text, re.S)
    assert match, f"docs/deploy.md has no bash block marked <!-- tested: {marker} -->"
    return match.group(1)


def venv_env(**extra) -> dict:
    """This interpreter's bin folder first on PATH (spark-submit, sparkdl-predict, python3), as an activated
    virtualenv has it; no PYSPARK_PYTHON / PYSPARK_DRIVER_PYTHON."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


@pytest.mark.slow  # two executor JVMs and the CLI twice: about 100 s
def test_deploy_doc_local_cluster_block_trains_and_predicts(tmp_path):
    bin_dir = os.path.dirname(sys.executable)
    for tool in ("spark-submit", "sparkdl-predict", "python3"):
        if not os.path.exists(os.path.join(bin_dir, tool)):
            pytest.skip(f"{tool} is not installed next to {sys.executable} (pip install -e .)")
    out = tmp_path / "out"
    block = doc_block("local-cluster")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT, env=venv_env(OUT=str(out)),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    # the training job: metrics, plot and model
    run = out / "mnist_quick"
    metrics = json.loads((run / "metrics.json").read_text())
    assert 0.85 < metrics["test_accuracy"] <= 1.0  # measured 0.9235 (MLP, 1 epoch, 2 workers)
    assert metrics["num_workers"] == 2 and metrics["epochs"] == 1 and metrics["local_steps"] == 16
    assert metrics["rounds"] >= 4 and 7000 < metrics["train_rows"] < 7400  # 8,000 rows less the 10 % validation split
    assert set(metrics["history"]) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert "sparkdl: fitting mnist_quick on local-cluster[2,1,1024] with 2 workers" in result.stdout
    assert f"sparkdl: test accuracy {metrics['test_accuracy']:.4f}" in result.stdout
    png = (run / "history.png").read_bytes()
    assert png[:8] == PNG_SIGNATURE and len(png) > 1024
    assert (run / "model" / "model.keras").is_file() and (run / "model" / "metadata").is_dir()

    # the scoring command: every test row, the columns asked for, the model's predictions
    import pyarrow.parquet as pq

    test = pq.read_table(os.path.join(ROOT, "data", "mnist10k", "test.parquet")).to_pandas()
    scored_table = pq.read_table(run / "predictions")
    assert scored_table.column_names == ["label", "prediction", "rawPrediction", "probability"]  # pixels dropped (--columns)
    scored = scored_table.to_pandas()
    assert len(scored) == len(test) == 2000
    assert re.search(r"sparkdl: wrote 2000 rows \(label, prediction, rawPrediction, probability\) to \S+ in [\d.]+ s",
                     result.stdout)
    accuracy = float((scored["prediction"] == scored["label"]).mean())
    assert accuracy > 0.85
    assert accuracy == pytest.approx(metrics["test_accuracy"], abs=1e-9)  # the same model on the same rows

    # row for row against the saved Keras model (one input file -> one partition -> the input's order)
    import keras

    assert scored["label"].tolist() == test["label"].tolist()
    model = keras.saving.load_model(str(run / "model" / "model.keras"), compile=False)
    expected = model.predict(np.stack(test["pixels"].to_numpy()).astype("float32"), verbose=0)
    probability = np.stack([np.asarray(v["values"]) for v in scored["probability"]])
    np.testing.assert_allclose(probability, expected, atol=1e-5)
    assert (scored["prediction"].to_numpy() == expected.argmax(axis=1)).mean() >= 0.999


@pytest.mark.slow
def test_sparkdl_train_console_script_runs_the_driver_in_process(tmp_path):
    """`sparkdl-train` without spark-submit: pyspark starts the JVM from SparkSession.builder; --master, --set,
    and an --output URI (written through Spark's Hadoop filesystem)."""
    train = os.path.join(os.path.dirname(sys.executable), "sparkdl-train")
    cmd = [train, "--config", "conf/mnist_quick.yaml", "--master", "local[2]", "--output", tmp_path.as_uri(),
           "--set", "fit.validation_split=0.0", "--set", "output.plot=false", "--set", "name=console"]
    result = subprocess.run(cmd, cwd=ROOT, env=venv_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["test_accuracy"] > 0.85 and metrics["train_rows"] == 8000
    assert set(metrics["history"]) == {"loss", "accuracy"}
    assert not (tmp_path / "history.png").exists()
    assert (tmp_path / "model" / "model.keras").is_file() and (tmp_path / "model" / "metadata").is_dir()
    assert "sparkdl: fitting console on local[2] with 2 workers" in result.stdout
    assert "[Stage " not in result.stderr and "oneDNN custom operations" not in result.stderr  # a quiet console
