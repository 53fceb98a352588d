"""Executor-side task code of a fit: train one round on a partition, evaluate a partition.

Each task receives plain values only (:class:`TaskSpec`, :class:`RoundTask`): no DataFrame, no
SparkSession, no live model; the master state arrives as Arrow IPC bytes through a broadcast (or
inlined in the plan on Spark Connect). A task loads the master state into the replica its Python
worker keeps for the fit (:func:`replica_for`), seeds its random layers from (seed, epoch, round,
partition), runs its τ local steps and returns its update as rows of
:mod:`sparkdl.spark.training.results`. Nothing here runs on the driver.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.pandas.types import from_arrow_schema

from sparkdl.core.compression import QUANTIZED, encode_update, quantize_update
from sparkdl.core.pieces import DEFAULT_PIECE_BYTES, split_state
from sparkdl.core.schedule import RoundPlan, epoch_order
from sparkdl.core.state import ModelState, WorkerLocal
from sparkdl.errors import InvariantError
from sparkdl.keras.runtime import keras_backend
from sparkdl.keras.spec import CompileSpec, ModelSpec
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays
from sparkdl.serialization.columns import ModelColumns, PartitionArrays
from sparkdl.spark.partitions import WORKER_CACHE, Partition, load_partition, release, split_validation
from sparkdl.spark.training import worker_state
from sparkdl.spark.training.faults import Point, TaskHooks
from sparkdl.spark.training.results import LOCAL, LOCAL_OPTIMIZER, RESIDUAL, chunk_batch, meta_row, piece_batch

log = logging.getLogger("sparkdl")


@dataclass(frozen=True)
class TaskSpec:
    """The fit's settings that travel to its tasks: plain values, no DataFrame, no weights.

    ``custom_objects`` are the driver's registered Keras objects (see
    :mod:`sparkdl.keras.custom_objects`); ``idle_s`` is how long a worker keeps this fit's cache
    without a round (seconds); ``canonical_order`` sorts each partition's rows by content when
    they came through the round-robin repartition (whose row order follows shuffle-fetch order);
    ``piece_bytes`` bounds one piece of an update (bytes); a partition over ``budget_bytes`` is
    kept on disk (:mod:`sparkdl.spark.partitions`); ``validation`` is how the validation data's
    columns are read, when there is validation data; ``compression`` how updates travel
    (:mod:`sparkdl.core.compression`); ``exact`` marks the weight arrays quantized updates send
    exactly (the non-trainable ones); ``hooks`` are fault-injection hooks
    (:mod:`sparkdl.spark.training.faults`; None in a production fit).
    """

    fit_id: str
    spec: ModelSpec
    compile_spec: CompileSpec
    columns: ModelColumns
    plan: RoundPlan
    batch_size: int
    seed: int
    shuffle: bool
    custom_objects: dict
    idle_s: float
    canonical_order: bool
    piece_bytes: int = DEFAULT_PIECE_BYTES
    budget_bytes: int = 2**62
    validation: ModelColumns | None = None
    compression: str | None = None
    threshold: float = 1e-3
    per_worker: bool = False
    mixed_precision: str | None = None  # the replicas' Keras dtype policy (FitConfig.mixed_precision)
    hooks: TaskHooks | None = None
    # the driver's Keras backend, set in each worker before Keras is imported (sparkdl.keras.runtime.configure)
    keras_backend: str = dataclasses.field(default_factory=keras_backend)


@dataclass(frozen=True)
class RoundTask:
    """One round's orders: where in the schedule it is (``index``: the fit's round count), the
    broadcast start state (``(weights, optimizer)`` Arrow IPC bytes, optimizer None for a fresh
    optimizer; with a per-worker mode one such pair per partition), for 1bit/threshold the round
    whose update the driver last applied per partition (``accepted``, -1: none), in a
    straggler-tolerant round the one partition this job trains (``only``), and whether the
    workers send their own state with their update (``collect``: a snapshot follows the round).
    ``local`` (a resumed fit's first round) holds per partition its own state, restored.
    ``validation_rows``: the validation rows of each partition where the cached training data
    holds them too (a task reading the data keeps its share); ``evaluate``: the task also
    evaluates these weights on its validation rows (an epoch's validation riding the next epoch's
    first round, :class:`~sparkdl.spark.training.loop.TrainingLoop`)."""

    epoch: int
    round_in_epoch: int
    last: bool
    state: object | None  # a Broadcast or a session.Inline: .value on the executors
    index: int = 0
    accepted: tuple[int, ...] = ()
    only: int | None = None
    learning_rate: float | None = None  # set by a driver callback: every replica trains the round with it
    release_only: bool = False  # a callback stopped the fit early: free this fit's cached rows, replica and state, train nothing
    collect: bool = False
    local: object | None = None  # a Broadcast / Inline of {partition: (version, residual IPC, optimizer IPC)}
    validation_rows: tuple[int, ...] | None = None  # per partition, where the training data holds the validation rows too
    evaluate: object | None = None  # validate with the round: "start" (its start weights), or a Broadcast / Inline of weights IPC


# ---- the replica a Python worker keeps -------------------------------------------------------

_REPLICAS: OrderedDict = OrderedDict()  # built replicas by (architecture, compile arguments), across fits
_MAX_REPLICAS = 2


def replica_for(task: TaskSpec):
    """The fit's replica in this Python worker. A replica built by an earlier fit of the same
    architecture and compile arguments is reused (building, compiling and tracing the train step
    costs 1-3 s per Python worker per fit) after ``Replica.reset`` puts every non-weight variable
    back to its build-time value (a loss scale, the optimizers' counters); every round overwrites
    its weights, optimizer state and seed-generator states, and each step resets its metrics, so it
    trains exactly as a new one.
    At most two are kept, least recently used dropped first. Not with registered custom objects:
    a class redefined in a notebook keeps its name, and the old compiled step would train."""
    from sparkdl.keras.replica import Replica

    replica = WORKER_CACHE.get(task.fit_id, "replica")
    if replica is None:
        if task.custom_objects:  # a redefined custom layer or loss keeps its name: never reuse then
            replica = Replica(task.spec, task.compile_spec, task.seed, task.mixed_precision)
        else:
            key = (task.spec.reuse_key, task.mixed_precision, task.compile_spec.reuse_key())
            replica = _REPLICAS.pop(key, None)
            if replica is not None:  # every variable back to its build-time value (a loss scale, custom state)
                replica.reset()
            else:
                replica = Replica(task.spec, task.compile_spec, task.seed, task.mixed_precision)
            _REPLICAS[key] = replica
            while len(_REPLICAS) > _MAX_REPLICAS:
                _REPLICAS.popitem(last=False)
        WORKER_CACHE.put(task.fit_id, "replica", replica)
    return replica


def warm_replica(spec: ModelSpec, compile_spec: CompileSpec, seed: int, mixed_precision: str | None,
                 row_specs: tuple | None = None, batch_size: int = 32) -> None:
    """Build the replica a fit's first task here would build (``spec``: the architecture only), into
    this Python worker's replica cache, where :func:`replica_for` finds it, and trace its train step
    on a batch of zeros (:meth:`~sparkdl.keras.replica.Replica.warm_step`; ``row_specs``: the rows'
    shapes and dtypes, None: not traced). Run by the data check tasks, so that the build
    overlaps the check (not for fits with registered custom objects, whose replicas are never reused)."""
    from sparkdl.keras.replica import Replica

    key = (spec.reuse_key, mixed_precision, compile_spec.reuse_key())
    if key not in _REPLICAS:
        replica = Replica(spec, compile_spec, seed, mixed_precision)
        if row_specs is not None:
            try:
                replica.warm_step(row_specs, batch_size)
            except Exception as exc:  # noqa: BLE001 - e.g. a loss that refuses zeros: the first step traces it instead
                log.debug("sparkdl: the replica's warm-up step failed: %s", exc)
        _REPLICAS[key] = replica
    _REPLICAS.move_to_end(key)
    while len(_REPLICAS) > _MAX_REPLICAS:
        _REPLICAS.popitem(last=False)


def prepare_worker(context, task: TaskSpec) -> None:
    """Set up this Python worker for a task of ``task``'s fit: Keras' backend, thread pools and GPU
    from the task's resources, the custom objects, the cache's idle time."""
    from sparkdl.keras import runtime

    runtime.configure(context.cpus(), context.resources(), task.keras_backend)
    from sparkdl.keras.custom_objects import register

    register(task.custom_objects)
    WORKER_CACHE.idle_s = task.idle_s


def hook_point(task: TaskSpec, partition: int, epoch: int, round_in_epoch: int, index: int, attempt: int) -> None:
    """Call the fit's fault-injection hooks before a slot's steps (nothing in a production fit)."""
    if task.hooks is not None:
        task.hooks.before_steps(Point(partition, epoch, round_in_epoch, index, attempt))


# ---- a worker's own state (1bit / threshold) --------------------------------------------------


def own_state(task: TaskSpec, round_task: RoundTask, partition: int) -> tuple[WorkerLocal | None, bool]:
    """This partition's own state (residual, optimizer state) as of the round the driver last
    applied from it: restored by a resumed fit, else from this Python worker or this executor's
    disk. Returns ``(state or None, reset)``: ``reset`` when the driver applied an update of this
    partition but its state was found nowhere (a lost executor): the worker starts afresh."""
    version = round_task.accepted[partition] if partition < len(round_task.accepted) else -1
    restored = round_task.local.value.get(partition) if round_task.local is not None else None
    if restored is not None and restored[0] == version:
        residual, optimizer = (decode_arrays(b).arrays if b is not None else None for b in restored[1:])
        return WorkerLocal(version, residual, optimizer), False
    if version < 0:
        return None, False
    local = worker_state.load(task.fit_id, partition, version)
    return local, local is None


def _local_pieces(local: WorkerLocal, piece_bytes: int):
    residual = split_state(ModelState(list(local.residual or [])), piece_bytes)
    optimizer = split_state(ModelState(list(local.optimizer or [])), piece_bytes)
    for piece in residual:
        if local.residual:
            yield dataclasses.replace(piece, group=RESIDUAL)
    for piece in optimizer:
        if local.optimizer:
            yield dataclasses.replace(piece, group=LOCAL_OPTIMIZER)


# ---- train one round -------------------------------------------------------------------------


def train_partition(task: TaskSpec, round_task: RoundTask, batches: Iterator[pa.RecordBatch], from_data: bool) -> Iterator[pa.RecordBatch]:
    """Run one worker's share of a round on its partition and yield its update as Arrow rows.

    Args:
        task: the fit's plain-value settings.
        round_task: schedule position and the broadcast master state.
        batches: the partition's rows (feature column ``array<T>``, label column) when
            ``from_data``; otherwise a one-byte column of the same cached partition, drained unread:
            the rows come from this worker's cache or this executor's disk copy.
        from_data: whether ``batches`` is the cached training data.

    Yields:
        Record batches of :data:`~sparkdl.spark.training.results.RESULT_SCHEMA`: one meta row
        (rows and steps trained, the partition's row count, the metric variable sums; ``missing``
        when the partition was in neither cache), then the weights and optimizer state as pieces
        of at most ``task.piece_bytes`` bytes (none when no row was trained), or a quantized
        payload's chunks; in a collected round, the worker's own state.

    Raises:
        InvariantError: the partition does not hold the rows the driver counted for it.
    """
    context = TaskContext.get()
    partition = context.partitionId()
    if round_task.only is not None and partition != round_task.only:  # a straggler-tolerant round: one job per partition
        for _ in batches:
            pass
        return
    if round_task.release_only:  # what the fit's last round and last validation would have freed
        for _ in batches:
            pass
        worker_state.drop(task.fit_id, partition)
        release(task.fit_id, "train", partition)
        release(task.fit_id, "val", partition)
        WORKER_CACHE.release(task.fit_id)  # this Python worker may hold other partitions' copies too: the fit is over
        return
    prepare_worker(context, task)
    plan = task.plan
    expected = plan.partition_rows[partition] if partition < len(plan.partition_rows) else 0
    if not from_data:
        for _ in batches:  # the placeholder column; an unread input stops Spark reusing this Python worker
            pass
    kept: list = []
    if from_data and round_task.validation_rows:
        batches = split_validation(batches, kept)
    try:
        data = load_partition(task.fit_id, "train", partition, task.columns, batches if from_data else None, expected,
                              task.budget_bytes, task.canonical_order)
    except InvariantError:
        release(task.fit_id, "train", partition)
        raise
    if data is None and expected == 0:  # nothing to find: an empty partition needs no data
        data = Partition(PartitionArrays.empty(task.columns))
    val_rows = round_task.validation_rows[partition] if round_task.validation_rows else 0
    validation = None
    if val_rows and (from_data or round_task.evaluate is not None):  # kept on the executor's disk for the rounds that validate
        validation = load_partition(task.fit_id, "val", partition, validation_columns(task), iter(kept) if from_data else None,
                                    val_rows, task.budget_bytes, True)
        if validation is not None and len(validation) != val_rows:
            release(task.fit_id, "val", partition)
            raise InvariantError(f"validation partition {partition} must hold the {val_rows} rows counted. Received: {len(validation)}")
    del kept
    if data is None or (round_task.evaluate is not None and val_rows and validation is None):
        yield meta_row(partition, 0, expected, 0, missing=True)
        return
    if len(data) != expected:
        release(task.fit_id, "train", partition)
        raise InvariantError(
            f"partition {partition} must hold the {expected} rows counted before training. Received: {len(data)} rows "
            "(the cached training data changed; is the input non-deterministic?)"
        )
    quantized = task.compression in QUANTIZED
    begin, stop = plan.row_range(partition, round_task.round_in_epoch) if expected else (0, 0)
    local, reset = own_state(task, round_task, partition) if quantized and (stop > begin or round_task.collect) else (None, False)
    rows, steps, metrics, pieces, payload, nbytes = 0, 0, None, (), b"", 0
    if stop > begin:
        replica = replica_for(task)
        value = round_task.state.value  # read once per Python worker per round (PySpark keeps it)
        weights, optimizer = value[partition] if task.per_worker else value
        start = ModelState(decode_arrays(weights, copy=False).arrays, decode_arrays(optimizer, copy=False).arrays if optimizer is not None else None)
        if quantized:  # the optimizer state stays on the worker: its own, else the master's
            own_optimizer = local.optimizer if local is not None and local.optimizer is not None else start.optimizer
            replica.set_state(ModelState(start.weights, own_optimizer))
        else:
            replica.set_state(start)
        if round_task.learning_rate is not None:
            replica.set_learning_rate(round_task.learning_rate)
        replica.seed_round(task.seed, round_task.epoch, round_task.round_in_epoch, partition)
        order = epoch_order(expected, task.seed, round_task.epoch, partition, task.shuffle)[begin:stop]
        hook_point(task, partition, round_task.epoch, round_task.round_in_epoch, round_task.index, context.attemptNumber())
        arrays = data.arrays
        metrics = replica.train(arrays.x, arrays.y, task.batch_size, sample_weight=arrays.w, rows=data.rows(order),
                                pads=task.columns.input_pads)
        rows, steps = int(stop) - int(begin), -(-(int(stop) - int(begin)) // task.batch_size)
        state = replica.get_state()
        if quantized:
            payload, residual = quantize_update(state.weights, start.weights, local.residual if local is not None else None,
                                                task.compression, task.threshold, exact=[not t for t in replica.trainable])
            local = WorkerLocal(round_task.index, [np.asarray(r) for r in residual], list(state.optimizer))
            worker_state.save(task.fit_id, partition, local)
            nbytes = len(payload)
        else:
            update = encode_update(state, start, task.compression) if task.compression else state
            pieces = list(split_state(update, task.piece_bytes))
            nbytes = sum(len(piece.values) for piece in pieces)
    evaluated = None
    if round_task.evaluate is not None:  # the master of the epoch before, on this partition's validation rows
        if val_rows:
            weights = round_task.state.value[0] if round_task.evaluate == "start" else round_task.evaluate.value
            evaluated = (val_rows, evaluate_rows(task, replica_for(task), validation, decode_arrays(weights, copy=False).arrays))
        else:
            evaluated = (0, None)
    collect = round_task.collect and local is not None
    if round_task.last:
        worker_state.drop(task.fit_id, partition)
        release(task.fit_id, "val", partition)  # (the last validation's job reads its rows again)
        release(task.fit_id, "train", partition)
    yield meta_row(partition, rows, expected, steps, metrics=metrics, nbytes=nbytes, local_reset=reset,
                   version=local.version if collect else None, validation=evaluated)
    for index, piece in enumerate(pieces):
        yield piece_batch(partition, rows, index, piece)
    for offset in range(0, len(payload), task.piece_bytes):
        yield chunk_batch(partition, rows, offset, payload[offset : offset + task.piece_bytes])
    if collect:
        for piece in _local_pieces(local, task.piece_bytes):
            yield piece_batch(partition, rows, LOCAL, piece)


# ---- evaluate a partition --------------------------------------------------------------------

VALIDATION_SCHEMA = pa.schema([("partition", pa.int32()), ("rows", pa.int64()), ("payload", pa.binary())])
VALIDATION_SPARK_SCHEMA = from_arrow_schema(VALIDATION_SCHEMA)


def evaluate_rows(task: TaskSpec, replica, data: Partition, weights: list[np.ndarray]) -> list[np.ndarray]:
    """``weights`` evaluated on a validation partition's rows (``data``, in their content order) by
    ``replica``: the summed metric variables of ``test_on_batch`` over its batches (exact when
    summed across partitions). Rows are weighted by the sample-weight column, if any, never by
    ``class_weight``. The replica keeps ``weights`` (a round sets its whole state again)."""
    replica.set_state(ModelState(weights, None))
    arrays = data.arrays
    order = data.rows(np.arange(len(data))) if data.base is not None else None  # on disk or in memory: ordered through base
    return replica.evaluate(arrays.x, arrays.y, task.batch_size, sample_weight=arrays.w, rows=order, pads=task.validation.input_pads)


def validation_columns(task: TaskSpec) -> ModelColumns:
    """How a task reads the validation rows: the fit's validation columns without ``class_weight``
    (Keras applies it to training rows only)."""
    return dataclasses.replace(task.validation, class_weight=None)


def evaluate_partition(task: TaskSpec, rows: tuple[int, ...], weights, last: bool,
                       batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Evaluate the master weights on one validation partition: the loss and compiled metrics of
    ``test_on_batch`` over its rows in batches, as summed metric variables (exact when summed
    across partitions), in one row ``(partition, rows, payload)``; ``payload`` null for no rows.
    The rows are put in an order defined by their values (they came through a round-robin
    repartition, in shuffle-fetch order), so the batches, and the metrics that depend on them
    (a multi-output model's per-output losses are means of batch means in Keras), are the same
    in every run. ``weights`` is the master weights' Arrow IPC bytes as ``.value`` (a broadcast,
    or inlined on Spark Connect). Rows are weighted by the sample-weight column, if any, never by ``class_weight``
    (Keras applies ``class_weight`` to training rows only).

    Raises:
        InvariantError: the partition does not hold the rows counted for it.
    """
    context = TaskContext.get()
    prepare_worker(context, task)
    partition = context.partitionId()
    expected = rows[partition] if partition < len(rows) else 0
    data = load_partition(task.fit_id, "val", partition, validation_columns(task), batches, expected, task.budget_bytes, True, share=False)
    if len(data) != expected:
        release(task.fit_id, "val", partition)
        raise InvariantError(f"validation partition {partition} must hold the {expected} rows counted. Received: {len(data)}")
    payload = None
    if expected:
        payload = encode_arrays(evaluate_rows(task, replica_for(task), data, decode_arrays(weights.value, copy=False).arrays))
    if last:
        release(task.fit_id, "val", partition)
    yield pa.RecordBatch.from_pylist([{"partition": partition, "rows": expected, "payload": payload}],
                                     schema=VALIDATION_SCHEMA)
