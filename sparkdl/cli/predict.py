"""sparkdl-predict: score a file with a saved Spark ML model (KerasModel, PipelineModel, ...) and write the result.

Usage::

    sparkdl-predict --model runs/mnist_cnn/model --input data/mnist10k/test.parquet --output /tmp/preds \\
        [--input-format parquet] [--output-format parquet] [--columns label] [--mode errorifexists] \\
        [--batch-size 1024] [--arrays] [--master 'local[*]'] [--input-option header=true ...] [--output-option k=v ...]
    spark-submit jobs/predict.py --model ... --input ... --output ...                  # the same job

Loads the fitted stage saved at ``MODEL``, whatever its class (:func:`load_stage`: a ``KerasModel``,
a ``PipelineModel`` such as ``VectorAssembler`` + ``KerasModel`` as tabular models are saved, or any
other Spark ML ``Transformer``; the class is read from the folder's metadata), transforms
``spark.read.format(INPUT_FORMAT).load(INPUT)`` and writes the input columns (all, or ``--columns``)
plus the columns the model adds (a ``KerasModel``'s ``prediction``, and for a classifier
``probability`` and ``rawPrediction``; a pipeline's intermediate columns too) with
``df.write.format(OUTPUT_FORMAT)``. ``--batch-size`` sets the ``inferenceBatchSize`` of every
``KerasModel`` in it.
Vector columns (``probability``, ``rawPrediction``) are written as Spark ML vectors (a struct in
Parquet, ORC and JSON, which Spark ML reads back as a vector); with ``--arrays`` as plain
``array<double>`` columns, which pandas and pyarrow read as lists of floats. CSV holds neither: its
vectors and arrays are written as JSON text, ``"[0.1,0.9]"``. Prints the rows written and the seconds taken.

A local model folder, input path or (with ``--mode errorifexists``) output path is checked before
Spark starts; a URI (``hdfs://``, ``s3a://``, ``dbfs:/``) is left to Spark.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

from sparkdl.cli import is_user_error, quiet_tensorflow, spark_session
from sparkdl.cli.train import is_uri, setup_logging
from sparkdl.errors import ConfigError, did_you_mean

MODES = ("errorifexists", "overwrite", "append")


def _options(pairs: list[str], flag: str) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} must be key=value. Received: {pair!r}")
        options[key] = value
    return options


def build_parser() -> argparse.ArgumentParser:
    """``sparkdl-predict``'s options (docs/reference/cli.md's table is :func:`sparkdl.cli.options_markdown` of it)."""
    parser = argparse.ArgumentParser(prog="sparkdl-predict", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--model", required=True,
                        help="folder of a saved Spark ML model: a KerasModel (e.g. runs/mnist_cnn/model), a PipelineModel, ...")
    parser.add_argument("--input", required=True, help="rows to score: a path spark.read reads")
    parser.add_argument("--output", required=True, help="where to write the scored rows")
    parser.add_argument("--input-format", default="parquet", help="spark.read format: parquet (default), csv, json, orc, delta, ...")
    parser.add_argument("--output-format", default="parquet", help="DataFrame writer format (default parquet)")
    parser.add_argument("--columns", help="comma-separated input columns to keep (default: all); the model's output columns are always written")
    parser.add_argument("--mode", default="errorifexists", choices=MODES, help="save mode when the output exists (default errorifexists)")
    parser.add_argument("--batch-size", type=int, help="rows per predict call (inferenceBatchSize of each KerasModel in the model)")
    parser.add_argument("--arrays", action="store_true",
                        help="write vector columns (probability, rawPrediction, and an input vector column) as plain "
                             "array<double> columns that pandas and pyarrow read as lists (default: Spark ML vectors, "
                             "structs outside Spark)")
    parser.add_argument("--master", help="Spark master, e.g. 'local[*]' (default: spark-submit's, else local[*])")
    parser.add_argument("--input-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a spark.read option (repeatable); csv defaults: header=true, inferSchema=true")
    parser.add_argument("--output-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a DataFrame writer option (repeatable); csv default: header=true")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def check_paths(model: str, input_path: str, output: str, mode: str) -> None:
    """The checks that need no Spark: a local model folder holding a saved stage, a local input that
    exists, and no local output when ``mode`` is ``errorifexists``.

    Raises:
        ConfigError: naming the path and what is wrong with it.
    """
    if not is_uri(model):
        if not os.path.isdir(model):
            raise ConfigError(f"--model must be the folder of a saved Spark ML model (KerasModel, PipelineModel, ...); "
                              f"no folder at {model!r}. Received: {model!r}")
        if not os.path.isdir(os.path.join(model, "metadata")):
            raise ConfigError(f"--model {model!r} holds no saved Spark ML model (no metadata/ folder; "
                              f"found: {sorted(os.listdir(model))[:10]}). Received: {model!r}")
    if not is_uri(input_path) and not glob.glob(input_path):
        raise ConfigError(f"--input: no file or folder at {input_path!r}. Received: {input_path!r}")
    def norm(path: str) -> str:
        return path.rstrip("/") if is_uri(path) else os.path.realpath(path)

    source, target = norm(input_path), norm(output)
    if source == target or target.startswith(source + "/") or source.startswith(target + "/"):
        raise ConfigError(f"--output must not be the input or a folder inside or around it (Spark deletes the output first "
                          f"when it overwrites it, before the input is read). Received: --input {input_path!r}, --output {output!r}")
    if not is_uri(output) and mode == "errorifexists" and os.path.exists(output):
        raise ConfigError(f"--output {output!r} exists; pass --mode overwrite (or append) to write there. Received: {output!r}")


def load_stage(path: str, spark):
    """The Spark ML stage saved at ``path``, loaded by the class its metadata names
    (``pyspark.ml.util.DefaultParamsReader.loadParamsInstance``: ``sparkdl.spark.model.KerasModel``,
    ``pyspark.ml.pipeline.PipelineModel``, a JVM stage such as ``org.apache.spark.ml.PipelineModel``
    as its pyspark class).

    Raises:
        ConfigError: a class that cannot be imported, or a stage that cannot score rows (an
            unfitted ``Pipeline`` or Estimator: no ``transform``).
    """
    from pyspark.ml import Transformer
    from pyspark.ml.util import DefaultParamsReader

    from sparkdl.spark.session import is_connect

    source = spark if is_connect(spark) else spark.sparkContext
    try:
        stage = DefaultParamsReader.loadParamsInstance(path, source)
    except (ImportError, AttributeError) as e:  # the metadata names a class this Python cannot import
        raise ConfigError(f"--model {path!r}: cannot load the saved stage's class ({type(e).__name__}: {e}); install the "
                          f"package that defines it. Received: {path!r}") from e
    if not isinstance(stage, Transformer):
        raise ConfigError(f"--model must be a fitted model (a Transformer: KerasModel, PipelineModel, ...); {path!r} holds "
                          f"a {type(stage).__name__}, which must be fit first. Received: {path!r}")
    return stage


def keras_stages(stage) -> list:
    """The ``KerasModel`` stages of ``stage``: itself, or those of a ``PipelineModel`` (nested ones too)."""
    if hasattr(stage, "setInferenceBatchSize"):
        return [stage]
    return [found for inner in getattr(stage, "stages", None) or () for found in keras_stages(inner)]


def plain_columns(df, *, arrays: bool, text: bool):
    """``df`` with its top-level vector columns (``pyspark.ml`` or ``pyspark.mllib`` vectors: the
    scores, and an input's ``features`` too) as ``array<double>`` (``arrays``), and with its vectors,
    arrays, maps and structs as JSON text (``text``: for CSV, which holds none of them, e.g.
    ``"[0.1,0.9]"``). Vectors nested in an array or a struct stay as they are."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.mllib.linalg import VectorUDT as OldVectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StructType

    def plain(field):
        column = F.col(field.name)
        vector = isinstance(field.dataType, (VectorUDT, OldVectorUDT))
        if vector and (arrays or text):
            column = vector_to_array(column, "float64")
        if text and (vector or isinstance(field.dataType, (ArrayType, MapType, StructType))):
            column = F.to_json(column)
        return column.alias(field.name)

    return df.select(*[plain(f) for f in df.schema.fields]) if arrays or text else df


def predict(model: str, input_path: str, output: str, *, input_format: str = "parquet", output_format: str = "parquet",
            columns: list[str] | None = None, mode: str = "errorifexists", batch_size: int | None = None,
            master: str | None = None, input_options: dict | None = None, output_options: dict | None = None,
            arrays: bool = False) -> dict:
    """Score ``input_path`` with the Spark ML model saved at ``model`` (:func:`load_stage`) and write ``output``; returns
    ``{"rows": rows written, "seconds": load + transform + write, "columns": [...]}``. ``arrays``: vector
    columns written as ``array<double>`` (``pyspark.ml.functions.vector_to_array``), not as Spark ML vectors.

    Stops the SparkSession at the end only when it started it.
    """
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}.{did_you_mean(mode, MODES)} Received: {mode!r}")
    if batch_size is not None and batch_size <= 0:
        raise ConfigError(f"--batch-size must be a positive number of rows. Received: {batch_size!r}")
    check_paths(model, input_path, output, mode)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    spark, started_here = spark_session("sparkdl predict", master)
    try:
        started = time.perf_counter()
        read_options = {"header": "true", "inferSchema": "true"} if input_format == "csv" else {}
        read_options.update(input_options or {})
        df = spark.read.format(input_format).options(**read_options).load(input_path)
        if columns:
            missing = [c for c in columns if c not in df.columns]
            if missing:
                raise ConfigError(f"--columns: the input has no column(s) {missing}.{did_you_mean(missing[0], df.columns)} "
                                  f"Its columns: {df.columns}. Received: {','.join(columns)}")
        fitted = load_stage(model, spark)
        if batch_size is not None:
            stages = keras_stages(fitted)
            if not stages:
                raise ConfigError(f"--batch-size sets a KerasModel's inferenceBatchSize; the {type(fitted).__name__} at "
                                  f"{model!r} has no KerasModel. Received: {batch_size!r}")
            for stage in stages:
                stage.setInferenceBatchSize(batch_size)
        scored = fitted.transform(df)
        added = [c for c in scored.columns if c not in df.columns]
        kept = list(columns) if columns else list(df.columns)
        scored = scored.select(*kept, *added)
        scored = plain_columns(scored, arrays=arrays, text=output_format == "csv")
        write_options = {"header": "true"} if output_format == "csv" else {}
        write_options.update(output_options or {})
        scored.write.format(output_format).mode(mode).options(**write_options).save(output)
        if mode == "append":
            rows = df.count()
        else:
            rows = spark.read.format(output_format).options(**write_options).load(output).count()
        seconds = time.perf_counter() - started
        return {"rows": rows, "seconds": round(seconds, 2), "columns": kept + added}
    finally:
        if started_here:
            spark.stop()


def main(argv: list[str] | None = None) -> int:
    """The ``sparkdl-predict`` command (and ``jobs/predict.py``): returns 0, or exits with the message of
    a ``ConfigError`` (a missing model or input, a bad option) and status 2."""
    args = parse_args(argv)
    setup_logging()
    quiet_tensorflow()
    try:
        columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
        result = predict(
            args.model, args.input, args.output, input_format=args.input_format, output_format=args.output_format,
            columns=columns, mode=args.mode, batch_size=args.batch_size, master=args.master,
            input_options=_options(args.input_option, "--input-option"),
            output_options=_options(args.output_option, "--output-option"), arrays=args.arrays,
        )
    except Exception as e:
        if not is_user_error(e):
            raise
        print(f"sparkdl-predict: error: {e}" if isinstance(e, ConfigError) else f"sparkdl-predict: error: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)
        return 2
    print(f"sparkdl: wrote {result['rows']} rows ({', '.join(result['columns'])}) to {args.output} "
          f"in {result['seconds']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
