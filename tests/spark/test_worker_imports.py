"""A task that cannot import a module says which setting ships it and which Python ran: a decoder's
module missing on the executors (here: on the driver's sys.path only) names the module, --py-files /
addPyFile and the executor's sys.executable; sparkdl missing in the executors' Python (a real session
whose PYSPARK_PYTHON is a bare virtualenv) names PYSPARK_PYTHON / spark.pyspark.python and that Python,
before any job on a local master."""

import json
import os
import subprocess
import sys
import uuid
import venv

import numpy as np
import pytest

from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError, WorkerError
from tests.conftest import ROOT, jobs_started

import keras  # noqa: E402


def _binary_df(spark):
    rows = [(np.full(3, i, np.float32).tobytes(), float(i % 2)) for i in range(8)]
    return spark.createDataFrame(rows, "blob binary, label double")


def _estimator(decoder):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    return KerasEstimator(model=model, loss="mse", featuresCol="blob", labelCol="label", decoders={"blob": decoder},
                          numWorkers=1, verbose=0)


def test_a_decoder_module_nowhere_is_refused_before_any_job_naming_how_to_ship_it(spark):
    df = _binary_df(spark)
    with pytest.raises(ConfigError) as info:
        assert jobs_started(spark, lambda: _estimator("nonexistent_mod_xyz:fn").fit(df)) == 0
    first = str(info.value).splitlines()[0]
    assert first.startswith("decoder 'nonexistent_mod_xyz:fn' must be an importable callable")
    assert "module 'nonexistent_mod_xyz' cannot be imported" in first
    assert "--py-files" in first and "SparkContext.addPyFile" in first and sys.executable in first


def test_a_decoder_module_on_the_drivers_path_only_fails_in_the_task_naming_the_executors_python(spark, tmp_path, monkeypatch):
    name = f"driver_only_{uuid.uuid4().hex[:8]}"  # a new name: no Python worker has it imported
    (tmp_path / f"{name}.py").write_text("import numpy as np\n\ndef decode(b):\n    return np.frombuffer(b, np.float32)\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the driver's sys.path only: the executors' workers never see it
    df = _binary_df(spark)
    with pytest.raises(ConfigError) as info:
        _estimator(f"{name}:decode").fit(df)  # the driver's check passes; the check job's task cannot import it
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"decoder '{name}:decode' must be an importable callable on the driver and every executor: "
                              f"module '{name}' cannot be imported by this Python ({os.environ['PYSPARK_PYTHON']}, Python ")
    assert "--py-files" in message and "SparkContext.addPyFile" in message
    assert message.endswith(f"Received: ModuleNotFoundError: No module named '{name}'")


def test_task_error_names_the_setting_for_sparkdl_or_a_user_module_missing_on_the_executors():
    from pyspark.errors.exceptions.connect import PythonException

    from sparkdl.spark.jobs import task_error

    def failure(module):
        return PythonException(message="[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback:\n"
                                       '  File "/opt/py/pyspark/worker.py", line 1, in main\n'
                                       f"ModuleNotFoundError: No module named '{module}'\n SQLSTATE: 38000")

    mapped = task_error(failure("sparkdl"), "sparkdl: check and count training rows", "/usr/bin/python3 (Python 3.10.12)")
    assert isinstance(mapped, WorkerError)
    assert str(mapped).startswith("the executors' Python must have sparkdl and its dependencies installed, as the driver's: "
                                  "set PYSPARK_PYTHON or spark.pyspark.python to such a Python on every executor")
    assert "an executor runs /usr/bin/python3 (Python 3.10.12)" in str(mapped)
    assert f"the driver runs {sys.executable}" in str(mapped) and "No module named 'sparkdl'" in str(mapped)
    assert str(task_error(failure("pyarrow.lib"), "job")).startswith("the executors' Python must have sparkdl")  # a dependency
    user = task_error(failure("mypkg.layers"), "job")
    assert str(user).startswith("module 'mypkg.layers' must be importable on the executors: ship your own code with "
                                "--py-files (of spark-submit or sparkdl-train), SparkContext.addPyFile(path) or a wheel "
                                "installed on the cluster")
    assert "PYSPARK_PYTHON" in str(user)  # unknown executors' Python: the configured one is named
    # an import caught inside a task, then another failure: not an import failure
    caught = PythonException(message="Traceback:\nModuleNotFoundError: No module named 'scipy'\n\nDuring handling of the above "
                                     "exception, another exception occurred:\nValueError: bad value\n")
    assert "must be importable" not in str(task_error(caught, "job"))
    # sparkdl's worker daemon where the executors' Python has no sparkdl: Spark's error carries the daemon's stderr
    daemon = PythonException(message="org.apache.spark.SparkException: Python daemon failed to launch: Bad data in "
                                     "sparkdl.spark.daemon's standard output. Invalid port number: 791289458 (0x2f2a2a2f)\n"
                                     "/usr/bin/python3: Error while finding module specification for 'sparkdl.spark.daemon' "
                                     "(ModuleNotFoundError: No module named 'sparkdl')\n")
    assert str(task_error(daemon, "job")).startswith("the executors' Python must have sparkdl and its dependencies installed")


SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[2])  # sparkdl on the driver's path only: the executors' bare Python has none of it
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("OFF")
import keras
from sparkdl import KerasEstimator
df = spark.createDataFrame([([1.0, 2.0], 1.0)] * 4, "features array<double>, label double")
try:
    KerasEstimator(model=keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), loss="mse", numWorkers=1, verbose=0).fit(df)
    out = {"type": None, "message": ""}
except Exception as e:
    out = {"type": type(e).__name__, "message": str(e)}
spark.stop()
json.dump(out, open(sys.argv[1], "w"))
"""


@pytest.mark.slow  # a second JVM and a TensorFlow import: 64 s measured on 2 shared, loaded cores
def test_a_session_whose_executors_run_a_python_without_sparkdl_says_to_set_pyspark_python_before_any_job(tmp_path):
    venv.create(tmp_path / "bare", with_pip=False)  # this Python's version, none of its packages
    bare = str(tmp_path / "bare" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_DRIVER_PYTHON")}
    env["PYSPARK_PYTHON"] = bare
    out = tmp_path / "out.json"
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(out), ROOT], env=env, cwd=str(tmp_path), timeout=300,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    raised = json.loads(out.read_text())
    assert raised["type"] == "ConfigError"  # a local master's Python workers: checked before any job (issue 31)
    message = raised["message"]
    assert len(message.splitlines()) == 1
    assert message.startswith("the executors' Python must have sparkdl and its dependencies installed, as the driver's: "
                              "set PYSPARK_PYTHON to such a Python before the SparkSession starts")
    minor = "%d.%d" % sys.version_info[:2]
    assert (f"master local[1] runs its Python workers with {bare!r}, which cannot import sparkdl, numpy, pyarrow, keras, "
            f"tensorflow ({bare}, Python {minor}); the driver runs {sys.executable}") in message
    assert message.endswith(f"Received: PYSPARK_PYTHON={bare!r} now, {bare!r} when the SparkContext started")


DRIVER_ONLY_LOSS = """
import keras

@keras.saving.register_keras_serializable(package="driver_only")
def doubled_mse(y_true, y_pred):
    return 2.0 * keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)
"""

RETRIED = """
import json, sys
sys.path.insert(0, sys.argv[1])  # the driver's sys.path only: the executors' Python workers never see it
import numpy as np
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false").getOrCreate()  # 4 attempts per task
spark.sparkContext.setLogLevel("OFF")
import keras
from sparkdl import KerasEstimator
import {module}
df = spark.createDataFrame([([float(i), 1.0], float(i)) for i in range(8)], "x array<double>, y double")
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
est = KerasEstimator(model=model, loss={module}.doubled_mse, featuresCol="x", labelCol="y", numWorkers=2, verbose=0)
try:
    est.fit(df)
    message = None
except Exception as exc:
    message = f"{{type(exc).__name__}}: {{exc}}"
tracker = spark.sparkContext.statusTracker()
stages = [tracker.getStageInfo(s) for j in tracker.getJobIdsForGroup() for s in tracker.getJobInfo(j).stageIds]
print(json.dumps({{"message": message, "failed_tasks": sum(s.numFailedTasks for s in stages if s)}}))
"""


def test_a_custom_objects_module_on_the_drivers_path_only_fails_the_fit_at_the_first_attempt(tmp_path):
    """A custom loss in a module the executors cannot import, on local[2,4] (4 attempts per task): the
    check job's tasks unpickle the custom objects as the training tasks would and report the import
    instead of failing, so no task attempt fails and no training job starts; the error names the
    module and how to ship it."""
    module = f"driver_only_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(DRIVER_ONLY_LOSS)
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, "-c", RETRIED.format(module=module), str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    message = report["message"]
    assert message.startswith(f"WorkerError: module '{module}' must be importable on the executors: ship your own code with "
                              "--py-files (of spark-submit or sparkdl-train), SparkContext.addPyFile(path)"), message
    assert f"sparkdl: check and count training rows, partition 0, failed: an executor cannot import '{module}'" in message
    assert f"Received: ModuleNotFoundError: No module named '{module}'" in message
    assert "spark.submit.pyFiles" in message and "failed at the first attempt" in message
    assert report["failed_tasks"] == 0  # not one task attempt failed: nothing left for spark.task.maxFailures to retry
