"""Backend ``ps`` against its environment: C35 (dynamic allocation refused before any job, while
backend ``rounds`` works with it), C39 (an HTTP proxy on a dead address in the executors'
environment does not reach the parameter server's gRPC channels) and a silent worker failing the
fit within ``workerTimeout`` seconds, naming its partition."""

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
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    return KerasEstimator(model=model, optimizer="adam", loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y",
                          numWorkers=2, epochs=2, batchSize=8, verbose=0, **kw)
"""

C35 = _SCRIPT_HEAD.format(env="", conf='builder = builder.config("spark.dynamicAllocation.enabled", "true")') + """
jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
started = time.perf_counter()
try:
    estimator(mode="async").fit(df)
    error = None
except ConfigError as exc:
    error = str(exc)
seconds = time.perf_counter() - started
jobs_after = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
fitted = estimator(mode="sync").fit(df)   # backend auto -> rounds: works with dynamic allocation
json.dump({"error": error, "seconds": seconds, "jobs_before": jobs_before, "jobs_after": jobs_after,
           "rounds_backend": fitted.fitInfo.get("backend", "rounds"), "rounds_epochs": len(fitted.history["loss"])}, open(sys.argv[1], "w"))
spark.stop()
"""

DEAD_PROXY = "http://127.0.0.1:9"
C39 = _SCRIPT_HEAD.format(
    env="\n".join([f"os.environ[{k!r}] = {DEAD_PROXY!r}" for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy", "all_proxy")]
                  + ["os.environ.pop('no_proxy', None)", "os.environ.pop('NO_PROXY', None)"]),
    conf="\n".join(f'builder = builder.config("spark.executorEnv.{k}", {DEAD_PROXY!r})' for k in ("http_proxy", "https_proxy", "grpc_proxy")),
) + """
seen = spark.sparkContext.parallelize([0, 1], 2).map(lambda _: [os.environ.get(k) for k in ("http_proxy", "https_proxy", "grpc_proxy", "no_proxy")]).collect()
fitted = estimator(mode="async", localSteps=2).fit(df)
json.dump({"seen": seen, "backend": fitted.fitInfo["backend"], "updates": fitted.fitInfo["updates_applied"],
           "loss": fitted.history["loss"]}, open(sys.argv[1], "w"))
spark.stop()
"""


def test_c35_dynamic_allocation_is_refused_before_any_job_and_rounds_works_with_it(tmp_path):
    out = run_spark_script(C35, tmp_path)
    assert "spark.dynamicAllocation.enabled" in out["error"] and "backend='rounds'" in out["error"]
    assert out["jobs_after"] == out["jobs_before"]  # refused before any job
    assert out["seconds"] < 10
    assert out["rounds_backend"] == "rounds" and out["rounds_epochs"] == 2


def test_c39_a_dead_http_proxy_in_the_executors_environment_does_not_stop_a_ps_fit(tmp_path):
    out = run_spark_script(C39, tmp_path)
    assert out["seen"] == [[DEAD_PROXY, DEAD_PROXY, DEAD_PROXY, None]] * 2  # the Python workers do see the dead proxy
    assert out["backend"] == "ps"
    assert out["updates"] == 8  # 2 workers x (4 steps per epoch / τ=2) pushes x 2 epochs
    assert len(out["loss"]) == 2 and all(np.isfinite(out["loss"]))


MARKER = 999.0


@keras.saving.register_keras_serializable(package="sparkdl_ps_stall")
class StallOnMarker(keras.layers.Layer):
    """Identity, except that a batch holding ``marker`` sleeps ``seconds`` first (a hung worker)."""

    def __init__(self, marker=MARKER, seconds=45.0, **kwargs):
        super().__init__(**kwargs)
        self.marker, self.seconds = marker, seconds

    def call(self, x):
        import tensorflow as tf

        def stall(values):
            if np.any(values.numpy() == self.marker):
                time.sleep(self.seconds)
            return values

        out = tf.py_function(stall, [x], x.dtype)
        out.set_shape(x.shape)
        return out

    def get_config(self):
        return {**super().get_config(), "marker": self.marker, "seconds": self.seconds}


def test_a_silent_worker_fails_the_fit_within_worker_timeout_naming_its_partition(spark):
    rng = np.random.default_rng(0)
    rows = [([float(v) for v in rng.normal(size=4)], float(i % 2)) for i in range(32)]
    stalled = [([MARKER, 0.0, 0.0, 0.0], 1.0)] + rows[1:]
    df = partitioned_df(spark, [rows, stalled], XY)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), StallOnMarker(), keras.layers.Dense(2, activation="softmax")])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    est = KerasEstimator(model=model, optimizer="adam", loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y",
                         numWorkers=2, epochs=1, batchSize=8, shuffle=False, keepPartitioning=True, verbose=0,
                         backend="ps", workerTimeout=10.0, jitCompile=False, serverPort=port)
    threads_before = {t.ident for t in threading.enumerate()}
    started = time.perf_counter()
    with pytest.raises(WorkerError, match="partition 1 silent for") as raised:
        est.fit(df)
    seconds = time.perf_counter() - started
    assert seconds < 40, seconds  # the stall is 45 s: the timeout, not the stall's end, failed the fit
    assert "workerTimeout=10" in str(raised.value)
    # C19 after a failed fit: the server is stopped, its port free, no thread of the fit left behind
    left = [t.name for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()]
    assert left == [], left
    with socket.socket() as again:  # a listener can take the port again (as gRPC's own, SO_REUSEADDR:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the server closed connections
        again.bind(("127.0.0.1", port))  # first, so they may sit in TIME_WAIT)
        again.listen()
