"""sparkdl's Python worker daemon (``spark.python.daemon.module=sparkdl.spark.daemon``, issue 31 item 3):
the workers fork from a daemon that imported TensorFlow and Keras once, still size their pools to
their task's CPUs, and :func:`sparkdl.spark.daemon.start_workers` starts them before the first fit.

The test session (conftest) runs this daemon, as ``sparkdl-train``'s sessions do, so every other
test's Python workers fork from it too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa

from tests.conftest import ROOT


def _where(batches):
    import os
    import sys

    from pyspark import TaskContext

    from sparkdl.keras import runtime

    for _ in batches:
        pass
    parent = os.getppid()
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode()
    with open(f"/proc/{parent}/maps") as f:
        parent_has_tensorflow = "_pywrap_tensorflow" in f.read()
    runtime.configure(TaskContext.get().cpus(), None)
    info = runtime.describe()
    yield pa.RecordBatch.from_pylist([{"info": json.dumps({
        "daemon": cmdline, "parent_has_tensorflow": parent_has_tensorflow, "keras": "keras" in sys.modules,
        "intra": info["intra_op_threads"], "inter": info["inter_op_threads"]})}])


def test_workers_fork_from_a_daemon_that_imported_tensorflow_and_keep_their_task_cpus(spark):
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == "sparkdl.spark.daemon"
    rows = spark.range(4).repartition(2).mapInArrow(_where, "info string").collect()
    infos = [json.loads(r["info"]) for r in rows]
    assert len(infos) == 2
    for info in infos:
        assert "-m sparkdl.spark.daemon" in info["daemon"], info  # Spark started sparkdl's daemon
        assert info["parent_has_tensorflow"], info  # which loaded TensorFlow before it forked this worker
        assert info["keras"]
        assert (info["intra"], info["inter"]) == (1, 1)  # the fork left TensorFlow's runtime unstarted: pools per task


PRELOAD = r"""
import json, os, sys
from sparkdl.spark import daemon
print("before", flush=True)
loaded = daemon.preload()
print(json.dumps({"loaded": loaded, "tensorflow": "tensorflow" in sys.modules, "keras": "keras" in sys.modules,
                  "backend": daemon.backend_from_environment()}), flush=True)
"""


def _preload(env_update: dict) -> tuple[list[str], dict]:
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="0", **env_update)  # 0: TensorFlow's start-up lines all shown
    result = subprocess.run([sys.executable, "-c", PRELOAD], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    return lines, json.loads(lines[-1])


def test_preload_writes_nothing_to_stdout_which_carries_the_daemons_port():
    lines, out = _preload({"KERAS_BACKEND": "tensorflow"})
    assert out == {"loaded": True, "tensorflow": True, "keras": True, "backend": "tensorflow"}
    assert lines[:-1] == ["before"]  # whatever TensorFlow printed while loading went to stderr


def test_preload_imports_nothing_for_another_backend(tmp_path):
    lines, out = _preload({"KERAS_BACKEND": "jax"})
    assert out == {"loaded": False, "tensorflow": False, "keras": False, "backend": "jax"}
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "torch", "floatx": "float32"}))
    _, out = _preload({"KERAS_HOME": str(tmp_path)})  # no KERAS_BACKEND: keras.json decides, as Keras does
    assert out == {"loaded": False, "tensorflow": False, "keras": False, "backend": "torch"}


START = r"""
import json, os, sys, time
import pyarrow as pa
from pyspark.sql import SparkSession
from sparkdl.spark.daemon import session_conf, start_workers

def state(batches):
    import os, sys
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"keras": "keras" in sys.modules, "pid": os.getpid()}])

out = {}
for daemon in (True, False):
    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    for key, value in (session_conf() if daemon else {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    started = start_workers(spark)
    ended = started.join(240)
    again = start_workers(spark)
    rows = spark.range(2).repartition(2).mapInArrow(state, "keras boolean, pid long").collect()
    out["daemon" if daemon else "plain"] = {"ended": ended, "again": again is None, "keras": [r["keras"] for r in rows],
                                            "pids": len({r["pid"] for r in rows})}
    spark.stop()
print(json.dumps(out))
"""


def test_start_workers_starts_a_sessions_workers_with_keras_imported_once():
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable)
    result = subprocess.run([sys.executable, "-c", START], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    # with sparkdl's daemon: one task started the daemon, which imported Keras; the next job's workers fork from it
    assert out["daemon"] == {"ended": True, "again": True, "keras": [True, True], "pids": 2}
    # without it: one task per slot imported Keras in its own worker, which the next job reuses
    assert out["plain"] == {"ended": True, "again": True, "keras": [True, True], "pids": 2}
