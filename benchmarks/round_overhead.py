"""Fixed cost of one ``rounds`` round: a round of one local step minus that step's compute.

For each model size (an MLP ``784 → h → 10`` with ``h`` chosen for about 1M, 10M or 100M float32
parameters, Adam), sparkdl fits ``--rounds`` rounds of τ = 1 step per epoch on ``local[2]`` with
2 workers, two epochs; the second epoch's seconds per round (replicas built, TensorFlow warm) minus
one training step's compute (the same model and batch trained in this process on one thread, as
each task has one CPU) is the round's fixed cost: scheduling, broadcast, reduction, transfers.

Beside each size it measures, in the same session, the floor under any round: an empty Spark job
(a ``mapInArrow`` that drains a one-byte column of ``workers`` cached partitions and returns
nothing, collected with ``toArrow``; median of 15, before and after the fit), and prints the
round's fixed cost over that floor (``overhead_per_empty_job``).

Prints one JSON line per size, e.g. ``{"benchmark": "round_overhead", "params": 1000000,
"round_s": 0.21, "step_s": 0.02, "round_overhead_s": 0.19, "empty_job_s": 0.12,
"overhead_per_empty_job": 1.58}``, then a Markdown table.

Memory: 100M float32 parameters with Adam are 1.2 GB of state per copy; a round holds several
copies in each Python worker (broadcast, replica, update), in the JVM and on the driver: about
20 GB in all on ``local[2]``.

Usage: python benchmarks/round_overhead.py [--params 1e6 1e7 1e8] [--rounds 10] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import json
import time

import setup_env  # noqa: E402, F401  (sys.path and the environment, before pyspark/keras)

import numpy as np  # noqa: E402

INPUTS, CLASSES = 784, 10


def hidden_units(params: int) -> int:
    """Width h of ``784 → h → 10`` with about ``params`` parameters: (784 + 1)·h + (h + 1)·10."""
    return max(1, round((params - CLASSES) / (INPUTS + 1 + CLASSES)))


def build_model(params: int):
    import keras

    keras.utils.set_random_seed(0)
    h = hidden_units(params)
    return keras.Sequential([keras.Input((INPUTS,)), keras.layers.Dense(h, activation="relu"), keras.layers.Dense(CLASSES)])


def step_seconds(params: int, batch_size: int, repeats: int = 20) -> float:
    """Median seconds of one ``train_on_batch`` (after two warm-up steps)."""
    import keras

    model = build_model(params)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.random((batch_size, INPUTS), dtype=np.float32)
    y = rng.integers(0, CLASSES, batch_size)
    for _ in range(2):
        model.train_on_batch(x, y)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def round_seconds(spark, params: int, rounds: int, batch_size: int, workers: int) -> dict:
    import keras

    from sparkdl import KerasEstimator

    rows = rounds * batch_size * workers
    rng = np.random.default_rng(1)
    x = rng.random((rows, INPUTS), dtype=np.float32)
    y = rng.integers(0, CLASSES, rows)
    df = spark.createDataFrame([(row.tolist(), float(label)) for row, label in zip(x, y)], "features array<float>, label double")
    estimator = KerasEstimator(
        model=build_model(params), optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), numWorkers=workers, epochs=2,
        batchSize=batch_size, localSteps=1, verbose=0, roundTimeout=1800.0,
    )
    started = time.perf_counter()
    model = estimator.fit(df)
    fit_s = time.perf_counter() - started
    info = model.fitInfo
    assert info["rounds_per_epoch"] == rounds, info
    return {"fit_s": fit_s, "first_epoch_s": info["epoch_seconds"][0], "round_s": info["epoch_seconds"][1] / rounds,
            "combined_on": "executors" if info.get("reduced_on_executors") else "driver"}


def _drain(batches):
    for _ in batches:
        pass
    return iter(())


def empty_job_seconds(spark, workers: int, repeats: int = 15) -> float:
    """Median seconds of an empty Spark job over ``workers`` cached partitions in this session: a
    ``mapInArrow`` whose tasks drain a one-byte column and return nothing, collected with ``toArrow``
    (the floor under any round: scheduling, a Python worker hand-off per task, the driver's plan)."""
    from pyspark.sql import functions as F

    ids = spark.range(workers * 4).repartition(workers).select(F.lit(0).cast("byte").alias("_")).persist()
    ids.count()
    times = []
    for i in range(repeats + 2):
        started = time.perf_counter()
        ids.mapInArrow(_drain, "x int").toArrow()
        if i >= 2:
            times.append(time.perf_counter() - started)
    ids.unpersist()
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, nargs="+", default=[1e6, 1e7, 1e8])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(f"local[{args.workers}]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "8g")
             .config("spark.driver.maxResultSize", "4g")  # 100M parameters with Adam: 1.2 GB a worker's update
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    for params in (int(p) for p in args.params):
        floor_before = empty_job_seconds(spark, args.workers)
        measured = round_seconds(spark, params, args.rounds, args.batch_size, args.workers)
        floor = (floor_before + empty_job_seconds(spark, args.workers)) / 2
        step = step_seconds(params, args.batch_size)
        h = hidden_units(params)
        result = {
            "benchmark": "round_overhead", "params": params, "exact_params": (INPUTS + 1) * h + (h + 1) * CLASSES,
            "workers": args.workers, "batch_size": args.batch_size, "rounds": args.rounds,
            "round_s": round(measured["round_s"], 4), "step_s": round(step, 4),
            "round_overhead_s": round(measured["round_s"] - step, 4), "empty_job_s": round(floor, 4),
            "overhead_per_empty_job": round((measured["round_s"] - step) / floor, 2),
            "first_epoch_s": round(measured["first_epoch_s"], 2), "fit_s": round(measured["fit_s"], 2),
            "combined_on": measured["combined_on"],
        }
        results.append(result)
        print(json.dumps(result), flush=True)
    spark.stop()
    print("\n| parameters | round s | step s | round overhead s | empty job s | overhead / empty job | first epoch s | combined on |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['params']:,} | {r['round_s']} | {r['step_s']} | {r['round_overhead_s']} | {r['empty_job_s']} | "
              f"{r['overhead_per_empty_job']} | {r['first_epoch_s']} | {r['combined_on']} |")


if __name__ == "__main__":
    main()
