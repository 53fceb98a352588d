"""Backend ``rounds``: synchronous rounds, one Spark job each (SparkNet, Moritz et al. 2016).

Per round the driver encodes the master state as Arrow IPC bytes and sends it once as a Spark
broadcast (torrent-distributed, destroyed when the round ends); the task closure carries only
plain settings (:class:`TaskSpec`, :class:`RoundTask`). Each task loads the master state into the
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
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import SparkFiles, TaskContext
from pyspark.broadcast import Broadcast
from pyspark.sql import functions as F

from sparkdl.core.cache import WorkerCache
from sparkdl.core.metrics import MetricSums, append_epoch
from sparkdl.core.modes import ModePolicy
from sparkdl.core.schedule import RoundPlan, canonical_order, epoch_order
from sparkdl.core.pieces import DEFAULT_PIECE_BYTES, Piece, PieceMean, assemble, split_state
from sparkdl.core.state import ModelState
from sparkdl.errors import ConfigError, InvariantError
from sparkdl.keras.spec import CompileSpec, ModelSpec
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays
from sparkdl.serialization.columns import column_to_numpy
from sparkdl.spark.backends.base import EpochCallback, FitResult, TrainJob
from sparkdl.spark.data import ColumnSpec
from sparkdl.spark.jobs import run_job

RESULT_DDL = (
    "partition int, piece int, rows bigint, partition_rows bigint, steps bigint, missing boolean, "
    "grp int, arr int, offset bigint, shape string, dtype string, payload binary"
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
    ]
)
META = -1

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
    ``piece_bytes`` bounds one piece of an update (bytes).
    """

    fit_id: str
    spec: ModelSpec
    compile_spec: CompileSpec
    features: ColumnSpec
    label: ColumnSpec
    plan: RoundPlan
    batch_size: int
    seed: int
    shuffle: bool
    custom_objects: dict
    idle_s: float
    canonical_order: bool
    piece_bytes: int = DEFAULT_PIECE_BYTES


@dataclass(frozen=True)
class RoundTask:
    """One round's orders: where in the schedule it is, and the broadcast master state
    (``(weights, optimizer)`` Arrow IPC bytes; optimizer None for a fresh optimizer)."""

    epoch: int
    round_in_epoch: int
    last: bool
    state: Broadcast


# ---- executor side ---------------------------------------------------------------------------

WORKER_CACHE = WorkerCache(max_fits=4)


def _load_partition(task: TaskSpec, batches: Iterator[pa.RecordBatch]) -> tuple[np.ndarray, np.ndarray]:
    """The partition as numpy ``(rows, *input_shape)`` features and ``(rows, *label_shape)`` labels."""
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return tuple(np.zeros((0, *c.shape), c.dtype) for c in (task.features, task.label))
    table = pa.Table.from_batches(batches)
    return tuple(column_to_numpy(table.column(c.name), c.source, c.shape, c.dtype) for c in (task.features, task.label))


_REPLICAS: OrderedDict = OrderedDict()  # built replicas by (architecture, compile arguments), across fits
_MAX_REPLICAS = 2


def _replica(task: TaskSpec):
    """The fit's replica in this Python worker. A replica built by an earlier fit of the same
    architecture and compile arguments is reused (building, compiling and tracing the train step
    costs 1-3 s per Python worker per fit): every round overwrites its weights, optimizer state and
    seed-generator states, and each step resets its metrics, so it trains exactly as a new one.
    At most two are kept, least recently used dropped first. Not with registered custom objects:
    a class redefined in a notebook keeps its name, and the old compiled step would train."""
    from sparkdl.keras.replica import Replica

    replica = WORKER_CACHE.get(task.fit_id, "replica")
    if replica is None:
        if task.custom_objects:  # a redefined custom layer or loss keeps its name: never reuse then
            replica = Replica(task.spec, task.compile_spec, task.seed)
        else:
            key = (task.spec.digest, json.dumps(dataclasses.asdict(task.compile_spec), sort_keys=True, default=repr))
            replica = _REPLICAS.pop(key, None) or Replica(task.spec, task.compile_spec, task.seed)
            _REPLICAS[key] = replica
            while len(_REPLICAS) > _MAX_REPLICAS:
                _REPLICAS.popitem(last=False)
        WORKER_CACHE.put(task.fit_id, "replica", replica)
    return replica


def _spill_dir(fit_id: str) -> str:
    """This executor's directory for the fit's partitions (inside Spark's per-application files
    directory, which Spark deletes when the application ends)."""
    return os.path.join(SparkFiles.getRootDirectory(), f"sparkdl-{fit_id}")


def _spill(fit_id: str, partition: int, arrays: tuple[np.ndarray, np.ndarray]) -> None:
    """Keep the partition as ``.npy`` files on the executor's disk, for the other Python workers of
    this executor (written to a temporary name and renamed: readers never see half a file)."""
    directory = _spill_dir(fit_id)
    os.makedirs(directory, exist_ok=True)
    for name, array in zip(("x", "y"), arrays, strict=True):
        path = os.path.join(directory, f"partition-{partition}-{name}.npy")
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "wb") as file:  # a file object: np.save would append ".npy" to a name
            np.save(file, array)
        os.replace(temporary, path)


def _unspill(fit_id: str, partition: int) -> tuple[np.ndarray, np.ndarray] | None:
    paths = [os.path.join(_spill_dir(fit_id), f"partition-{partition}-{name}.npy") for name in ("x", "y")]
    try:
        return tuple(np.load(path, mmap_mode="r") for path in paths)
    except (OSError, ValueError):
        return None


def _partition_arrays(task: TaskSpec, partition: int, batches: Iterator[pa.RecordBatch] | None):
    """The partition's ``(x, y)``: from this Python worker's cache, else from this executor's disk
    copy, else (with ``batches``, the cached training data) converted, ordered and kept in both.
    ``None`` when ``batches`` is None and neither copy exists (a new worker or a lost executor)."""
    key = ("partition", partition)
    cached = WORKER_CACHE.get(task.fit_id, key)
    if cached is None:
        cached = _unspill(task.fit_id, partition)
        if cached is not None:
            WORKER_CACHE.put(task.fit_id, key, cached)
    if cached is not None or batches is None:
        for _ in batches or ():  # drain the unread input, so Spark can reuse this Python worker
            pass
        return cached
    arrays = _load_partition(task, batches)
    if task.canonical_order:
        order = canonical_order(*arrays)
        arrays = (arrays[0][order], arrays[1][order])
    WORKER_CACHE.put(task.fit_id, key, arrays)
    _spill(task.fit_id, partition, arrays)
    return arrays


def _release(task: TaskSpec, partition: int) -> None:
    """After a fit's last round: drop this partition (memory and disk), and the replica once no
    partition is left in this Python worker."""
    WORKER_CACHE.release(task.fit_id, ("partition", partition))
    for name in ("x", "y"):
        try:
            os.remove(os.path.join(_spill_dir(task.fit_id), f"partition-{partition}-{name}.npy"))
        except OSError:
            pass
    try:
        os.rmdir(_spill_dir(task.fit_id))
    except OSError:
        pass  # other partitions' files still there, or already gone
    if not any(isinstance(k, tuple) and k[0] == "partition" for k in WORKER_CACHE.keys(task.fit_id)):
        WORKER_CACHE.release(task.fit_id)


def _meta_row(partition: int, rows: int, partition_rows: int, steps: int, missing: bool = False, metrics=None) -> dict:
    return {
        "partition": partition, "piece": META, "rows": rows, "partition_rows": partition_rows, "steps": steps,
        "missing": missing, "payload": encode_arrays(metrics) if metrics is not None else None,
    }


def _piece_batch(partition: int, rows: int, index: int, piece: Piece) -> pa.RecordBatch:
    """One piece as a one-row batch of :data:`RESULT_SCHEMA`, its payload the array's own memory."""
    data = pa.py_buffer(piece.values)
    payload = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(np.array([0, data.size], np.int32)), data])
    columns = [
        pa.array([partition], pa.int32()), pa.array([index], pa.int32()), pa.array([rows], pa.int64()),
        pa.nulls(1, pa.int64()), pa.nulls(1, pa.int64()), pa.nulls(1, pa.bool_()),
        pa.array([piece.group], pa.int32()), pa.array([piece.array], pa.int32()), pa.array([piece.offset], pa.int64()),
        pa.array([piece.shape_json], pa.string()), pa.array([piece.dtype], pa.string()), payload,
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
    runtime.configure(context.cpus())
    from sparkdl.keras.custom_objects import register

    register(task.custom_objects)
    WORKER_CACHE.idle_s = task.idle_s
    partition = context.partitionId()
    plan = task.plan
    expected = plan.partition_rows[partition] if partition < len(plan.partition_rows) else 0
    if not from_data:
        for _ in batches:  # the placeholder column; an unread input stops Spark reusing this Python worker
            pass
    arrays = _partition_arrays(task, partition, batches if from_data else None)
    if arrays is None and expected == 0:  # nothing to find: an empty partition needs no data
        arrays = tuple(np.zeros((0, *c.shape), c.dtype) for c in (task.features, task.label))
    if arrays is None:
        yield pa.RecordBatch.from_pylist([_meta_row(partition, 0, expected, 0, missing=True)], schema=RESULT_SCHEMA)
        return
    x, y = arrays
    if len(x) != expected:
        _release(task, partition)
        raise InvariantError(
            f"partition {partition} must hold the {expected} rows counted before training. Received: {len(x)} rows "
            "(the cached training data changed; is the input non-deterministic?)"
        )
    start, stop = plan.row_range(partition, round_task.round_in_epoch) if expected else (0, 0)
    if stop <= start:
        meta, pieces = _meta_row(partition, 0, expected, 0), ()
    else:
        replica = _replica(task)
        weights, optimizer = round_task.state.value  # read once per Python worker per round (PySpark keeps it)
        replica.set_state(ModelState(decode_arrays(weights, copy=False).arrays,
                                     decode_arrays(optimizer, copy=False).arrays if optimizer is not None else None))
        replica.seed_round(task.seed, round_task.epoch, round_task.round_in_epoch, partition)
        order = epoch_order(expected, task.seed, round_task.epoch, partition, task.shuffle)[start:stop]
        metrics = replica.train(x[order], y[order], task.batch_size)
        steps = -(-(stop - start) // task.batch_size)
        meta = _meta_row(partition, stop - start, expected, steps, metrics=metrics)
        pieces = split_state(replica.get_state(), task.piece_bytes)
    if round_task.last:
        _release(task, partition)
    yield pa.RecordBatch.from_pylist([meta], schema=RESULT_SCHEMA)
    for index, piece in enumerate(pieces):
        yield _piece_batch(partition, meta["rows"], index, piece)


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
        mean: the row-weighted mean of the trained workers' states, None when no worker trained.
        rows: rows trained in the round.
        metrics: each trained worker's metric variable sums.
        missing: partitions that were in no cache (the round must be run again over the data).
    """

    workers: list[tuple[int, int, int]]
    mean: ModelState | None
    rows: int
    metrics: list[list[np.ndarray]]
    missing: list[int]


def _outcome(table: pa.Table, plan: RoundPlan, description: str, reduced: bool) -> RoundOutcome:
    """Check the round's rows (one meta row per partition, each with its counted rows) and combine
    its pieces (already means when ``reduced`` on the executors)."""
    meta = _meta_rows(table).to_pydict()
    partitions = sorted(meta["partition"])
    if partitions != list(range(len(plan.partition_rows))):
        raise InvariantError(f"{description} must return one update per partition 0..{len(plan.partition_rows) - 1}. Received partitions {partitions}")
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
    if missing:
        return RoundOutcome(workers, None, rows, metrics, missing)
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
    return RoundOutcome(workers, mean if mean.weights else None, rows, metrics, missing)
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
    """``spark.driver.maxResultSize`` in bytes, read by Spark's own size parser (0: no limit)."""
    return int(spark.sparkContext._jsc.sc().conf().getSizeAsBytes("spark.driver.maxResultSize", "1g"))


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


class RoundsBackend:
    """One Spark job per round; see the module docstring."""

    name = "rounds"

    def run(self, job: TrainJob, policy: ModePolicy, state: ModelState, on_epoch_end: EpochCallback | None = None) -> FitResult:
        from sparkdl.keras.custom_objects import registered
        from sparkdl.keras.metrics import MetricReader
        from sparkdl.keras.replica import state_nbytes

        config = job.config
        task = TaskSpec(
            fit_id=job.fit_id,
            spec=job.spec.architecture_only(),
            compile_spec=job.compile_spec,
            features=job.data.features,
            label=job.data.label,
            plan=job.plan,
            batch_size=config.batch_size,
            seed=config.seed,
            shuffle=config.shuffle,
            custom_objects=registered(),
            idle_s=max(3600.0, 2 * config.round_timeout_s),
            canonical_order=not config.keep_partitioning,
            piece_bytes=PIECE_BYTES,
        )
        features, label = job.data.features, job.data.label
        reader = job.reader or MetricReader(job.spec, job.compile_spec, features.shape, features.dtype, label.shape, label.dtype)
        names = decode_arrays(job.spec.weights).names
        spark = job.data.df.sparkSession
        workers = len(job.plan.partition_rows)
        reduced = plan_reduction(result_limit_bytes(spark), state_nbytes(reader.model), workers)
        # Rounds after the first: one tiny column of the cached data, so each task is scheduled where
        # the cached block, and the partition's copies in memory and on disk, are (cache locality),
        # and receives a byte per row instead of the rows.
        ids = job.data.df.select(F.lit(0).cast("byte").alias("_"))
        result = FitResult(state=state)
        result.info.update(reduced_on_executors=reduced, rounds_reading_data=0)
        rounds_per_epoch = job.plan.rounds_per_epoch
        total_rounds = config.epochs * rounds_per_epoch
        try:
            for epoch in range(config.epochs):
                started = time.perf_counter()
                sums, rows = MetricSums(), 0
                for r in range(rounds_per_epoch):
                    description = f"sparkdl fit {job.fit_id[:8]}: round {result.rounds + 1}/{total_rounds} (epoch {epoch + 1})"
                    last = result.rounds + 1 == total_rounds
                    round_started = time.perf_counter()
                    outcome = self._round(spark, ids, job, task, result, RoundTask(epoch, r, last, None), reduced, description)
                    if result.rounds == 0:
                        result.info["first_round_s"] = time.perf_counter() - round_started
                    if outcome.rows and (outcome.mean is None or len(outcome.mean.weights) != len(names)):
                        raise InvariantError(
                            f"{description} must return all {len(names)} weight arrays of the model. Received: "
                            f"{0 if outcome.mean is None else len(outcome.mean.weights)}"
                        )
                    result.state = policy.apply_mean(result.state, outcome.mean, outcome.rows)
                    _check_finite(result.state, names, description)
                    result.rounds += 1
                    rows += outcome.rows
                    for variables in outcome.metrics:
                        sums.add(variables)
                if rows != job.data.total_rows:
                    raise InvariantError(
                        f"each epoch must train on every row once. Received: {rows} rows trained in epoch {epoch + 1}, "
                        f"{job.data.total_rows} rows counted in the input"
                    )
                epoch_metrics = reader.results(sums.total())
                seconds = time.perf_counter() - started
                append_epoch(result.history, epoch_metrics)
                result.epoch_seconds.append(seconds)
                if on_epoch_end is not None:
                    on_epoch_end(epoch, epoch_metrics, seconds)
        finally:
            # The last round's tasks delete their partitions' disk copies; after a failed fit, or
            # for copies another executor made, this removes the ones on the driver's machine (all
            # of them in local mode); Spark deletes the rest with the application's directory.
            shutil.rmtree(os.path.join(SparkFiles.getRootDirectory(), f"sparkdl-{job.fit_id}"), ignore_errors=True)
        return result

    def _round(self, spark, ids, job: TrainJob, task: TaskSpec, result: FitResult, round_task: RoundTask, reduced: bool,
               description: str) -> RoundOutcome:
        """One round: the master state broadcast once (destroyed however the round ends); the job over
        the partition-id DataFrame after the first round, and over the cached data for the first round
        or when a partition was in no worker's cache."""
        state = result.state
        broadcast = spark.sparkContext.broadcast(
            (encode_arrays(state.weights), encode_arrays(state.optimizer) if state.optimizer is not None else None)
        )
        try:
            round_task = RoundTask(round_task.epoch, round_task.round_in_epoch, round_task.last, broadcast)
            if result.rounds > 0:
                outcome = self._job(spark, ids, False, job, task, round_task, reduced, description)
                if not outcome.missing:
                    return outcome
            result.info["rounds_reading_data"] += 1
            outcome = self._job(spark, job.data.df, True, job, task, round_task, reduced, description)
        finally:
            broadcast.destroy()
        if outcome.missing:
            raise InvariantError(f"{description} must find every partition in the training data. Received: partitions {outcome.missing} missing")
        return outcome

    def _job(self, spark, df, from_data: bool, job: TrainJob, task: TaskSpec, round_task: RoundTask, reduced: bool,
             description: str) -> RoundOutcome:
        """Run one round's Spark job over ``df`` (the training data when ``from_data``, else the
        partition-id DataFrame), combining the updates on the executors when ``reduced``."""
        out = df.mapInArrow(lambda batches: train_partition(task, round_task, batches, from_data), RESULT_DDL)
        if reduced:
            out = out.groupBy("piece").applyInArrow(reduce_pieces, RESULT_DDL)
        tag = f"sparkdl-{job.fit_id}-round-{round_task.epoch}-{round_task.round_in_epoch}"
        table = run_job(spark, out.toArrow, description, tag, job.config.round_timeout_s)
        return _outcome(table, job.plan, description, reduced)
