"""GPU pinning on a machine without GPUs (issue 11, items 1 and 5): Spark's resource scheduling with a fake
discovery script on ``local-cluster[2,1,1024]``, and the CPU threads of a task on ``local[2]``.

Each fake GPU task pins the address Spark gave it: ``CUDA_VISIBLE_DEVICES`` set by
:func:`sparkdl.keras.runtime.configure` before TensorFlow starts (the CPU build ignores it), read back
by :func:`sparkdl.keras.runtime.describe` in the same task.
"""

import os
import shutil
import stat
import textwrap

import pyarrow as pa
import pytest

from tests.conftest import ROOT, run_spark_script

FAKE_GPUS = os.path.join(ROOT, "tests", "resources", "fake_gpus.sh")

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import SparkSession
    script = sys.argv[2]
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]").config("spark.ui.enabled", "false")
             .config("spark.executor.memory", "512m")
             .config("spark.worker.resource.gpu.amount", "1").config("spark.worker.resource.gpu.discoveryScript", script)
             .config("spark.executor.resource.gpu.amount", "1").config("spark.executor.resource.gpu.discoveryScript", script)
             .config("spark.task.resource.gpu.amount", "1").getOrCreate())

    def report(batches):
        from pyspark import BarrierTaskContext
        from sparkdl.keras import runtime
        context = BarrierTaskContext.get()
        before = dict(os.environ).get("CUDA_VISIBLE_DEVICES")
        runtime.configure(context.cpus(), context.resources())  # what the fit and transform tasks call
        for _ in batches:
            pass
        info = runtime.describe()
        info.update(partition=context.partitionId(), spark_addresses=list(context.resources()["gpu"].addresses), before=before)
        yield pa.RecordBatch.from_pylist([{"info": json.dumps(info)}])

    rows = spark.range(2).repartition(2).mapInArrow(report, "info string", barrier=True).collect()
    pinned = [json.loads(r["info"]) for r in rows]

    result = {"pinned": pinned}
    if FIT:  # a fit on each backend and a transform, whose tasks carry a GPU resource
        import keras
        from sparkdl import KerasEstimator
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
        df = spark.createDataFrame([(float(v), 2.0 * v) for v in (1, 2, 3, 4)] * 4, "x double, y double")
        for backend in ("rounds", "ps"):
            model.set_weights([np.zeros((1, 1), np.float32)])
            fitted = KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.02), loss="mse", featuresCol="x", labelCol="y",
                                    numWorkers=2, epochs=5, batchSize=4, verbose=0, backend=backend).fit(df)
            result[backend] = float(fitted.getKerasModel().get_weights()[0][0, 0])
        result["predictions"] = [r["prediction"] for r in fitted.transform(df.limit(4)).collect()]
    json.dump(result, open(sys.argv[1], "w"))
    spark.stop()
    """
)


def _run_on_fake_gpus(tmp_path, monkeypatch, fit: bool) -> dict:
    script = tmp_path / "fake_gpus.sh"
    shutil.copy(FAKE_GPUS, script)  # executable wherever the checkout lost the mode bit
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    claims = tmp_path / "claims"
    claims.mkdir()
    monkeypatch.setenv("SPARKDL_FAKE_GPU_DIR", str(claims))  # each worker of the cluster claims one fake GPU
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    source = SCRIPT.replace("sys.argv[2]", repr(str(script))).replace("if FIT:", f"if {fit}:")
    return run_spark_script(source, tmp_path, timeout_s=600)


@pytest.mark.slow  # the pinning rules run by default in tests/unit/test_gpu.py
def test_two_fake_gpu_tasks_each_pin_their_own_address(tmp_path, monkeypatch):
    pinned = sorted(_run_on_fake_gpus(tmp_path, monkeypatch, fit=False)["pinned"], key=lambda r: r["partition"])
    assert sorted(r["spark_addresses"][0] for r in pinned) == ["0", "1"]  # two tasks, two distinct addresses
    for r in pinned:
        assert r["before"] is None  # the executors inherited no CUDA_VISIBLE_DEVICES
        assert r["cuda_visible_devices"] == r["spark_addresses"][0]  # pinned to Spark's address
        assert r["gpu_addresses"] == r["spark_addresses"] and r["ordinals"] == [0]
        assert r["intra_op_threads"] == 1  # spark.task.cpus
        assert r["gpus"] == 0  # the CPU build of TensorFlow sees no GPU
    assert len({r["pid"] for r in pinned}) == 2


@pytest.mark.slow
def test_fit_and_transform_on_fake_gpus_train_as_on_cpu(tmp_path, monkeypatch):
    got = _run_on_fake_gpus(tmp_path, monkeypatch, fit=True)
    assert sorted(r["cuda_visible_devices"] for r in got["pinned"]) == ["0", "1"]
    assert 1.0 < got["rounds"] <= 2.0 + 1e-6  # y = 2x, from w = 0
    assert abs(got["ps"] - got["rounds"]) < 1e-5  # sync on ps equals sync on rounds
    assert len(got["predictions"]) == 4


def _threads(batches):
    import json

    from pyspark import TaskContext

    from sparkdl.keras import runtime

    context = TaskContext.get()
    runtime.configure(context.cpus(), context.resources())
    for _ in batches:
        pass
    info = runtime.describe()
    info.update(cpus=context.cpus(), resources=sorted(context.resources()))
    yield pa.RecordBatch.from_pylist([{"info": json.dumps(info)}])


@pytest.mark.slow  # the default run's 25-minute budget: tests/unit/test_gpu.py runs the rules; make test-jax still runs it
@pytest.mark.backends  # also run under KERAS_BACKEND=jax and torch (make test, make test-all)
def test_a_task_without_gpus_runs_on_cpu_with_its_task_cpus_as_intra_op_threads(spark):
    import json

    rows = spark.range(2).repartition(2).mapInArrow(_threads, "info string").collect()
    infos = [json.loads(r["info"]) for r in rows]
    assert len(infos) == 2
    cpus = int(spark.sparkContext.getConf().get("spark.task.cpus", "1"))
    for info in infos:
        assert info["cpus"] == cpus == 1
        assert info["intra_op_threads"] == cpus  # TensorFlow's default would be 0 (all 2 cores)
        assert info["backend"] == os.environ.get("KERAS_BACKEND", "tensorflow")  # the driver's, reported by that backend
        assert info["inter_op_threads"] == 1
        assert info["resources"] == [] and info["gpu_addresses"] == [] and info["ordinals"] == []
        assert info["cuda_visible_devices"] == os.environ.get("CUDA_VISIBLE_DEVICES")  # nothing pinned
