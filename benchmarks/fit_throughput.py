"""Training throughput: plain ``keras.Model.fit`` in one process vs sparkdl ``sync`` on ``local[2]``.

Same model (``sparkdl.keras.zoo:mnist_cnn``, or ``mnist_mlp`` with ``--model mlp``), same data (bundled mnist10k, 8,000 training rows),
same epochs, batch size and optimizer, measured side by side in one run on the same cores.
Prints one JSON line per run (``samples_per_s`` = epochs × rows / fit seconds), a JSON line
with ``ratio`` = sparkdl / Keras samples/s and both test accuracies, then a Markdown table.

The cold first fit: per backend, a fresh Python process starts its session as the deployment page
recommends (``sparkdl.spark.daemon.session_conf()``: sparkdl's worker daemon, which imports
TensorFlow and Keras once per executor; ``start_workers`` right after the session starts;
``--no-daemon``: a plain session), then imports Keras, builds the model and fits (``--epochs``), timed from ``fit()`` to its return: what a
spark-submit job's one fit costs. ``cold_ratio`` = that time / the median Keras fit (goal: at most
1.25 on ``auto``). Then, in this process's session, sparkdl runs once untimed (1 epoch) so that
the executors' Python workers are started, as in any session after its first fit, and each side
runs ``--repeats`` times, alternating; JSON lines carry every run, the summary the medians (single
fits on a shared 2-core machine vary by up to 25 %).

Each backend of ``--backends`` (default ``rounds,ps``) runs in every repeat; the summary gives per
backend ``time_ratio`` = median sparkdl fit seconds / median Keras fit seconds (goal: at most 1.0)
and the medians of ``fitInfo["seconds"]``, where its time went (checks, data preparation, first
step, first round, other rounds, train, total).

The main job's settings (conf/mnist_cnn.yaml): ``--epochs 8 --local-steps 16`` (batch 64, 2 workers).

``--sessions``: a session's first and second fit instead, per kind of session, each in a fresh
process that fits twice (``--backends``' first, default ``auto``), ``--pause`` seconds apart (default
70: Spark ends a Python worker idle for 60 s, as a notebook's pause between two fits would):

- ``plain``: ``SparkSession.builder.master("local[W]").getOrCreate()`` and nothing else, as in a
  notebook (the fit switches a local master's later workers to sparkdl's daemon);
- ``pyspark-daemon``: the same with ``spark.python.daemon.module=pyspark.daemon`` set by hand, which
  keeps pyspark's daemon (every plain session before the switch: each worker imports TensorFlow);
- ``session_conf``: started with ``session_conf()`` and ``start_workers`` (docs/user-guide/deployment.md).

Each fit's seconds in all and to its first step (``fitInfo["seconds"]["first_step"]``), and its
ratio to the median of the plain Keras fits run in this process: ``--repeats`` before the sessions
and one after each kind (a shared machine's speed drifts over the run's quarter of an hour).

Usage: python benchmarks/fit_throughput.py [--epochs 5] [--workers 2] [--local-steps N] [--repeats 3] [--model cnn|mlp]
       [--backends rounds,ps] [--no-daemon] [--sessions [--pause 70]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
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


SESSIONS = ("plain", "pyspark-daemon", "session_conf")


def start_spark(workers, daemon=True, conf=None):
    from pyspark.sql import SparkSession

    from sparkdl.spark.daemon import session_conf, start_workers

    builder = (SparkSession.builder.master(f"local[{workers}]").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in dict(session_conf() if daemon else {}, **(conf or {})).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if daemon:  # the executors' workers start while this process builds the model (docs/user-guide/deployment.md)
        start_workers(spark)
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
    if warm_up is None:  # one fit, as it comes: what it cost and where the time went
        started = time.perf_counter()
        fitted = estimator(epochs).fit(train)
        return {"backend": fitted.fitInfo["backend"], "fit_s": round(time.perf_counter() - started, 2),
                "seconds": fitted.fitInfo["seconds"]}
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
    parser.add_argument("--no-daemon", action="store_true",
                        help="sessions without sparkdl's worker daemon (spark.python.daemon.module): each Python worker imports TensorFlow")
    parser.add_argument("--sessions", action="store_true", help="a session's first and second fit, per kind of session")
    parser.add_argument("--pause", type=float, default=70.0, help="--sessions: seconds between the two fits")
    parser.add_argument("--cold-run", default=None, help=argparse.SUPPRESS)  # one cold fit in this fresh process
    parser.add_argument("--session-run", default=None, help=argparse.SUPPRESS)  # two fits in this fresh process
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.session_run:
        session_fits(args, args.session_run, backends[0])
        return
    if args.sessions:
        compare_sessions(args, backends[0] if "--backends" in sys.argv else "auto")
        return
    if args.cold_run:
        started = time.perf_counter()
        spark = start_spark(args.workers, daemon=not args.no_daemon)
        session_s = round(time.perf_counter() - started, 2)
        run = run_sparkdl(spark, args.epochs, args.batch_size, args.workers, args.local_steps, warm_up=False,
                          model_name=args.model, backend=args.cold_run)
        spark.stop()
        print(json.dumps(dict(run, run=f"{run['run']} cold", session_s=session_s)), flush=True)
        return
    keras_runs, spark_runs = [], {b: [] for b in backends}
    keras_runs.append(run_keras(args.epochs, args.batch_size, args.model))
    print(json.dumps(keras_runs[-1]), flush=True)
    cold_runs = {}
    for backend in backends:  # each in a fresh process, the first fit of its session: what a spark-submit job times
        cold_runs[backend] = cold_fit(args, backend)
        print(json.dumps(cold_runs[backend]), flush=True)
    spark = start_spark(args.workers, daemon=not args.no_daemon)
    for i in range(args.repeats):  # alternating: keras, then each backend, per repeat
        if i > 0:
            keras_runs.append(run_keras(args.epochs, args.batch_size, args.model))
            print(json.dumps(keras_runs[-1]), flush=True)
        for j, backend in enumerate(backends):
            spark_runs[backend].append(run_sparkdl(spark, args.epochs, args.batch_size, args.workers, args.local_steps,
                                                   warm_up=i == 0 and j == 0, model_name=args.model, backend=backend))
            print(json.dumps(spark_runs[backend][-1]), flush=True)
    spark.stop()
    median = statistics.median
    keras_s = round(median(r["fit_s"] for r in keras_runs), 2)
    summary = {"keras_fit_s": keras_s, "keras_test_accuracy": keras_runs[-1]["test_accuracy"], "cpus": os.cpu_count(),
               "repeats": args.repeats, "model": args.model, "local_steps": args.local_steps, "epochs": args.epochs,
               "workers": args.workers, "daemon": not args.no_daemon, "backends": {}}
    for backend, runs in spark_runs.items():
        fit_s = median(r["fit_s"] for r in runs)
        summary["backends"][backend] = {
            "ran_on": runs[0]["backend"], "fit_s": fit_s, "time_ratio": round(fit_s / keras_s, 3),
            "ratios_per_repeat": [round(s["fit_s"] / k["fit_s"], 3) for k, s in zip(keras_runs, runs)],
            "cold_fit_s": cold_runs[backend]["fit_s"], "cold_ratio": round(cold_runs[backend]["fit_s"] / keras_s, 3),
            "cold_seconds": cold_runs[backend]["seconds"],
            "test_accuracy": runs[-1]["test_accuracy"], "rounds": runs[-1]["rounds"],
            "seconds": {key: round(median(r["seconds"][key] for r in runs), 2) for key in runs[0]["seconds"]},
        }
    print(json.dumps(summary), flush=True)
    print("\n| run | cold first fit s | cold / keras | warm fit s (median) | warm / keras | test accuracy | checks | prepare_data | first_step | first_round | other_rounds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| keras | | | {keras_s} | 1.0 | {keras_runs[-1]['test_accuracy']:.4f} | | | | | |")
    for backend, b in summary["backends"].items():
        s, c = b["seconds"], b["cold_seconds"]
        print(f"| sparkdl {backend} ({b['ran_on']}) | {b['cold_fit_s']} | {b['cold_ratio']} | {b['fit_s']} | {b['time_ratio']} "
              f"| {b['test_accuracy']:.4f} | {c['checks']} / {s['checks']} | {c['prepare_data']} / {s['prepare_data']} "
              f"| {c['first_step']} / {s['first_step']} | {c['first_round']} / {s['first_round']} | {c['other_rounds']} / {s['other_rounds']} |")
    print("\n(phase columns: cold / warm median, seconds)")


def cold_fit(args, backend):
    """One fit of ``args.epochs`` in a fresh Python process and session (its first): the JSON line it prints."""
    command = [sys.executable, os.path.abspath(__file__), "--cold-run", backend, "--epochs", str(args.epochs),
               "--batch-size", str(args.batch_size), "--workers", str(args.workers), "--model", args.model]
    if args.local_steps:
        command += ["--local-steps", str(args.local_steps)]
    if args.no_daemon:
        command.append("--no-daemon")
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])

def session_fits(args, kind, backend):
    """Two fits ``args.pause`` seconds apart in this fresh process' session of ``kind``: one JSON line each."""
    started = time.perf_counter()
    if kind == "plain":  # a notebook's session: nothing of sparkdl's before the first fit
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.master(f"local[{args.workers}]").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
    else:
        conf = {"spark.python.daemon.module": "pyspark.daemon"} if kind == "pyspark-daemon" else None
        spark = start_spark(args.workers, daemon=kind == "session_conf", conf=conf)
    session_s = round(time.perf_counter() - started, 2)
    for fit in (1, 2):
        if fit == 2:
            time.sleep(args.pause)
        run = run_sparkdl(spark, args.epochs, args.batch_size, args.workers, args.local_steps, warm_up=None,
                          model_name=args.model, backend=backend)
        print(json.dumps(dict(run, run="session", session=kind, fit=fit, session_s=session_s, pause_s=args.pause)), flush=True)
    spark.stop()


def compare_sessions(args, backend):
    """``--sessions``: each kind of session's first and second fit, beside plain Keras' median fit
    (``--repeats`` fits first, one after each kind)."""
    keras_runs = []

    def keras_fit():
        keras_runs.append(run_keras(args.epochs, args.batch_size, args.model))
        print(json.dumps(keras_runs[-1]), flush=True)

    for _ in range(args.repeats):
        keras_fit()
    fits = []
    for kind in SESSIONS:
        command = [sys.executable, os.path.abspath(__file__), "--session-run", kind, "--backends", backend,
                   "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--workers", str(args.workers),
                   "--model", args.model, "--pause", str(args.pause)]
        if args.local_steps:
            command += ["--local-steps", str(args.local_steps)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        if result.returncode != 0:
            raise RuntimeError(result.stderr[-3000:])
        fits += [json.loads(line) for line in result.stdout.strip().splitlines() if line.startswith("{")]
        keras_fit()  # one more after each kind: the median is the machine's speed over the whole run
    keras_s = statistics.median(r["fit_s"] for r in keras_runs)
    for fit in fits:
        fit["ratio"] = round(fit["fit_s"] / keras_s, 3)
        print(json.dumps(fit), flush=True)
    print(json.dumps({"summary": "sessions", "keras_fit_s": round(keras_s, 2), "cpus": os.cpu_count(),
                      "load_1min": round(os.getloadavg()[0], 2), "epochs": args.epochs, "local_steps": args.local_steps,
                      "pause_s": args.pause, "fits": [{k: f[k] for k in ("session", "fit", "fit_s", "ratio", "backend")}
                                                      | {"first_step_s": f["seconds"]["first_step"]} for f in fits]}), flush=True)
    print(f"\n| session | fit | backend | seconds to the first step | fit s | fit / plain Keras ({keras_s:.1f} s) |")
    print("|---|---|---|---|---|---|")
    for f in fits:
        print(f"| {f['session']} | {f['fit']} | {f['backend']} | {f['seconds']['first_step']} | {f['fit_s']} | {f['ratio']} |")


if __name__ == "__main__":
    main()
