"""Training throughput: plain ``keras.Model.fit`` in one process vs sparkdl ``sync`` on ``local[2]``.

Same model (``sparkdl.keras.zoo:mnist_cnn``, or ``mnist_mlp`` with ``--model mlp``), same data (bundled mnist10k, 8,000 training rows),
same epochs, batch size and optimizer, measured side by side in one run on the same cores.
Prints one JSON line per run (``samples_per_s`` = epochs × rows / fit seconds), a JSON line
with ``ratio`` = sparkdl / Keras samples/s and both test accuracies, then a Markdown table.

sparkdl runs once untimed first (1 epoch) so that executor Python workers have imported
TensorFlow, as they have in any session after its first fit; the cold first fit is reported too.
Each side runs ``--repeats`` times, alternating; JSON lines carry every run, the summary the
medians (single fits on a shared 2-core machine vary by up to 25 %).

``fitInfo["seconds"]`` of each sparkdl fit shows where its time went (checks, data preparation,
first round, other rounds).

Usage: python benchmarks/fit_throughput.py [--epochs 5] [--workers 2] [--local-steps N] [--repeats 3] [--model cnn|mlp]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from setup_env import ROOT  # noqa: E402  (sys.path and the environment, before pyspark/keras)

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

TRAIN = os.path.join(ROOT, "data", "mnist10k", "train.parquet")
TEST = os.path.join(ROOT, "data", "mnist10k", "test.parquet")


def load(path):
    table = pq.read_table(path)
    x = np.stack(table.column("pixels").to_numpy(zero_copy_only=False)).astype(np.float32)
    return x, table.column("label").to_numpy().astype(np.int64)


def model_factory(name):
    from sparkdl.keras import zoo as models

    return {"cnn": models.mnist_cnn, "mlp": models.mnist_mlp}[name]


def run_keras(epochs, batch_size, model_name="cnn"):
    import keras

    (x, y), (xt, yt) = load(TRAIN), load(TEST)
    model = model_factory(model_name)()
    model.compile(optimizer=keras.optimizers.Adam(0.002), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    started = time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=True, verbose=0)
    seconds = time.perf_counter() - started
    accuracy = float((model.predict(xt, batch_size=512, verbose=0).argmax(axis=1) == yt).mean())
    return {"run": "keras", "processes": 1, "epochs": epochs, "rows": len(x), "fit_s": round(seconds, 2),
            "samples_per_s": round(epochs * len(x) / seconds, 1), "test_accuracy": accuracy}


def start_spark(workers):
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(f"local[{workers}]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_sparkdl(spark, epochs, batch_size, workers, local_steps, warm_up, model_name="cnn"):
    from pyspark.sql import functions as F

    import keras
    from sparkdl import KerasEstimator

    build = model_factory(model_name)

    train, test = spark.read.parquet(TRAIN), spark.read.parquet(TEST)

    def estimator(n_epochs):
        return KerasEstimator(model=build(), optimizer=keras.optimizers.Adam(0.002), loss="sparse_categorical_crossentropy",
                              metrics=["accuracy"], featuresCol="pixels", labelCol="label", numWorkers=workers,
                              epochs=n_epochs, batchSize=batch_size, localSteps=local_steps, verbose=0)

    cold_s = None
    if warm_up:
        started = time.perf_counter()
        estimator(1).fit(train)
        cold_s = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    model = estimator(epochs).fit(train)
    seconds = time.perf_counter() - started
    accuracy = model.transform(test).select(F.avg((F.col("prediction") == F.col("label")).cast("double"))).first()[0]
    rows = sum(model.fitInfo["partition_rows"])
    return {"run": "sparkdl", "workers": workers, "master": f"local[{workers}]", "epochs": epochs, "rows": rows,
            "rounds": model.fitInfo["rounds"], "local_steps": model.fitInfo["local_steps"], "fit_s": round(seconds, 2),
            "samples_per_s": round(epochs * rows / seconds, 1), "test_accuracy": accuracy,
            "cold_first_fit_1_epoch_s": cold_s, "seconds": model.fitInfo.get("seconds")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=None, help="τ; default one round per epoch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn", help="sparkdl.keras.zoo: mnist_cnn or mnist_mlp")
    args = parser.parse_args()
    spark = start_spark(args.workers)
    keras_runs, spark_runs = [], []
    for i in range(args.repeats):
        keras_runs.append(run_keras(args.epochs, args.batch_size, args.model))
        print(json.dumps(keras_runs[-1]), flush=True)
        spark_runs.append(run_sparkdl(spark, args.epochs, args.batch_size, args.workers, args.local_steps, warm_up=i == 0,
                                      model_name=args.model))
        print(json.dumps(spark_runs[-1]), flush=True)
    spark.stop()
    keras_sps = statistics.median(r["samples_per_s"] for r in keras_runs)
    spark_sps = statistics.median(r["samples_per_s"] for r in spark_runs)
    summary = {"ratio": round(spark_sps / keras_sps, 3), "keras_samples_per_s": keras_sps, "sparkdl_samples_per_s": spark_sps,
               "ratios_per_repeat": [round(s["samples_per_s"] / k["samples_per_s"], 3) for k, s in zip(keras_runs, spark_runs)],
               "keras_test_accuracy": keras_runs[-1]["test_accuracy"], "sparkdl_test_accuracy": spark_runs[-1]["test_accuracy"],
               "cpus": os.cpu_count(), "repeats": args.repeats, "model": args.model,
               "local_steps": args.local_steps, "epochs": args.epochs}
    print(json.dumps(summary), flush=True)
    print("\n| run | fit s (median) | samples/s (median) | test accuracy |\n|---|---|---|---|")
    for name, runs, sps in (("keras", keras_runs, keras_sps), ("sparkdl", spark_runs, spark_sps)):
        print(f"| {name} | {statistics.median(r['fit_s'] for r in runs)} | {sps} | {runs[-1]['test_accuracy']:.4f} |")
    print(f"\nratio (sparkdl / keras samples/s, medians): {summary['ratio']}")


if __name__ == "__main__":
    main()
