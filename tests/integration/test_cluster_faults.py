"""A fit survives what clusters do, on real executor JVMs (``local-cluster``), in subprocesses (one
SparkContext a process): an executor JVM killed mid-fit (both backends), dynamic allocation that
releases executors between rounds (``rounds``), a loaded machine that raises no false alarm
(``ps``), and a driver killed mid-fit whose job, run again, ends as an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.conftest import ROOT, run_spark_script

pytestmark = pytest.mark.slow

HEAD = textwrap.dedent(
    """
    import json, os, sys, tempfile, time
    import numpy as np
    from pyspark.sql import SparkSession
    import keras
    from sparkdl import KerasEstimator
    from sparkdl.spark.training import faults
    builder = (SparkSession.builder.master("local-cluster[2,1,1024]").config("spark.ui.enabled", "false")
               .config("spark.executor.memory", "512m").config("spark.ui.showConsoleProgress", "false"))
    {conf}
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] - x[:, 1] > 0).astype(np.float64)
    df = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range(64)], "x array<float>, y double").repartition(2)

    def fit(backend="rounds", mode="sync", hook=None, callbacks=(), **kw):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2, activation="softmax")])
        params = dict(numWorkers=2, epochs=2, batchSize=8, localSteps=2, verbose=0, backend=backend, mode=mode, callbacks=list(callbacks))
        params.update(kw)
        est = KerasEstimator(model=model, optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy", featuresCol="x",
                             labelCol="y", **params)
        if hook is None:
            return est.fit(df)
        with faults.inject(hook):
            return est.fit(df)

    def weights(model):
        return [w.tolist() for w in model.getKerasModel().get_weights()]
    """
)

EXECUTOR_KILL = HEAD.format(conf="") + textwrap.dedent(
    """
    out = {}
    for backend, mode in (("rounds", "sync"), ("ps", "sync"), ("ps", "async")):
        base = fit(backend, mode)
        started = time.perf_counter()
        hit = fit(backend, mode, hook=faults.Fault(partition=1, index=2, how="executor", marker_dir=tempfile.mkdtemp()))
        out[f"{backend}-{mode}"] = {"base": weights(base), "hit": weights(hit), "seconds": time.perf_counter() - started,
                                    "updates": hit.fitInfo.get("updates_applied"), "attempts": hit.fitInfo.get("task_attempts"),
                                    "loss": hit.history["loss"]}
    json.dump(out, open(sys.argv[1], "w"))
    spark.stop()
    """
)


def _difference(a, b):
    return max(float(np.abs(np.array(p) - np.array(q)).max()) for p, q in zip(a, b, strict=True))


def test_an_executor_jvm_killed_mid_fit_is_survived_on_both_backends(tmp_path):
    out = run_spark_script(EXECUTOR_KILL, tmp_path, timeout_s=1500)
    for key in ("rounds-sync", "ps-sync"):
        assert _difference(out[key]["hit"], out[key]["base"]) < 1e-5, key
    assert out["ps-async"]["updates"] == 2 * 2 * 2  # every slot applied once
    assert len(out["ps-async"]["loss"]) == 2 and all(np.isfinite(out["ps-async"]["loss"]))


DYNAMIC = HEAD.format(conf=textwrap.dedent(
    """
    if sys.argv[2] == "dynamic":
        for key, value in {"spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.shuffleTracking.enabled": "true",
                           "spark.dynamicAllocation.executorIdleTimeout": "1s", "spark.dynamicAllocation.cachedExecutorIdleTimeout": "1s",
                           "spark.dynamicAllocation.minExecutors": "0", "spark.dynamicAllocation.maxExecutors": "2",
                           "spark.dynamicAllocation.schedulerBacklogTimeout": "1s",
                           # without it an executor holding the input's shuffle output is never released
                           "spark.dynamicAllocation.shuffleTracking.timeout": "1s"}.items():
            builder = builder.config(key, value)
    """)) + textwrap.dedent(
    """
    class Pids(faults.TaskHooks):
        def __init__(self, folder):
            self.folder = folder
        def before_steps(self, point):
            with open(os.path.join(self.folder, f"{point.index}-{point.partition}"), "w") as f:
                f.write(str(faults.executor_pid()))

    class Idle(keras.callbacks.Callback):  # the driver waits between rounds: idle executors are released
        def on_train_batch_end(self, batch, logs=None):
            if sys.argv[2] == "dynamic":
                time.sleep(4)

    folder = tempfile.mkdtemp()
    model = fit("rounds", "sync", hook=Pids(folder), callbacks=[Idle()])
    pids = sorted({open(os.path.join(folder, name)).read() for name in os.listdir(folder)})
    json.dump({"weights": weights(model), "jvms": len(pids), "rounds": model.fitInfo["rounds"],
               "reading": model.fitInfo["rounds_reading_data"]}, open(sys.argv[1], "w"))
    spark.stop()
    """
)


def _run(script, tmp_path, *args, timeout_s=1500):
    out = tmp_path / f"out-{'-'.join(args) or 'x'}.json"
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", script, str(out), *args], env=env, timeout=timeout_s, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def test_rounds_with_dynamic_allocation_releases_executors_between_rounds_and_equals_static_allocation(tmp_path):
    static = _run(DYNAMIC, tmp_path, "static")
    dynamic = _run(DYNAMIC, tmp_path, "dynamic")
    assert static["rounds"] == dynamic["rounds"] == 2 * 2
    assert dynamic["jvms"] > 2, dynamic  # executors released while the driver waited, and new ones came
    assert dynamic["reading"] > 1  # a new executor's round read the data again
    assert _difference(dynamic["weights"], static["weights"]) < 1e-5


LOAD = textwrap.dedent(
    """
    import sys, time
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    until = time.time() + float(sys.argv[1])
    while time.time() < until:  # busy: both cores, all the time
        spark.range(0, 30_000_000, 1, 2).selectExpr("sum(id * id % 7)").collect()
    spark.stop()
    """
)

UNDER_LOAD = HEAD.format(conf="").replace('master("local-cluster[2,1,1024]")', 'master("local[2]")') + textwrap.dedent(
    """
    for _ in range(2):
        model = fit("ps", "sync", workerTimeout=10.0, epochs=3)
    json.dump({"loss": model.history["loss"]}, open(sys.argv[1], "w"))
    spark.stop()
    """
)


def test_a_loaded_machine_raises_no_false_alarm_with_a_short_worker_timeout(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    others = [subprocess.Popen([sys.executable, "-c", LOAD, "600"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              for _ in range(2)]
    try:
        time.sleep(20)  # the other applications are up and busy
        out = run_spark_script(UNDER_LOAD, tmp_path, timeout_s=1200)
    finally:
        for other in others:
            other.send_signal(signal.SIGKILL)
            other.wait(30)
    assert len(out["loss"]) == 3 and all(np.isfinite(out["loss"]))


def _train_job(tmp_path, name: str, backend: str, checkpoint_dir: str | None) -> subprocess.Popen:
    """``spark-submit jobs/train.py`` of conf/mnist_quick.yaml, 4 epochs, on ``local[2]``."""
    sets = [f"fit.epochs=4", f"fit.backend={backend}", "fit.local_steps=32", f"output.dir={tmp_path / name}", "output.plot=false"]
    if checkpoint_dir is not None:
        sets.append(f"fit.checkpoint_dir={checkpoint_dir}")
    args = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[2]",
            "--conf", "spark.ui.showConsoleProgress=false", os.path.join(ROOT, "jobs", "train.py"),
            "--config", os.path.join(ROOT, "conf", "mnist_quick.yaml"), *[x for s in sets for x in ("--set", s)]]
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _weights(folder):
    import keras

    return [w.tolist() for w in keras.saving.load_model(os.path.join(folder, "model", "model.keras")).get_weights()]


@pytest.mark.parametrize("backend", ["rounds", "ps"])
def test_a_killed_driver_run_again_with_its_checkpoint_dir_ends_as_an_uninterrupted_run(tmp_path, backend):
    whole = _train_job(tmp_path, "whole", backend, None)
    out, _ = whole.communicate(timeout=1200)
    assert whole.returncode == 0, out[-3000:]
    folder = tmp_path / "checkpoints"
    killed = _train_job(tmp_path, "killed", backend, str(folder))
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and not any(p.stat().st_size == 64 for p in folder.glob("snapshot-*-000002.done")):  # after epoch 2's snapshot, its marker whole
        assert killed.poll() is None, killed.stdout.read()[-3000:]
        time.sleep(0.2)
    os.killpg(killed.pid, signal.SIGKILL)  # the driver (and its executors' Python workers) die mid-fit
    killed.wait(60)
    assert not (tmp_path / "killed" / "model").exists()
    again = _train_job(tmp_path, "killed", backend, str(folder))
    out, _ = again.communicate(timeout=1200)
    assert again.returncode == 0, out[-3000:]
    metrics = json.loads((tmp_path / "killed" / "metrics.json").read_text())
    assert metrics["resumed_from_epoch"] >= 2 and metrics["epochs_run"] == 4 - metrics["resumed_from_epoch"], metrics
    assert _difference(_weights(tmp_path / "killed"), _weights(tmp_path / "whole")) < 1e-6
