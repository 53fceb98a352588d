"""Backend ``rounds``: synchronous rounds, one Spark job each (SparkNet, Moritz et al. 2016).

Per round the driver encodes the master state as Arrow IPC bytes and sends it once as a Spark
broadcast (torrent-distributed, destroyed when the round ends); the task closure carries only
plain settings (:class:`TaskSpec`, :class:`RoundTask`). On Spark Connect, which has no broadcast,
the bytes ride in the round's task closure instead, inside the plan (:func:`sparkdl.spark.session.share`;
the fit is refused before any job when they cannot fit Connect's message limit). Each task loads the master state into the
replica its Python worker keeps for the fit, seeds its random layers from (seed, epoch, round,
partition), runs its τ local steps and returns one meta row (rows, steps, metric variables) and
its weights and optimizer state cut into pieces of at most 16 MiB (:mod:`sparkdl.core.pieces`), so
no value nears Arrow's or the JVM's 2 GiB limit whatever the model's size.

- **Reduction**: with more than two workers and updates over 64 MiB in all, or when
  ``spark.driver.maxResultSize`` would not hold every update, a second stage
  (``groupBy("piece").applyInArrow``) combines each piece across workers on the executors, so the
  driver receives one combined update per round whatever ``numWorkers`` is; otherwise the driver
  combines the pieces as they come (a second stage costs about 0.1 s a round). Either way the mode
  policy receives the row-weighted mean and the rows behind it.
- **Data read once**: the first round runs over the cached training data; each task converts its
  partition once, keeps it in its Python worker's cache and on its executor's disk (Spark's
  per-application directory). Later rounds run over one literal byte column of the cached data
  (the cache's locality places each task where its copies are); a task whose partition is in neither copy (a new Python worker on another executor, a
  lost executor) reports it missing and the driver runs that round again over the cached data,
  with the same result. The last round releases the partitions.
- **Invariants**, checked on the driver: one update per partition, each partition still holding
  the rows counted, rows trained per epoch equal to rows counted, finite master weights. A failed
  task is retried by Spark like any other; it never touches the master state, which only changes
  once a whole round has returned. Works with dynamic allocation: no barrier, no server.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import shutil
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import functions as F

from sparkdl.core.compression import QUANTIZED, decode_mean, dequantize, encode_update
from sparkdl.core.metrics import MetricSums, append_epoch
from sparkdl.core.modes import ModePolicy, row_weighted_mean
from sparkdl.core.schedule import RoundPlan, epoch_order
from sparkdl.core.pieces import DEFAULT_PIECE_BYTES, Piece, PieceMean, assemble, split_state
from sparkdl.core.state import ModelState, WorkerUpdate
from sparkdl.errors import ConfigError, FitCancelledError, InvariantError
from sparkdl.keras.runtime import keras_backend
from sparkdl.keras.spec import CompileSpec, ModelSpec
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays
from sparkdl.serialization.columns import ModelColumns, PartitionArrays
from sparkdl.spark.backends.base import FitResult, TrainJob
from sparkdl.spark.partitions import WORKER_CACHE, Partition, load_partition, release, spill_dir
from sparkdl.spark.jobs import run_job
from sparkdl.spark.session import cancel_tag, conf_size, share

RESULT_DDL = (
    "partition int, piece int, rows bigint, partition_rows bigint, steps bigint, missing boolean, "
    "grp int, arr int, offset bigint, shape string, dtype string, payload binary, nbytes bigint, local_reset boolean"
)
RESULT_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),  # the worker's partition
        ("piece", pa.int32()),  # -1: the worker's meta row; >= 0: the piece's index, the reduction key
        ("rows", pa.int64()),  # rows trained (meta and pieces alike: the piece's weight)
        ("partition_rows", pa.int64()),  # meta: rows the partition holds
        ("steps", pa.int64()),  # meta: local steps run
        ("missing", pa.bool_()),  # meta: the partition was not in this worker's cache (nothing trained)
        ("grp", pa.int32()),  # piece: 0 weights, 1 optimizer state
        ("arr", pa.int32()),  # piece: array index in its group
        ("offset", pa.int64()),  # piece: first element
        ("shape", pa.string()),  # piece: the whole array's shape, JSON
        ("dtype", pa.string()),  # piece: numpy dtype.str
        ("payload", pa.binary()),  # piece: raw values; meta: Arrow IPC of the metric variable sums
        ("nbytes", pa.int64()),  # meta: bytes of the worker's update pieces (what it sends)
        ("local_reset", pa.bool_()),  # meta: 1bit/threshold: the worker's residual and optimizer state were not found
    ]
)
META = -1
COMPRESSED = -2  # a quantized update's bytes (1bit, threshold): ``offset`` is the chunk's first byte

# Rounds whose updates (workers x state bytes) exceed this, with more than two workers, are combined
# on the executors; smaller ones come to the driver as they are (a second stage costs ~0.1 s).
EXECUTOR_REDUCE_MIN_BYTES = 64 * 2**20
PIECE_BYTES = DEFAULT_PIECE_BYTES


@dataclass(frozen=True)
class TaskSpec:
    """The part of a :class:`TrainJob` that travels to the tasks: plain values, no DataFrame, no weights.

    ``custom_objects`` are the driver's registered Keras objects (see
    :mod:`sparkdl.keras.custom_objects`); ``idle_s`` is how long a worker keeps this fit's cache
    without a round (seconds); ``canonical_order`` sorts each partition's rows by content when
    they came through the round-robin repartition (whose row order follows shuffle-fetch order);
    ``piece_bytes`` bounds one piece of an update (bytes); a partition over ``budget_bytes`` is
    kept on disk (:mod:`sparkdl.spark.partitions`); ``validation`` is how the validation data's
    columns are read, when there is validation data; ``compression`` (``"fp16"`` or None) how
    updates travel (:mod:`sparkdl.core.compression`).
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
    # the driver's Keras backend, set in each worker before Keras is imported (sparkdl.keras.runtime.configure)
    keras_backend: str = dataclasses.field(default_factory=keras_backend)


@dataclass(frozen=True)
class RoundTask:
    """One round's orders: where in the schedule it is (``index``: the fit's round count), the
    broadcast start state (``(weights, optimizer)`` Arrow IPC bytes, optimizer None for a fresh
    optimizer; with a per-worker mode one such pair per partition), for 1bit/threshold the round
    whose update the driver last applied per partition (``accepted``, -1: none), and in a
    straggler-tolerant round the one partition this job trains (``only``)."""

    epoch: int
    round_in_epoch: int
    last: bool
    state: object | None  # a Broadcast or a session.Inline: .value on the executors
    index: int = 0
    accepted: tuple[int, ...] = ()
    only: int | None = None
    learning_rate: float | None = None  # set by a driver callback: every replica trains the round with it
    release_only: bool = False  # a callback stopped the fit early: free this fit's cached rows, replica and state, train nothing


# ---- executor side ---------------------------------------------------------------------------

_REPLICAS: OrderedDict = OrderedDict()  # built replicas by (architecture, compile arguments), across fits
_MAX_REPLICAS = 2


def _replica(task: TaskSpec):
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
            key = (task.spec.digest, task.mixed_precision, json.dumps(dataclasses.asdict(task.compile_spec), sort_keys=True, default=repr))
            replica = _REPLICAS.pop(key, None)
            if replica is not None:
                replica.reset()  # an earlier fit's: its loss scale and counters back to their build-time values
            else:
                replica = Replica(task.spec, task.compile_spec, task.seed, task.mixed_precision)
            _REPLICAS[key] = replica
            while len(_REPLICAS) > _MAX_REPLICAS:
                _REPLICAS.popitem(last=False)
        WORKER_CACHE.put(task.fit_id, "replica", replica)
    return replica


def _meta_row(partition: int, rows: int, partition_rows: int, steps: int, missing: bool = False, metrics=None, nbytes: int = 0,
              local_reset: bool = False) -> dict:
    return {
        "partition": partition, "piece": META, "rows": rows, "partition_rows": partition_rows, "steps": steps,
        "missing": missing, "payload": encode_arrays(metrics) if metrics is not None else None, "nbytes": nbytes,
        "local_reset": local_reset,
    }


def _chunk_batch(partition: int, rows: int, offset: int, chunk: bytes) -> pa.RecordBatch:
    """One chunk of a quantized update as a one-row batch of :data:`RESULT_SCHEMA`."""
    return pa.RecordBatch.from_pylist(
        [{"partition": partition, "piece": COMPRESSED, "rows": rows, "offset": offset, "payload": chunk}], schema=RESULT_SCHEMA
    )


def _quantized_update(task: TaskSpec, round_task: RoundTask, partition: int, replica, start: ModelState):
    """Train-side half of 1bit/threshold: load this partition's residual and optimizer state (the
    version the driver last applied), set the replica; returns ``(local_reset, finish)`` where ``finish(state)`` quantizes the update, saves the new residual and optimizer state as
    this round's version and returns the payload."""
    from sparkdl.core.compression import quantize_update
    from sparkdl.spark import worker_state

    n = len(start.weights)
    version = round_task.accepted[partition] if partition < len(round_task.accepted) else -1
    local = worker_state.load(task.fit_id, partition, version) if version >= 0 else None
    residual, optimizer = (local[:n], local[n:]) if local is not None else (None, start.optimizer)
    replica.set_state(ModelState(start.weights, optimizer))

    def finish(state: ModelState) -> bytes:
        payload, new_residual = quantize_update(state.weights, start.weights, residual, task.compression, task.threshold,
                                                exact=[not t for t in replica.trainable])
        worker_state.save(task.fit_id, partition, round_task.index, [np.asarray(r) for r in new_residual] + list(state.optimizer))
        return payload

    return version >= 0 and local is None, finish


def _piece_batch(partition: int, rows: int, index: int, piece: Piece) -> pa.RecordBatch:
    """One piece as a one-row batch of :data:`RESULT_SCHEMA`, its payload the array's own memory."""
    data = pa.py_buffer(piece.values)
    payload = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(np.array([0, data.size], np.int32)), data])
    columns = [
        pa.array([partition], pa.int32()), pa.array([index], pa.int32()), pa.array([rows], pa.int64()),
        pa.nulls(1, pa.int64()), pa.nulls(1, pa.int64()), pa.nulls(1, pa.bool_()),
        pa.array([piece.group], pa.int32()), pa.array([piece.array], pa.int32()), pa.array([piece.offset], pa.int64()),
        pa.array([piece.shape_json], pa.string()), pa.array([piece.dtype], pa.string()), payload, pa.nulls(1, pa.int64()),
        pa.nulls(1, pa.bool_()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=RESULT_SCHEMA)


def train_partition(
    task: TaskSpec, round_task: RoundTask, batches: Iterator[pa.RecordBatch], from_data: bool
) -> Iterator[pa.RecordBatch]:
    """Run one worker's share of a round on its partition and yield its update as Arrow rows.

    Args:
        task: the fit's plain-value settings.
        round_task: schedule position and the broadcast master state.
        batches: the partition's rows (feature column ``array<T>``, label column) when
            ``from_data``; otherwise a one-byte column of the same cached partition, drained unread:
            the rows come from this worker's cache or this executor's disk copy.
        from_data: whether ``batches`` is the cached training data.

    Yields:
        Record batches of :data:`RESULT_SCHEMA`: one meta row (rows and steps trained, the
        partition's row count, the metric variable sums; ``missing`` when the partition was in
        neither cache), then the weights and optimizer state as pieces of at most
        ``task.piece_bytes`` bytes (none when no row was trained).

    Raises:
        InvariantError: the partition does not hold the rows the driver counted for it.
    """
    from sparkdl.keras import runtime

    context = TaskContext.get()
    partition = context.partitionId()
    if round_task.only is not None and partition != round_task.only:  # a straggler-tolerant round: one job per partition
        for _ in batches:
            pass
        return
    if round_task.release_only:  # what the fit's last round and last validation would have freed
        for _ in batches:
            pass
        if task.compression in QUANTIZED:
            from sparkdl.spark import worker_state

            worker_state.drop(task.fit_id, partition)
        release(task.fit_id, "train", partition)
        release(task.fit_id, "val", partition)
        WORKER_CACHE.release(task.fit_id)  # this Python worker may hold other partitions' copies too: the fit is over
        return
    runtime.configure(context.cpus(), context.resources(), task.keras_backend)
    from sparkdl.keras.custom_objects import register

    register(task.custom_objects)
    WORKER_CACHE.idle_s = task.idle_s
    plan = task.plan
    expected = plan.partition_rows[partition] if partition < len(plan.partition_rows) else 0
    if not from_data:
        for _ in batches:  # the placeholder column; an unread input stops Spark reusing this Python worker
            pass
    try:
        data = load_partition(task.fit_id, "train", partition, task.columns, batches if from_data else None, expected,
                              task.budget_bytes, task.canonical_order)
    except InvariantError:
        release(task.fit_id, "train", partition)
        raise
    if data is None and expected == 0:  # nothing to find: an empty partition needs no data
        data = Partition(PartitionArrays.empty(task.columns))
    if data is None:
        yield pa.RecordBatch.from_pylist([_meta_row(partition, 0, expected, 0, missing=True)], schema=RESULT_SCHEMA)
        return
    if len(data) != expected:
        release(task.fit_id, "train", partition)
        raise InvariantError(
            f"partition {partition} must hold the {expected} rows counted before training. Received: {len(data)} rows "
            "(the cached training data changed; is the input non-deterministic?)"
        )
    begin, stop = plan.row_range(partition, round_task.round_in_epoch) if expected else (0, 0)
    if stop <= begin:
        meta, pieces = _meta_row(partition, 0, expected, 0), ()
    else:
        replica = _replica(task)
        value = round_task.state.value  # read once per Python worker per round (PySpark keeps it)
        weights, optimizer = value[partition] if task.per_worker else value
        start = ModelState(decode_arrays(weights, copy=False).arrays, decode_arrays(optimizer, copy=False).arrays if optimizer is not None else None)
        quantized = task.compression in QUANTIZED
        local_reset, finish = _quantized_update(task, round_task, partition, replica, start) if quantized else (False, None)
        if not quantized:
            replica.set_state(start)
        if round_task.learning_rate is not None:
            replica.set_learning_rate(round_task.learning_rate)
        replica.seed_round(task.seed, round_task.epoch, round_task.round_in_epoch, partition)
        order = epoch_order(expected, task.seed, round_task.epoch, partition, task.shuffle)[begin:stop]
        arrays = data.arrays
        _test_delay(context, partition)
        metrics = replica.train(arrays.x, arrays.y, task.batch_size, sample_weight=arrays.w, rows=data.rows(order))
        rows = int(stop) - int(begin)
        state = replica.get_state()
        if quantized:
            payload = finish(state)
            pieces, nbytes = (), len(payload)
        else:
            update = encode_update(state, start, task.compression) if task.compression else state
            pieces = list(split_state(update, task.piece_bytes))
            nbytes = sum(len(piece.values) for piece in pieces)
        meta = _meta_row(partition, rows, expected, -(-rows // task.batch_size), metrics=metrics, nbytes=nbytes, local_reset=local_reset)
    if round_task.last:
        if task.compression in QUANTIZED:
            from sparkdl.spark import worker_state

            worker_state.drop(task.fit_id, partition)
        release(task.fit_id, "train", partition)
    yield pa.RecordBatch.from_pylist([meta], schema=RESULT_SCHEMA)
    for index, piece in enumerate(pieces):
        yield _piece_batch(partition, meta["rows"], index, piece)
    if meta["rows"] and task.compression in QUANTIZED:
        for offset in range(0, len(payload), task.piece_bytes):
            yield _chunk_batch(partition, meta["rows"], offset, payload[offset : offset + task.piece_bytes])


TEST_DELAY_PROPERTY = "sparkdl.test.slowPartition"


def _test_delay(context, partition: int) -> None:
    """A test hook: the job's local property ``sparkdl.test.slowPartition`` = ``"p:seconds"`` makes
    partition p sleep that long before its local steps (a straggler)."""
    value = context.getLocalProperty(TEST_DELAY_PROPERTY)
    if value:
        slow, seconds = value.split(":")
        if int(slow) == partition:
            time.sleep(float(seconds))


VALIDATION_DDL = "partition int, rows bigint, payload binary"


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
    from sparkdl.keras import runtime

    context = TaskContext.get()
    runtime.configure(context.cpus(), context.resources(), task.keras_backend)
    from sparkdl.keras.custom_objects import register

    register(task.custom_objects)
    WORKER_CACHE.idle_s = task.idle_s
    partition = context.partitionId()
    expected = rows[partition] if partition < len(rows) else 0
    columns = dataclasses.replace(task.validation, class_weight=None)
    data = load_partition(task.fit_id, "val", partition, columns, batches, expected, task.budget_bytes, True, share=False)
    if len(data) != expected:
        release(task.fit_id, "val", partition)
        raise InvariantError(f"validation partition {partition} must hold the {expected} rows counted. Received: {len(data)}")
    payload = None
    if expected:
        replica = _replica(task)
        replica.set_state(ModelState(decode_arrays(weights.value, copy=False).arrays, None))
        arrays = data.arrays
        order = data.rows(np.arange(expected)) if data.base is not None else None  # on disk or in memory: ordered through base
        payload = encode_arrays(replica.evaluate(arrays.x, arrays.y, task.batch_size, sample_weight=arrays.w, rows=order))
    if last:
        release(task.fit_id, "val", partition)
    yield pa.RecordBatch.from_pylist([{"partition": partition, "rows": expected, "payload": payload}],
                                     schema=pa.schema([("partition", pa.int32()), ("rows", pa.int64()), ("payload", pa.binary())]))


def _pieces_of(table: pa.Table) -> Iterator[tuple[Piece, int]]:
    """``(piece, rows)`` for each piece row of ``table``, payloads read without a copy."""
    columns = {name: table.column(name).to_pylist() for name in ("piece", "grp", "arr", "offset", "shape", "dtype", "rows")}
    payloads = table.column("payload")
    for i, kind in enumerate(columns["piece"]):
        if kind == META:
            continue
        values = payloads[i].as_buffer()
        piece = Piece(columns["grp"][i], columns["arr"][i], columns["offset"][i], tuple(json.loads(columns["shape"][i])),
                      columns["dtype"][i], values if values is not None else b"")
        yield piece, columns["rows"][i]


def _meta_rows(table: pa.Table) -> pa.Table:
    """The meta rows of ``table`` (``piece == META``)."""
    return table.take(np.flatnonzero(table.column("piece").to_numpy() == META))


def reduce_pieces(table: pa.Table) -> pa.Table:
    """The executor-side reduction of one group of a round's rows (``groupBy("piece")``).

    Meta rows pass through unchanged; the pieces of one key from every worker become one row
    holding their row-weighted mean, with ``rows`` = their total rows and ``partition`` = -1.
    """
    meta = _meta_rows(table)
    mean = PieceMean()
    for piece, rows in _pieces_of(table):
        mean.add(piece, rows)
    out = [meta.cast(RESULT_SCHEMA)] if meta.num_rows else []
    for piece, rows in mean.results():
        row = {
            "partition": -1, "piece": int(table.column("piece")[0].as_py()), "rows": int(rows), "grp": piece.group,
            "arr": piece.array, "offset": piece.offset, "shape": piece.shape_json, "dtype": piece.dtype,
            "payload": bytes(piece.values),  # a lone worker's piece comes back as it came: an Arrow buffer
        }
        out.append(pa.Table.from_pylist([row], schema=RESULT_SCHEMA))
    return pa.concat_tables(out) if out else RESULT_SCHEMA.empty_table()


# ---- driver side -----------------------------------------------------------------------------


@dataclass
class RoundOutcome:
    """What the driver takes from one round.

    Attributes:
        workers: per partition ``(partition, rows, steps)``, sorted by partition.
        mean: the row-weighted mean of the trained workers' states (or of their fp16 updates, before
            :func:`decode_mean`), None when no worker trained or when ``states`` is used.
        rows: rows trained in the round.
        metrics: each trained worker's metric variable sums.
        missing: partitions that were in no cache (the round must be run again over the data).
        nbytes: bytes of update pieces the workers sent (compressed when compression is on).
        states: per trained partition its own update (a state, an fp16 update, or a quantized
            payload's bytes), when the round is not combined into ``mean`` (per-worker modes,
            1bit/threshold, straggler-tolerant rounds).
        local_resets: 1bit/threshold workers that found no residual and optimizer state of theirs.
        updates: per-worker modes: each trained worker's :class:`WorkerUpdate` (decoded).
        dropped: straggler-tolerant rounds: the partitions whose updates came late and were dropped.
        rows_dropped: the rows those partitions trained in vain.
    """

    workers: list[tuple[int, int, int]]
    mean: ModelState | None
    rows: int
    metrics: list[list[np.ndarray]]
    missing: list[int]
    nbytes: int = 0
    states: dict | None = None
    local_resets: int = 0
    updates: list | None = None
    dropped: list[int] = dataclasses.field(default_factory=list)
    rows_dropped: int = 0


def _outcome(table: pa.Table, plan: RoundPlan, description: str, reduced: bool, partitions: list[int] | None = None,
             separate: bool = False) -> RoundOutcome:
    """Check the round's rows (one meta row per partition of ``partitions``, default all, each with
    its counted rows) and combine its pieces (already means when ``reduced`` on the executors), or
    with ``separate`` keep each partition's update apart (:attr:`RoundOutcome.states`)."""
    meta = _meta_rows(table).to_pydict()
    expected = list(range(len(plan.partition_rows))) if partitions is None else sorted(partitions)
    if sorted(meta["partition"]) != expected:
        named = f"0..{len(expected) - 1}" if partitions is None else str(expected)
        raise InvariantError(f"{description} must return one update per partition {named}. Received partitions {sorted(meta['partition'])}")
    missing = sorted(p for p, m in zip(meta["partition"], meta["missing"], strict=True) if m)
    workers, metrics = [], []
    for i, partition in enumerate(meta["partition"]):
        if meta["partition_rows"][i] != plan.partition_rows[partition]:
            raise InvariantError(
                f"partition {partition} must hold the {plan.partition_rows[partition]} rows counted before "
                f"training. Received: {meta['partition_rows'][i]} rows in {description}"
            )
        workers.append((partition, meta["rows"][i], meta["steps"][i]))
        if meta["payload"][i] is not None:
            metrics.append(decode_arrays(meta["payload"][i]).arrays)
    workers.sort()
    rows = sum(w[1] for w in workers)
    nbytes = sum(n or 0 for n in meta["nbytes"])
    resets = sum(1 for r in meta["local_reset"] if r)
    if missing:
        return RoundOutcome(workers, None, rows, metrics, missing, nbytes, local_resets=resets)
    if separate:
        trained = {p: n for p, n, _ in workers if n}
        states = _separate(table, trained, description)
        return RoundOutcome(workers, None, rows, metrics, missing, nbytes, states=states, local_resets=resets)
    if reduced:
        pieces = _pieces_of(table)
    else:
        combined = PieceMean()
        for piece, piece_rows in _pieces_of(table):
            combined.add(piece, piece_rows)
        del table  # the combined sums hold what is needed
        pieces = combined.results()  # each sum freed as it is assembled

    def checked(pairs):
        # Every piece must be the mean over every worker that trained: a piece a worker's update
        # lacks (lost, or recomputed differently after a fetch failure) breaks the total.
        for piece, piece_rows in pairs:
            if piece_rows != rows:
                raise InvariantError(
                    f"{description} must combine every piece over the {rows} rows trained. Received: piece "
                    f"{piece.key} combined over {piece_rows:g} rows"
                )
            yield piece

    mean = assemble(checked(pieces))
    return RoundOutcome(workers, mean if mean.weights else None, rows, metrics, missing, nbytes, local_resets=resets)


def _separate(table: pa.Table, trained: dict[int, int], description: str) -> dict:
    """Each trained partition's own update from its rows: the state assembled from its pieces, or the
    bytes of its quantized payload (chunks in offset order)."""
    kinds = table.column("piece").to_numpy()
    partition_of = table.column("partition").to_numpy()
    out = {}
    for partition in trained:
        rows = table.take(np.flatnonzero((partition_of == partition) & (kinds != META)))
        if not rows.num_rows:
            raise InvariantError(f"{description} must return the update of partition {partition}, which trained. Received: none")
        if rows.column("piece")[0].as_py() == COMPRESSED:
            order = np.argsort(rows.column("offset").to_numpy())
            out[partition] = b"".join(rows.column("payload")[int(i)].as_py() for i in order)
        else:
            out[partition] = assemble(piece for piece, _ in _pieces_of(rows))
    return out


def _check_finite(state: ModelState, names: list[str], description: str) -> None:
    for name, array in zip(names, state.weights, strict=True):
        if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
            raise InvariantError(
                f"the master weights must stay finite. Received: non-finite values in {name!r} after {description} "
                "(the loss diverged: lower the learning rate, or check the inputs' scale)"
            )


def _mib(n: int) -> int:
    return -(-n // 2**20)


def result_limit_bytes(spark) -> int:
    """``spark.driver.maxResultSize`` in bytes (0: no limit; default 1g), parsed as Spark parses
    sizes (a bare number in bytes), read through ``spark.conf`` on classic and Connect sessions.

    Raises:
        ConfigError: a value that is not a size such as ``512m`` or ``4g``.
    """
    return conf_size(spark, "spark.driver.maxResultSize", "1g")


def plan_reduction(limit: int, state_bytes: int, workers: int) -> bool:
    """Decide where a round's updates are combined, and refuse, before any job, a fit whose
    updates cannot reach the driver.

    Each worker returns ``state_bytes`` (weights plus optimizer state). Combined on the driver, a
    round brings ``workers × state_bytes`` to it; combined on the executors (a second stage, about
    0.1 s a round on ``local[2]``), one ``state_bytes``. The executors combine when there are more
    than two workers and the updates exceed :data:`EXECUTOR_REDUCE_MIN_BYTES`, or when
    ``spark.driver.maxResultSize`` would not hold them all.

    Args:
        limit: ``spark.driver.maxResultSize`` in bytes (:func:`result_limit_bytes`; 0: no limit).
        state_bytes: one worker's update (bytes).
        workers: partitions that train.

    Returns:
        True to combine on the executors.

    Raises:
        ConfigError: when even one combined update exceeds ``spark.driver.maxResultSize``, naming
            the size and the value to set.
    """
    total = workers * state_bytes
    on_executors = workers > 2 and total > EXECUTOR_REDUCE_MIN_BYTES
    if limit > 0 and not on_executors and total > limit:
        on_executors = workers > 1
    needed = state_bytes if on_executors else total
    if limit > 0 and needed > limit:
        value = f"{_mib(needed) + 64}m"
        raise ConfigError(
            f"a round's combined update ({needed} bytes of weights and optimizer state) must fit "
            f"spark.driver.maxResultSize ({limit} bytes): raise it to at least {value} "
            f"(--conf spark.driver.maxResultSize={value}, or 0 for no limit). Received: {needed} bytes"
        )
    return on_executors


def check_separate(limit: int, state_bytes: int, workers: int) -> None:
    """Refuse, before any job, a fit whose round brings every worker's whole update to the driver
    (per-worker modes, straggler-tolerant rounds) when they cannot fit ``spark.driver.maxResultSize``.

    Raises:
        ConfigError: naming the size needed and the value to set.
    """
    needed = workers * state_bytes
    if limit > 0 and needed > limit:
        value = f"{_mib(needed) + 64}m"
        raise ConfigError(
            f"this mode brings each worker's update ({state_bytes} bytes) to the driver every round: {workers} workers "
            f"need spark.driver.maxResultSize >= {value} (--conf spark.driver.maxResultSize={value}, or 0 for no limit). "
            f"Received: spark.driver.maxResultSize={limit} bytes"
        )


def validate_epoch(spark, job: TrainJob, task: TaskSpec, reader, weights: list, epoch: int, last: bool) -> dict:
    """The validation loss and metrics of ``weights`` (the master weights after ``epoch``): one job
    over the cached validation data, each partition's summed metric variables added up on the
    driver (exact: never a mean of per-partition means), read as Keras reads them, keys ``val_*``;
    ``last`` releases the executors' copies of the validation data."""
    data = job.validation
    rows = data.partition_rows
    broadcast = share(spark, encode_arrays(weights), "the master weights to validate")
    try:
        out = data.df.mapInArrow(lambda batches: evaluate_partition(task, rows, broadcast, last, batches), VALIDATION_DDL)
        description = f"sparkdl fit {job.fit_id[:8]}: validation after epoch {epoch + 1}"
        table = run_job(spark, out.toArrow, description, f"sparkdl-{job.fit_id}-val-{epoch}", job.config.round_timeout_s)
    finally:
        broadcast.destroy()
    values = summed_evaluation(table, len(rows), data.total_rows, reader, f"validation after epoch {epoch + 1}")
    return {f"val_{name}": value for name, value in values.items()}


def summed_evaluation(table: pa.Table, partitions: int, total_rows: int, reader, what: str) -> dict:
    """The loss and metrics of an evaluation job's result (:func:`evaluate_partition`'s rows): each
    of the ``partitions`` partitions' summed metric variables added up and read as Keras reads them.

    Raises:
        InvariantError: when the rows do not cover every partition and all ``total_rows`` rows (``what`` names the job).
    """
    found = table.to_pydict()
    if sorted(found["partition"]) != list(range(partitions)) or sum(found["rows"]) != total_rows:
        raise InvariantError(
            f"{what} must cover the {total_rows} rows of every partition. Received "
            f"partitions {sorted(found['partition'])} with {sum(found['rows'])} rows"
        )
    sums = MetricSums()
    for payload in found["payload"]:
        if payload is not None:
            sums.add(decode_arrays(payload).arrays)
    return reader.results(sums.total())


def _decode_update(update, start: ModelState, compression: str | None) -> ModelState:
    """A worker's state from what it sent: its state itself, start + its fp16 update, or start + its
    dequantized update (1bit/threshold; weights only, the optimizer state stayed on the worker)."""
    if compression in QUANTIZED:
        update = ModelState(dequantize(update, start.weights), None)
    return decode_mean(update, start) if compression is not None else update


class _SharedBroadcast:
    """A round's broadcast, destroyed when its last user released it: the round itself and each
    straggler job still running after the round closed (a task that reads it later would fail).
    On Spark Connect it holds an inlined value (:class:`sparkdl.spark.session.Inline`), whose
    destroy does nothing."""

    def __init__(self, broadcast) -> None:
        self.value, self._users, self._lock = broadcast, 1, threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self.value.destroy()


def _state_bytes(state: ModelState) -> tuple[bytes, bytes | None]:
    return encode_arrays(state.weights), encode_arrays(state.optimizer) if state.optimizer is not None else None


class RoundsBackend:
    """One Spark job per round; see the module docstring.

    Per-worker modes (``easgd``, ``gossip``: the policy's ``per_worker``) broadcast each worker's
    own start state (every executor fetches all of them: workers × state bytes down per round)
    and receive each worker's state apart; so do 1bit/threshold (each payload decoded on the
    driver) and straggler-tolerant rounds (``minWorkersPerRound``: one job per partition, the
    round closed once the minimum arrived and ``roundDeadline`` passed, a late job left to end in
    the background and its update dropped; see :meth:`_straggler_round`).
    """

    name = "rounds"
    _policy = None  # set by run(); a bare _round (tests) averages from the master
    _min_workers: int | None = None  # set by run(): below the workers, straggler-tolerant rounds
    _separate = False

    def run(self, job: TrainJob, policy: ModePolicy, state: ModelState, callbacks=None) -> FitResult:
        from sparkdl.keras.custom_objects import registered
        from sparkdl.keras.metrics import MetricReader
        from sparkdl.keras.replica import state_nbytes

        config = job.config
        per_worker = bool(getattr(policy, "per_worker", False))
        task = TaskSpec(
            fit_id=job.fit_id,
            spec=job.spec.architecture_only(),
            compile_spec=job.compile_spec,
            columns=job.data.columns,
            plan=job.plan,
            batch_size=config.batch_size,
            seed=config.seed,
            shuffle=config.shuffle,
            custom_objects=registered(),
            idle_s=max(3600.0, 2 * config.round_timeout_s),
            canonical_order=not config.keep_partitioning,
            piece_bytes=PIECE_BYTES,
            budget_bytes=job.budget_bytes,
            validation=job.validation.columns if job.validation is not None else None,
            compression=config.compression,
            threshold=config.compression_threshold,
            per_worker=per_worker,
            mixed_precision=config.mixed_precision,
        )
        reader = job.reader or MetricReader.for_columns(job.spec, job.compile_spec, job.data.columns)
        self._policy = policy
        names = decode_arrays(job.spec.weights).names
        spark = job.data.df.sparkSession
        workers = len(job.plan.partition_rows)
        self._min_workers = config.min_workers(workers)
        separate = per_worker or config.compression in QUANTIZED or self._min_workers < workers
        limit, state_bytes = result_limit_bytes(spark), state_nbytes(reader.model)
        if separate:  # every worker's update comes to the driver as it is
            if config.compression not in QUANTIZED:
                check_separate(limit, state_bytes, workers)
            reduced = False
        else:
            reduced = plan_reduction(limit, state_bytes, workers)
        self._separate = separate
        self._busy, self._busy_lock = {}, threading.Lock()  # straggler-tolerant rounds: partition -> tag of its running job
        self._late_errors: list[str] = []  # failures of jobs that ended after their round closed
        # Rounds after the first: one tiny column of the cached data, so each task is scheduled where
        # the cached block, and the partition's copies in memory and on disk, are (cache locality),
        # and receives a byte per row instead of the rows.
        ids = job.data.df.select(F.lit(0).cast("byte").alias("_"))
        result = FitResult(state=state)
        result.info.update(reduced_on_executors=reduced, rounds_reading_data=0, compression=task.compression)
        if config.compression == "threshold":
            result.info["compression_threshold"] = config.compression_threshold
        if config.compression in QUANTIZED:
            result.info["local_state_resets"] = 0
        if self._min_workers < workers:
            result.info.update(min_workers_per_round=self._min_workers, updates_dropped=0, rows_dropped=0, dropped_per_round=[])
        accepted = [-1] * workers  # per partition: the round whose update was last applied (1bit/threshold)
        rounds_per_epoch = job.plan.rounds_per_epoch
        total_rounds = config.epochs * rounds_per_epoch
        start_epoch = 0
        if callbacks is not None:
            callbacks.train_begin(result.state)
            start_epoch = callbacks.initial_epoch()  # keras.callbacks.BackupAndRestore: resume after its last saved epoch
            if start_epoch >= config.epochs:
                raise ConfigError(f"BackupAndRestore restored the model after epoch {start_epoch}, at or beyond epochs={config.epochs}: "
                                  "nothing is left to train (delete its backup_dir or raise epochs)")
            if start_epoch or callbacks.weights_changed() is not None:
                result.state = callbacks.master_state()
                result.info["resumed_from_epoch"] = start_epoch
                result.rounds = start_epoch * rounds_per_epoch  # the rounds' indices, seeds and shuffles go on from there
        logs: dict = {}
        try:
            for epoch in range(start_epoch, config.epochs):
                started = time.perf_counter()
                if callbacks is not None:
                    callbacks.epoch_begin(epoch)
                sums, rows, dropped, nbytes = MetricSums(), 0, 0, 0
                expected_rows = 0  # rows of the rounds run (all of the epoch's unless a callback stopped the fit)
                for r in range(rounds_per_epoch):
                    if callbacks is not None:
                        callbacks.round_begin(r)
                    description = (f"sparkdl fit {job.fit_id[:8]}: round {result.rounds + 1}/{total_rounds} "
                                   f"(epoch {epoch + 1}/{config.epochs}, round {r + 1}/{rounds_per_epoch})")
                    last = result.rounds + 1 == total_rounds
                    round_started = time.perf_counter()
                    learning_rate = callbacks.learning_rate if callbacks is not None else None
                    orders = RoundTask(epoch, r, last, None, index=result.rounds, accepted=tuple(accepted), learning_rate=learning_rate)
                    outcome = self._round(spark, ids, job, task, result, orders, reduced, description)
                    if result.rounds == 0:
                        result.info["first_round_s"] = time.perf_counter() - round_started
                    if outcome.rows and outcome.updates is None and (outcome.mean is None or len(outcome.mean.weights) != len(names)):
                        raise InvariantError(
                            f"{description} must return all {len(names)} weight arrays of the model. Received: "
                            f"{0 if outcome.mean is None else len(outcome.mean.weights)}"
                        )
                    if per_worker:
                        new_state = policy.apply(result.state, outcome.updates)
                    else:
                        new_state = policy.apply_mean(result.state, outcome.mean, outcome.rows)
                    not_finite = None
                    try:
                        _check_finite(new_state, names, description)
                        result.state = new_state
                    except InvariantError as exc:  # the master keeps the last finite state; a callback may stop (TerminateOnNaN)
                        if callbacks is None:
                            raise
                        not_finite = exc
                    for partition, n, _ in outcome.workers:
                        if n:
                            accepted[partition] = result.rounds
                    result.rounds += 1
                    rows += outcome.rows
                    dropped += outcome.rows_dropped
                    nbytes += outcome.nbytes
                    if "local_state_resets" in result.info:
                        result.info["local_state_resets"] += outcome.local_resets
                    if "updates_dropped" in result.info:
                        result.info["updates_dropped"] += len(outcome.dropped)
                        result.info["rows_dropped"] += outcome.rows_dropped
                        result.info["dropped_per_round"].append(list(outcome.dropped))
                    for variables in outcome.metrics:
                        sums.add(variables)
                    expected_rows += job.plan.round_rows(r)
                    if callbacks is not None:
                        if callbacks.wants_rounds:  # the epoch's running metrics, for the callbacks' round hooks
                            total = sums.total()
                            callbacks.round_end(r, reader.results(total) if total is not None else {})
                        if learning_rate is not None:  # what the replicas trained with, read back from their optimizer state
                            exact = task.compression is None  # compressed updates carry the optimizer state approximately, or not at all
                            result.info.setdefault("learning_rates", []).append(
                                (result.rounds - 1, learning_rate, callbacks.master_learning_rate(result.state) if exact else None))
                        if not_finite is not None:
                            if not callbacks.stop_training:
                                raise not_finite
                            result.info["stopped_reason"] = f"not finite: {not_finite}"[:300]
                        if callbacks.stop_training:
                            break
                stopped = callbacks is not None and callbacks.stop_training
                if rows + dropped != expected_rows or (not stopped and expected_rows != job.data.total_rows):
                    raise InvariantError(
                        f"each epoch must train on every row once. Received: {rows} rows trained and {dropped} dropped "
                        f"(late workers) in epoch {epoch + 1}, {expected_rows} rows in its rounds, {job.data.total_rows} "
                        "rows counted in the input"
                    )
                total = sums.total()
                epoch_metrics = reader.results(total) if total is not None else {}
                if job.validation is not None and job.validation.total_rows:
                    last_epoch = epoch + 1 == config.epochs
                    epoch_metrics.update(validate_epoch(spark, job, task, reader, result.state.weights, epoch, last_epoch))
                seconds = time.perf_counter() - started
                if callbacks is not None:
                    epoch_metrics = callbacks.epoch_end(epoch, epoch_metrics, result.state)
                logs = epoch_metrics
                append_epoch(result.history, epoch_metrics)
                result.info.setdefault("update_bytes_per_epoch", []).append(nbytes)  # what the workers sent (bytes)
                result.info["update_bytes"] = result.info.get("update_bytes", 0) + nbytes
                result.epoch_seconds.append(seconds)
                if callbacks is not None and callbacks.stop_training:  # every worker stops here: the driver starts no more rounds
                    result.info["stopped"] = {"epoch": epoch + 1, "round": result.rounds, "rows_in_epoch": expected_rows}
                    if result.rounds < total_rounds:
                        self._release(spark, ids, job, task, epoch)
                    break
            if callbacks is not None:
                callbacks.train_end(logs)
        finally:
            self._cancel_stragglers(spark)
            if self._late_errors:
                result.info["late_job_errors"] = list(self._late_errors)
                warnings.warn(f"{len(self._late_errors)} late straggler job(s) failed after their round closed: "
                              f"{self._late_errors[0]}", stacklevel=2)
            # The last round's tasks delete their partitions' disk copies; after a failed fit, or
            # for copies another executor made, this removes the ones on the driver's machine (all
            # of them in local mode); Spark deletes the rest with the application's directory.
            shutil.rmtree(spill_dir(job.fit_id), ignore_errors=True)
        return result

    def _round(self, spark, ids, job: TrainJob, task: TaskSpec, result: FitResult, round_task: RoundTask, reduced: bool,
               description: str) -> RoundOutcome:
        """One round: the start state(s) broadcast once (destroyed however the round ends); the job over
        the partition-id DataFrame after the first round, and over the cached data for the first round
        or when a partition was in no worker's cache; each worker's update decoded on the driver."""
        policy = self._policy
        if task.per_worker:
            starts = policy.starts(result.state)
            value = [_state_bytes(s) for s in starts]
        else:
            start = policy.start(result.state) if hasattr(policy, "start") else result.state  # bmuf: W + η·Δ with Nesterov
            value = _state_bytes(start)
        broadcast = _SharedBroadcast(share(spark, value, "the round's start weights and optimizer state"))
        try:
            round_task = dataclasses.replace(round_task, state=broadcast.value)
            if self._min_workers is not None and self._min_workers < len(job.plan.partition_rows):
                outcome = self._straggler_round(spark, ids, job, task, result, round_task, description, broadcast)
            else:
                outcome = self._job(spark, ids, False, job, task, round_task, reduced, description) if result.rounds > 0 else None
                if outcome is None or outcome.missing:
                    result.info["rounds_reading_data"] += 1
                    outcome = self._job(spark, job.data.df, True, job, task, round_task, reduced, description)
        finally:
            broadcast.release()  # destroyed once no late job of the round still needs it
        if outcome.missing:
            raise InvariantError(f"{description} must find every partition in the training data. Received: partitions {outcome.missing} missing")
        if outcome.states is not None:
            trained = {p: n for p, n, _ in outcome.workers if n}
            states = {p: _decode_update(u, starts[p] if task.per_worker else start, task.compression) for p, u in outcome.states.items()}
            if task.per_worker:
                steps = {p: k for p, _, k in outcome.workers}
                outcome.updates = [WorkerUpdate(p, trained[p], steps[p], states[p]) for p in sorted(states)]
            else:
                outcome.mean, _ = row_weighted_mean([WorkerUpdate(p, trained[p], 0, states[p]) for p in sorted(states)])
            outcome.states = None
        elif task.compression and outcome.mean is not None:  # the workers sent fp16 updates: the mean state is start + their mean
            outcome.mean = decode_mean(outcome.mean, start)
        return outcome

    def _straggler_round(self, spark, ids, job: TrainJob, task: TaskSpec, result: FitResult, round_task: RoundTask,
                         description: str, broadcast: _SharedBroadcast) -> RoundOutcome:
        """A straggler-tolerant round: one job per partition with rows in it, each started as soon as
        its partition's job of an earlier round has ended. The round closes when every such
        partition returned, or once ``min_workers`` of them returned and ``roundDeadline`` seconds
        passed since it started. A job still running then goes on in the background (its Python
        worker and replica are kept, and the round's broadcast until it ends) and its update is
        dropped when it comes; a partition whose job had not started sits out the round. Both are
        counted in :attr:`RoundOutcome.dropped`; jobs still running when the fit ends are
        cancelled, and a late job's failure is reported in ``fitInfo["late_job_errors"]``."""
        from pyspark import InheritableThread

        plan, config = job.plan, job.config
        r = round_task.round_in_epoch
        with_rows = [p for p in range(len(plan.partition_rows)) if plan.partition_rows[p] and plan.row_range(p, r)[1] > plan.row_range(p, r)[0]]
        need = min(self._min_workers, len(with_rows))
        arrived: queue.Queue = queue.Queue()
        reading_data, launched, closed = [], set(), threading.Event()

        def one(partition: int) -> None:
            orders = dataclasses.replace(round_task, only=partition)
            label = f"{description}, partition {partition}"
            try:
                out = self._job(spark, ids, False, job, task, orders, False, label, [partition]) if result.rounds > 0 else None
                if out is None or out.missing:
                    reading_data.append(partition)
                    out = self._job(spark, job.data.df, True, job, task, orders, False, label, [partition])
                arrived.put((partition, out, None))
            except BaseException as exc:  # handed to the driver's thread, or recorded when the round has closed
                arrived.put((partition, None, exc))
                if closed.is_set() and not isinstance(exc, FitCancelledError):
                    self._late_errors.append(f"partition {partition}, {description}: {type(exc).__name__}: {exc}"[:500])
            finally:
                with self._busy_lock:
                    self._busy.pop(partition, None)
                broadcast.release()

        started = time.monotonic()
        done: dict[int, RoundOutcome] = {}
        while len(done) < len(with_rows):
            with self._busy_lock:  # start the partitions whose earlier job has ended
                ready = [p for p in with_rows if p not in launched and p not in self._busy]
                for partition in ready:
                    self._busy[partition] = self._tag(job, round_task, partition)
            for partition in ready:
                launched.add(partition)
                broadcast.acquire()
                InheritableThread(lambda p=partition: one(p), session=spark, daemon=True).start()
            now = time.monotonic()
            deadline = started + config.round_deadline_s
            if len(done) >= need and now >= deadline:
                break
            waiting_for_busy = len(launched) < len(with_rows)
            wait = (deadline - now) if len(done) >= need else 1.0
            try:
                partition, out, error = arrived.get(timeout=max(0.005, min(wait, 0.05) if waiting_for_busy else wait))
            except queue.Empty:
                continue
            if error is not None:
                raise error
            done[partition] = out
        closed.set()
        if reading_data:
            result.info["rounds_reading_data"] += 1
        late = [p for p in with_rows if p not in done]
        workers, metrics, states, nbytes, resets = [], [], {}, 0, 0
        for partition in range(len(plan.partition_rows)):
            out = done.get(partition)
            if out is None:
                workers.append((partition, 0, 0))
                continue
            workers.extend(out.workers)
            metrics.extend(out.metrics)
            states.update(out.states or {})
            nbytes += out.nbytes
            resets += out.local_resets
        dropped_rows = 0
        for partition in late:
            begin, stop = plan.row_range(partition, r)
            dropped_rows += int(stop - begin)
        return RoundOutcome(workers, None, sum(w[1] for w in workers), metrics, [], nbytes, states=states, local_resets=resets,
                            dropped=late, rows_dropped=dropped_rows)

    def _release(self, spark, ids, job: TrainJob, task: TaskSpec, epoch: int) -> None:
        """After an early stop: one job over the partition ids that frees what the last round would
        have (each partition's cached rows, validation rows, 1bit/threshold state and, with them, the
        replica), so that no executor keeps the fit until its cache's idle timeout. Best effort: a
        failure is logged, the fit's result stands."""
        orders = RoundTask(epoch, 0, True, None, release_only=True)
        out = ids.mapInArrow(lambda batches: train_partition(task, orders, batches, False), RESULT_DDL)
        try:
            run_job(spark, out.toArrow, f"sparkdl fit {job.fit_id[:8]}: release the executors' caches after an early stop",
                    f"sparkdl-{job.fit_id}-release", job.config.round_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the caches also expire on their own (LRU, idle timeout)
            logging.getLogger("sparkdl").warning("fit %s: releasing the executors' caches failed: %s", job.fit_id[:8], exc)

    def _cancel_stragglers(self, spark) -> None:
        """Cancel the jobs of straggler-tolerant rounds still running (the fit has ended)."""
        with self._busy_lock:
            tags = list(self._busy.values())
            self._busy.clear()
        for tag in tags:
            cancel_tag(spark, tag)

    @staticmethod
    def _tag(job: TrainJob, round_task: RoundTask, partition: int | None = None) -> str:
        tag = f"sparkdl-{job.fit_id}-round-{round_task.epoch}-{round_task.round_in_epoch}"
        return tag if partition is None else f"{tag}-p{partition}"

    def _job(self, spark, df, from_data: bool, job: TrainJob, task: TaskSpec, round_task: RoundTask, reduced: bool,
             description: str, partitions: list[int] | None = None) -> RoundOutcome:
        """Run one round's Spark job over ``df`` (the training data when ``from_data``, else the
        partition-id DataFrame), combining the updates on the executors when ``reduced``; with
        ``partitions``, the job of a straggler-tolerant round that trains only those."""
        out = df.mapInArrow(lambda batches: train_partition(task, round_task, batches, from_data), RESULT_DDL)
        if reduced:
            out = out.groupBy("piece").applyInArrow(reduce_pieces, RESULT_DDL)
        tag = self._tag(job, round_task, round_task.only)
        table = run_job(spark, out.toArrow, description, tag, job.config.round_timeout_s)
        return _outcome(table, job.plan, description, reduced, partitions, separate=self._separate)
