"""Fixed cost of validation per epoch (issue 31 item 6): the same small fit with and without
``validationData``, side by side in one session, on each backend.

Small data is where it shows: an MLP ``784 → 64 → 10`` on ``--rows`` rows of the bundled MNIST digits
(``--val-rows`` more for validation), 2 workers on ``local[2]``, one round per epoch (``localSteps``
large), ``--epochs`` epochs. An epoch's time is the gap between two ``on_epoch_end`` calls on the
driver (the round, then validation, then the callbacks); the median over the epochs after the first
(replicas built, TensorFlow warm) is taken with and without validation, alternating the two fits
``--repeats`` times. ``validation_cost_s`` is the difference: the fixed cost validation adds to an
epoch (its Spark job, and on ``ps`` the end of the workers' stage at the epoch's end and the start of
the next one). The goal of issue 31 item 6 is at most 0.3 s.

Prints one JSON line per backend, e.g. ``{"benchmark": "validation_cost", "backend": "ps", "epoch_s": 0.21,
"epoch_with_validation_s": 1.35, "validation_cost_s": 1.14, ...}``, then a Markdown table.

Usage: python benchmarks/validation_cost.py [--backends rounds,ps] [--rows 512] [--val-rows 128] [--epochs 6] [--repeats 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import setup_env  # noqa: E402, F401  (sys.path and the environment, before pyspark/keras)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "data", "mnist10k", "train.parquet")


def epoch_gaps(spark, backend: str, train, validation, epochs: int) -> list[float]:
    """Seconds between the driver's ``on_epoch_end`` calls of one fit (``validation`` None: none)."""
    import keras

    from sparkdl import KerasEstimator

    ends: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            ends.append(time.perf_counter())

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Rescaling(1 / 255), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    est = KerasEstimator(model=model, optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                         featuresCol="pixels", labelCol="label", numWorkers=2, epochs=epochs, batchSize=32, localSteps=10_000,
                         backend=backend, verbose=0, callbacks=[Clock()])
    est.fit(train, validationData=validation)
    return [b - a for a, b in zip(ends, ends[1:], strict=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="rounds,ps")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--val-rows", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    rows = spark.read.parquet(TRAIN).limit(args.rows + args.val_rows).toPandas()
    train = spark.createDataFrame(rows.iloc[:args.rows]).repartition(2).cache()
    validation = spark.createDataFrame(rows.iloc[args.rows:]).repartition(2).cache()
    train.count(), validation.count()
    results = []
    for backend in args.backends.split(","):
        without, with_validation = [], []
        for _ in range(args.repeats):
            without += epoch_gaps(spark, backend, train, None, args.epochs)
            with_validation += epoch_gaps(spark, backend, train, validation, args.epochs)
        plain, validated = statistics.median(without), statistics.median(with_validation)
        result = {"benchmark": "validation_cost", "backend": backend, "rows": args.rows, "val_rows": args.val_rows,
                  "epochs": args.epochs, "repeats": args.repeats, "epoch_s": round(plain, 3),
                  "epoch_with_validation_s": round(validated, 3), "validation_cost_s": round(validated - plain, 3),
                  "goal_s": 0.3, "date": time.strftime("%Y-%m-%d")}
        print(json.dumps(result), flush=True)
        results.append(result)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(result) + "\n")
    print("\n| backend | epoch (s) | epoch with validation (s) | validation's fixed cost (s) | goal (s) |\n|---|---|---|---|---|")
    for r in results:
        print(f"| {r['backend']} | {r['epoch_s']:.3f} | {r['epoch_with_validation_s']:.3f} | {r['validation_cost_s']:.3f} | {r['goal_s']} |")
    spark.stop()


if __name__ == "__main__":
    main()
