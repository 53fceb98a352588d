"""Every training mode side by side on real data: test accuracy against wall-clock seconds and bytes sent.

The CNN and settings of ``conf/mnist_cnn.yaml`` (8,000 mnist10k rows, Adam, batch 64) with 2
workers on ``local[2]``, the same epochs for every mode, one after the other in one Spark session
(after one untimed epoch, so that no mode pays the Python workers' TensorFlow import):
``sync``, ``sync`` with each compression (``fp16``, ``1bit``, ``threshold`` with t = 0.01),
``bmuf``, ``easgd`` and ``gossip`` (``conf/mnist_cnn_{bmuf,easgd,gossip}.yaml``) and the
asynchronous modes of backend ``ps`` (``conf/mnist_cnn_{async,hogwild,staleness_aware,ssp}.yaml``),
and the runs of backend ``sharded`` (the state in one slice per worker, owned by the workers' tasks):
``sharded`` (``sync``, ``conf/mnist_cnn_sharded.yaml``), ``sharded_lean`` (the same with
``keepLocalOptimizer=True`` and ``compression="fp16"``: each worker puts its fp16 weights alone) and
``diloco`` (``conf/mnist_cnn_diloco.yaml``: τ = 32 inner Adam steps, an outer Nesterov step η = 0.7,
μ = 0.9 on the averaged delta, the workers keeping their optimizers), as Jin, Yuan, Iandola and
Keutzer ("How to scale distributed deep learning?", 2016) compare theirs. And, on ``sharded``,
``sharded``, ``bmuf_sharded`` and ``diloco`` each with ``_overlap`` (rounds that never block),
``_int8``, ``_int4`` and ``_overlap_int8`` / ``_overlap_int4`` (not in the default ``--modes``).

The 2,000 test rows are the fit's ``validationData``, so each epoch's test accuracy comes from
the history (``val_accuracy``, exact over all test rows) and is plotted against the fit's
cumulative seconds (``epoch_seconds``) and the update bytes the workers sent (backend ``rounds``:
``fitInfo["update_bytes_per_epoch"]``; backend ``ps``: ``bytes_pushed`` per epoch). On ``rounds`` an
epoch's seconds include its validation job (about 0.5 s); on ``ps`` the epochs are validated after
the barrier stage, outside the epoch seconds (``fit_s`` includes both). Backend ``sharded`` takes no
validation data (its workers' tasks hold the state for the whole fit): a driver callback evaluates
the master on the same 2,000 test rows at each epoch's end (the slices' weights read into the
driver's model, the accuracy computed in this process) and adds ``val_accuracy`` to the epoch's
logs, outside the epoch seconds (``fit_s`` includes it; ``eval_s`` says how much); its bytes are
the contributions the workers put to the slice owners (``fitInfo["worker_bytes_pushed"]``, also
``bytes_pulled``: what they read back, the all-gather).

Prints one JSON line per mode, e.g. ``{"mode": "bmuf", "compression": null, "test_accuracy": 0.981,
"fit_s": 40.2, "update_bytes": 123456}``, then a Markdown table, and writes a PNG
(``--plot``, default ``benchmarks/compare_modes.png``) when matplotlib is installed
(``pip install matplotlib``; it is not a dependency of sparkdl).

Usage: python benchmarks/compare_modes.py [--epochs 8] [--modes sync,sync_fp16,sync_1bit,...,sharded,diloco] [--plot PATH] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from setup_env import ROOT  # noqa: E402  (sys.path and the environment, before pyspark/keras)

RUNS = {  # name -> (config file, extra fit settings)
    "sync": ("conf/mnist_cnn.yaml", {}),
    "sync_fp16": ("conf/mnist_cnn.yaml", {"compression": "fp16"}),
    "sync_1bit": ("conf/mnist_cnn.yaml", {"compression": "1bit"}),
    "sync_threshold": ("conf/mnist_cnn.yaml", {"compression": "threshold", "compressionThreshold": 0.01}),
    "bmuf": ("conf/mnist_cnn_bmuf.yaml", {}),
    "easgd": ("conf/mnist_cnn_easgd.yaml", {}),
    "gossip": ("conf/mnist_cnn_gossip.yaml", {}),
    "async": ("conf/mnist_cnn_async.yaml", {}),
    "hogwild": ("conf/mnist_cnn_hogwild.yaml", {}),
    "staleness_aware": ("conf/mnist_cnn_staleness_aware.yaml", {}),
    "ssp": ("conf/mnist_cnn_ssp.yaml", {}),
    "sharded": ("conf/mnist_cnn_sharded.yaml", {}),
    "sharded_lean": ("conf/mnist_cnn_sharded.yaml", {"keepLocalOptimizer": True, "compression": "fp16"}),
    "diloco": ("conf/mnist_cnn_diloco.yaml", {}),
    "bmuf_sharded": ("conf/mnist_cnn_bmuf.yaml", {"backend": "sharded"}),
}
# issue 43: rounds that never block (overlap) and few bits (int8 / int4 / 1bit) on backend sharded, each mode beside its
# blocking run; not in the default --modes
SHARDED_VARIANTS = {
    f"{prefix}{suffix}": (path, {**base, **extra})
    for prefix, path, base in (("sharded", "conf/mnist_cnn_sharded.yaml", {}),
                               ("bmuf_sharded", "conf/mnist_cnn_bmuf.yaml", {"backend": "sharded"}),
                               ("diloco", "conf/mnist_cnn_diloco.yaml", {}))
    for suffix, extra in (("_overlap", {"overlap": True}), ("_int8", {"compression": "int8"}), ("_int4", {"compression": "int4"}),
                          ("_1bit", {"compression": "1bit"}), ("_overlap_int8", {"overlap": True, "compression": "int8"}),
                          ("_overlap_int4", {"overlap": True, "compression": "int4"}),
                          ("_overlap_1bit", {"overlap": True, "compression": "1bit"}))
}
RUNS.update(SHARDED_VARIANTS)


def test_accuracy_callback(test):
    """A driver callback adding ``val_accuracy`` (the master's accuracy on the test rows, computed
    in this process) to each epoch's logs: for backend ``sharded``, which takes no validation data."""
    import keras
    import numpy as np

    rows = test.select("pixels", "label").toArrow()
    x = np.asarray(rows.column("pixels").combine_chunks().flatten(), dtype=np.float32).reshape(rows.num_rows, -1)
    y = np.asarray(rows.column("label"), dtype=np.int64)

    class TestAccuracy(keras.callbacks.Callback):
        seconds = 0.0

        def on_epoch_end(self, epoch, logs=None):
            started = time.perf_counter()
            predicted = np.concatenate([np.argmax(np.asarray(self.model(x[i : i + 500], training=False)), axis=1)
                                        for i in range(0, len(x), 500)])
            accuracy = float(np.mean(predicted == y))
            if logs is not None:
                logs["val_accuracy"] = accuracy
            self.accuracies = [*getattr(self, "accuracies", []), accuracy]
            self.seconds += time.perf_counter() - started

    return TestAccuracy()


def run(spark, name: str, epochs: int) -> dict:
    from jobs.train import FIT_KEYS, build_model, load_config
    from sparkdl import KerasEstimator

    path, extra = RUNS[name]
    config = load_config(os.path.join(ROOT, path))
    data = config["data"]
    train = spark.read.parquet(os.path.join(ROOT, data["train"]))
    test = spark.read.parquet(os.path.join(ROOT, data["test"]))
    params = {FIT_KEYS[k]: v for k, v in config["fit"].items()}
    params.update(extra, epochs=epochs, verbose=0)
    cwd = os.getcwd()
    os.chdir(ROOT)  # the model factory's module path is relative to the checkout
    try:
        model = build_model(config["model"])
    finally:
        os.chdir(cwd)
    sharded = params.get("backend") == "sharded"
    probe = test_accuracy_callback(test) if sharded else None
    if probe is not None:
        params["callbacks"] = [*params.get("callbacks", []), probe]
    estimator = KerasEstimator(model=model, featuresCol=data["features_col"], labelCol=data["label_col"], **params)
    started = time.perf_counter()
    fitted = estimator.fit(train, validationData=None if sharded else test)
    fit_s = time.perf_counter() - started
    info, history = fitted.fitInfo, dict(fitted.history)
    extra = {}
    if sharded:
        history.setdefault("val_accuracy", probe.accuracies)
        pushed, pulled = sum(info["worker_bytes_pushed"]), sum(info["worker_bytes_pulled"])
        per_epoch = [pushed / epochs] * epochs  # the workers count their bytes per fit; a round's are the same in every epoch
        extra = {"eval_s": round(probe.seconds, 2), "bytes_pulled": pulled, "reported_update_bytes": info.get("update_bytes"),
                 "keep_local_optimizer": info.get("keep_local_optimizer"), "final_evaluate_accuracy": None}
    else:
        per_epoch = info.get("update_bytes_per_epoch") or [int(b) for b in history.get("bytes_pushed", [])]
    seconds, total = [], 0.0
    for s in info["epoch_seconds"]:
        total += s
        seconds.append(round(total, 2))
    bytes_sent, total_bytes = [], 0
    for b in per_epoch:
        total_bytes += int(b)
        bytes_sent.append(total_bytes)
    if sharded:  # the fitted model on the test rows, through Spark: the callback's last value, checked
        extra["final_evaluate_accuracy"] = round(float(fitted.evaluate(test)["accuracy"]), 4)
    return {
        "mode": estimator.getMode(), "run": name, "compression": estimator.getCompression(), "backend": info["backend"],
        "test_accuracy": round(history["val_accuracy"][-1], 4), "fit_s": round(fit_s, 2), "update_bytes": total_bytes,
        "epochs": epochs, "rounds": info["rounds"], **extra, "curve": {"seconds": seconds, "bytes": bytes_sent, "test_accuracy": [round(a, 4) for a in history["val_accuracy"]]},
    }


def plot(results: list[dict], path: str) -> bool:
    if not path:  # --plot '': no figure
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, (by_time, by_bytes) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.get_cmap("tab20").colors  # more runs than the default cycle's 10 colors
    for i, r in enumerate(results):
        curve, color = r["curve"], colors[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20]
        by_time.plot(curve["seconds"], curve["test_accuracy"], marker="o", label=r["run"], color=color)
        if curve["bytes"]:
            by_bytes.plot([b / 2**20 for b in curve["bytes"]], curve["test_accuracy"], marker="o", label=r["run"], color=color)
    by_time.set(xlabel="wall-clock seconds (fit, cumulative by epoch)", ylabel="test accuracy", title="accuracy vs time")
    by_bytes.set(xlabel="update bytes sent by the workers (MiB, cumulative)", ylabel="test accuracy", title="accuracy vs bytes")
    by_bytes.set_xscale("log")
    lowest = min(a for r in results for a in r["curve"]["test_accuracy"])
    for axis in (by_time, by_bytes):
        axis.set_ylim(min(0.97, lowest - 0.01), 1.0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("mnist10k CNN, 2 workers on local[2]")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--modes", default=",".join(r for r in RUNS if r not in SHARDED_VARIANTS and r != "bmuf_sharded"))
    parser.add_argument("--plot", default=os.path.join(ROOT, "benchmarks", "compare_modes.png"))
    parser.add_argument("--out", help="also append the JSON lines to this file")
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("sparkdl compare_modes").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    run(spark, "sync", 1)  # untimed: the Python workers import TensorFlow once, as in any session after its first fit
    results = []
    for name in args.modes.split(","):
        result = run(spark, name, args.epochs)
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "curve"}), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps({"benchmark": "compare_modes", **result}) + "\n")
    spark.stop()
    drawn = plot(results, args.plot)
    print(json.dumps({"summary": True, "plot": args.plot if drawn else None, "curves": {r["run"]: r["curve"] for r in results}}))
    print("\n| run | mode | backend | compression | test accuracy | fit s | update bytes |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['run']} | {r['mode']} | {r['backend']} | {r['compression'] or '-'} | {r['test_accuracy']:.4f} | {r['fit_s']:.1f} | {r['update_bytes']:,} |")


if __name__ == "__main__":
    main()
