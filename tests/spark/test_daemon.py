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
import pytest

from sparkdl.spark.daemon import gpu_machine
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(gpu_machine(), reason="the daemon preloads nothing on a machine with an NVIDIA GPU")


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
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        pytest.skip("the daemon preloads TensorFlow only for a TensorFlow driver")
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
import numpy as np
from sparkdl.spark import daemon
print("before", flush=True)
loaded = daemon.preload()
draws = []
for _ in range(2):  # two workers forked from the daemon draw from numpy's global random state
    read, write = os.pipe()
    if os.fork() == 0:
        os.write(write, str(np.random.randint(2**62)).encode())
        os._exit(0)
    os.close(write)
    os.wait()
    draws.append(os.read(read, 64).decode())
print(json.dumps({"loaded": loaded, "tensorflow": "tensorflow" in sys.modules, "keras": "keras" in sys.modules,
                  "distinct_draws": len(set(draws)), "backend": daemon.backend_from_environment()}), flush=True)
"""


def _preload(env_update: dict) -> tuple[list[str], dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "SPARKDL_DAEMON_PRELOAD")}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="0", **env_update)  # 0: TensorFlow's start-up lines all shown
    result = subprocess.run([sys.executable, "-c", PRELOAD], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    return lines, json.loads(lines[-1])


def test_preload_writes_nothing_to_stdout_which_carries_the_daemons_port_and_reseeds_numpy_per_worker():
    lines, out = _preload({"SPARKDL_DAEMON_PRELOAD": "tensorflow"})
    assert out == {"loaded": True, "tensorflow": True, "keras": True, "distinct_draws": 2, "backend": "tensorflow"}
    assert lines[:-1] == ["before"]  # whatever TensorFlow printed while loading went to stderr


def test_preload_imports_nothing_unless_the_driver_said_tensorflow(tmp_path):
    _, out = _preload({"SPARKDL_DAEMON_PRELOAD": "jax", "KERAS_BACKEND": "tensorflow"})  # the driver's backend decides
    assert (out["loaded"], out["tensorflow"], out["keras"]) == (False, False, False)
    _, out = _preload({})  # a daemon module set by hand, without session_conf's marker: pyspark's daemon as it is
    assert (out["loaded"], out["tensorflow"], out["keras"]) == (False, False, False)
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "torch", "floatx": "float32"}))
    _, out = _preload({"KERAS_HOME": str(tmp_path)})  # no KERAS_BACKEND: keras.json decides, as Keras does
    assert out["backend"] == "torch"


START = r"""
import json, sys
import pyarrow as pa
from pyspark.sql import SparkSession
from sparkdl.spark.daemon import session_conf, start_workers

def state(batches):
    import sys
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"keras": "keras" in sys.modules}])

daemon = sys.argv[1] == "daemon"
builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
if daemon:
    builder = builder.config(map=session_conf("tensorflow"))
spark = builder.getOrCreate()
started = start_workers(spark)
out = {"started": started is not None}
if started is not None:
    out["ended"] = started.join(240)
    out["again"] = start_workers(spark) is None
    rows = spark.range(2).repartition(2).mapInArrow(state, "keras boolean").collect()
    out["keras"] = [r["keras"] for r in rows]
spark.stop()
print(json.dumps(out))
"""


def _start(mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable)
    result = subprocess.run([sys.executable, "-c", START, mode], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_start_workers_starts_the_daemon_which_imports_keras_once():
    # one task started the executor's daemon, which imported Keras; the next job's workers fork from it
    assert _start("daemon") == {"started": True, "ended": True, "again": True, "keras": [True, True]}
    assert _start("plain") == {"started": False}  # pyspark's own daemon: nothing to start ahead


CLI = r"""
import json
from sparkdl.cli import spark_session
spark, started_here = spark_session("t", "local[1]")
conf = spark.sparkContext.getConf()
print(json.dumps({"here": started_here, "daemon": conf.get("spark.python.daemon.module"),
                  "preload": conf.get("spark.executorEnv.SPARKDL_DAEMON_PRELOAD")}))
spark.stop()
"""


def test_the_commands_sessions_run_sparkdls_daemon_unless_the_submitted_conf_says_otherwise():
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, KERAS_BACKEND="tensorflow")
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    runs = {}
    for name, submit in (("default", None), ("own", "--conf spark.python.daemon.module=pyspark.daemon pyspark-shell")):
        run_env = dict(env, **({"PYSPARK_SUBMIT_ARGS": submit} if submit else {}))
        result = subprocess.run([sys.executable, "-c", CLI], env=run_env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = json.loads(result.stdout.strip().splitlines()[-1])
    assert runs["default"] == {"here": True, "daemon": "sparkdl.spark.daemon", "preload": "tensorflow"}
    assert runs["own"] == {"here": True, "daemon": "pyspark.daemon", "preload": "tensorflow"}  # spark-submit's --conf wins
