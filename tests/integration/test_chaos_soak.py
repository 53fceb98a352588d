"""The chaos soak (``benchmarks/chaos.py``), one seed per backend, mode ``sync``: four faults found and
fired from outside the library (a Python worker SIGKILLed, an executor JVM SIGKILLed, a Python worker
SIGSTOPped for 30–60 s) at seeded times of a ``local-cluster[3,1,1024]`` fit of three workers; each
fit completes with the undisturbed fit's model (1e-5). About 15 minutes on 2 cores: ``make test-all``."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _run(args: list[str], out, timeout_s: float) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    log = out.with_suffix(".log")
    with open(log, "w") as sink:
        try:
            code = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "chaos.py"), *args, "--out", str(out)], env=env,
                                  timeout=timeout_s, stdout=sink, stderr=subprocess.STDOUT).returncode
        except subprocess.TimeoutExpired:
            code = f"killed at the test's timeout ({timeout_s} s)"
    assert code == 0, f"{code}: {log.read_text()[-6000:]}"
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_every_backend_survives_four_real_faults_with_the_undisturbed_model(tmp_path):
    """One child process per backend (each bounded at 900 s, its process group killed there); every
    fit completes, each of its four faults fired, and its weights equal the undisturbed fit's."""
    records = _run(["--seeds", "0", "--faults", "4", "--backends", "rounds,ps,sharded", "--modes", "sync", "--timeout", "900"],
                   tmp_path / "chaos.jsonl", timeout_s=2900)
    assert [(r["backend"], r["mode"]) for r in records] == [("rounds", "sync"), ("ps", "sync"), ("sharded", "sync")]
    for r in records:
        logs = open(r["log"]).read()[-6000:] if r.get("log") else ""
        assert r["completed"], f"{r}\n{logs}"
        assert len(r["faults_fired"]) == 4 and all(f["fired"] for f in r["faults_fired"]), r
        assert r["max_abs_dw"] < 1e-5, r
