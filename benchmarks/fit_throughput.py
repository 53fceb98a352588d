"""Training throughput: plain ``keras.Model.fit`` in one process vs sparkdl ``sync`` on ``local[2]``.

Same model (``sparkdl.keras.zoo:mnist_cnn``, or ``mnist_mlp`` with ``--model mlp``), same data (bundled mnist10k, 8,000 training rows),
same epochs, batch size and optimizer, measured side by side in one run on the same cores.
Prints one JSON line per run (``samples_per_s`` = epochs × rows / fit seconds), a JSON line
with ``ratio`` = sparkdl / Keras samples/s and both test accuracies, then a Markdown table.

sparkdl runs once untimed first (1 epoch) so that executor Python workers have imported
TensorFlow, as they have in any session after its first fit; the cold first fit is reported too.
Each side runs ``--repeats`` times, alternating; JSON lines carry every run, the summary the
medians (single fits on a shared 2-core machine vary by up to 25 %).

Each backend of ``--backends`` (default ``rounds,ps``) runs in every repeat; the summary gives per
backend ``time_ratio`` = median sparkdl fit seconds / median Keras fit seconds (goal: at most 1.0)
and the medians of ``fitInfo["seconds"]``, where its time went (checks, data preparation, first
step, first round, other rounds, train, total).

The main job's settings (conf/mnist_cnn.yaml): ``--epochs 8 --local-steps 16`` (batch 64, 2 workers).

Usage: python benchmarks/fit_throughput.py [--epochs 5] [--workers 2] [--local-steps N] [--repeats 3] [--model cnn|mlp]
       [--backends rounds,ps]
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


def run_sparkdl(spark, epochs, batch_size, workers, local_steps, warm_up, model_name="cnn", backend="auto"):
    from pyspark.sql import functions as F

    import keras
    from sparkdl import KerasEstimator

    build = model_factory(model_name)

    train, test = spark.read.parquet(TRAIN), spark.read.parquet(TEST)

    def estimator(n_epochs):
        return KerasEstimator(model=build(), optimizer=keras.optimizers.Adam(0.002), loss="sparse_categorical_crossentropy",
                              metrics=["accuracy"], featuresCol="pixels", labelCol="label", numWorkers=workers,
                              epochs=n_epochs, batchSize=batch_size, localSteps=local_steps, verbose=0, backend=backend)

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
    return {"run": f"sparkdl {model.fitInfo['backend']}", "backend": model.fitInfo["backend"], "workers": workers, "master": f"local[{workers}]", "epochs": epochs, "rows": rows,
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
    parser.add_argument("--backends", default="rounds,ps", help="comma-separated: rounds, ps, auto")
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    spark = start_spark(args.workers)
    keras_runs, spark_runs = [], {b: [] for b in backends}
    for i in range(args.repeats):  # alternating: keras, then each backend, per repeat
        keras_runs.append(run_keras(args.epochs, args.batch_size, args.model))
        print(json.dumps(keras_runs[-1]), flush=True)
        for j, backend in enumerate(backends):
            spark_runs[backend].append(run_sparkdl(spark, args.epochs, args.batch_size, args.workers, args.local_steps,
                                                   warm_up=i == 0 and j == 0, model_name=args.model, backend=backend))
            print(json.dumps(spark_runs[backend][-1]), flush=True)
    spark.stop()
    median = statistics.median
    keras_s = median(r["fit_s"] for r in keras_runs)
    summary = {"keras_fit_s": keras_s, "keras_test_accuracy": keras_runs[-1]["test_accuracy"], "cpus": os.cpu_count(),
               "repeats": args.repeats, "model": args.model, "local_steps": args.local_steps, "epochs": args.epochs,
               "workers": args.workers, "backends": {}}
    for backend, runs in spark_runs.items():
        fit_s = median(r["fit_s"] for r in runs)
        summary["backends"][backend] = {
            "ran_on": runs[0]["backend"], "fit_s": fit_s, "time_ratio": round(fit_s / keras_s, 3),
            "ratios_per_repeat": [round(s["fit_s"] / k["fit_s"], 3) for k, s in zip(keras_runs, runs)],
            "test_accuracy": runs[-1]["test_accuracy"], "rounds": runs[-1]["rounds"],
            "seconds": {key: round(median(r["seconds"][key] for r in runs), 2) for key in runs[0]["seconds"]},
        }
    print(json.dumps(summary), flush=True)
    print("\n| run | fit s (median) | time / keras | test accuracy | checks | prepare_data | first_step | first_round | other_rounds |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| keras | {keras_s} | 1.0 | {keras_runs[-1]['test_accuracy']:.4f} | | | | | |")
    for backend, b in summary["backends"].items():
        s = b["seconds"]
        print(f"| sparkdl {backend} ({b['ran_on']}) | {b['fit_s']} | {b['time_ratio']} | {b['test_accuracy']:.4f} | {s['checks']} "
              f"| {s['prepare_data']} | {s['first_step']} | {s['first_round']} | {s['other_rounds']} |")

if __name__ == "__main__":
    main()
