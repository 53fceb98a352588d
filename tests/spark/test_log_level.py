"""``SPARKDL_LOG_LEVEL``: the Python workers, which no user code configures, write the ``sparkdl``
logger's lines to their stderr, which Spark keeps in the executor's log (a local master's: the
driver's stderr), each line naming its process."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from sparkdl import LOG_LEVEL_ENV
from tests.conftest import ROOT

FIT = r"""
import keras
from pyspark.sql import SparkSession
from sparkdl import KerasEstimator
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.executorEnv.SPARKDL_LOG_LEVEL", "INFO").getOrCreate())
df = spark.createDataFrame([([float(i % 7), 1.0], float(i % 3)) for i in range(40)], "features array<float>, label float")
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
KerasEstimator(model=model, optimizer="sgd", loss="mse", numWorkers=2, epochs=1, batchSize=10, backend="sharded",
               verbose=0).fit(df)
spark.stop()
print("driver", __import__("os").getpid())
"""


def test_the_executors_log_level_shows_the_workers_lines_and_the_drivers_stay_its_own():
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, KERAS_BACKEND="tensorflow")
    env.pop(LOG_LEVEL_ENV, None)  # the driver's own logging is left as it is: nothing at INFO
    result = subprocess.run([sys.executable, "-c", FIT], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    driver = result.stdout.split("driver ")[-1].strip()
    restored = re.findall(r"sparkdl\[(\d+)\] INFO: sparkdl: slice (\d) restored at version 0 from the fit's start", result.stderr)
    assert sorted(int(s) for _, s in restored) == [0, 1], result.stderr[-3000:]  # each slice's owner said it
    assert driver not in {pid for pid, _ in restored}  # from the Python workers, not the driver
    assert f"sparkdl[{driver}]" not in result.stderr


def test_a_log_level_that_is_not_one_is_refused_naming_the_variable():
    env = dict(os.environ, PYTHONPATH=ROOT, **{LOG_LEVEL_ENV: "loud"})
    result = subprocess.run([sys.executable, "-c", "import sparkdl"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "SPARKDL_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR. Received: SPARKDL_LOG_LEVEL='loud'" in result.stderr
