"""Driver peak memory of a ``rounds`` fit as the number of workers grows.

For each worker count (default 2, 8 and 32) a fresh process fits an MLP of about 10M float32
parameters (``784 → h → 10``, Adam: weights plus two moments, 120 MB per update) for two rounds of
one local step on ``local[2]`` (tasks run in waves), and reports the peak resident set size of the
driver's Python process (``ru_maxrss``), where a round's updates arrive, before and after the
fit. With the updates combined on the executors the driver receives one combined update per round
whatever the worker count; combined on the driver it would receive one per worker.

Prints one JSON line per worker count, e.g. ``{"benchmark": "driver_memory", "workers": 32,
"params": 10000000, "driver_peak_rss_mb": 950.0, ...}``, then a Markdown table.

Usage: python benchmarks/driver_memory.py [--workers 2 8 32] [--params 1e7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks"))
import numpy as np
import round_overhead as ro
from pyspark.sql import SparkSession

workers, params = int(sys.argv[2]), int(sys.argv[3])
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "6g")
         .config("spark.sql.shuffle.partitions", "8").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
import keras
from sparkdl import KerasEstimator

batch = 8
rows = 2 * workers * batch
rng = np.random.default_rng(0)
x = rng.random((rows, ro.INPUTS), dtype=np.float32)
df = spark.createDataFrame([(r.tolist(), float(i % 10)) for i, r in enumerate(x)], "features array<float>, label double")
model = ro.build_model(params)
est = KerasEstimator(model=model, optimizer=keras.optimizers.Adam(1e-3),
                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), numWorkers=workers, epochs=1,
                     batchSize=batch, localSteps=1, verbose=0, roundTimeout=1800.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
started = time.perf_counter()
fitted = est.fit(df)
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"benchmark": "driver_memory", "workers": workers, "params": params,
                  "driver_peak_rss_mb": round(peak, 1), "driver_rss_before_fit_mb": round(before, 1),
                  "fit_growth_mb": round(peak - before, 1), "update_mb": round(3 * 4 * params / 2**20, 1),
                  "rounds": fitted.fitInfo["rounds"], "reduced_on_executors": fitted.fitInfo["reduced_on_executors"],
                  "fit_s": round(seconds, 1)}), flush=True)
spark.stop()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--params", type=float, default=1e7)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("KERAS_BACKEND", "tensorflow")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    results = []
    for workers in args.workers:
        out = subprocess.run([sys.executable, "-c", CHILD, ROOT, str(workers), str(int(args.params))], env=env,
                             capture_output=True, text=True, timeout=3600)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode != 0 or not lines:
            raise SystemExit(f"workers={workers} failed:\n{out.stderr[-3000:]}")
        results.append(json.loads(lines[-1]))
        print(lines[-1], flush=True)
    base = results[0]["driver_peak_rss_mb"]
    print("\n| workers | driver peak RSS MB | vs first | growth during fit MB | combined on | fit s |\n|---|---|---|---|---|---|")
    for r in results:
        where = "executors" if r["reduced_on_executors"] else "driver"
        print(f"| {r['workers']} | {r['driver_peak_rss_mb']} | {r['driver_peak_rss_mb'] / base:.2f}x | {r['fit_growth_mb']} | {where} | {r['fit_s']} |")


if __name__ == "__main__":
    main()
