"""sparkdl-train: train a Keras model on Spark from a YAML job config, evaluate it, save it, its metrics and a plot.

Usage::

    sparkdl-train --config conf/mnist_cnn.yaml [--master 'local[*]'] [--output DIR] [--set fit.epochs=1 ...]
    spark-submit --master 'local[*]' jobs/train.py --config conf/mnist_cnn.yaml [...]   # the same job
    sparkdl-train --config conf/mnist_cnn.yaml --check     # validate the config, print it, no Spark

Writes under ``runs/<config name>/`` (or ``output.dir``, or ``--output``; a URI such as
``hdfs://``, ``s3a://`` or ``dbfs:/`` goes through Spark's Hadoop filesystem):

- ``model/``: the fitted ``KerasModel`` (Spark ML format: metadata + ``model.keras``);
- ``metrics.json``: ``test_accuracy`` (fraction), ``fit_s`` (seconds), ``num_workers``,
  ``epochs``, ``rounds``, ``history`` (per-epoch metrics) and row counts;
- ``history.png``: the history, one subplot per metric (needs matplotlib; skipped with a warning
  without it).

The config's keys are documented in ``conf/README.md`` (:mod:`sparkdl.cli.config`). ``--master``
sets the Spark master; without it the master is spark-submit's (``--master``), else ``local[*]``.
The executors' Python is ``PYSPARK_PYTHON``, by default this interpreter. The job's own lines go to
stdout through the ``sparkdl.cli`` logger; the last line gives the test accuracy.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import re
import sys
import tempfile
import time

from sparkdl.cli import is_user_error, spark_session
from sparkdl.cli.config import build_callbacks, build_model, estimator_keywords, estimator_params, load_config
from sparkdl.errors import ConfigError

log = logging.getLogger("sparkdl.cli")

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+:")  # a scheme of 2+ characters (not a Windows drive letter)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        return f"sparkdl: {level}{record.getMessage()}"


def setup_logging() -> None:
    """Send the ``sparkdl.cli`` logger's records (INFO and up) to stdout as ``sparkdl: ...`` lines,
    unless it has a handler already."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(_Formatter())
        log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)


def is_uri(path: str) -> bool:
    """Whether ``path`` has a URI scheme (``hdfs://``, ``s3a://``, ``dbfs:/``, ``file:``)."""
    return bool(_URI.match(path))


def join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}" if is_uri(folder) else os.path.join(folder, name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sparkdl-train", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--config", required=True, help="YAML job config, e.g. conf/mnist_cnn.yaml (keys: conf/README.md)")
    parser.add_argument("--output", help="output folder or URI (default: output.dir of the config, else runs/<name>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config key, the value parsed as YAML (repeatable), e.g. --set fit.epochs=1")
    parser.add_argument("--master", help="Spark master, e.g. 'local[*]' (default: spark-submit's, else local[*])")
    parser.add_argument("--check", action="store_true",
                        help="validate the config (and build its callbacks), print it as JSON, and exit without Spark")
    return parser.parse_args(argv)


def _write_outputs(output: str, files: dict[str, str], spark) -> None:
    """Copy the driver-local ``files`` (name -> local path) into ``output``: plain copies for a local
    folder, Spark's Hadoop filesystem for a URI."""
    if is_uri(output):
        from sparkdl.spark.persistence import upload_file

        for name, local in files.items():
            upload_file(local, join(output, name), spark)
    else:
        import shutil

        os.makedirs(output, exist_ok=True)
        for name, local in files.items():
            shutil.copyfile(local, os.path.join(output, name))


def build_estimator(config: dict):
    """The ``KerasEstimator`` of a validated ``config``: its model built, its callbacks made and
    every fit setting checked (``FitConfig``), all without Spark.

    Raises:
        ConfigError: a Param out of its range, a callback that is not a Keras callback, a model
            factory that fails.
    """
    from sparkdl import KerasEstimator

    params = estimator_params(config)
    callbacks = build_callbacks(config)
    if callbacks:
        if "callbacks" not in estimator_keywords():
            raise ConfigError("the config's callbacks need KerasEstimator(callbacks=...), which this version of sparkdl "
                              f"does not have. Received: {[c['class'] for c in config['callbacks']]}")
        params["callbacks"] = callbacks
    estimator = KerasEstimator(model=build_model(config["model"]), **params)
    estimator._fit_config()  # numWorkers, epochs, mode and backend, ...: their ranges
    return estimator


def train(config: dict, output: str | None = None, master: str | None = None) -> dict:
    """Run the job of a validated ``config`` (:func:`~sparkdl.cli.config.load_config`): fit, score
    the test rows, save the model, ``metrics.json`` and ``history.png``; returns the metrics.

    Stops the SparkSession at the end only when it started it (an existing session, as in a
    Databricks notebook or job, stays up).
    """
    name = config["name"]
    output = output or config["output"].get("dir") or os.path.join("runs", name)
    if not is_uri(output):
        os.makedirs(output, exist_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    estimator = build_estimator(config)  # everything that can fail on the config, before Spark starts
    data = config["data"]
    for key in ("train", "test", "validation"):
        path = data.get(key)
        if path and not is_uri(path) and not glob.glob(path):
            raise ConfigError(f"data.{key}: no file or folder at {path!r} (relative paths are read from the working directory "
                              f"{os.getcwd()!r}). Received: {path!r}")

    from pyspark.sql import functions as F

    spark, started_here = spark_session(f"sparkdl {name}", master)
    try:
        read = spark.read.format(data["format"])
        train_df = read.load(data["train"])
        test_df = read.load(data["test"])
        validation = read.load(data["validation"]) if data.get("validation") else None
        label_col = estimator.getLabelCol()
        log.info("fitting %s on %s with %d workers", name, spark.sparkContext.master, estimator.getNumWorkers())
        started = time.perf_counter()
        fitted = estimator.fit(train_df, validationData=validation)
        fit_s = time.perf_counter() - started

        scored = fitted.transform(test_df)
        accuracy = scored.select(F.avg((F.col("prediction") == F.col(label_col)).cast("double")).alias("a")).first()["a"]
        fitted.write().overwrite().save(join(output, "model"))
        metrics = {
            "test_accuracy": accuracy,
            "fit_s": round(fit_s, 2),
            "num_workers": estimator.getNumWorkers(),
            "epochs": estimator.getEpochs(),
            "rounds": fitted.fitInfo["rounds"],
            "local_steps": fitted.fitInfo["local_steps"],
            "train_rows": sum(fitted.fitInfo["partition_rows"]),
            "history": fitted.history,
            "mode": estimator.getMode(),
            "backend": fitted.fitInfo.get("backend", "rounds"),
        }
        with tempfile.TemporaryDirectory(prefix="sparkdl-train-") as tmp:
            files = {"metrics.json": os.path.join(tmp, "metrics.json")}
            with open(files["metrics.json"], "w") as f:
                json.dump(metrics, f, indent=2)
            if config["output"].get("plot", True):
                png = _plot(fitted.history, os.path.join(tmp, "history.png"), f"{name}: test accuracy {accuracy:.4f}")
                if png:
                    files["history.png"] = png
            _write_outputs(output, files, spark)
        print(f"sparkdl: test accuracy {accuracy:.4f}, fit {fit_s:.1f} s, {metrics['rounds']} rounds; "
              f"wrote {join(output, 'metrics.json')}", flush=True)
        return metrics
    finally:
        if started_here:
            spark.stop()


def _plot(history: dict, path: str, title: str) -> str | None:
    """``plot_history`` into ``path``, or ``None`` with a warning when it cannot (never fails the job)."""
    try:
        from sparkdl.cli.plot import plot_history

        return plot_history(history, path, title=title)
    except ImportError as e:
        log.warning("history.png skipped: matplotlib is not installed (pip install 'sparkdl-keras[plot]'): %s", e)
    except Exception as e:  # noqa: BLE001 - a plot never fails a finished fit
        log.warning("history.png skipped: %s: %s", type(e).__name__, e)
    return None


def main(argv: list[str] | None = None) -> int:
    """The ``sparkdl-train`` command (and ``jobs/train.py``): returns 0, or exits with the message of
    a ``ConfigError`` (a bad config or Param) and status 2."""
    args = parse_args(argv)
    setup_logging()
    try:
        config = load_config(args.config, args.overrides)
        if args.check:
            build_estimator(config)
            print(json.dumps(config, indent=2, default=repr))
            return 0
        train(config, output=args.output, master=args.master)
    except Exception as e:
        if not is_user_error(e):
            raise
        print(f"sparkdl-train: error: {type(e).__name__}: {e}" if not isinstance(e, ConfigError) else f"sparkdl-train: error: {e}",
              file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
