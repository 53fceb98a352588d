"""The driver's memory during a fit, per backend: its Python process' peak RSS growth in multiples of
the model's state, and its JVM's RSS after each epoch (flat: broadcasts and results of finished
rounds are released).

For each backend (default ``rounds``, ``ps``, ``sharded``) a fresh process fits an MLP of about
``--params`` float32 parameters (``784 → h → 10``, Adam: the state is weights plus two moments, 12
bytes a parameter) with ``--workers`` workers, ``--epochs`` epochs of ``--rounds`` rounds of one
local step, on ``--master`` (``local[2]``). The driver Python process' peak resident set is the
kernel's (``VmHWM``, reset through ``/proc/self/clear_refs`` as ``fit()`` begins and read once it
returned the fitted ``KerasModel``, so the final model's assembly counts; Linux only); a callback
reads the driver JVM's resident set (the Java child of this process) at each epoch's end. Growth =
the peak from ``fit()`` until the fitted model exists minus the RSS when it began.
That callback counts as one that reads the model's weights (Keras' default), so on ``sharded`` the
driver fetches the master at each epoch's end; with ``--probe-reads-nothing`` it declares
``needs_weights = False`` and the driver fetches the master only at the fit's end. With
``--heap-after-gc`` the callback then also runs a full GC in the driver JVM (``System.gc()``) and
reads its heap in use: what the JVM still holds, apart from the garbage G1 sizes its heap to (the GC
also lets the heap shrink, so the next epochs' RSS is not the same as without the flag).

Prints one JSON line per backend, e.g. ``{"benchmark": "driver_memory", "backend": "sharded",
"params": 20000000, "state_mb": 240.0, "python_growth_mb": 280.1, "python_growth_states": 1.17,
"jvm_rss_mb_per_epoch": [900.1, 902.3, 901.7], ...}``, then a Markdown table.

Usage: python benchmarks/driver_memory.py [--backends rounds ps sharded] [--params 2e7] [--epochs 3]
       [--rounds 1] [--workers 2] [--master 'local[2]'] [--driver-memory 8g] [--probe-reads-nothing] [--heap-after-gc]
       [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks"))
import numpy as np
import round_overhead as ro
from pyspark.sql import SparkSession

backend, workers, params, epochs, rounds, master, driver_memory = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), \
    int(sys.argv[6]), sys.argv[7], sys.argv[8]
probe_reads_weights = sys.argv[9] == "1"
heap_after_gc = sys.argv[10] == "1"
spark = (SparkSession.builder.master(master).config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.memory", driver_memory).config("spark.driver.maxResultSize", "0")
         .config("spark.sql.shuffle.partitions", "8").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
import keras
from sparkdl import KerasEstimator


def rss_mb(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def jvm_pid():
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                java = b"java" in f.read().split(b"\0")[0]
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and java:
            return int(name)
    return None


class JvmPerEpoch(keras.callbacks.Callback):
    needs_weights = probe_reads_weights  # True (Keras' default for any callback): the master is put into the driver's model each epoch

    def __init__(self, pid):
        super().__init__()
        self.pid, self.readings, self.heap = pid, [], []

    def on_epoch_end(self, epoch, logs=None):
        self.readings.append(round(rss_mb(self.pid), 1) if self.pid else None)
        if heap_after_gc:
            from sparkdl.spark.internals import jvm as driver_jvm

            java = driver_jvm(spark.sparkContext).java.lang
            java.System.gc()
            runtime = java.Runtime.getRuntime()
            self.heap.append(round((runtime.totalMemory() - runtime.freeMemory()) / 2**20, 1))


batch = 8
rows = workers * rounds * batch
rng = np.random.default_rng(0)
x = rng.random((rows, ro.INPUTS), dtype=np.float32)
df = spark.createDataFrame([(r.tolist(), float(i % 10)) for i, r in enumerate(x)], "features array<float>, label double").cache()
df.count()
model = ro.build_model(params)
exact = sum(int(np.prod(w.shape)) for w in model.weights)
jvm = JvmPerEpoch(jvm_pid())
est = KerasEstimator(model=model, optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     numWorkers=workers, epochs=epochs, batchSize=batch, localSteps=1, verbose=0, roundTimeout=3600.0, backend=backend,
                     callbacks=[jvm])
with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM, the kernel's peak RSS, to the RSS now
    f.write("5")
before = rss_mb(os.getpid())
started = time.perf_counter()
fitted = est.fit(df)  # returns the fitted KerasModel: the final model assembled
seconds = time.perf_counter() - started
peak = rss_mb(os.getpid(), "VmHWM")
state_mb = 3 * 4 * exact / 2**20
info = fitted.fitInfo
print(json.dumps({"benchmark": "driver_memory", "backend": info["backend"], "workers": workers, "params": exact, "epochs": epochs,
                  "rounds": info["rounds"], "state_mb": round(state_mb, 1), "python_rss_before_mb": round(before, 1),
                  "python_peak_mb": round(peak, 1), "peak_from": "VmHWM", "python_growth_mb": round(peak - before, 1),
                  "python_growth_states": round((peak - before) / state_mb, 2), "jvm_rss_mb_per_epoch": jvm.readings,
                  "jvm_heap_after_gc_mb_per_epoch": jvm.heap or None,
                  "driver_bytes_fetched": info.get("driver_bytes_fetched"), "probe_needs_weights": probe_reads_weights,
                  "fit_s": round(seconds, 1)}), flush=True)
spark.stop()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["rounds", "ps", "sharded"])
    parser.add_argument("--params", type=float, default=2e7)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="rounds per epoch")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--probe-reads-nothing", action="store_true", help="the per-epoch JVM probe declares needs_weights=False: "
                        "no callback reads weights, so backend sharded fetches no master at the epochs' ends")
    parser.add_argument("--heap-after-gc", action="store_true", help="at each epoch's end also run a full GC in the driver JVM "
                        "and read its heap in use (what it still holds)")
    parser.add_argument("--out", help="also append the JSON lines to this file")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("KERAS_BACKEND", "tensorflow")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    results = []
    for backend in args.backends:
        out = subprocess.run([sys.executable, "-c", CHILD, ROOT, backend, str(args.workers), str(int(args.params)), str(args.epochs),
                              str(args.rounds), args.master, args.driver_memory, "0" if args.probe_reads_nothing else "1",
                              "1" if args.heap_after_gc else "0"], env=env,
                             capture_output=True, text=True, timeout=7200)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode != 0 or not lines:
            raise SystemExit(f"backend={backend} failed:\n{out.stderr[-3000:]}")
        results.append(json.loads(lines[-1]))
        print(lines[-1], flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(lines[-1] + "\n")
    print("\n| backend | state MB | driver Python peak growth MB | in states | driver JVM RSS MB after each epoch | fit s |\n|---|---|---|---|---|---|")
    for r in results:
        jvm = ", ".join(f"{v:.0f}" for v in r["jvm_rss_mb_per_epoch"] if v is not None)
        heap = r.get("jvm_heap_after_gc_mb_per_epoch")
        jvm += f" (heap after a full GC: {', '.join(f'{v:.0f}' for v in heap)})" if heap else ""
        print(f"| {r['backend']} | {r['state_mb']} | {r['python_growth_mb']} | {r['python_growth_states']} | {jvm} | {r['fit_s']} |")


if __name__ == "__main__":
    main()
