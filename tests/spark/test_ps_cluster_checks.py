"""Backend ``ps`` against its environment: C35 (no barrier stage: it trains under dynamic
allocation, as backend ``rounds`` does), C39 (an HTTP proxy on a dead address in the executors'
environment does not reach the parameter server's gRPC channels; with a driver bound to all
interfaces), a hung worker failing the fit
killed after ``workerTimeout`` seconds and retried (the fit failing, naming its partition, once the
kills are spent), and a slow step that is no false alarm."""

import socket
import threading
import time

import numpy as np
import pytest
from pyspark.sql import types as T

import keras
from sparkdl import KerasEstimator
from sparkdl.errors import WorkerError
from tests.conftest import partitioned_df, run_spark_script

XY = T.StructType([T.StructField("x", T.ArrayType(T.FloatType())), T.StructField("y", T.DoubleType())])

_SCRIPT_HEAD = """
import json, os, sys, time
{env}
import numpy as np
from pyspark.sql import SparkSession
builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
{conf}
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
import keras
from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype(np.float32)
df = spark.createDataFrame([([float(v) for v in xi], float(xi[0] > 0)) for xi in x], "x array<float>, y double")
def estimator(**kw):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    return KerasEstimator(model=model, optimizer="adam", loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y",
                          numWorkers=2, epochs=2, batchSize=8, verbose=0, **kw)
"""

DEAD_PROXY = "http://127.0.0.1:9"
# C35 and C39 in one spark-submit (one driver and its Python workers started instead of two): dynamic allocation,
# an HTTP proxy on a dead address in the driver's and the executors' environment, a driver bound to all interfaces.
ENVIRONMENT = _SCRIPT_HEAD.format(
    env="\n".join([f"os.environ[{k!r}] = {DEAD_PROXY!r}" for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy", "all_proxy")]
                  + ["os.environ.pop('no_proxy', None)", "os.environ.pop('NO_PROXY', None)"]),
    conf="\n".join(['builder = builder.config("spark.dynamicAllocation.enabled", "true")']
                   + [f'builder = builder.config("spark.executorEnv.{k}", {DEAD_PROXY!r})' for k in ("http_proxy", "https_proxy", "grpc_proxy")]
                   + ['builder = builder.config("spark.driver.bindAddress", "0.0.0.0").config("spark.driver.host", "127.0.0.1")']),
) + """
seen = spark.sparkContext.parallelize([0, 1], 2).map(lambda _: [os.environ.get(k) for k in ("http_proxy", "https_proxy", "grpc_proxy", "no_proxy")]).collect()
on_ps = estimator(mode="sync", backend="ps", shuffle=False).fit(df)
on_rounds = estimator(mode="sync", shuffle=False).fit(df)  # backend auto: rounds under dynamic allocation
asynchronous = estimator(mode="async", localSteps=2).fit(df)
difference = max(float(np.abs(a - b).max()) for a, b in zip(on_ps.getKerasModel().get_weights(), on_rounds.getKerasModel().get_weights()))
json.dump({"difference": difference, "backends": [on_ps.fitInfo["backend"], on_rounds.fitInfo["backend"], asynchronous.fitInfo["backend"]],
           "epochs": [len(m.history["loss"]) for m in (on_ps, on_rounds, asynchronous)],
           "auto_reason": on_rounds.fitInfo["backend_reason"], "seen": seen, "updates": asynchronous.fitInfo["updates_applied"],
           "loss": asynchronous.history["loss"], **{k: asynchronous.fitInfo[k] for k in ("server_bind", "server_location", "server_tls")}},
          open(sys.argv[1], "w"))
spark.stop()
"""


@pytest.fixture(scope="module")
def environment(tmp_path_factory):
    return run_spark_script(ENVIRONMENT, tmp_path_factory.mktemp("ps-environment"))


@pytest.mark.slow  # the default run's 25-minute budget: a session with dynamic allocation (50 s); tests/spark/test_auto_backend.py checks the rule
def test_c35_without_a_barrier_stage_ps_trains_under_dynamic_allocation_to_the_weights_of_rounds(environment):
    out = environment
    assert out["backends"] == ["ps", "rounds", "ps"] and out["epochs"] == [2, 2, 2]
    assert out["auto_reason"] == ("auto: spark.dynamicAllocation.enabled is true, and backends 'ps' and 'sharded' hold a "
                                  "task slot per worker for the whole fit")
    assert out["difference"] < 1e-5


def test_c39_a_dead_http_proxy_in_the_executors_environment_does_not_stop_a_ps_fit(environment):
    """Also a driver bound to all interfaces (spark.driver.bindAddress 0.0.0.0, as in a container):
    the server binds there, advertises spark.driver.host, and so turns TLS on."""
    out = environment
    assert out["server_bind"] == "0.0.0.0" and out["server_location"].startswith("grpc+tls://127.0.0.1:") and out["server_tls"] is True
    assert out["seen"] == [[DEAD_PROXY, DEAD_PROXY, DEAD_PROXY, None]] * 2  # the Python workers do see the dead proxy
    assert out["backends"][2] == "ps"
    assert out["updates"] == 8  # 2 workers x (4 steps per epoch / τ=2) pushes x 2 epochs
    assert len(out["loss"]) == 2 and all(np.isfinite(out["loss"]))


def _two_partitions(spark):
    rng = np.random.default_rng(0)
    rows = [([float(v) for v in rng.normal(size=4)], float(i % 2)) for i in range(32)]
    return partitioned_df(spark, [rows, rows], XY)


def _ps_estimator(**kw):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    settings = dict(numWorkers=2, batchSize=8, localSteps=2, shuffle=False, keepPartitioning=True, verbose=0, backend="ps")
    return KerasEstimator(model=model, optimizer="adam", loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y",
                          **{**settings, **kw})


def _release(markers):
    """SIGKILL and SIGCONT the Python workers the hang faults stopped (a test never leaves one behind)."""
    import os
    import signal

    for name in os.listdir(markers) if os.path.isdir(markers) else []:
        pid = int(open(os.path.join(markers, name)).read())
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("backend", ["ps", pytest.param("sharded", marks=pytest.mark.slow)])  # sharded: the same monitor and kill
def test_a_hung_worker_is_killed_after_worker_timeout_and_retried_with_the_same_model(spark, tmp_path, backend):
    """Partition 1's Python worker stops itself (SIGSTOP) before round 2: its heartbeats stop, the
    driver kills its task attempt after workerTimeout, Spark runs it again (ps: the slots it had
    pushed are skipped; sharded: its slice is served again from its backup) and the fit ends as the
    undisturbed one."""
    from sparkdl.spark.training import faults

    df = _two_partitions(spark)
    base = _ps_estimator(epochs=2, backend=backend).fit(df)
    markers = str(tmp_path / "markers")
    try:
        with faults.inject(faults.Fault(partition=1, index=1, how="hang", marker_dir=markers)):
            hit = _ps_estimator(epochs=2, workerTimeout=8.0, backend=backend).fit(df)
    finally:
        _release(markers)
    killed = hit.fitInfo["silent_attempts_killed"]
    assert [k["partition"] for k in killed] == [1] and killed[0]["silent_s"] >= 8.0, killed
    assert hit.fitInfo["task_attempts"] == {"0": 1, "1": 2}
    for got, want in zip(hit.getKerasModel().get_weights(), base.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.slow  # the default run's 25-minute budget: test_a_hung_worker_is_killed_after_worker_timeout_and_retried_with_the_same_model runs its kind
def test_a_worker_hung_on_every_attempt_fails_the_fit_naming_its_partition_and_leaves_nothing(spark, tmp_path):
    """Three attempts of partition 1 hang in turn: two are killed and retried, the third fails the
    fit with WorkerError naming the partition and workerTimeout, leaving no thread and a free port."""
    from sparkdl.spark.training import faults

    df = _two_partitions(spark)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _ps_estimator(epochs=1).fit(df)  # warm Python workers
    threads_before = {t.ident for t in threading.enumerate()}
    markers = str(tmp_path / "markers")
    hangs = faults.Faults(tuple(faults.Fault(partition=1, index=1, how="hang", marker_dir=markers, name=f"hang-{i}") for i in range(3)))
    try:
        with faults.inject(hangs), pytest.raises(WorkerError, match="partition 1 silent for") as raised:
            _ps_estimator(epochs=2, workerTimeout=8.0, serverPort=port).fit(df)
    finally:
        _release(markers)
    assert "workerTimeout=8" in str(raised.value)
    time.sleep(0.5)
    left = [t.name for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()]
    assert left == [], left
    with socket.socket() as again:  # the port is free again
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()


def test_a_slow_step_is_no_false_alarm(spark):
    """A step longer than workerTimeout (partition 1 sleeps 6 s before each round's steps, against the
    shortest timeout allowed, 5 s) is a slow worker, not a dead one: its heartbeat thread beats every
    0.5 s and the fit completes."""
    from sparkdl.spark.training import faults

    df = _two_partitions(spark)
    with faults.inject(faults.Delay(partition=1, seconds=6.0)):
        fitted = _ps_estimator(epochs=1, localSteps=4, workerTimeout=5.0).fit(df)
    assert fitted.fitInfo["rounds"] == 1 and np.isfinite(fitted.history["loss"]).all()
