"""Issue 10 item 5, C40: sparkdl on Spark Connect (``SparkSession.builder.remote("local[2]")``).

``fit`` (backends ``rounds`` and ``ps``), ``transform``, ``evaluate``, ``save``/``load`` and ``Pipeline`` on a
Connect session give the weights and predictions of the same seeded run on a classic session
(within 1e-6) and keep the row count; what cannot work on Connect is refused before any job with
a ``ConfigError`` naming Spark Connect.

The Connect side runs in a fresh process (``run_spark_script``): a Connect session cannot share the
pytest process with the classic ``spark`` fixture. pyspark refuses ``remote("local[...]")`` next to
a running SparkContext (``SESSION_ALREADY_EXIST``), and a Connect session sets
``SPARK_CONNECT_MODE_ENABLED`` for the whole process, which sends ``pyspark.sql.functions`` and
``pyspark.ml`` to their Connect implementations for every later test. The classic side runs the
same workload (:data:`WORKLOAD`) here, on the ``spark`` fixture.
"""

import os
import threading
import types

import numpy as np
import pytest

from sparkdl.errors import ConfigError
from tests.conftest import run_spark_script

# The workload both sides run: C40's 8 rows and Sequential([Input((1,)) or (2,), Dense(1)]), numWorkers=2.
WORKLOAD = '''
import os
import numpy as np
import keras
from sparkdl import KerasEstimator, KerasModel

ROWS = [(float(i), float(i % 3), 2.0 * i + 1.0) for i in range(8)]


def c40_frame(spark):
    return spark.createDataFrame(ROWS, "a double, b double, y double")


def c40_estimator(inputs, **kw):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(1)])
    return KerasEstimator(model=model, optimizer="sgd", loss="mse", labelCol="y", numWorkers=2, epochs=2, batchSize=2,
                          seed=0, verbose=0, **kw)


def weights(fitted):
    return [w.ravel().tolist() for w in fitted.getKerasModel().get_weights()]


def predictions(scored):
    return [r["prediction"] for r in scored.orderBy("a").collect()]


def run_core(spark, out):
    df = c40_frame(spark)
    res = {}
    fitted = c40_estimator(1, featuresCol="a", backend="rounds").fit(df)
    res["rounds_weights"] = weights(fitted)
    scored = fitted.transform(df)
    res["rows"] = scored.count()
    res["predictions"] = predictions(scored)
    path = os.path.join(out, "model")
    fitted.save(path)
    fitted.write().overwrite().save(path)
    res["loaded_predictions"] = predictions(KerasModel.load(path).transform(df))
    res["evaluate"] = fitted.evaluate(df)
    ps = c40_estimator(1, featuresCol="a", backend="ps").fit(df)
    res["ps_backend"] = ps.fitInfo.get("backend")
    res["ps_weights"] = weights(ps)
    return res


def run_pipeline(spark, out):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    df = c40_frame(spark)
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["a", "b"], outputCol="features"), c40_estimator(2, featuresCol="features")])
    fitted = pipeline.fit(df)
    res = {"weights": weights(fitted.stages[-1])}
    scored = fitted.transform(df)
    res["rows"] = scored.count()
    res["predictions"] = predictions(scored)
    fitted.save(os.path.join(out, "pipeline_model"))
    res["loaded_predictions"] = predictions(PipelineModel.load(os.path.join(out, "pipeline_model")).transform(df))
    pipeline.write().overwrite().save(os.path.join(out, "pipeline"))
    res["loaded_stages"] = [type(s).__name__ for s in Pipeline.load(os.path.join(out, "pipeline")).getStages()]
    return res
'''

# The Connect process: the server's message limit lowered to 16 MiB, so a 16 MB model shows the
# refusal (12 MiB may be inlined) while C40's plans stay far below it.
CONNECT_SCRIPT = '''
import json, os, sys
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
from pyspark import SparkContext
from pyspark.sql import SparkSession
spark = (SparkSession.builder.remote("local[2]").config("spark.sql.shuffle.partitions", "4")
         .config("spark.connect.grpc.maxInboundMessageSize", str(16 * 2**20)).getOrCreate())
''' + WORKLOAD + '''
from sparkdl.errors import ConfigError

out = sys.argv[1] + ".d"
os.makedirs(out)
res = {"session": type(spark).__module__, "parts": {}}
for part in PARTS:
    res["parts"][part] = globals()["run_" + part](spark, out)


def jobs():  # the in-process Connect server's SparkContext: test-only introspection
    return SparkContext._active_spark_context._jsc.sc().statusStore().jobsList(None).size()


if "core" in PARTS:
    keras.utils.set_random_seed(0)
    big = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2000), keras.layers.Dense(2000), keras.layers.Dense(1)])  # 16 MB
    df = c40_frame(spark)
    refused, before = [], jobs()
    try:
        KerasEstimator(model=big, optimizer="sgd", loss="mse", featuresCol="a", labelCol="y", verbose=0,
                       backend="rounds").fit(df)  # rounds ships the weights in the plan; auto would pick ps, which trains it
    except ConfigError as exc:
        refused.append(str(exc))
    try:
        KerasModel.fromKeras(big, featuresCol="a").transform(df)
    except ConfigError as exc:
        refused.append(str(exc))
    res["refused"], res["jobs_while_refusing"] = refused, jobs() - before
json.dump(res, open(sys.argv[1], "w"))
'''


def _connect_and_classic(spark, tmp_path, part):
    """``(connect, classic)`` results of ``part``: the Connect process runs while this process runs
    the classic side (the subprocess waits in a thread), so the two overlap."""
    found: dict = {}

    def connect() -> None:
        try:
            found["connect"] = run_spark_script(f"PARTS = [{part!r}]\n" + CONNECT_SCRIPT, tmp_path / "connect", timeout_s=600)
        except BaseException as exc:  # re-raised in the test's thread
            found["error"] = exc

    (tmp_path / "connect").mkdir()
    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    try:
        classic = _classic(spark, tmp_path, part)
    finally:
        thread.join()
    if "error" in found:
        raise found["error"]
    return found["connect"], classic


def _classic(spark, tmp_path, part):
    scope: dict = {}
    exec(WORKLOAD, scope)  # noqa: S102 - the same source the Connect process runs
    out = tmp_path / "classic"
    out.mkdir(exist_ok=True)
    return scope[f"run_{part}"](spark, str(out))


def _assert_close(connect, classic, atol=1e-6):
    assert len(connect) == len(classic)
    for a, b in zip(connect, classic, strict=True):
        np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=0, atol=atol)


@pytest.mark.slow  # the default run's 25-minute budget: a Connect server start (80 s); the refusals run by default below
def test_c40_fit_on_both_backends_transform_and_save_load_on_connect_equal_classic(spark, tmp_path):
    connect, want = _connect_and_classic(spark, tmp_path, "core")
    assert connect["session"] == "pyspark.sql.connect.session"
    got = connect["parts"]["core"]
    _assert_close(got["rounds_weights"], want["rounds_weights"])
    _assert_close(got["ps_weights"], want["ps_weights"])
    _assert_close(got["ps_weights"], got["rounds_weights"], atol=1e-5)  # sync on ps equals rounds
    assert got["ps_backend"] == want["ps_backend"] == "ps"
    assert got["rows"] == want["rows"] == 8
    _assert_close([got["predictions"]], [want["predictions"]])
    _assert_close([got["loaded_predictions"]], [want["predictions"]])
    assert got["evaluate"].keys() == want["evaluate"].keys() == {"loss"}
    np.testing.assert_allclose(got["evaluate"]["loss"], want["evaluate"]["loss"], rtol=1e-6)
    # Weights too large for a Connect plan: refused before any job, by fit and by transform.
    assert connect["jobs_while_refusing"] == 0
    assert len(connect["refused"]) == 2
    for message in connect["refused"]:
        assert "Spark Connect" in message and "spark.connect.grpc.maxInboundMessageSize" in message
        assert "classic SparkSession" in message and "Received: 16" in message


@pytest.mark.slow
def test_c40_pipeline_fit_transform_and_pipeline_model_save_load_on_connect_equal_classic(spark, tmp_path):
    connect, want = _connect_and_classic(spark, tmp_path, "pipeline")
    got = connect["parts"]["pipeline"]
    _assert_close(got["weights"], want["weights"])
    assert got["rows"] == want["rows"] == 8
    _assert_close([got["predictions"]], [want["predictions"]])
    _assert_close([got["loaded_predictions"]], [want["predictions"]])
    assert got["loaded_stages"] == want["loaded_stages"] == ["VectorAssembler", "KerasEstimator"]


# ---- what Connect refuses, on stand-in sessions (no Spark) ---------------------------------------


class _Conf:
    def __init__(self, values):
        self.values = dict(values)

    def get(self, key, default=None):
        return self.values.get(key, default)


def _session(master="local[2]", host="localhost", **conf):
    """A stand-in for ``pyspark.sql.connect.session.SparkSession``: its class's module, conf and server URL."""
    cls = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})
    session = cls()
    session.conf = _Conf({"spark.master": master, **conf})
    session.client = types.SimpleNamespace(_builder=types.SimpleNamespace(host=host, _channel_options=[("grpc.max_send_message_length", 128 * 2**20)]))
    return session


@pytest.fixture
def no_local_remote(monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_REMOTE", raising=False)


def test_sizes_are_read_as_spark_reads_them():
    from sparkdl.spark.session import parse_size

    assert parse_size("1g") == 2**30 and parse_size("512M") == 512 * 2**20 and parse_size("134217728b") == 2**27
    assert parse_size("1024", unit="m") == 2**30 and parse_size("4096") == 4096 and parse_size(" 2 kb ") == 2048
    with pytest.raises(ConfigError, match=r"spark.driver.memory must be a whole size such as 512m or 1g. Received: '1.5g'"):
        parse_size("1.5g", key="spark.driver.memory")


def test_connect_sessions_are_told_apart_and_their_cluster_counted(no_local_remote):
    from sparkdl.spark.session import task_slots
    from sparkdl.spark.session import default_parallelism, is_connect, is_local_server

    assert is_connect(_session()) and not is_connect(object())
    assert is_local_server(_session("local[2]", "127.0.0.1"))
    assert not is_local_server(_session("local[2]", "spark.example.com"))  # a remote server's local master
    assert not is_local_server(_session("yarn", "localhost"))  # a tunnel to a cluster
    assert task_slots(_session("local[3]")) == 3 and default_parallelism(_session("local[3]")) == 3
    assert task_slots(_session("local-cluster[2, 2, 1024]", **{"spark.task.cpus": "2"})) == 2
    assert task_slots(_session("yarn", "spark.example.com")) is None  # unknown: the workers' liveness timeout applies
    assert task_slots(_session("yarn", "h", **{"spark.executor.instances": "3", "spark.executor.cores": "4"})) == 12


def test_ps_on_a_remote_connect_server_needs_a_host_the_executors_reach(no_local_remote):
    from sparkdl.spark.session import FitPlan

    def check_barrier_ready(session, workers):
        facts = FitPlan.read(session).cluster
        facts.check_slots(workers, "ps")
        facts.server_addresses()

    def server_host(session):
        return FitPlan.read(session).cluster.server_addresses()[1]

    assert server_host(_session("local[2]", "localhost")) == "127.0.0.1"
    remote = _session("spark://master:7077", "connect.example.com", **{"spark.executor.instances": "2", "spark.executor.cores": "2"})
    with pytest.raises(ConfigError) as info:
        check_barrier_ready(remote, 2)
    message = str(info.value)
    assert "Spark Connect" in message and "spark.sparkdl.ps.host" in message and "backend='rounds'" in message
    assert "sc://connect.example.com" in message
    remote.conf.values["spark.sparkdl.ps.host"] = "10.0.0.5"
    check_barrier_ready(remote, 2)
    assert server_host(remote) == "10.0.0.5"
    with pytest.raises(ConfigError, match=r"numWorkers=5 workers, but the cluster has 4 free task slots"):
        check_barrier_ready(remote, 5)


def test_weights_too_large_for_a_connect_plan_are_refused_naming_the_limit(no_local_remote):
    from sparkdl.spark.session import Inline, check_inline, inline_limit, share

    session = _session(**{"spark.connect.grpc.maxInboundMessageSize": "8m"})
    assert inline_limit(session) == 4 * 2**20  # 8 MiB less 4 MiB for the rest of the plan
    shared = share(session, (b"w" * 1000, None))
    assert isinstance(shared, Inline) and shared.value == (b"w" * 1000, None) and shared.nbytes == 1000
    shared.destroy()  # nothing to free: the bytes went with the plan
    with pytest.raises(ConfigError, match=r"on Spark Connect the model's weights travel inside the task closure.*Received: 5242880 bytes"):
        share(session, b"w" * 5 * 2**20, "the model's weights")
    check_inline(object(), 10**12, "anything")  # a classic session broadcasts: no limit here


def test_connect_paths_are_refused_where_this_client_and_the_server_would_not_meet(no_local_remote, tmp_path):
    from sparkdl.spark import persistence

    remote = _session("yarn", "connect.example.com")
    with pytest.raises(ConfigError, match=r"on Spark Connect a path without a scheme .* Received: '/models/m' with a remote Connect server"):
        persistence.exists("/models/m", remote)
    with pytest.raises(ConfigError, match=r"on Spark Connect .*pyarrow\.fs.*classic SparkSession.*Received: 'dbfs:/models/m/model.keras'"):
        persistence.write_bytes("dbfs:/models/m/model.keras", b"x", remote)
    local = _session("local[2]", "localhost")
    path = str(tmp_path / "saved" / "model.keras")
    persistence.write_bytes(path, b"keras bytes", local)  # parent folders created
    assert persistence.read_bytes(f"file://{path}", local) == b"keras bytes"
    assert persistence.qualify(path, local) == f"file:{path}"
    assert persistence.listing(str(tmp_path / "saved"), local) == ["model.keras"]
    assert persistence.read_bytes(str(tmp_path / "nothing"), local) is None
    persistence._files(local).delete(str(tmp_path / "saved"))
    assert not os.path.exists(tmp_path / "saved")


def test_connect_server_errors_become_sparkdl_errors():
    from pyspark.errors.exceptions.connect import AnalysisException, PythonException, UnknownException

    from sparkdl.errors import FitCancelledError, SchemaError
    from sparkdl.spark.jobs import task_error

    raised = PythonException(message="[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback:\n"
                                     "sparkdl.errors.SchemaError: column 'x' must hold 2 values. Received: 3\n SQLSTATE: 38000")
    mapped = task_error(raised, "sparkdl fit 1234: round 1/2")
    assert isinstance(mapped, SchemaError) and str(mapped) == "column 'x' must hold 2 values. Received: 3"
    cancelled = UnknownException(message="[OPERATION_CANCELED] Operation has been canceled. SQLSTATE: HY008",
                                 reason="org.apache.spark.SparkSQLException")
    assert isinstance(task_error(cancelled, "sparkdl fit 1234: round 1/2"), FitCancelledError)
    analysis = AnalysisException(message="[UNRESOLVED_COLUMN] x")
    assert task_error(analysis, "round") is analysis  # a driver-side analysis error keeps its class
