"""A node lost for good under backend ``ps`` (``../shared/cases`` C49): a standalone cluster of real
daemons (a master and two 1-core Workers started with ``spark-class``); a Worker daemon and its
executor SIGKILLed, as a spot termination takes a node, and no executor comes back.

- During the data check (a UDF of the input kills its node while the check reads it) and mid-fit
  (round 3 of 4), a round mode goes on on backend ``rounds`` with the executor that is left and
  ends with the undisturbed fit's model; the console said what was lost, at once, and that it goes
  on; ``fitInfo["node_lost"]`` says so.
- An asynchronous mode whose workers wait for each other (``ssp``, on ``ps`` only) fails with
  ``NodeLostError`` naming the executor soon after the node's wait (half of ``workerTimeout`` here:
  10 s), never a silent wait. (The other asynchronous modes do not wait for each other: the lost
  worker's task runs on the slot the others free when their slots are done.)
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # about 3 minutes on 2 cores: make test-all

SCRIPT = textwrap.dedent(
    """
    import json, os, subprocess, sys, tempfile, time
    import numpy as np
    from pyspark.sql import SparkSession, functions as F, types as T
    import keras
    from sparkdl import KerasEstimator
    from sparkdl.errors import NodeLostError
    from sparkdl.spark import internals
    from sparkdl.spark.training import faults

    out_path, markers = sys.argv[1], sys.argv[2]
    spark = (SparkSession.builder.master(os.environ["TEST_MASTER"]).config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.executor.memory", "512m")
             .config("spark.task.maxFailures", "4").getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] - x[:, 1] > 0).astype(np.float64)
    raw = spark.createDataFrame([(i, x[i].tolist(), float(y[i])) for i in range(64)], "i int, x array<float>, y double").repartition(2, "i")
    armed = os.path.join(markers, "armed")

    def node_at_check(i, v):  # the input's own UDF: the first row read once armed takes its node
        if os.path.exists(armed):
            try:
                os.close(os.open(os.path.join(markers, "check"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return v
            faults.kill_node()
        return v

    df = raw.select(F.udf(node_at_check, T.ArrayType(T.FloatType()))("i", "x").alias("x"), "y")

    def fit(mode="sync", hook=None, **kw):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2, activation="softmax")])
        est = KerasEstimator(model=model, optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy",
                             featuresCol="x", labelCol="y", **{**dict(numWorkers=2, epochs=2, batchSize=8, localSteps=2, verbose=1,
                                                                    backend="ps", mode=mode, seed=1, workerTimeout=20.0), **kw})
        with faults.inject(hook or faults.TaskHooks()):  # no fault: hooks that do nothing
            return est.fit(df)

    weights = lambda model: [w.tolist() for w in model.getKerasModel().get_weights()]  # noqa: E731

    def node_back():  # a new Worker daemon (as a new node would join) and its executor
        proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "spark-class"), "org.apache.spark.deploy.worker.Worker",
                                 "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", "0", os.environ["TEST_MASTER"]],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        with open(os.path.join(markers, "pids"), "a") as f:
            f.write(f"{proc.pid}\\n")
        deadline = time.monotonic() + 120
        while sum(e["active"] for e in internals.executors(spark.sparkContext)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)

    def hit(name, run):
        started = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            model = run()
            return {"weights": weights(model), "info": model.fitInfo.get("node_lost"), "loss": model.history["loss"],
                    "seconds": time.monotonic() - started}
        except NodeLostError as exc:
            killed = os.path.getmtime(os.path.join(markers, name))  # the fault's marker, written as it killed the node
            return {"error": str(exc), "type": type(exc).__name__, "after_kill_s": time.time() - killed}

    out = {}
    base = fit()
    out["base"] = {"weights": weights(base), "loss": base.history["loss"]}
    open(armed, "w").close()
    out["check"] = hit("check", fit)
    node_back()
    out["mid"] = hit("mid", lambda: fit(hook=faults.Fault(partition=1, index=2, how="node", marker_dir=markers, name="mid")))
    node_back()
    out["ssp"] = hit("ssp", lambda: fit("ssp", staleness=1, hook=faults.Fault(partition=1, index=1, how="node", marker_dir=markers,
                                                                               name="ssp")))
    json.dump(out, open(out_path, "w"))
    spark.stop()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def standalone(tmp_path):
    """A standalone cluster on this machine: a master and two 1-core Workers; every daemon the test
    started (and those its script started, listed in ``markers/pids``) killed afterwards."""
    spark_class = os.path.join(os.path.dirname(sys.executable), "spark-class")
    markers = tmp_path / "markers"
    markers.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1", SPARK_LOCAL_IP="127.0.0.1",
               SPARK_WORKER_DIR=str(tmp_path / "work"), SPARK_LOG_DIR=str(tmp_path / "logs"))
    log = open(tmp_path / "daemons.log", "w")
    procs = []

    def start(*args):
        procs.append(subprocess.Popen([spark_class, *args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    port = _free_port()
    master = f"spark://127.0.0.1:{port}"
    try:
        start("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(_free_port()))
        time.sleep(3)
        for _ in range(2):
            start("org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", "0",
                  master)
        yield {"master": master, "markers": markers, "env": env}
    finally:
        started = [p.pid for p in procs]
        if (markers / "pids").exists():
            started += [int(line) for line in (markers / "pids").read_text().split()]
        for pid in started:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in procs:
            proc.wait(30)
        log.close()


def _difference(a, b):
    return max(float(np.abs(np.array(p) - np.array(q)).max()) for p, q in zip(a, b, strict=True))


def test_a_node_lost_for_good_during_the_data_check_or_mid_fit_costs_a_switch_to_rounds_not_a_silent_wait(tmp_path, standalone):
    out_path = tmp_path / "out.json"
    env = dict(standalone["env"], TEST_MASTER=standalone["master"], PYSPARK_DRIVER_PYTHON=sys.executable)
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(out_path), str(standalone["markers"])], env=env, timeout=900,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(out_path.read_text())
    console = result.stdout
    print(console[-3000:])
    for moment in ("check", "mid"):
        got = out[moment]
        assert "error" not in got, got
        assert _difference(got["weights"], out["base"]["weights"]) < 1e-5, moment
        assert got["loss"] == pytest.approx(out["base"]["loss"], abs=1e-5)
        info = got["info"]
        assert info["continued_on"] == "rounds" and info["slots"] == 1 and info["workers"] == 2, info
        assert info["executors"] and "worker lost" in info["executors"][0]["remove_reason"], info
        assert 10 <= info["waited_s"] <= 20, info  # half of workerTimeout=20, from the loss's first sight
    assert out["check"]["info"]["from_round"] == 1 and out["mid"]["info"]["from_round"] == 3
    section = console.split("== mid")[1].split("== ssp")[0]
    announced = section.index("lost: 1 task slot left for 2 ps workers, which run at once; waiting up to 10 s")
    assert section.index("the fit goes on on backend 'rounds' from round 3 of") > announced
    failed = out["ssp"]
    assert failed.get("type") == "NodeLostError", failed
    assert "worker lost" in failed["error"] and "1 task slot left for 2 ps workers" in failed["error"], failed
    assert "Mode 'ssp' runs only on backend 'ps'" in failed["error"] and "numWorkers" in failed["error"], failed
    assert failed["after_kill_s"] < 180, failed  # a bound against a hang on a loaded machine (the wait is 10 s); the type and words above decide
