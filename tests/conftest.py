"""Shared fixtures: one SparkSession (``local[2]``) for the whole test session.

Executors use this interpreter (``PYSPARK_PYTHON``), Keras uses TensorFlow, and Python
worker reuse stays on so TensorFlow is imported once per worker process.
"""

import os
import sys

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    from sparkdl.spark.daemon import session_conf

    session = (
        SparkSession.builder.master("local[2]")
        .appName("sparkdl-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .config(map=session_conf())  # as sparkdl-train's sessions: workers fork from a daemon that imported TensorFlow
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def partitioned_df(spark, partitions, schema):
    """A DataFrame whose partition i holds exactly the rows ``partitions[i]`` (list of tuples), in order."""
    rdd = spark.sparkContext.parallelize(partitions, len(partitions)).flatMap(lambda rows: rows)
    return spark.createDataFrame(rdd, schema)


def spark_submit_main(script, tmp_path, timeout_s=600):
    """``spark-submit --master local[2]`` of ``script`` written to ``tmp_path/job.py`` (run with ``tmp_path``
    as its working directory and first argument: code of ``__main__``, as a user's job), and the JSON it
    wrote to ``tmp_path/out.json``."""
    import json
    import subprocess

    (tmp_path / "job.py").write_text(script)
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    result = subprocess.run([spark_submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                             "--conf", "spark.ui.showConsoleProgress=false", str(tmp_path / "job.py"), str(tmp_path)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "out.json").read_text())


def run_spark_script(script, tmp_path, timeout_s=900):
    """Run ``script`` (Python source that writes JSON to ``sys.argv[1]``) in a fresh process with its own
    SparkContext (one process holds one), and return the JSON it wrote."""
    import json
    import subprocess

    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", script, str(out)], env=env, timeout=timeout_s, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def jobs_started(spark, call, group: str = "sparkdl-test-jobs") -> int:
    """Spark jobs that ``call()`` started, counted through a job group of its own."""
    sc = spark.sparkContext
    before = len(sc.statusTracker().getJobIdsForGroup(group))
    sc.setJobGroup(group, group)
    try:
        call()
    finally:
        sc.setJobGroup("", "")
    return len(sc.statusTracker().getJobIdsForGroup(group)) - before


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    """An MLflow client of a local file store under tmp_path (MLflow >= 3.7 wants the file store allowed
    explicitly); no run is left active after the test."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    assert mlflow.active_run() is None
    yield mlflow.tracking.MlflowClient()
    while mlflow.active_run() is not None:
        mlflow.end_run()
