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
                  "tasks": all(m in sys.modules for m in daemon.WORKER_MODULES),
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
    assert out == {"loaded": True, "tensorflow": True, "keras": True, "tasks": True, "distinct_draws": 2, "backend": "tensorflow"}
    assert lines[:-1] == ["before"]  # whatever TensorFlow printed while loading went to stderr


def test_preload_imports_nothing_unless_the_driver_said_tensorflow(tmp_path):
    _, out = _preload({"SPARKDL_DAEMON_PRELOAD": "jax", "KERAS_BACKEND": "tensorflow"})  # the driver's backend decides
    assert (out["loaded"], out["tensorflow"], out["keras"], out["tasks"]) == (False, False, False, False)
    _, out = _preload({})  # a daemon module set by hand, without session_conf's marker: pyspark's daemon as it is
    assert (out["loaded"], out["tensorflow"], out["keras"]) == (False, False, False)
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "torch", "floatx": "float32"}))
    _, out = _preload({"KERAS_HOME": str(tmp_path)})  # no KERAS_BACKEND: keras.json decides, as Keras does
    assert out["backend"] == "torch"


START = r"""
import json, sys, warnings
import pyarrow as pa
from pyspark.sql import SparkSession
from sparkdl.spark.daemon import session_conf, start_workers

def state(batches):
    import os, sys
    for _ in batches:
        pass
    parent = open(f"/proc/{os.getppid()}/cmdline").read().replace("\0", " ")
    yield pa.RecordBatch.from_pylist([{"keras": "keras" in sys.modules, "parent": parent, "pid": os.getppid()}])

def probe():
    rows = spark.range(2).repartition(2).mapInArrow(state, "keras boolean, parent string, pid long").collect()
    return [r["keras"] for r in rows], sorted({r["parent"].split(" -m ")[-1].split()[0] for r in rows}), {r["pid"] for r in rows}

mode = sys.argv[1]
master = "local-cluster[1,1,1024]" if mode == "cluster" else "local[2]"
builder = SparkSession.builder.master(master).config("spark.ui.enabled", "false")
if mode == "daemon":
    builder = builder.config(map=session_conf("tensorflow"))
if mode == "hidden":  # a setting whose worker variable the start job cannot tell: it runs as a DataFrame job
    builder = builder.config("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "true")
spark = builder.getOrCreate()
out = {}
if mode == "fit":  # a session started the ordinary way, then a fit: no start_workers
    import keras
    import numpy as np
    from sparkdl import KerasEstimator
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    df = spark.createDataFrame([([float(i), 1.0], float(i)) for i in range(16)], "features array<float>, label float")
    KerasEstimator(model=model, optimizer="sgd", loss="mse", numWorkers=2, epochs=1, batchSize=4, verbose=0).fit(df)
else:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = start_workers(spark)
    out["warned"] = [str(w.message) for w in caught if "start_workers" in str(w.message)]
    out["started"] = started is not None
    out["ended"] = started.join(240)
    out["again"] = start_workers(spark) is None
out["keras"], out["daemon"], pids = probe()
if mode != "fit":
    out["same_daemon"] = set(started.daemons) == pids  # the DataFrame tasks forked from the daemon the start job started
spark.stop()
print(json.dumps(out))
"""


def _start(mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, KERAS_BACKEND="tensorflow")
    result = subprocess.run([sys.executable, "-c", START, mode], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_start_workers_starts_the_daemon_which_imports_keras_once():
    # one task started the executor's daemon, which imported Keras; the next job's workers fork from it
    # (an RDD job, given the DataFrame runners' worker variables: its daemon is the one their tasks fork from)
    started = {"warned": [], "started": True, "ended": True, "again": True, "keras": [True, True],
               "daemon": ["sparkdl.spark.daemon"], "same_daemon": True}
    assert _start("daemon") == started
    # a session started the ordinary way on a local master: switched to sparkdl's daemon, the same
    assert _start("plain") == started
    # a setting that may add a variable the start job cannot tell: a DataFrame job starts the daemon, the same one
    assert _start("hidden") == started


def test_a_plain_local_sessions_fit_has_its_later_workers_fork_from_sparkdls_daemon():
    # the fit switched the session: a job after it (or the next fit, after Spark retired the idle
    # workers) forks its workers from a daemon that imported TensorFlow, not from pyspark's
    assert _start("fit") == {"keras": [True, True], "daemon": ["sparkdl.spark.daemon"]}


def test_start_workers_on_a_clusters_running_executors_says_what_the_cluster_config_needs():
    out = _start("cluster")
    assert (out["started"], out["ended"], out["keras"], out["daemon"]) == (True, True, [True, True], ["pyspark.daemon"])
    assert out["same_daemon"], out  # an executor JVM of its own: the start job still started the daemon the DataFrame tasks use
    assert len(out["warned"]) == 1, out
    assert "spark.python.daemon.module=sparkdl.spark.daemon" in out["warned"][0]
    assert "cluster's Spark config" in out["warned"][0] and "import TensorFlow each" in out["warned"][0]


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


def test_the_switch_is_decided_from_the_facts_a_fit_plan_read(spark):
    """The fit path decides from its plan's facts (no second read of the session) as ``start_workers``
    decides from the session's: both give the same facts for the test session, which runs sparkdl's
    daemon already (nothing to switch, nothing to tell)."""
    from sparkdl.spark.daemon import DaemonFacts, preload_decision
    from sparkdl.spark.session import FitPlan

    facts = DaemonFacts.of(spark)
    assert DaemonFacts.from_plan(FitPlan.read(spark)) == facts
    assert facts.module == "sparkdl.spark.daemon" and preload_decision(facts) == (False, None)
    plain = DaemonFacts(connect=False, app="a", master="local[2]", module=None)
    assert preload_decision(plain) == (True, None)  # this machine: tensorflow, no GPU, the executors' Python has sparkdl
    assert preload_decision(DaemonFacts(connect=False, app="a", master="local[2]", module="pyspark.daemon")) == (False, None)
    assert preload_decision(DaemonFacts(connect=False, app="a", master="local[2]", gpu_conf=True)) == (False, None)
    for facts, words in ((DaemonFacts(connect=True, app="connect"), "Spark Connect session's Python workers are the server's"),
                         (DaemonFacts(connect=False, app="a", master="local[2]", use_daemon=False), "spark.python.use.daemon is false"),
                         (DaemonFacts(connect=False, app="a", master="spark://h:7077"), "(spark://h:7077) started with pyspark's daemon")):
        switch, reason = preload_decision(facts)
        assert switch is False and words in reason, reason
