"""Each asynchronous mode trains the CNN of conf/mnist_cnn.yaml to >= 97 % test accuracy on the
bundled MNIST digits with 2 workers, through ``spark-submit jobs/train.py --config
conf/mnist_cnn_<mode>.yaml`` (backend ps, τ = 4, Adam 0.001). ``async`` runs in the default
suite; the others are slow (``make test-all``)."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


TAU = {"async": 4, "hogwild": 4, "staleness_aware": 4, "ssp": 4}


def _run(mode, tmp_path):
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    cmd = [spark_submit, "--master", "local[2]", "--conf", "spark.ui.showConsoleProgress=false",
           "jobs/train.py", "--config", f"conf/mnist_cnn_{mode}.yaml", "--output", str(tmp_path)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["test_accuracy"] >= 0.97, metrics
    assert metrics["mode"] == mode and metrics["backend"] == "ps" and metrics["num_workers"] == 2
    tau = TAU[mode]
    assert metrics["local_steps"] == tau and metrics["epochs"] == 8
    assert set(metrics["history"]) == {"loss", "accuracy"}  # the server's counts are fitInfo["ps_epochs"], written as ps_epochs
    epochs = metrics["ps_epochs"]
    # 4,000 rows per worker, batch 64: 63 steps per epoch, ceil(63 / τ) pushes per worker per epoch
    assert [e["updates_applied"] for e in epochs] == [2 * -(-63 // tau)] * 8
    assert all(e["bytes_pushed"] > 0 and e["bytes_pulled"] > 0 for e in epochs)
    assert "Epoch 8/8" in result.stdout
    return metrics


@pytest.mark.slow  # an MNIST accuracy run (8 epochs of the CNN), as the main job's
def test_async_reaches_target_accuracy(tmp_path):
    _run("async", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hogwild", "staleness_aware", "ssp"])
def test_mode_reaches_target_accuracy(mode, tmp_path):
    metrics = _run(mode, tmp_path)
    if mode == "ssp":
        staleness = [e["staleness_max"] for e in metrics["ps_epochs"]]  # the server's counts, per epoch (not the history)
        assert len(staleness) == 8 and max(staleness) <= 2 * 2 + 1  # bound s = 2 clocks: at most 2 s + 1 other pushes
