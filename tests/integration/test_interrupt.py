"""Ctrl-C of the driver alone (SIGINT to the driver's Python process, as an IDE's stop button sends
it) ends a fit cleanly: a FitCancelledError (a KeyboardInterrupt; uncaught, exit status 1), no fatal error of the interpreter
(a thread still inside py4j while Python finalized aborted it, exit 134), on each backend; caught, it is a
FitCancelledError saying so, no job of the fit is left running and the session runs the next job."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false") \\
        .config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    import keras
    from sparkdl import KerasEstimator
    x = np.random.default_rng(0).normal(size=(400, 4)).astype(np.float32)
    df = spark.createDataFrame([(r.tolist(), float(r[0] > 0)) for r in x], "x array<float>, y double")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2, activation="softmax")])

    class Started(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            print("round", flush=True)

    est = KerasEstimator(model=model, optimizer="adam", loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y",
                         numWorkers=2, epochs=500, batchSize=8, localSteps=2, verbose=0, backend=sys.argv[1], callbacks=[Started()])
    est.fit(df)
    """
)


@pytest.mark.parametrize("backend", ["rounds", "ps", "sharded"])
def test_sigint_to_the_driver_alone_ends_the_fit_with_status_130(backend):
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, backend], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        rounds = 0
        while rounds < 3 and time.monotonic() < deadline:  # a few rounds ran: the interrupt lands mid-fit
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-3000:]
            rounds += line.strip() == "round"
        proc.send_signal(signal.SIGINT)  # the driver's Python process alone, not its process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The fit raises FitCancelledError, a KeyboardInterrupt subclass: Python ends by SIGINT (status 130) for
    # KeyboardInterrupt itself only, so an uncaught one ends with status 1, after the interrupt's traceback.
    assert proc.returncode == 1, (proc.returncode, err[-3000:])
    assert "KeyboardInterrupt" in err and "Fatal Python error" not in err
    assert "sparkdl.errors.FitCancelledError: KerasEstimator.fit was cancelled by an interrupt" in err, err[-3000:]


CAUGHT = SCRIPT.replace("\nest.fit(df)\n", textwrap.dedent("""
    from sparkdl.errors import FitCancelledError
    try:
        est.fit(df)
    except KeyboardInterrupt as exc:
        print("caught", type(exc).__name__, isinstance(exc, FitCancelledError), flush=True)
        print("message", str(exc), flush=True)
        print("active", spark.sparkContext.statusTracker().getActiveJobsIds(), flush=True)
        print("count", spark.range(3).count(), flush=True)
    """))


def test_sigint_caught_is_a_fit_cancelled_error_and_the_session_runs_the_next_job():
    assert CAUGHT != SCRIPT
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.Popen([sys.executable, "-c", CAUGHT, "rounds"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        rounds = 0
        while rounds < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-3000:]
            rounds += line.strip() == "round"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (proc.returncode, err[-3000:])
    said = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.splitlines() if " " in line and line.split(" ", 1)[0] != "round"}
    assert said["caught"] == "FitCancelledError True"
    assert said["message"].startswith("KerasEstimator.fit was cancelled by an interrupt (Ctrl-C or a notebook's stop): its Spark "
                                      "jobs were cancelled and none is left running; the SparkSession is usable and the estimator "
                                      "unchanged. Received: KeyboardInterrupt during fit "), said["message"]
    assert said["active"] == "[]" and said["count"] == "3"
