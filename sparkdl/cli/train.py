"""sparkdl-train: train a Keras model on Spark from a YAML job config, evaluate it, save it, its metrics and a plot.

Usage::

    sparkdl-train --config conf/mnist_cnn.yaml [--master 'local[*]'] [--output DIR] [--set fit.epochs=1 ...]
    spark-submit --master 'local[*]' jobs/train.py --config conf/mnist_cnn.yaml [...]   # the same job
    sparkdl-train --config conf/mnist_cnn.yaml --check     # validate the config, print it, no Spark (config errors: no Keras either)
    sparkdl-train --config job.yaml --master spark://host:7077 --py-files mymodels.py --conf spark.executor.memory=4g

The model is saved first, then evaluated. Writes under ``runs/<config name>/`` (or ``output.dir``, or ``--output``; a URI such as
``hdfs://``, ``s3a://`` or ``dbfs:/`` goes through Spark's Hadoop filesystem):

- ``model/``: the fitted ``KerasModel`` (Spark ML format: metadata + ``model.keras``);
- ``metrics.json``: ``test_metrics`` (``KerasModel.evaluate`` on the test rows: the compiled loss
  and metrics, e.g. ``{"accuracy": 0.9855, "loss": 0.0452}``), ``test_accuracy`` (fraction; only
  for a single classification output with class-index labels or an accuracy metric),
  ``fit_s`` (seconds), ``num_workers``, ``epochs``, ``rounds``, ``history`` (per-epoch losses and
  metrics), row counts and, on backend ``ps``, ``ps_epochs`` (the parameter server's counts per epoch);
- ``history.png``: the history, one subplot per metric (needs matplotlib; skipped with a warning
  without it).

The config's keys are documented in ``conf/README.md`` (:mod:`sparkdl.cli.config`). ``--master``
sets the Spark master; without it the master is spark-submit's (``--master``), else ``local[*]``.
``--py-files`` ships your own modules to the executors (and puts them on the driver's path), and
``--conf KEY=VALUE`` sets the session the command starts, both as spark-submit's options do; a
session that exists already keeps its settings. Spark's own INFO lines are off from the session's
start (``spark.log.level=WARN``) unless your log4j configuration or ``--conf spark.log.level`` says
otherwise.
The executors' Python is ``PYSPARK_PYTHON``, by default this interpreter. The job's own lines go to
stdout through the ``sparkdl.cli`` logger; the last line gives the test results
(``sparkdl: test accuracy 0.9855, loss 0.0452, fit 28.0 s, 32 rounds; wrote ...``, or
``sparkdl: test loss 0.0812, mae 0.2214, ...`` for a regressor).

Before Spark starts (and with ``--check``) the config is checked against its model and its local
Parquet files (:mod:`sparkdl.cli.checks`): a label column per model output, ``fit.task`` against
the output shapes, and the labels' form against the loss (one-hot rows for
``categorical_crossentropy``, class indices for ``sparse_categorical_crossentropy``).
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import sys
import tempfile
import time

from sparkdl.cli import add_to_driver_path, is_user_error, python_files, quiet_tensorflow, spark_session, spark_settings
from sparkdl.cli.config import build_callbacks, build_model, estimator_keywords, estimator_params, is_uri, load_config
from sparkdl.errors import ConfigError

log = logging.getLogger("sparkdl.cli")


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


def join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}" if is_uri(folder) else os.path.join(folder, name)


def build_parser() -> argparse.ArgumentParser:
    """``sparkdl-train``'s options (docs/reference/cli.md's table is :func:`sparkdl.cli.options_markdown` of it)."""
    parser = argparse.ArgumentParser(prog="sparkdl-train", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--config", required=True, help="YAML job config, e.g. conf/mnist_cnn.yaml (keys: conf/README.md)")
    parser.add_argument("--output", help="output folder or URI (default: output.dir of the config, else runs/<name>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config key, the value parsed as YAML (repeatable), e.g. --set fit.epochs=1")
    parser.add_argument("--master", help="Spark master, e.g. 'local[*]' (default: spark-submit's, else local[*])")
    parser.add_argument("--conf", dest="spark_conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting of the session the command starts, as spark-submit's (repeatable), "
                             "e.g. --conf spark.executor.memory=4g")
    parser.add_argument("--py-files", dest="py_files", action="append", default=[], metavar="FILES",
                        help="comma-separated .py, .zip, .egg or .whl files shipped to the executors (SparkContext.addPyFile), "
                             "as spark-submit's: your own modules (model factories, custom objects, decoders)")
    parser.add_argument("--check", action="store_true",
                        help="validate the config (and build its callbacks), print it as JSON, and exit without Spark")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


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


def check_data_paths(config: dict) -> None:
    """Each local path of ``data.train``, ``data.test`` and ``data.validation`` names a file or a
    folder (a glob matches one); URIs are left to Spark. Imports neither Spark nor Keras.

    Raises:
        ConfigError: naming the key, the path and the folder it was read against.
    """
    data = config["data"]
    for key in ("train", "test", "validation"):
        path = data.get(key)
        if path and not is_uri(path) and not glob.glob(path):
            raise ConfigError(f"data.{key}: no file or folder at {path!r} (a config file's relative paths are read from its "
                              f"folder, those of --set and of a config dict from the working directory {os.getcwd()!r}). "
                              f"Received: {path!r}")


def build_estimator(config: dict):
    """The ``KerasEstimator`` of a validated ``config``: its model built, its callbacks made and
    every fit setting checked (``FitConfig``), all without Spark. ``fit.learning_rate`` is the
    ``learningRate`` Param: the rate of ``fit.optimizer``, else of the compiled model's optimizer,
    else of Keras' ``adam``.

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
    model = build_model(config["model"])
    estimator = KerasEstimator(model=model, **params)  # fit.learning_rate: the learningRate Param
    estimator._fit_config()  # numWorkers, epochs, mode and backend, ...: their ranges
    return estimator


def check_job(config: dict, estimator) -> list[str]:
    """The checks of ``config`` that need no Spark (:mod:`sparkdl.cli.checks`), run by the job and
    by ``--check``: one label column per model output, ``fit.task`` against the output shapes, and
    the label columns of local Parquet inputs against the loss. Returns each output's label column.

    Raises:
        ConfigError: naming the config key (and the file) that does not fit the model or loss.
    """
    from sparkdl.cli.checks import check_data_labels, check_outputs

    columns = check_outputs(config, estimator)
    check_data_labels(config, estimator, columns)
    return columns


#: Keras metric names whose value is the fraction of rows classified right
ACCURACY_METRICS = ("accuracy", "acc", "categorical_accuracy", "sparse_categorical_accuracy", "binary_accuracy")


def meaningful_accuracy(fitted, test_df, evaluation: dict) -> float | None:
    """The test rows' accuracy where it means something, else None.

    - a single classification output whose labels are one number per row (class indices, or 0/1
      under a binary loss) and whose loss is not a hinge loss (labels -1/1): the fraction of test
      rows with ``prediction == label`` (rows labelled with the loss's ``ignore_class`` left out),
      counted by Spark, exact;
    - else a single classification output compiled with an accuracy metric (one-hot labels with
      ``metrics: [accuracy]``): that metric of ``evaluation``;
    - else (regression, several outputs, no accuracy metric) None.

    Args:
        fitted: the fitted ``KerasModel``.
        test_df: the test rows.
        evaluation: ``fitted.evaluate(test_df)``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from sparkdl.keras.losses import CATEGORICAL_HINGE, HINGE

    info, task = fitted._loss_and_task()
    if len(fitted._spec.output_specs) != 1 or task != "classification":
        return None
    label = fitted.getLabelCol() if fitted.getLabelCols() is None else _only(fitted.getLabelCols())
    scalar = isinstance(test_df.schema[label].dataType, (T.NumericType, T.BooleanType))
    if scalar and info.family not in (HINGE, CATEGORICAL_HINGE):
        rows = fitted.transform(test_df)
        if info.ignore_class is not None:
            rows = rows.where(F.col(label) != F.lit(info.ignore_class))
        right = (F.col(fitted.getPredictionCol()) == F.col(label).cast("double")).cast("double")
        return rows.select(F.avg(right).alias("a")).first()["a"]
    for name in ACCURACY_METRICS:
        if name in evaluation:
            return evaluation[name]
    return None


def _only(label_cols):
    return next(iter(label_cols.values())) if isinstance(label_cols, dict) else label_cols[0]


def summary(accuracy: float | None, evaluation: dict) -> str:
    """The test results in one phrase: ``"accuracy 0.9855, loss 0.0452"`` (accuracy first when there
    is one, then the loss, then the other metrics by name; an accuracy metric shown once)."""
    parts = [] if accuracy is None else [f"accuracy {accuracy:.4f}"]
    names = sorted(evaluation, key=lambda k: (k != "loss", k))
    parts += [f"{k} {evaluation[k]:.4f}" for k in names if not (accuracy is not None and k in ACCURACY_METRICS)]
    return ", ".join(parts)


def train(config: dict, output: str | None = None, master: str | None = None, spark_conf: dict[str, str] | None = None,
          py_files: list[str] = ()) -> dict:
    """Run the job of a validated ``config`` (:func:`~sparkdl.cli.config.load_config`): fit, save
    the model, evaluate it on the test rows, write ``metrics.json`` and ``history.png``; returns the
    metrics.

    The model is saved before the test rows are read, so a fit is never lost to its evaluation.
    The test metrics are ``KerasModel.evaluate``'s (the compiled loss and metrics, right for every
    label form and output count) under ``test_metrics``; ``test_accuracy`` is there only where it
    means something (:func:`meaningful_accuracy`).

    Stops the SparkSession at the end only when it started it (an existing session, as in a
    Databricks notebook or job, stays up). ``spark_conf`` and ``py_files`` are ``--conf`` and
    ``--py-files`` (:func:`~sparkdl.cli.spark_session`).

    Raises:
        ConfigError: a config that does not fit its model, loss or data (before Spark starts).
    """
    name = config["name"]
    output = output or config["output"].get("dir") or os.path.join("runs", name)
    if not is_uri(output):
        output = os.path.abspath(output)  # this process's working directory, not the JVM's (Spark's writer resolves against that)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    check_data_paths(config)  # before the model is built: no TensorFlow import for a missing file
    estimator = build_estimator(config)  # everything that can fail on the config, before Spark starts
    data = config["data"]
    check_job(config, estimator)
    if not is_uri(output):
        os.makedirs(output, exist_ok=True)  # after the checks: a refused config leaves no folder behind

    spark, started_here = spark_session(f"sparkdl {name}", master, conf=spark_conf, py_files=py_files)
    try:
        read = spark.read.format(data["format"])
        train_df = read.load(data["train"])
        test_df = read.load(data["test"])
        validation = read.load(data["validation"]) if data.get("validation") else None
        log.info("fitting %s on %s with %d workers", name, spark.sparkContext.master, estimator.getNumWorkers())
        started = time.perf_counter()
        fitted = estimator.fit(train_df, validationData=validation)
        fit_s = time.perf_counter() - started
        model_path = join(output, "model")
        fitted.write().overwrite().save(model_path)  # first: the evaluation below may fail, the fit is kept
        try:
            evaluation = fitted.evaluate(test_df)
            accuracy = meaningful_accuracy(fitted, test_df, evaluation)
        except Exception:
            log.error("the test rows could not be evaluated; the fitted model is saved at %s", model_path)
            raise
        metrics = {
            **({} if accuracy is None else {"test_accuracy": accuracy}),
            "test_metrics": evaluation,
            "fit_s": round(fit_s, 2),
            "num_workers": estimator.getNumWorkers(),
            "epochs": estimator.getEpochs(),
            "rounds": fitted.fitInfo["rounds"],
            "local_steps": fitted.fitInfo["local_steps"],
            "train_rows": sum(fitted.fitInfo["partition_rows"]),
            "history": fitted.history,
            "mode": estimator.getMode(),
            "backend": fitted.fitInfo["backend"],
            "backend_reason": fitted.fitInfo["backend_reason"],
            "fit_seconds": fitted.fitInfo["seconds"],
            **{key: fitted.fitInfo[key] for key in ("resumed_from_epoch", "resumed_from_round", "epochs_run", "ps_epochs")
               if key in fitted.fitInfo},
        }
        results = summary(accuracy, evaluation)
        with tempfile.TemporaryDirectory(prefix="sparkdl-train-") as tmp:
            files = {"metrics.json": os.path.join(tmp, "metrics.json")}
            with open(files["metrics.json"], "w") as f:
                json.dump(metrics, f, indent=2)
            if config["output"].get("plot", True):
                png = _plot(fitted.history, os.path.join(tmp, "history.png"), f"{name}: test {results}")
                if png:
                    files["history.png"] = png
            _write_outputs(output, files, spark)
        print(f"sparkdl: test {results}, fit {fit_s:.1f} s, {metrics['rounds']} rounds; "
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
        # The config's own errors (an unreadable file, a typo, a value out of range; for a run, a data path that is
        # not there) before TensorFlow's import, which costs seconds: a --check of a typo answers at once.
        spark_conf, py_files = spark_settings(args.spark_conf), python_files(args.py_files)
        add_to_driver_path(py_files)
        config = load_config(args.config, args.overrides)
        if not args.check:  # --check validates a config also where its data is not (a cluster's paths)
            check_data_paths(config)
        quiet_tensorflow()
        if args.check:
            check_job(config, build_estimator(config))
            print(json.dumps(config, indent=2, default=repr))
            return 0
        train(config, output=args.output, master=args.master, spark_conf=spark_conf, py_files=py_files)
    except Exception as e:
        if not is_user_error(e):
            raise
        print(f"sparkdl-train: error: {type(e).__name__}: {e}" if not isinstance(e, ConfigError) else f"sparkdl-train: error: {e}",
              file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
