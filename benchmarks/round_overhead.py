"""Fixed cost of one round: a round of one local step minus that step's compute, on each backend.

For each model size (an MLP ``784 → h → 10`` with ``h`` chosen for about 1M, 10M or 100M float32
parameters, Adam, or SGD with ``--optimizer sgd``) and each backend of ``--backends`` (``rounds``: a Spark job per round; ``ps``: the
parameter server, no job per round; ``sharded``: the state in one slice per worker, owned by the workers' long-lived tasks, the
driver coordinating, no job per round; ``sharded_lean``: ``sharded`` with ``keepLocalOptimizer=True`` and ``compression="fp16"``,
each worker putting its fp16 weights alone), sparkdl fits ``--rounds`` rounds of τ = 1 step per epoch on
``local[2]`` with 2 workers, two epochs; the second epoch's seconds per round (replicas built, TensorFlow warm) minus
one training step's compute (the same model and batch trained in this process on one thread, as
each task has one CPU) is the round's fixed cost: scheduling, broadcast, reduction, transfers.

Beside each size it measures, in the same session, the floor under any round: an empty Spark job of
the same plan shape as a round's after the first (the fit's rows, not cast, repartitioned into ``workers`` partitions and
cached, a literal byte column of them, a ``mapInArrow`` that drains it and returns nothing, collected
with ``toArrow``; median of 15, before and after the fit), and prints the round's fixed cost over that
floor (``overhead_per_empty_job``). The plan matters: the same empty job over ``spark.range`` after a
``repartition`` took 0.28 s where this one took 0.18 s (adaptive query execution re-plans the shuffle).

Beside both it measures the round's data path without Keras (``data_job_s``): a broadcast of the
round's start state (float32 weights, and Adam's two moments) and the same empty job whose tasks read
it and each return as many bytes in 16 MiB binary rows, collected with ``toArrow`` (median of 7): what
Spark's broadcast and result path alone cost for the round's bytes; ``overhead_per_data_job`` is the
round's fixed cost over it (the share the library adds: decoding, setting and reading the replica's
state, combining the updates on the driver).

Prints one JSON line per size and backend, e.g. ``{"benchmark": "round_overhead", "backend": "rounds",
"params": 1000000, "round_s": 0.72, "step_s": 0.008, "round_overhead_s": 0.71, "empty_job_s": 0.28,
"overhead_per_empty_job": 2.56, "data_job_s": 0.47, "overhead_per_data_job": 1.5, ...}``, then a
Markdown table.

Memory: 100M float32 parameters with Adam are 1.2 GB of state per copy; a round holds several
copies in each Python worker (broadcast, replica, update), in the JVM and on the driver (its Python
process alone: the model, the master, the broadcast's bytes, both updates, their float64 sum): on a
24 GB machine the kernel killed the driver (7.9 GB) in the first round, at 22.5 GB in use. With
``--optimizer sgd`` (no moments) the state is 0.4 GB, a third.

Usage: python benchmarks/round_overhead.py [--params 1e6 1e7 1e8] [--rounds 10] [--batch-size 32] [--backends rounds,ps,sharded]
       [--optimizer adam|sgd] [--out FILE]
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


def optimizer(name: str):
    """``adam``: Adam(1e-3), state 3 × the weights; ``sgd``: SGD(1e-3), state the weights."""
    import keras

    return keras.optimizers.Adam(1e-3) if name == "adam" else keras.optimizers.SGD(1e-3)


def step_seconds(params: int, batch_size: int, optimizer_name: str = "adam", repeats: int = 20) -> float:
    """Median seconds of one ``train_on_batch`` (after two warm-up steps)."""
    import keras

    model = build_model(params)
    model.compile(optimizer=optimizer(optimizer_name), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
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


def training_rows(spark, rounds: int, batch_size: int, workers: int):
    """``rounds × batch_size × workers`` random rows: ``features array<float>`` (784), ``label double``."""
    rows = rounds * batch_size * workers
    rng = np.random.default_rng(1)
    x = rng.random((rows, INPUTS), dtype=np.float32)
    y = rng.integers(0, CLASSES, rows)
    return spark.createDataFrame([(row.tolist(), float(label)) for row, label in zip(x, y)], "features array<float>, label double")


# backend name of --backends -> the fit's settings (``sharded``, ``ps`` and ``auto`` hold a task slot per worker)
BACKENDS = {
    "rounds": {"backend": "rounds"},
    "ps": {"backend": "ps"},
    "sharded": {"backend": "sharded"},
    "sharded_lean": {"backend": "sharded", "keepLocalOptimizer": True, "compression": "fp16"},
}


def round_seconds(df, params: int, rounds: int, batch_size: int, workers: int, backend: str = "rounds",
                  optimizer_name: str = "adam") -> dict:
    import keras

    from sparkdl import KerasEstimator

    estimator = KerasEstimator(
        model=build_model(params), optimizer=optimizer(optimizer_name),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), numWorkers=workers, epochs=2,
        batchSize=batch_size, localSteps=1, verbose=0, roundTimeout=1800.0, **BACKENDS[backend],
    )
    started = time.perf_counter()
    model = estimator.fit(df)
    fit_s = time.perf_counter() - started
    info = model.fitInfo
    assert info["rounds_per_epoch"] == rounds, info
    if info["backend"] == "sharded":
        combined_on = "slice owners"
    elif info["backend"] == "ps":
        combined_on = "server"
    else:
        combined_on = "executors" if info.get("reduced_on_executors") else "driver"
    return {"fit_s": fit_s, "first_epoch_s": info["epoch_seconds"][0], "round_s": info["epoch_seconds"][1] / rounds,
            "combined_on": combined_on, "driver_bytes_fetched": info.get("driver_bytes_fetched"),
            "load_average": round(__import__("os").getloadavg()[0], 1)}  # the machine's 1-minute load at the fit's end


def _drain(batches):
    for _ in batches:
        pass
    return iter(())


def empty_job_seconds(df, workers: int, repeats: int = 15) -> float:
    """Median seconds of an empty Spark job of a round's plan in this session: ``df`` repartitioned
    into ``workers`` partitions and cached, as a fit caches its rows; a ``mapInArrow`` whose tasks
    drain a literal byte column of it and return nothing, collected with ``toArrow`` (the floor under
    any round: scheduling, a Python worker hand-off per task, the driver's plan)."""
    from pyspark.sql import functions as F

    cached = df.repartition(workers).persist()
    cached.count()
    ids = cached.select(F.lit(0).cast("byte").alias("_"))
    times = []
    for i in range(repeats + 2):
        started = time.perf_counter()
        ids.mapInArrow(_drain, "x int").toArrow()
        if i >= 2:
            times.append(time.perf_counter() - started)
    cached.unpersist()
    return float(np.median(times))


def _echo(batches, broadcast, nbytes: int, piece_bytes: int):
    """A data-floor task: drains its partition, reads the broadcast, returns ``nbytes`` as binary
    rows of at most ``piece_bytes`` (a round's update, without Keras)."""
    import pyarrow as pa

    for _ in batches:
        pass
    value = broadcast.value
    assert len(value) == nbytes
    payload = np.frombuffer(value, np.uint8)
    for offset in range(0, nbytes, piece_bytes):
        yield pa.RecordBatch.from_pydict({"payload": [payload[offset : offset + piece_bytes].tobytes()]},
                                         schema=pa.schema([("payload", pa.binary())]))


def data_job_seconds(df, workers: int, nbytes: int, repeats: int = 7) -> float:
    """Median seconds of a round's data path without Keras, in this session: a broadcast of
    ``nbytes`` created, an empty job's plan (:func:`empty_job_seconds`) whose tasks each read it
    and return ``nbytes`` as binary rows of at most 16 MiB (a round's update pieces), collected
    with ``toArrow``, the broadcast destroyed. What Spark's broadcast and result path alone cost
    for a state of this size."""
    from pyspark.sql import functions as F

    from sparkdl.core.pieces import DEFAULT_PIECE_BYTES

    spark = df.sparkSession
    cached = df.repartition(workers).persist()
    cached.count()
    ids = cached.select(F.lit(0).cast("byte").alias("_"))
    value = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    times = []
    for i in range(repeats + 1):
        started = time.perf_counter()
        broadcast = spark.sparkContext.broadcast(value)
        table = ids.mapInArrow(lambda batches: _echo(batches, broadcast, nbytes, DEFAULT_PIECE_BYTES), "payload binary").toArrow()
        broadcast.destroy()
        if i >= 1:
            times.append(time.perf_counter() - started)
        assert sum(len(v) for v in table.column("payload").to_pylist()) == workers * nbytes
    cached.unpersist()
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, nargs="+", default=[1e6, 1e7, 1e8])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    parser.add_argument("--out", help="also append the JSON lines to this file")
    parser.add_argument("--backends", default="rounds,ps", help="comma-separated: rounds, ps, sharded, sharded_lean (the fit's "
                        "rounds: a job each on rounds, none on ps and sharded)")
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
    unknown = [b for b in args.backends.split(",") if b not in BACKENDS]
    if unknown:
        parser.error(f"--backends: unknown {unknown}; known: {sorted(BACKENDS)}")
    for params in (int(p) for p in args.params):
        df = training_rows(spark, args.rounds, args.batch_size, args.workers)
        floor_before = empty_job_seconds(df, args.workers)
        measured = {b: round_seconds(df, params, args.rounds, args.batch_size, args.workers, b, args.optimizer)
                    for b in args.backends.split(",")}
        floor = (floor_before + empty_job_seconds(df, args.workers)) / 2
        step = step_seconds(params, args.batch_size, args.optimizer)
        h = hidden_units(params)
        exact = (INPUTS + 1) * h + (h + 1) * CLASSES
        state_bytes = (3 if args.optimizer == "adam" else 1) * 4 * exact  # float32 weights (+ Adam's two moments)
        data_floor = data_job_seconds(df, args.workers, state_bytes)
        for backend, m in measured.items():
            result = {
                "benchmark": "round_overhead", "backend": backend, "optimizer": args.optimizer, "params": params,
                "exact_params": exact, "workers": args.workers, "batch_size": args.batch_size,
                "rounds": args.rounds, "round_s": round(m["round_s"], 4), "step_s": round(step, 4),
                "round_overhead_s": round(m["round_s"] - step, 4), "empty_job_s": round(floor, 4),
                "overhead_per_empty_job": round((m["round_s"] - step) / floor, 2),
                "data_job_s": round(data_floor, 4), "overhead_per_data_job": round((m["round_s"] - step) / data_floor, 2),
                "first_epoch_s": round(m["first_epoch_s"], 2), "fit_s": round(m["fit_s"], 2),
                "combined_on": m["combined_on"], "load_average": m["load_average"],
            }
            if BACKENDS[backend]["backend"] == "sharded":
                result.update({k: v for k, v in BACKENDS[backend].items() if k != "backend"})
                result["driver_bytes_fetched"] = m["driver_bytes_fetched"]
            results.append(result)
            print(json.dumps(result), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(result) + "\n")
    spark.stop()
    print("\n| parameters | backend | round s | step s | round overhead s | empty job s | overhead / empty job | data job s | "
          "overhead / data job | first epoch s | combined on |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['params']:,} | {r['backend']} | {r['round_s']} | {r['step_s']} | {r['round_overhead_s']} | {r['empty_job_s']} | "
              f"{r['overhead_per_empty_job']} | {r['data_job_s']} | {r['overhead_per_data_job']} | {r['first_epoch_s']} | "
              f"{r['combined_on']} |")


if __name__ == "__main__":
    main()
