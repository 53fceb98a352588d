"""Executor-side task code of backend ``rounds``: train one round on a partition.

Each task receives plain values only (:class:`~sparkdl.spark.training.tasks.TaskSpec`,
:class:`RoundTask`): no DataFrame, no SparkSession, no live model; the master state arrives as
Arrow IPC bytes through a broadcast (or inlined in the plan on Spark Connect). A task loads the
master state into the replica its Python worker keeps for the fit
(:func:`~sparkdl.spark.training.tasks.replica_for`), seeds its random layers from (seed, epoch,
round, partition), runs its τ local steps and returns its update as rows of
:mod:`sparkdl.spark.backends.rounds.results`. Nothing here runs on the driver.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import TaskContext

from sparkdl.core.compression import QUANTIZED, encode_update, quantize_update
from sparkdl.core.pieces import split_state
from sparkdl.core.schedule import epoch_order
from sparkdl.core.state import ModelState, WorkerLocal
from sparkdl.errors import InvariantError
from sparkdl.serialization.arrow_codec import decode_arrays
from sparkdl.serialization.columns import PartitionArrays
from sparkdl.spark.backends.rounds.results import LOCAL, LOCAL_OPTIMIZER, RESIDUAL, chunk_batch, meta_row, piece_batch
from sparkdl.spark.partitions import Partition, load_partition, release, split_validation
from sparkdl.spark.training import worker_state
from sparkdl.spark.training.tasks import TaskSpec, evaluate_rows, hook_point, prepare_worker, replica_for, validation_columns

log = logging.getLogger("sparkdl")


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
    collect: bool = False
    local: object | None = None  # a Broadcast / Inline of {partition: (version, residual IPC, optimizer IPC)}
    validation_rows: tuple[int, ...] | None = None  # per partition, where the training data holds the validation rows too
    evaluate: object | None = None  # validate with the round: "start" (its start weights), or a Broadcast / Inline of weights IPC


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
        Record batches of :data:`~sparkdl.spark.backends.rounds.results.RESULT_SCHEMA`: one meta row
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
