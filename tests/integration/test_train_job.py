"""The main job, as ``make train`` runs it: spark-submit jobs/train.py on the bundled MNIST digits."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_main_job_reaches_target_accuracy(tmp_path):
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    cmd = [spark_submit, "--master", "local[2]", "jobs/train.py", "--config", "conf/mnist_cnn.yaml", "--output", str(tmp_path)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["test_accuracy"] >= 0.975
    assert metrics["num_workers"] == 2 and metrics["epochs"] == 8 and metrics["rounds"] == 32
    assert os.path.isfile(tmp_path / "model" / "model.keras")
    assert "Epoch 8/8" in result.stdout
    assert "[Stage " not in result.stderr  # no Spark stage bars without --conf spark.ui.showConsoleProgress=false
    assert "oneDNN custom operations" not in result.stderr  # the workers' TensorFlow start-up lines filtered
