"""Train a Keras model on Spark from a YAML config, evaluate it, save it and its metrics.

Usage::

    spark-submit --master 'local[*]' jobs/train.py --config conf/mnist_cnn.yaml [--output DIR]

Writes under ``runs/<config name>/`` (or ``--output``):

- ``model/``: the fitted ``KerasModel`` (Spark ML format: metadata + ``model.keras``);
- ``metrics.json``: ``test_accuracy`` (fraction), ``fit_s`` (seconds), ``num_workers``,
  ``epochs``, ``rounds``, ``history`` (per-epoch metrics) and row counts.

Config sections: ``data`` (train/test Parquet paths, column names), ``model`` (``factory:
module:function`` with optional ``kwargs``, or ``json: path`` to a Keras model JSON) and ``fit``
(``KerasEstimator`` Params in snake_case: optimizer, loss, metrics, num_workers, epochs,
batch_size, local_steps, mode, seed, backend, staleness, server_port, worker_timeout,
sample_weight_col, class_weight, validation_col, validation_split, handle_invalid,
max_task_memory_mb, block_momentum, block_learning_rate, nesterov, elastic_force, compression,
compression_threshold, min_workers_per_round, round_deadline, mixed_precision). ``data`` may also give ``validation`` (a Parquet path validated on after
each epoch), ``features_cols``, ``label_cols`` and ``decoders``. Relative paths are read from
the working directory.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

import yaml

FIT_KEYS = {
    "optimizer": "optimizer",
    "loss": "loss",
    "metrics": "metrics",
    "num_workers": "numWorkers",
    "epochs": "epochs",
    "batch_size": "batchSize",
    "local_steps": "localSteps",
    "mode": "mode",
    "seed": "seed",
    "shuffle": "shuffle",
    "verbose": "verbose",
    "backend": "backend",
    "staleness": "staleness",
    "server_port": "serverPort",
    "worker_timeout": "workerTimeout",
    "sample_weight_col": "sampleWeightCol",
    "class_weight": "classWeight",
    "validation_col": "validationCol",
    "validation_split": "validationSplit",
    "handle_invalid": "handleInvalid",
    "max_task_memory_mb": "maxTaskMemoryMB",
    "block_momentum": "blockMomentum",
    "block_learning_rate": "blockLearningRate",
    "nesterov": "nesterov",
    "elastic_force": "elasticForce",
    "compression": "compression",
    "compression_threshold": "compressionThreshold",
    "min_workers_per_round": "minWorkersPerRound",
    "round_deadline": "roundDeadline",
    "mixed_precision": "mixedPrecision",
}
DATA_KEYS = {"features_cols": "featuresCols", "label_cols": "labelCols", "decoders": "decoders"}


def load_config(path: str) -> dict:
    with open(path) as f:
        config = yaml.safe_load(f)
    for section in ("data", "model", "fit"):
        if section not in config:
            raise SystemExit(f"config {path} must have a '{section}' section")
    unknown = set(config["fit"]) - set(FIT_KEYS)
    if unknown:
        raise SystemExit(f"config fit section has unknown keys {sorted(unknown)}; allowed: {sorted(FIT_KEYS)}")
    config.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    return config


def build_model(model_config: dict):
    """A ``keras.Model`` from ``factory: module:function`` (+ ``kwargs``) or ``json: path``."""
    import keras

    if "factory" in model_config:
        module_name, _, function_name = model_config["factory"].partition(":")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        factory = getattr(importlib.import_module(module_name), function_name)
        return factory(**model_config.get("kwargs", {}))
    if "json" in model_config:
        with open(model_config["json"]) as f:
            return keras.models.model_from_json(f.read())
    raise SystemExit("model section must give 'factory: module:function' or 'json: path'")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML job config, e.g. conf/mnist_cnn.yaml")
    parser.add_argument("--output", help="output folder (default runs/<config name>)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    output = args.output or os.path.join("runs", config["name"])
    os.makedirs(output, exist_ok=True)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from sparkdl import KerasEstimator

    spark = SparkSession.builder.appName(f"sparkdl {config['name']}").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    data = config["data"]
    features_col, label_col = data.get("features_col", "features"), data.get("label_col", "label")
    train = spark.read.parquet(data["train"])
    test = spark.read.parquet(data["test"])

    params = {FIT_KEYS[k]: v for k, v in config["fit"].items()}
    params.update({param: data[key] for key, param in DATA_KEYS.items() if data.get(key) is not None})
    estimator = KerasEstimator(model=build_model(config["model"]), featuresCol=features_col, labelCol=label_col, **params)
    validation = spark.read.parquet(data["validation"]) if data.get("validation") else None
    print(f"sparkdl: fitting {config['name']} on {spark.sparkContext.master} with {estimator.getNumWorkers()} workers", flush=True)
    started = time.perf_counter()
    model = estimator.fit(train, validationData=validation)
    fit_s = time.perf_counter() - started

    scored = model.transform(test)
    accuracy = scored.select(F.avg((F.col("prediction") == F.col(label_col)).cast("double")).alias("a")).first()["a"]
    model.write().overwrite().save(os.path.join(output, "model"))
    metrics = {
        "test_accuracy": accuracy,
        "fit_s": round(fit_s, 2),
        "num_workers": estimator.getNumWorkers(),
        "epochs": estimator.getEpochs(),
        "rounds": model.fitInfo["rounds"],
        "local_steps": model.fitInfo["local_steps"],
        "train_rows": sum(model.fitInfo["partition_rows"]),
        "history": model.history,
        "mode": estimator.getMode(),
        "backend": model.fitInfo.get("backend", "rounds"),
    }
    with open(os.path.join(output, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    print(f"sparkdl: test accuracy {accuracy:.4f}, fit {fit_s:.1f} s, {metrics['rounds']} rounds; wrote {output}/metrics.json", flush=True)
    spark.stop()
    return metrics


if __name__ == "__main__":
    main()
