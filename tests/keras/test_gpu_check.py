"""``benchmarks/gpu_check.py`` (issue 11, item 6) stays runnable with numpy, Keras and a backend alone: its data
file matches the Parquet files, the replica imports without Spark or pyarrow, and a CPU run reports float32 weights."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT

DATA = os.path.join(ROOT, "data", "mnist10k")

BLOCKED = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'pyspark', 'pyarrow', 'pandas', 'yaml'}:
            raise ImportError('gpu_check must not need ' + name)
sys.meta_path.insert(0, Block())
from sparkdl.core.state import ModelState
from sparkdl.keras.replica import Replica, build_mixed, mixed_architecture
print('ok')
"""


def test_the_npz_digits_are_the_parquet_digits():
    import pyarrow.parquet as pq

    with np.load(os.path.join(DATA, "mnist10k.npz")) as npz:
        for part in ("train", "test"):
            table = pq.read_table(os.path.join(DATA, f"{part}.parquet"))
            pixels = np.stack(table.column("pixels").to_numpy(zero_copy_only=False))
            np.testing.assert_array_equal(npz[f"x_{part}"], pixels)
            np.testing.assert_array_equal(npz[f"y_{part}"], table.column("label").to_numpy())
            assert npz[f"x_{part}"].shape == ((8000 if part == "train" else 2000), 784)


def test_the_replica_imports_without_spark_or_pyarrow():
    result = subprocess.run([sys.executable, "-c", BLOCKED], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


@pytest.mark.slow  # the benchmark script end to end
def test_gpu_check_runs_on_cpu_and_reports_float32_weights():
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "gpu_check.py"), "--epochs", "1", "--rows", "512",
               "--precisions", "float32,mixed_bfloat16", "--devices", "cpu"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env=dict(os.environ, KERAS_BACKEND="tensorflow"))
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["backend"] == "tensorflow"
    runs = {r["precision"]: r for r in report["results"]}
    assert sorted(runs) == ["float32", "mixed_bfloat16"]
    assert runs["float32"]["compute_dtype"] == "float32" and runs["mixed_bfloat16"]["compute_dtype"] == "bfloat16"
    for run in runs.values():
        assert run["device"] == "cpu:0" and run["rows"] == 512
        assert run["weights_dtype"] == ["float32"]
        assert run["samples_per_s"] > 0 and 0.2 < run["test_accuracy"] <= 1.0  # 8 steps: better than chance (0.1)
    assert "| cpu:0 | mixed_bfloat16 |" in result.stdout
