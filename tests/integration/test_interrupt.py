"""Ctrl-C of the driver alone (SIGINT to the driver's Python process, as an IDE's stop button sends
it) ends a fit cleanly: exit status 130 as a shell reports it (the process ends by SIGINT), a KeyboardInterrupt, no fatal error of the interpreter
(a thread still inside py4j while Python finalized aborted it, exit 134), on each backend."""

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
    # Python ends an unhandled KeyboardInterrupt by SIGINT itself: a shell reports 130 (128 + 2), Popen -2
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, err[-3000:])
    assert "KeyboardInterrupt" in err and "Fatal Python error" not in err
