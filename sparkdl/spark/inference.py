"""``KerasModel.transform``: batched inference on the executors, through an Arrow UDF (pyspark 4.1+)
or ``mapInArrow`` (pyspark 4.0).

Each task converts each incoming Arrow batch to numpy, predicts in batches of ``batchSize``
rows with a model built once per Python worker, and returns ``prediction`` (and, for
classifiers, ``rawPrediction`` and ``probability``) for the batch's rows. Rows never leave their
batch, so row order, row count and the row-to-prediction pairing are exact for any input: no
``zip``, no repartition, no collect to the driver. Input columns travel by position, so names
with dots or duplicate names (after a join) pass through unchanged.

On pyspark 4.1 and later the scoring is an iterator Arrow UDF (:func:`predict_arrays`) over a
struct of the model's input columns: only those go to Python and only the added columns come back
(Spark keeps the others beside them), the scores as ``array<double>`` made vectors by Spark's
``array_to_vector``. On pyspark 4.0, which has no Arrow UDF, ``mapInArrow`` (:func:`predict_partition`)
sends every column to Python and back. Measured by ``benchmarks/transform_throughput.py --map-in-arrow``.

Which columns a loss and task give, and their values, is decided by the loss family
(:class:`sparkdl.keras.losses.LossInfo`); the output schema is known on the driver without a job.
``rawPrediction`` and ``probability`` are ``pyspark.ml.linalg`` DenseVector columns (VectorUDT),
as Spark's own classifiers write them, built in Arrow as VectorUDT's struct
(``type=1`` dense, ``size`` and ``indices`` null, ``values`` a list of doubles), or
``array<double>`` columns on request. A model with several outputs gets one column per output
instead (its values), each classifier output followed by its own ``<column>_probability``.

Bad feature rows (nulls, null elements, NaN, ±inf, wrong lengths) can only be seen in the data;
``handleInvalid`` decides what happens to them. With ``"error"`` (the default) the scoring pass
checks them: the task that meets a bad batch raises :class:`~sparkdl.errors.SchemaError` naming the
column, the batch's counts, the partition and the partition's bad rows in all (counted without
scoring); ``transform`` itself stays lazy and runs no job. ``checkFeatures=True`` adds one aggregate
job over the feature columns when ``transform`` is called (no Python workers: Spark SQL expressions
only) that raises ``SchemaError`` with the counts for the whole input before any row is scored (not
on a streaming DataFrame); it was the default until measured: its read of the input costs 12–21 %
of transform's rows/s (``benchmarks/transform_throughput.py``). With ``"skip"`` each task leaves the
bad rows out of its output; with ``"keep"`` it keeps them, with NaN in every column it adds (the
model never sees them). Whatever the rule, a NaN never becomes a number on the way out: a row
whose model outputs hold a NaN gets a NaN prediction and NaN scores
(:meth:`~sparkdl.keras.losses.LossInfo.spark_outputs`).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.broadcast import Broadcast
from pyspark.ml.functions import array_to_vector
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdl.errors import SchemaError
from sparkdl.keras.losses import LossInfo, OutputLayout, losses_for_outputs
from sparkdl.keras.runtime import keras_backend
from sparkdl.keras.spec import ModelSpec
from sparkdl.serialization.columns import RowFaults, TensorSpec, array_faults, decoder_name, row_faults, shipped_decoder, tensor_to_numpy
from sparkdl.spark.data import SPARK_TYPES, as_array, check_pad_value, col, input_column, map_inputs, read_dtype
from sparkdl.spark.internals import context_stopped

_TMP_FEATURES = "__sparkdl_features"
_SCORED = "__sparkdl_scored"  # the Arrow UDF's struct of added columns
_DENSE = 1  # VectorUDT's type code of a dense vector
ARROW_UDF = hasattr(F, "arrow_udf")  # pyspark 4.1+: transform scores through an Arrow UDF, else through mapInArrow


@dataclass(frozen=True)
class OutputColumns:
    """Names of the columns ``transform`` adds; an empty ``raw_prediction`` or ``probability``
    name leaves that column out (as in Spark's classifiers).

    Attributes:
        prediction: the prediction column (always written).
        raw_prediction: the raw class scores column of classifiers, or ``""``.
        probability: the class probabilities column of classifiers, or ``""``.
        vectors: write scores as ``pyspark.ml.linalg`` DenseVector (True) or ``array<double>`` (False).
    """

    prediction: str
    raw_prediction: str = "rawPrediction"
    probability: str = "probability"
    vectors: bool = True


@dataclass(frozen=True)
class PredictSpec:
    """Plain values an inference task needs; ``output_names`` are the (positional) output column names.

    ``spec`` is the architecture only: the weights travel in ``weights`` (a Spark broadcast of their
    Arrow IPC bytes, one per model, see :func:`weights_broadcast`), and ``model_key`` is the full
    model's digest, the workers' cache key. ``custom_objects`` are the driver's registered Keras objects.
    """

    spec: ModelSpec
    weights: Broadcast
    model_key: str
    custom_objects: dict
    inputs: tuple  # one TensorSpec per model input; its columns come last in each batch
    batch_size: int | None  # rows per predict call; None: the worker's model decides (sparkdl.keras.predict.inference_rows)
    task: str
    loss: LossInfo
    write_raw: bool
    write_probability: bool
    vectors: bool
    output_names: tuple[str, ...]
    multi_output: bool = False
    # multi-output: per output, the (loss, task) whose probabilities follow its values, or None for no probability column
    output_probabilities: tuple = ()
    # rows with a null, NaN, ±inf or wrongly sized feature: "error" (raise), "skip" (drop) or "keep" (NaN outputs)
    handle_invalid: str = "error"
    # batch_size None: the fewest rows per predict call (batchSize)
    min_batch_size: int = 1
    # the driver's Keras backend, set in each worker before Keras is imported (sparkdl.keras.runtime.configure)
    keras_backend: str = dataclasses.field(default_factory=keras_backend)
    # mapInArrow: how many input columns each output batch repeats (the input DataFrame's); the Arrow UDF: the added columns' type
    echoed: int = 0
    added_type: T.StructType | None = None


def _list_column(values: np.ndarray) -> pa.Array:
    """``(rows, k)`` float64 values as an Arrow ``list<double>`` column."""
    rows, k = values.shape
    offsets = pa.array(np.arange(0, rows * k + 1, k, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(values, np.float64).reshape(-1)))


def _vector_column(values: np.ndarray) -> pa.Array:
    """``(rows, k)`` values as VectorUDT's Arrow struct of dense vectors."""
    rows = len(values)
    return pa.StructArray.from_arrays(
        [
            pa.array(np.full(rows, _DENSE, np.int8)),
            pa.nulls(rows, pa.int32()),
            pa.nulls(rows, pa.list_(pa.int32())),
            _list_column(values),
        ],
        names=["type", "size", "indices", "values"],
    )


def _score_type(vectors: bool) -> T.DataType:
    return VectorUDT() if vectors else T.ArrayType(T.DoubleType(), containsNull=False)


def _predictions(job: PredictSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[pa.RecordBatch, pa.RecordBatch, np.ndarray, object]]:
    """Per incoming record batch, in order: ``(batch, good, bad, predicted)``: ``good`` the batch's
    rows the model scored, ``bad`` (bool, one per row of ``batch``) the rows it did not (bad feature
    rows, :func:`batch_faults`, and a decoder's non-finite output), ``predicted`` the model's outputs
    for ``good`` (:func:`~sparkdl.keras.predict.predict_array`: one array, or a list per output).

    Raises:
        SchemaError: with ``job.handle_invalid == "error"``, a batch with bad feature rows: the
            column, the counts of null, NaN, infinite and wrongly sized rows, the partition and the
            batch are named, and the partition's bad rows in all (its later batches counted, not scored).
    """
    from sparkdl.keras import runtime

    context = TaskContext.get()
    runtime.configure(context.cpus(), context.resources(), job.keras_backend)
    from sparkdl.keras.custom_objects import register
    from sparkdl.keras.predict import cached_model, inference_rows, predict_array

    register(job.custom_objects)
    model = cached_model(job.spec, weights=job.weights.value, key=job.model_key)
    rows = job.batch_size or inference_rows(model, job.min_batch_size, gpu=runtime.describe()["gpus"] > 0)
    pads = tuple(t.columns[0].pad if t.columns[0].ragged else None for t in job.inputs)  # sequence inputs: cut per predict batch
    batches, seen = iter(batches), 0  # seen: the partition's rows up to this batch's end
    for batch in batches:
        seen += batch.num_rows
        where = f"transform, partition {context.partitionId()}, a batch of {batch.num_rows} rows"
        faults = batch_faults(batch, job.inputs)
        bad = faulty_rows(faults, batch.num_rows)
        if bad.any() and job.handle_invalid == "error":
            raise SchemaError(f"{where}: {faults_message(faults)}{partition_count(batches, job.inputs, int(bad.sum()), seen)}")
        good = batch.filter(pa.array(~bad)) if bad.any() else batch
        try:
            x = [tensor_to_numpy(good, _batch_shapes(good, t)) for t in job.inputs]
        except SchemaError as exc:
            raise SchemaError(f"{where}: {exc}") from None
        decoded = [(t.source, f"values whose decoding by {', '.join(repr(decoder_name(c.decoder)) for c in t.columns if c.decoder)} is finite", array_faults(a))
                   for t, a in zip(job.inputs, x, strict=True) if any(c.decoder for c in t.columns)]
        late = np.zeros(len(good), bool)
        for _, _, found in decoded:
            late |= found.any
        if late.any():  # a decoder's output holds NaN or ±inf
            if job.handle_invalid == "error":
                raise SchemaError(f"{where}: {faults_message(decoded)}")
            x = [a[~late] for a in x]
            good = good.filter(pa.array(~late))
            bad[np.flatnonzero(~bad)[late]] = True
        yield batch, good, bad, predict_array(model, x if len(x) > 1 else x[0], rows, pads)


def _added_columns(job: PredictSpec, predicted) -> list[pa.Array]:
    """The columns ``transform`` adds, from the model's outputs for a batch's rows (see :func:`transform`)."""
    scores = _vector_column if job.vectors else _list_column
    columns = []
    if job.multi_output:  # one column per output: its values (double, or array<double> for a wider output)
        for k, values in enumerate(predicted):
            flat = values.reshape(len(values), -1).astype(np.float64)
            columns.append(pa.array(flat[:, 0], pa.float64()) if flat.shape[1] == 1 else _list_column(flat))
            probability = job.output_probabilities[k] if k < len(job.output_probabilities) else None
            if probability is not None:  # a classifier output: its class probabilities next
                info, task = probability
                columns.append(scores(info.spark_outputs(values, task).probability))
        return columns
    out = job.loss.spark_outputs(predicted, job.task)
    columns.append(_list_column(out.prediction) if out.prediction.ndim == 2 else pa.array(out.prediction, pa.float64()))
    if job.write_raw:
        columns.append(scores(out.raw))
    if job.write_probability:
        columns.append(scores(out.probability))
    return columns


def _spread_all(job: PredictSpec, predicted, bad: np.ndarray):
    """``predicted`` (the good rows') spread over every row of the batch, NaN in the ``bad`` ones."""
    return [_spread(p, bad) for p in predicted] if job.multi_output else _spread(predicted, bad)


def predict_partition(job: PredictSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function (pyspark before 4.1): every record batch of a partition with the
    added columns appended, rows in input order; the bad rows follow ``job.handle_invalid``
    (``"skip"``: left out, ``"keep"``: NaN in every added column; see :func:`_predictions`)."""
    inputs = job.echoed  # the temporary input columns come last: not echoed
    for batch, good, bad, predicted in _predictions(job, batches):
        source = good
        if job.handle_invalid == "keep" and bad.any():  # every row stays; the bad ones get NaN outputs
            predicted, source = _spread_all(job, predicted, bad), batch
        columns = [source.column(i) for i in range(inputs)] + _added_columns(job, predicted)
        yield pa.RecordBatch.from_arrays(columns, names=list(job.output_names))


def predict_arrays(job: PredictSpec, arrays: Iterator[pa.Array]) -> Iterator[pa.Array]:
    """An iterator Arrow UDF's function (pyspark 4.1 and later): per incoming struct array of the
    model's input columns, a struct array of the added columns, one row per input row (a bad row
    with NaN in every added column, and null as a whole under ``"skip"``: :func:`transform` filters
    those). Only the model's input columns travel to Python and only the added ones come back."""
    from pyspark.sql.pandas.types import to_arrow_type

    target = to_arrow_type(job.added_type)  # the exact type Spark checks: fields and list elements not null
    names = [target.field(i).name for i in range(target.num_fields)]
    for batch, _good, bad, predicted in _predictions(job, (pa.RecordBatch.from_struct_array(a) for a in arrays)):
        if bad.any():
            predicted = _spread_all(job, predicted, bad)
        mask = pa.array(bad) if job.handle_invalid == "skip" and bad.any() else None
        yield pa.StructArray.from_arrays(_added_columns(job, predicted), names=names, mask=mask).cast(target)


def _spread(values: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """``values`` of the good rows placed among ``len(bad)`` rows; the bad rows' values are NaN."""
    out = np.full((len(bad), *values.shape[1:]), np.nan, np.float32)
    out[~bad] = values
    return out


def batch_faults(batch: pa.RecordBatch, tensors) -> list[tuple[str, str, RowFaults]]:
    """What keeps each row of ``batch`` from being scored, per feature column:
    ``(column, its rule, RowFaults)``.

    A column alone filling an input must hold ``prod(shape)`` values per row; a sequence column
    steps of ``k`` values; columns assembled into one input must hold ``prod(shape)`` values
    together (reported under their names joined). No column may hold a null, a null element, a
    NaN or ±inf (a binary column: a null; its decoder's output is checked once decoded).

    Args:
        batch: the task's Arrow batch (the columns ``tensors`` name).
        tensors: the model inputs' :class:`~sparkdl.serialization.columns.TensorSpec`.
    """
    out = []
    for tensor in tensors:
        size = None if None in tuple(tensor.shape) else int(np.prod(tensor.shape, dtype=np.int64))
        if len(tensor.columns) == 1:
            c = tensor.columns[0]
            column = batch.column(c.name)
            if c.decoder:
                out.append((c.source, "a non-null value", row_faults(column)))
            elif c.ragged and len(tensor.shape) == 1:
                out.append((c.source, "values none of which is null, NaN or ±inf,", row_faults(column)))
            elif c.ragged:
                width = tensor.shape[1]
                out.append((c.source, f"steps of {width} values, none null, NaN or ±inf,", row_faults(column, width=width)))
            else:
                out.append((c.source, f"{size} values per row, none null, NaN or ±inf,", row_faults(column, size=size)))
            continue
        total, nulls = np.zeros(batch.num_rows, np.int64), np.zeros(batch.num_rows, bool)
        for c in tensor.columns:
            column = batch.column(c.name)
            found = row_faults(column)
            out.append((c.source, "values none of which is null, NaN or ±inf,", found))
            nulls |= found.null
            total += pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False) if pa.types.is_list(column.type) else 1
        if size is not None:
            assembled = RowFaults.none(batch.num_rows)
            assembled.size = (total != size) & ~nulls
            out.append((tensor.source, f"{size} values per row together", assembled))
    return out


def faulty_rows(faults: list[tuple[str, str, RowFaults]], rows: int) -> np.ndarray:
    """Which of a batch's ``rows`` any column of :func:`batch_faults` finds at fault (bool, shape ``(rows,)``)."""
    bad = np.zeros(rows, bool)
    for _, _, found in faults:
        bad |= found.any
    return bad


def partition_count(rest: Iterator[pa.RecordBatch], tensors, bad: int, rows: int) -> str:
    """The end of a task's error message: its partition's bad feature rows in all, counted over the
    batches after the first bad one (``rest``, read without scoring: the checks of
    :func:`batch_faults` alone), ``bad`` of ``rows`` in the batches up to it. Empty when the rest
    cannot be read (the first bad batch's own message is the error)."""
    try:
        for batch in rest:
            bad, rows = bad + int(faulty_rows(batch_faults(batch, tensors), batch.num_rows).sum()), rows + batch.num_rows
    except Exception:  # noqa: BLE001 - the bad batch found is what the task reports
        return ""
    return (f". This partition holds {bad} such rows of the {rows} it was given (counted without scoring from its first bad "
            f"batch on); checkFeatures=True counts them over the whole input before scoring")


def faults_message(faults: list[tuple[str, str, RowFaults]]) -> str:
    """The message of the faulty columns of :func:`batch_faults` (or of decoded arrays)."""
    parts = [f"column {source!r} must hold {rule} to be scored (handleInvalid='error'; 'skip' drops such rows, 'keep' "
             f"scores them as NaN). Received: {found.describe()}" for source, rule, found in faults if found.any.any()]
    return "; ".join(parts)


def _batch_shapes(batch: pa.RecordBatch, tensor: TensorSpec) -> TensorSpec:
    """``tensor`` with the shapes only a batch tells: a sequence padded to the batch's longest row,
    the widths of assembled columns (each constant in the batch, summing to the input's size).

    Raises:
        SchemaError: assembled columns of uneven or wrong widths, naming them.
    """
    first = tensor.columns[0]
    if first.ragged:
        lengths = pc.list_value_length(batch.column(first.name)).to_numpy(zero_copy_only=False) if batch.num_rows else np.zeros(0)
        steps = max(1, int(np.nanmax(lengths)) if len(lengths) else 1)
        shape = (steps, *tensor.shape[1:])
        return dataclasses.replace(tensor, shape=shape, columns=(dataclasses.replace(first, shape=shape),))
    if len(tensor.columns) == 1:
        return tensor
    parts, size = [], int(np.prod(tensor.shape, dtype=np.int64))
    for c in tensor.columns:
        column = batch.column(c.name)
        if pa.types.is_list(column.type) and batch.num_rows:
            lengths = set(pc.list_value_length(column).drop_null().to_pylist())
            if len(lengths) > 1:
                raise SchemaError(f"features column {c.source!r} must hold the same number of values in every row. Received lengths {sorted(lengths)}")
            width = lengths.pop() if lengths else 0
        else:
            width = 1 if not pa.types.is_list(column.type) else 0
        parts.append(dataclasses.replace(c, shape=(width,)))
    if batch.num_rows and sum(p.shape[0] for p in parts) != size:
        found = ", ".join(f"{p.source!r}: {p.shape[0]}" for p in parts)
        raise SchemaError(f"featuresCols for model input {tensor.name!r} must hold {size} values per row in all. Received {found}")
    return dataclasses.replace(tensor, columns=tuple(parts))


@dataclass
class _Shared:
    """One model's weights broadcast on one SparkContext, and the live specs scoring with it."""

    context: object  # the SparkContext
    broadcast: Broadcast
    # weak references to the ModelSpec objects (one is shared by a KerasModel and its copies) scored with it,
    # by identity: a reload is equal to the spec it came from, and either may outlive the other
    owners: list = dataclasses.field(default_factory=list)

    def add_owner(self, spec) -> None:
        self.owners = [ref for ref in self.owners if ref() is not None]
        if not any(ref() is spec for ref in self.owners):
            self.owners.append(weakref.ref(spec))

    def owned(self) -> bool:
        """Whether a spec scored with this broadcast is alive (dead references are dropped)."""
        self.owners = [ref for ref in self.owners if ref() is not None]
        return bool(self.owners)


_broadcasts: OrderedDict[tuple[int, str], _Shared] = OrderedDict()  # least recently used first
_RECENT = 8  # models whose broadcast stays whole after their KerasModel is gone (lazy DataFrames may still run)


def weights_broadcast(spark, spec: ModelSpec) -> Broadcast:
    """The Spark broadcast of ``spec``'s Arrow IPC weights: one per model digest and SparkContext.

    Every ``transform`` of a model, of its copies and of its reloads reuses it, so scoring leaves no
    temp file per call (PySpark turns a task closure over 1 MB into a broadcast it never deletes).
    The driver's copy (a temp file and block-manager pieces, the size of the weights) lives while
    a ``ModelSpec`` with that digest lives (a ``KerasModel`` or a copy of it holds one) or while the
    model is among the 8 most recently scored; past both it is destroyed at the next call, so a
    session that scores many models (a CrossValidator's folds, a hyperparameter search) holds the
    weights of its live models plus 8. The executors' copies of models past the 8 most recent are
    unpersisted (fetched again if used). A model scored again after its broadcast was destroyed gets
    a new one. Entries of stopped SparkContexts are dropped. On Spark Connect (no broadcast) the
    weights ride in the scoring plan's task closure instead (:func:`sparkdl.spark.session.share`).

    A DataFrame from ``transform`` reads the broadcast when it runs: keep its ``KerasModel`` while
    the DataFrame is used, or run it before 8 other models are scored (past that its job fails
    with Spark's "Attempted to use Broadcast ... after it was destroyed").

    Raises:
        ConfigError: on Spark Connect, weights too large for a Connect plan, naming the limit.
    """
    from sparkdl.spark.session import is_connect, share

    if is_connect(spark):
        return share(spark, spec.weights, "the model's weights")
    sc = spark.sparkContext
    for stale in [k for k, shared in _broadcasts.items() if context_stopped(shared.context)]:
        del _broadcasts[stale]  # a stopped SparkContext removed its broadcasts and temp files itself
    key = (id(sc), spec.digest)
    if key not in _broadcasts:
        _broadcasts[key] = _Shared(sc, sc.broadcast(spec.weights))
    _broadcasts[key].add_owner(spec)
    _broadcasts.move_to_end(key)
    _release_old()
    return _broadcasts[key].broadcast


def _release_old() -> None:
    """Past the :data:`_RECENT` most recently used models: destroy the broadcasts no live spec holds,
    unpersist the executors' copies of the others."""
    for key in list(_broadcasts)[:-_RECENT]:
        shared = _broadcasts[key]
        if shared.owned():
            shared.broadcast.unpersist()
        else:
            del _broadcasts[key]
            shared.broadcast.destroy()


def held_weight_broadcasts(spark) -> set[str]:
    """The digests (:attr:`ModelSpec.digest`) of the models whose weights broadcast ``transform``
    holds on ``spark``'s SparkContext now (empty on Spark Connect)."""
    from sparkdl.spark.session import is_connect

    if is_connect(spark):
        return set()
    sc = id(spark.sparkContext)
    return {digest for context, digest in _broadcasts if context == sc}


def _reads_as_is(df: DataFrame, column: str, dtype: str) -> bool:
    """Whether ``column`` is already ``array<T>`` of the Spark type T that model dtype ``dtype`` reads as."""
    data_type = df.schema[column].dataType
    element = SPARK_TYPES.get(read_dtype(df, column, dtype), T.FloatType())
    return isinstance(data_type, T.ArrayType) and data_type.elementType == element


def _has_null_element(values, data_type) -> Column:
    """Whether a non-null array row holds a null element, without a lambda on every row:
    ``array_contains`` is null exactly when the row holds a null and not the probe (-inf), and a
    row that holds -inf is checked element by element (``exists``). Three times faster than
    ``exists`` alone on 784-value rows; ``False`` for types that cannot hold null elements."""
    if isinstance(data_type, T.ArrayType) and not data_type.containsNull:
        return F.lit(False)
    contains = F.array_contains(values, F.lit(float("-inf")).cast(T.FloatType()))
    return F.when(contains.isNull(), True).when(contains, F.exists(values, lambda v: v.isNull())).otherwise(False)


def _has_value(values, element: T.DataType, value: float) -> Column:
    """Whether an array row holds ``value`` (NaN, +inf, -inf): ``array_contains`` compares NaN as
    equal to NaN, as Spark SQL does; null when the row holds nulls and not ``value`` (not counted)."""
    return F.array_contains(values, F.lit(value).cast(element))


def check_feature_rows(df: DataFrame, checks: list[tuple], count_rows: bool = True) -> None:
    """Count null, null-element, NaN, ±inf and wrongly sized feature rows of the whole input,
    every feature column in one job.

    The job runs Spark SQL expressions only (no Python workers). A column is left out where the
    schema already rules the errors out (a non-nullable integer column for a one-value input); the
    job is skipped for streaming DataFrames, without ``count_rows`` and when no column is left.

    Args:
        df: the DataFrame (positional column names).
        checks: per feature column ``(column, input_shape, input_dtype, source)``: its name in ``df``,
            the model input's per-row shape (None for a column assembled with others: no length
            rule), the dtype it is read as, and the user's name of the column, for messages.
        count_rows: run the counting job (``handleInvalid="error"``); False checks the schema only.

    Raises:
        SchemaError: naming the first bad column, the rule and the counts over all rows; or a
            numeric column for an input of several values (no job).
    """
    counters, rules = [F.count(F.lit(1)).alias("rows")], []
    for i, (features_col, input_shape, input_dtype, source) in enumerate(checks):
        size = None if input_shape is None else int(np.prod(input_shape, dtype=np.int64))
        field = df.schema[features_col]
        scalar = isinstance(field.dataType, (T.NumericType, T.BooleanType))
        if scalar and size not in (None, 1):
            raise SchemaError(
                f"features column {source!r} must hold {size} values per row (the model input shape "
                f"{tuple(input_shape)}); a numeric column holds one. Received: {field.dataType.simpleString()}"
            )
        floating = np.dtype(input_dtype).kind == "f" and not isinstance(field.dataType, (T.IntegralType, T.BooleanType))
        if (scalar and not field.nullable and not floating) or df.isStreaming or not count_rows:
            continue
        values = as_array(df, features_col, input_dtype)
        present = col(features_col).isNotNull()
        wrong = present & (F.size(values) != F.lit(size)) if size is not None else F.lit(False)
        counters += [
            F.count(F.when(~present, 1)).alias(f"nulls_{i}"),
            F.count(F.when(present & _has_null_element(values, field.dataType), 1)).alias(f"element_nulls_{i}"),
            F.count(F.when(wrong, 1)).alias(f"wrong_{i}"),
            F.min(F.when(wrong, F.size(values))).alias(f"shortest_{i}"),
            F.max(F.when(wrong, F.size(values))).alias(f"longest_{i}"),
        ]
        if floating:
            element = SPARK_TYPES.get(input_dtype, T.FloatType())
            infinite = _has_value(values, element, float("inf")) | _has_value(values, element, float("-inf"))
            counters += [F.count(F.when(present & _has_value(values, element, float("nan")), 1)).alias(f"nans_{i}"),
                         F.count(F.when(present & infinite, 1)).alias(f"infs_{i}")]
        else:
            counters += [F.lit(0).alias(f"nans_{i}"), F.lit(0).alias(f"infs_{i}")]
        rules.append((i, size, input_shape, source))
    if not rules:
        return
    counts = df.agg(*counters).first()
    for i, size, input_shape, source in rules:
        problems = []
        if counts[f"nulls_{i}"]:
            problems.append(f"{counts[f'nulls_{i}']} null rows")
        if counts[f"element_nulls_{i}"]:
            problems.append(f"{counts[f'element_nulls_{i}']} rows with null elements")
        if counts[f"wrong_{i}"]:
            lengths = sorted({counts[f"shortest_{i}"], counts[f"longest_{i}"]})
            problems.append(f"{counts[f'wrong_{i}']} rows of {' to '.join(map(str, lengths))} values")
        if counts[f"nans_{i}"]:
            problems.append(f"{counts[f'nans_{i}']} rows with NaN")
        if counts[f"infs_{i}"]:
            problems.append(f"{counts[f'infs_{i}']} rows with ±inf")
        if problems:
            rule = f"{size} non-null values per row (the model input shape {tuple(input_shape)})" if size is not None else "non-null values"
            raise SchemaError(
                f"features column {source!r} must hold {rule}, none NaN or ±inf, to be scored (handleInvalid='error'; "
                f"'skip' drops such rows, 'keep' scores them as NaN). Received, of {counts['rows']} rows: {', '.join(problems)}"
            )


def output_losses(spec: ModelSpec, loss) -> list[LossInfo]:
    """The loss of each output of a multi-output model, in output order: ``loss`` itself for every
    output, or its entry per output when ``loss`` is a list (output order) or a dict by output name
    (:func:`sparkdl.keras.losses.losses_for_outputs`).

    Raises:
        SchemaError: a list or dict that does not give one loss per output.
    """
    return losses_for_outputs(loss, [name for name, _ in spec.output_specs])


def output_probabilities(spec: ModelSpec, loss, task: str) -> list[tuple[LossInfo, str] | None]:
    """Per output of a multi-output model, ``(loss, task)`` when ``transform`` writes its probability
    column (a classifier output whose loss gives probabilities, :meth:`LossInfo.layout`), else None.

    Args:
        spec: the model.
        loss: one :class:`LossInfo` for every output, or one per output (see :func:`output_losses`).
        task: ``"classification"``, ``"regression"``, or ``"auto"`` (each output's loss family decides).
    """
    decided = []
    for info, (_, shape) in zip(output_losses(spec, loss), spec.output_specs, strict=True):
        output_task = info.infer_task(task)
        width = info.layout(output_task, int(np.prod(shape, dtype=np.int64))).probability_width
        decided.append((info, output_task) if width else None)
    return decided


def output_columns(spec: ModelSpec, output_cols) -> list[str]:
    """The column of each output of a multi-output model, in output order (each classifier output's
    probability column, ``<column>_<probabilityCol>``, comes from :func:`transform`).

    Raises:
        SchemaError: ``output_cols`` not naming every output exactly once (a list of another length,
            a dict with other keys).
    """
    names = [name for name, _ in spec.output_specs]
    if output_cols is None:
        return names
    if isinstance(output_cols, dict):
        if sorted(output_cols) != sorted(names):
            raise SchemaError(f"outputCols must map every model output by name: the outputs are {names}. Received: {sorted(output_cols)}")
        return [output_cols[name] for name in names]
    if len(output_cols) != len(names):
        raise SchemaError(f"outputCols must name one column per model output {names}. Received: {list(output_cols)}")
    return list(output_cols)


def transform(
    df: DataFrame,
    spec: ModelSpec,
    features_col: str,
    columns: OutputColumns,
    batch_size: int | None,
    task: str,
    loss: LossInfo,
    check_features: bool = False,
    features_cols=None,
    decoders: dict | None = None,
    output_cols=None,
    handle_invalid: str = "error",
    pad_value: float = 0.0,
    min_batch_size: int = 1,
) -> DataFrame:
    """The lazy DataFrame of ``df`` plus prediction columns; see the module docstring.

    Output columns: every input column, then ``columns.prediction`` (double; ``array<double>`` for a
    regressor with several outputs or a multi-label classifier's 0/1 decisions) and, for
    classifiers, ``columns.raw_prediction`` and ``columns.probability`` (DenseVector, or
    ``array<double>`` when ``columns.vectors`` is False) where :meth:`LossInfo.layout` has them.
    A model with several outputs gets one column per output instead, named after the output (or as
    ``output_cols`` says): its values, double (one value) or ``array<double>`` (as the model outputs
    them, flattened per row); each classifier output (decided per output by its loss, as for a
    single output: :meth:`LossInfo.layout`) is followed by its class probabilities in
    ``<column>_<columns.probability>`` (e.g. ``cls_probability``; DenseVector, or ``array<double>``
    when ``columns.vectors`` is False; none when ``columns.probability`` is empty), the values of a
    single output's ``probability`` column (softmax of logits, ``[1 - p, p]`` for one sigmoid).

    Args:
        df: the DataFrame to score.
        spec: the trained model.
        features_col: numeric, ``array<numeric>`` or vector column of ``prod(spec.input_shape)`` values.
        columns: names and type of the output columns.
        batch_size: rows per ``predict_on_batch`` call; None: each worker sizes it to its model's
            largest per-row tensor (:func:`~sparkdl.keras.predict.inference_rows`), at least
            ``min_batch_size`` rows.
        task: ``"classification"`` or ``"regression"`` (already inferred); for a multi-output model
            given one loss per output, ``"auto"`` lets each output's loss decide.
        loss: the loss family that turns outputs into columns; for a multi-output model also a list
            (output order) or dict (output name) of them, one per output.
        check_features: count bad feature rows over the whole input now (one Spark-SQL pass), or leave
            them to the scoring tasks (lazy, the default; the first bad batch raises ``SchemaError``).
        features_cols: the model inputs' columns as in ``fit`` (a list assembled into the one input,
            or a dict input name -> column(s)); None: ``features_col``. A sequence input's rows are
            padded with ``pad_value`` to the longest row of each Arrow batch.
        decoders: binary column -> a function or ``"module:function"``, as in ``fit``.
        output_cols: a multi-output model's output columns (a list in output order or a dict output
            name -> column); None: the outputs' names.
        handle_invalid: rows with a null, NaN, ±inf or wrongly sized feature: ``"error"`` (counted
            now with ``check_features``, else raised by the task that meets one), ``"skip"`` (left
            out of the output) or ``"keep"`` (kept, NaN in every added column).
        pad_value: the value that pads a sequence input's rows (``padValue``), after each row's
            values, to the longest row of each Arrow batch.

    Raises:
        SchemaError: a missing or mistyped features column, an output column that already exists
            (or two with one name), or, with ``check_features`` and ``"error"``, null, NaN, ±inf or
            wrongly sized feature rows (counted over the input, one aggregate job). Without
            ``check_features`` the scoring task that meets one raises it when an action runs (Spark
            reports it as the job's failure, a ``PythonException`` naming ``SchemaError``).
    """
    decoders = dict(decoders or {})
    mapping = map_inputs(df, spec, features_col, features_cols, decoders)
    check_pad_value(mapping, pad_value)
    multi_output = len(spec.output_specs) > 1
    probabilities = []
    if multi_output:
        layout, write_raw, write_probability = None, False, False
        probabilities = output_probabilities(spec, loss, task) if columns.probability else [None] * len(spec.output_specs)
        values = output_columns(spec, output_cols)
        added = []
        for name, probability in zip(values, probabilities, strict=True):
            added += [name] + [f"{name}_{columns.probability}"] * (probability is not None)
    else:
        outputs = int(np.prod(spec.output_shape, dtype=np.int64))
        layout: OutputLayout = loss.layout(task, outputs)
        write_raw = bool(layout.raw_width and columns.raw_prediction)
        write_probability = bool(layout.probability_width and columns.probability)
        added = [columns.prediction] + [columns.raw_prediction] * write_raw + [columns.probability] * write_probability
    for name in added:
        if name in df.columns or added.count(name) > 1:
            raise SchemaError(
                f"output column {name!r} must not exist in the input DataFrame nor be given twice"
                + (" (set outputCols to name each output's column)" if multi_output else "")
                + f". Received columns: {df.columns}, output columns: {added}"
            )
    fields = list(df.schema.fields)
    if multi_output:
        for name, (_, shape), probability in zip(values, spec.output_specs, probabilities, strict=True):
            wide = int(np.prod(shape, dtype=np.int64)) != 1
            fields.append(T.StructField(name, T.ArrayType(T.DoubleType(), containsNull=False) if wide else T.DoubleType(), nullable=False))
            if probability is not None:
                fields.append(T.StructField(f"{name}_{columns.probability}", _score_type(columns.vectors), nullable=False))
    else:
        prediction_type = T.DoubleType() if layout.prediction_width == 0 else T.ArrayType(T.DoubleType(), containsNull=False)
        fields.append(T.StructField(columns.prediction, prediction_type, nullable=False))
        fields += [T.StructField(name, _score_type(columns.vectors), nullable=False) for name in added[1:]]
    # Columns travel under positional names and get their own names back afterwards: mapInArrow
    # resolves input names as expressions (dots break) and matches output names (duplicates break).
    names = [f"_{i}" for i in range(len(fields))]
    positional = df.toDF(*names[: len(df.columns)])
    positional_decoders = {names[df.columns.index(c)]: shipped_decoder(d, c) for c, d in decoders.items()  # __main__'s by value
                           if c in df.columns and isinstance(df.schema[c].dataType, T.BinaryType)}
    exprs, tensors, checks = [], [], []
    for i, (name, shape, dtype, cols) in enumerate(mapping):
        parts = []
        for j, c in enumerate(cols):
            where = names[df.columns.index(c)]
            expr, part = input_column(positional, where, f"{_TMP_FEATURES}_{i}_{j}", tuple(shape), dtype, positional_decoders, pad_value)
            plain = not (part.decoder or part.ragged)
            part = dataclasses.replace(part, source=c, shape=(tuple(shape) if len(cols) == 1 else (-1,)) if plain else part.shape)
            if check_features and plain:
                checks.append((where, tuple(shape) if len(cols) == 1 else None, read_dtype(positional, where, dtype), c))
            if plain and _reads_as_is(positional, where, dtype):  # the column itself: not sent twice to Python
                part = dataclasses.replace(part, name=where)
            else:
                exprs.append(expr)
            parts.append(part)
        tensors.append(TensorSpec(name, tuple(shape), dtype, tuple(parts)))
    # one job for every feature column (none without checkFeatures, and no job unless bad rows are an error)
    check_feature_rows(positional, checks, count_rows=handle_invalid == "error")
    from sparkdl.keras.custom_objects import registered

    kept = len(df.columns)
    # the Arrow UDF returns scores as array<double>, made vectors by Spark's array_to_vector (an Arrow UDF's UDT
    # return type fails on a streaming DataFrame)
    added_type = T.StructType([T.StructField(name, _score_type(False) if isinstance(f.dataType, VectorUDT) else f.dataType, False)
                               for name, f in zip(names[kept:], fields[kept:], strict=True)])
    job = PredictSpec(
        spec=spec.architecture_only(),
        weights=weights_broadcast(df.sparkSession, spec),
        model_key=spec.digest,
        custom_objects=registered(),
        inputs=tuple(tensors),
        batch_size=batch_size,
        min_batch_size=min_batch_size,
        task=task,
        loss=loss,
        write_raw=write_raw,
        write_probability=write_probability,
        vectors=columns.vectors and not ARROW_UDF,
        output_names=tuple(names),
        multi_output=multi_output,
        output_probabilities=tuple(probabilities),
        handle_invalid=handle_invalid,
        echoed=kept,
        added_type=added_type,
    )
    with_features = positional.select("*", *exprs)
    scored = (_scored_by_udf if ARROW_UDF else _scored_by_map)(with_features, job, fields)
    return scored.toDF(*[f.name for f in fields])


def _scored_by_udf(with_features: DataFrame, job: PredictSpec, fields: list[T.StructField]) -> DataFrame:
    """pyspark 4.1+: the input's columns (positional names) and the added ones, scored by an
    iterator Arrow UDF (:func:`predict_arrays`) over a struct of the model's input columns alone."""
    names, kept = list(job.output_names), job.echoed
    needed = list(dict.fromkeys(part.name for t in job.inputs for part in t.columns))

    def score_arrays(arrays: Iterator[pa.Array]) -> Iterator[pa.Array]:  # its type hints make it an iterator UDF
        return predict_arrays(job, arrays)

    # nondeterministic for the optimizer: "skip"'s filter on its result is then not pushed below it as a second call
    score = F.arrow_udf(score_arrays, job.added_type).asNondeterministic()
    scored = with_features.select(*names[:kept], score(F.struct(*[col(n) for n in needed])).alias(_SCORED))
    if job.handle_invalid == "skip":
        scored = scored.where(F.col(_SCORED).isNotNull())
    added = [F.col(_SCORED).getField(n) for n in names[kept:]]
    added = [array_to_vector(a) if isinstance(f.dataType, VectorUDT) else a for a, f in zip(added, fields[kept:], strict=True)]
    return scored.select(*names[:kept], *[a.alias(n) for a, n in zip(added, names[kept:], strict=True)])


def _scored_by_map(with_features: DataFrame, job: PredictSpec, fields: list[T.StructField]) -> DataFrame:
    """pyspark 4.0: every column goes to Python (:func:`predict_partition`) and comes back with the added ones."""
    schema = T.StructType([T.StructField(name, f.dataType, f.nullable) for name, f in zip(job.output_names, fields, strict=True)])
    return with_features.mapInArrow(lambda batches: predict_partition(job, batches), schema)
