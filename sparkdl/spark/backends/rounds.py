"""Backend ``rounds``: synchronous rounds, one Spark job each (SparkNet, Moritz et al. 2016).

Per round the driver encodes the master state as Arrow IPC bytes, sends them once as a Spark
broadcast (destroyed when the round ends, so no temporary file outlives it) and runs one
``mapInArrow`` job over the cached training data: each task loads the master state into the
replica its Python worker keeps for the fit, seeds its random layers from (seed, epoch, round,
partition), runs its τ local steps and returns its weights, optimizer state, rows and metric
variables as one Arrow row. The driver collects the round's rows with ``toArrow`` (Arrow, no
pickle), hands them to the mode policy, and checks its invariants: one update per partition,
rows trained per epoch equal to rows counted, finite master weights. A failed task is retried
by Spark like any other; it never touches the master state, which only changes once a whole
round has returned. Works with dynamic allocation: no barrier, no server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.broadcast import Broadcast

from sparkdl.core.cache import WorkerCache
from sparkdl.core.metrics import MetricSums, append_epoch
from sparkdl.core.modes import ModePolicy
from sparkdl.core.schedule import RoundPlan, canonical_order, epoch_order
from sparkdl.core.state import ModelState, WorkerUpdate
from sparkdl.errors import ConfigError, InvariantError
from sparkdl.keras.spec import CompileSpec, ModelSpec
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays
from sparkdl.serialization.columns import column_to_numpy
from sparkdl.spark.backends.base import EpochCallback, FitResult, TrainJob
from sparkdl.spark.data import ColumnSpec
from sparkdl.spark.jobs import run_job

RESULT_DDL = "partition int, rows bigint, partition_rows bigint, steps bigint, weights binary, optimizer binary, metrics binary"
RESULT_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("rows", pa.int64()),
        ("partition_rows", pa.int64()),
        ("steps", pa.int64()),
        ("weights", pa.binary()),
        ("optimizer", pa.binary()),
        ("metrics", pa.binary()),
    ]
)


@dataclass(frozen=True)
class TaskSpec:
    """The part of a :class:`TrainJob` that travels to the tasks: plain values, no DataFrame, no weights.

    ``custom_objects`` are the driver's registered Keras objects (see
    :mod:`sparkdl.keras.custom_objects`); ``idle_s`` is how long a worker keeps this fit's cache
    without a round (seconds); ``canonical_order`` sorts each partition's rows by content when
    they came through the round-robin repartition (whose row order follows shuffle-fetch order).
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


def _partition_arrays(task: TaskSpec, partition: int, batches: Iterator[pa.RecordBatch]) -> tuple[np.ndarray, np.ndarray]:
    """The partition, converted once per Python worker per fit; later rounds drain the input unread."""
    key = ("partition", partition)
    cached = WORKER_CACHE.get(task.fit_id, key)
    if cached is not None:
        for _ in batches:
            pass
        return cached
    arrays = _load_partition(task, batches)
    if task.canonical_order:
        order = canonical_order(*arrays)
        arrays = (arrays[0][order], arrays[1][order])
    WORKER_CACHE.put(task.fit_id, key, arrays)
    return arrays


def _release(task: TaskSpec, partition: int) -> None:
    """After a fit's last round: drop this partition, and the replica once no partition is left."""
    WORKER_CACHE.release(task.fit_id, ("partition", partition))
    if not any(isinstance(k, tuple) and k[0] == "partition" for k in WORKER_CACHE.keys(task.fit_id)):
        WORKER_CACHE.release(task.fit_id)


def _result_batch(partition: int, rows: int, partition_rows: int, steps: int, state: ModelState | None, metrics) -> pa.RecordBatch:
    weights = optimizer = encoded_metrics = None
    if state is not None:
        weights = encode_arrays(state.weights)
        optimizer = encode_arrays(state.optimizer) if state.optimizer is not None else None
        encoded_metrics = encode_arrays(metrics)
    row = {
        "partition": partition, "rows": rows, "partition_rows": partition_rows, "steps": steps,
        "weights": weights, "optimizer": optimizer, "metrics": encoded_metrics,
    }
    return pa.RecordBatch.from_pylist([row], schema=RESULT_SCHEMA)


def train_partition(task: TaskSpec, round_task: RoundTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Run one worker's share of a round on its partition and yield its update as one Arrow row.

    Args:
        task: the fit's plain-value settings.
        round_task: schedule position and the broadcast master state.
        batches: the partition's rows (feature column ``array<T>``, label column).

    Yields:
        One record batch of :data:`RESULT_SCHEMA`: rows and steps trained, the partition's row
        count, the weights, optimizer state and metric variables as Arrow IPC bytes (null when
        rows == 0).

    Raises:
        InvariantError: the partition does not hold the rows the driver counted for it.
    """
    from sparkdl.keras import runtime

    context = TaskContext.get()
    runtime.configure(context.cpus())
    from sparkdl.keras.custom_objects import register
    from sparkdl.keras.replica import Replica

    register(task.custom_objects)
    WORKER_CACHE.idle_s = task.idle_s
    partition = context.partitionId()
    x, y = _partition_arrays(task, partition, batches)
    plan = task.plan
    expected = plan.partition_rows[partition] if partition < len(plan.partition_rows) else 0
    if len(x) != expected:
        WORKER_CACHE.release(task.fit_id, ("partition", partition))
        raise InvariantError(
            f"partition {partition} must hold the {expected} rows counted before training. Received: {len(x)} rows "
            "(the cached training data changed; is the input non-deterministic?)"
        )
    start, stop = plan.row_range(partition, round_task.round_in_epoch) if expected else (0, 0)
    if stop <= start:
        result = _result_batch(partition, 0, expected, 0, None, None)
    else:
        replica = WORKER_CACHE.get_or_create(task.fit_id, "replica", lambda: Replica(task.spec, task.compile_spec, task.seed))
        weights, optimizer = round_task.state.value
        replica.set_state(ModelState(decode_arrays(weights).arrays, decode_arrays(optimizer).arrays if optimizer is not None else None))
        replica.seed_round(task.seed, round_task.epoch, round_task.round_in_epoch, partition)
        order = epoch_order(expected, task.seed, round_task.epoch, partition, task.shuffle)[start:stop]
        metrics = replica.train(x[order], y[order], task.batch_size)
        steps = -(-(stop - start) // task.batch_size)
        result = _result_batch(partition, stop - start, expected, steps, replica.get_state(), metrics)
    if round_task.last:
        _release(task, partition)
    yield result


# ---- driver side -----------------------------------------------------------------------------


def _updates(table: pa.Table, plan: RoundPlan, description: str) -> tuple[list[WorkerUpdate], list[list[np.ndarray]]]:
    """The round's updates and metric variables, after checking one row per partition with its rows."""
    rows = table.to_pylist()
    partitions = sorted(row["partition"] for row in rows)
    if partitions != list(range(len(plan.partition_rows))):
        raise InvariantError(f"{description} must return one update per partition 0..{len(plan.partition_rows) - 1}. Received partitions {partitions}")
    updates, metrics = [], []
    for row in rows:
        if row["partition_rows"] != plan.partition_rows[row["partition"]]:
            raise InvariantError(
                f"partition {row['partition']} must hold the {plan.partition_rows[row['partition']]} rows counted before "
                f"training. Received: {row['partition_rows']} rows in {description}"
            )
        state = None
        if row["weights"] is not None:
            optimizer = decode_arrays(row["optimizer"]).arrays if row["optimizer"] is not None else None
            state = ModelState(decode_arrays(row["weights"]).arrays, optimizer)
            metrics.append(decode_arrays(row["metrics"]).arrays)
        updates.append(WorkerUpdate(row["partition"], row["rows"], row["steps"], state))
    return updates, metrics


def _check_finite(state: ModelState, names: list[str], description: str) -> None:
    for name, array in zip(names, state.weights, strict=True):
        if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
            raise InvariantError(
                f"the master weights must stay finite. Received: non-finite values in {name!r} after {description} "
                "(the loss diverged: lower the learning rate, or check the inputs' scale)"
            )


_MAX_ROW_BYTES = 2**31 - 2**24  # one Arrow binary value / JVM byte array, with room for headers


def _check_result_size(spark, per_worker: int, workers: int) -> None:
    """Refuse, before the first round, a round whose results cannot come back to the driver.

    Raises:
        ConfigError: one worker's state over 2 GiB (one Arrow binary value), or all workers' states
            over ``spark.driver.maxResultSize``.
    """
    if per_worker > _MAX_ROW_BYTES:
        raise ConfigError(
            f"each worker's weights plus optimizer state must fit in one Arrow value of at most {_MAX_ROW_BYTES} bytes "
            f"on the rounds backend. Received: {per_worker} bytes"
        )
    limit = spark.sparkContext._jsc.sc().conf().getSizeAsBytes("spark.driver.maxResultSize", "1g")
    if limit > 0 and per_worker * workers > limit:
        raise ConfigError(
            f"a round's results ({workers} workers x {per_worker} bytes of weights and optimizer state) must fit "
            f"spark.driver.maxResultSize ({limit} bytes): raise it (--conf spark.driver.maxResultSize=4g) or lower "
            f"numWorkers. Received: {per_worker * workers} bytes"
        )


class RoundsBackend:
    """One Spark job per round over cached data; see the module docstring."""

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
        )
        features, label = job.data.features, job.data.label
        reader = job.reader or MetricReader(job.spec, job.compile_spec, features.shape, features.dtype, label.shape, label.dtype)
        names = decode_arrays(job.spec.weights).names
        spark = job.data.df.sparkSession
        _check_result_size(spark, state_nbytes(reader.model), len(job.plan.partition_rows))
        result = FitResult(state=state)
        rounds_per_epoch = job.plan.rounds_per_epoch
        total_rounds = config.epochs * rounds_per_epoch
        for epoch in range(config.epochs):
            started = time.perf_counter()
            sums, rows = MetricSums(), 0
            for r in range(rounds_per_epoch):
                description = f"sparkdl fit {job.fit_id[:8]}: round {result.rounds + 1}/{total_rounds} (epoch {epoch + 1})"
                updates, metrics = self._run_round(spark, job, task, result.state, epoch, r, result.rounds + 1 == total_rounds, description)
                result.state = policy.apply(result.state, updates)
                _check_finite(result.state, names, description)
                result.rounds += 1
                rows += sum(update.rows for update in updates)
                for variables in metrics:
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
        return result

    def _run_round(self, spark, job: TrainJob, task: TaskSpec, state: ModelState, epoch: int, r: int, last: bool, description: str):
        """Run one round's Spark job; the broadcast master state is destroyed however the round ends."""
        payload = (encode_arrays(state.weights), encode_arrays(state.optimizer) if state.optimizer is not None else None)
        broadcast = spark.sparkContext.broadcast(payload)
        try:
            round_task = RoundTask(epoch=epoch, round_in_epoch=r, last=last, state=broadcast)
            df = job.data.df.mapInArrow(lambda batches: train_partition(task, round_task, batches), RESULT_DDL)
            tag = f"sparkdl-{job.fit_id}-round-{epoch}-{r}"
            table = run_job(spark, df.toArrow, description, tag, job.config.round_timeout_s)
        finally:
            broadcast.destroy()
        return _updates(table, job.plan, description)
