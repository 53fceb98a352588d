"""Cold start: a fit's time from ``fit()`` to its workers' first step, in a fresh SparkSession,
against the time the same kind of session needs to import TensorFlow and build the model in one
Python worker.

Each repeat runs two fresh processes, one after the other, each with its own ``local[W]`` session:

- ``import``: a one-task Spark job whose task runs ``import tensorflow, keras`` and builds the
  model (``sparkdl.keras.zoo:mnist_cnn``); timed on the driver from the job's submission to its
  result (a Python worker started, TensorFlow imported, the model built): an RDD job
  (``parallelize().mapPartitions``), and the same task as a DataFrame job (``mapInArrow`` over
  ``spark.range``: the kind of task a fit's data runs in, whose first job in a fresh session
  costs Spark seconds more before any Python line runs: the SQL planning and the Arrow Python
  runner's start);
- ``fit``: the main job's fit (``conf/mnist_cnn.yaml``: 2 workers, batch 64, τ=16, ``backend``
  as given, 1 epoch) in a session started as the deployment page recommends (``session_conf()``:
  sparkdl's worker daemon; ``start_workers`` right after the session starts, then the model built;
  ``--no-daemon``: a plain session), its ``fitInfo["seconds"]`` (``first_step``: from ``fit()`` to the workers'
  first step; ``checks``, ``prepare_data``, ``first_round``) and the fit's own wall time.

Prints one JSON line per process, then the medians, ``ratio`` = median first_step / median
import as an RDD job (goal: at most 1.5) and ``ratio_dataframe`` = the same against the DataFrame job.

Usage: python benchmarks/cold_start.py [--repeats 3] [--backend auto|rounds|ps] [--workers 2] [--no-daemon]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from setup_env import ROOT  # noqa: E402  (sys.path and the environment, before pyspark/keras)

_HEAD = """
import json, sys, time
sys.path.insert(0, {root!r})
import setup_env  # noqa
from pyspark.sql import SparkSession
builder = (SparkSession.builder.master("local[{workers}]").config("spark.ui.enabled", "false")
           .config("spark.ui.showConsoleProgress", "false"))
if {daemon}:  # sparkdl's worker daemon, the workers started at once (docs/user-guide/deployment.md)
    from sparkdl.spark.daemon import session_conf, start_workers
    builder = builder.config(map=session_conf())
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
if {daemon}:
    start_workers(spark)
"""

IMPORT = _HEAD + """
def task(_):
    import time
    started = time.perf_counter()
    import tensorflow  # noqa: F401
    import keras  # noqa: F401
    from sparkdl.keras.zoo import mnist_cnn
    mnist_cnn(seed=1)
    return [time.perf_counter() - started]
started = time.perf_counter()
if {dataframe}:
    import pyarrow as pa
    job = spark.range(0, 1, numPartitions=1).mapInArrow(
        lambda batches: iter([pa.RecordBatch.from_pylist([{{"s": task(None)[0]}}])]), "s double")
    in_task = job.collect()[0]["s"]
else:
    in_task = spark.sparkContext.parallelize([0], 1).mapPartitions(task).collect()[0]
json.dump({{"run": "import_dataframe" if {dataframe} else "import", "job_s": round(time.perf_counter() - started, 2),
           "in_task_s": round(in_task, 2)}}, open(sys.argv[1], "w"))
spark.stop()
"""

FIT = _HEAD + """
import keras
from sparkdl.keras.zoo import mnist_cnn
from sparkdl import KerasEstimator
train = spark.read.parquet({train!r})
estimator = KerasEstimator(model=mnist_cnn(seed=1), optimizer=keras.optimizers.Adam(0.002), loss="sparse_categorical_crossentropy",
                           metrics=["accuracy"], featuresCol="pixels", labelCol="label", numWorkers={workers}, epochs=1,
                           batchSize=64, localSteps=16, seed=1, verbose=0, backend={backend!r})
started = time.perf_counter()
fitted = estimator.fit(train)
seconds = dict(fitted.fitInfo["seconds"])
if "first_step" not in seconds:  # a sparkdl before fitInfo had it: the first round's excess over a steady round
    rounds = fitted.fitInfo["rounds"]
    steady = seconds["other_rounds"] / (rounds - 1) if rounds > 1 else 0.0
    seconds["first_step"] = round(seconds["checks"] + seconds["prepare_data"] + seconds["first_round"] - steady, 3)
json.dump({{"run": "fit", "fit_s": round(time.perf_counter() - started, 2), "backend": fitted.fitInfo["backend"],
           "seconds": seconds}}, open(sys.argv[1], "w"))
spark.stop()
"""


def run(script: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="sparkdl-cold-") as tmp:
        out = os.path.join(tmp, "out.json")
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        result = subprocess.run([sys.executable, "-c", script, out], env=env, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            raise RuntimeError(result.stderr[-3000:])
        with open(out) as f:
            return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="auto", choices=["auto", "rounds", "ps"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-daemon", action="store_true",
                        help="the fit's session without sparkdl's worker daemon and start_workers (as before 2026-12-04)")
    args = parser.parse_args()
    bench = os.path.join(ROOT, "benchmarks")
    values = {"root": bench, "workers": args.workers, "daemon": False}
    imports, frames, fits = [], [], []
    for _ in range(args.repeats):
        imports.append(run(IMPORT.format(**values, dataframe=False)))
        print(json.dumps(imports[-1]), flush=True)
        frames.append(run(IMPORT.format(**values, dataframe=True)))
        print(json.dumps(frames[-1]), flush=True)
        fits.append(run(FIT.format(**dict(values, daemon=not args.no_daemon), train=os.path.join(ROOT, "data", "mnist10k", "train.parquet"),
                                   backend=args.backend)))
        print(json.dumps(fits[-1]), flush=True)
    median = statistics.median
    phases = {key: round(median(f["seconds"][key] for f in fits), 2) for key in fits[0]["seconds"]}
    import_s, frame_s = median(r["job_s"] for r in imports), median(r["job_s"] for r in frames)
    summary = {"import_and_build_s": import_s, "import_in_task_s": median(r["in_task_s"] for r in imports),
               "import_and_build_dataframe_s": frame_s, "first_step_s": phases["first_step"],
               "ratio": round(phases["first_step"] / import_s, 2), "ratio_dataframe": round(phases["first_step"] / frame_s, 2),
               "fit_phases_s": phases, "backend": fits[0]["backend"], "repeats": args.repeats, "cpus": os.cpu_count(),
               "daemon": not args.no_daemon}
    print(json.dumps(summary), flush=True)
    print("\n| measure (median of %d, fresh session each) | seconds |\n|---|---|" % args.repeats)
    print(f"| one-task RDD job: import TensorFlow + Keras, build the model | {import_s} |")
    print(f"| one-task DataFrame job (mapInArrow): the same | {frame_s} |")
    for key, value in phases.items():
        print(f"| fit ({summary['backend']}): {key} | {value} |")
    print(f"\nratio (first_step / import and build): {summary['ratio']} against the RDD job, "
          f"{summary['ratio_dataframe']} against the DataFrame job")


if __name__ == "__main__":
    main()
