"""Backend ``rounds``: synchronous rounds, one Spark job each (SparkNet, Moritz et al. 2016).

Per round the driver encodes the master state as Arrow IPC bytes and runs one
``mapInArrow`` job over the cached training data: each of the ``numWorkers`` tasks loads the
master state into its cached replica, runs its τ local steps, and returns its weights,
optimizer state, rows and metrics as one Arrow row. The driver collects the round's rows
with ``toArrow`` (Arrow, no pickle) and hands them to the mode policy. A failed task is
retried by Spark like any other; it never touches the master state, which only changes
once a whole round has returned. Works with dynamic allocation: no barrier, no server.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from sparkdl.core.metrics import MetricMeans, append_epoch
from sparkdl.core.modes import ModePolicy
from sparkdl.core.schedule import RoundPlan, epoch_order
from sparkdl.core.state import ModelState, WorkerUpdate
from sparkdl.errors import RoundTimeoutError, WorkerError
from sparkdl.keras.spec import CompileSpec, ModelSpec
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays
from sparkdl.serialization.columns import batches_to_table, column_to_numpy
from sparkdl.spark.backends.base import EpochCallback, FitResult, TrainJob
from sparkdl.spark.data import ColumnSpec

RESULT_DDL = "partition int, rows bigint, steps bigint, weights binary, optimizer binary, metrics string"
RESULT_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("rows", pa.int64()),
        ("steps", pa.int64()),
        ("weights", pa.binary()),
        ("optimizer", pa.binary()),
        ("metrics", pa.string()),
    ]
)


@dataclass(frozen=True)
class TaskSpec:
    """The part of a :class:`TrainJob` that travels to the tasks: plain values, no DataFrame."""

    fit_id: str
    spec: ModelSpec
    compile_spec: CompileSpec
    features: ColumnSpec
    label: ColumnSpec
    plan: RoundPlan
    batch_size: int
    seed: int
    shuffle: bool


@dataclass(frozen=True)
class RoundTask:
    """One round's orders: the master state as Arrow IPC bytes and where in the schedule it is."""

    epoch: int
    round_in_epoch: int
    weights: bytes
    optimizer: bytes | None


# ---- executor side ---------------------------------------------------------------------------

_partitions: OrderedDict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = OrderedDict()


def _partition_arrays(task: TaskSpec, partition: int, batches: Iterator[pa.RecordBatch]) -> tuple[np.ndarray, np.ndarray]:
    """The partition as numpy, converted once per Python worker per fit; later rounds drain the input."""
    key = (task.fit_id, partition)
    cached = _partitions.get(key)
    if cached is not None:
        for _ in batches:
            pass
        return cached
    for other in [k for k in _partitions if k[0] != task.fit_id]:
        del _partitions[other]
    table = batches_to_table(batches)
    x, y = (
        np.zeros((0, *column.shape), column.dtype)
        if table is None
        else column_to_numpy(table.column(column.name), column.source, column.shape, column.dtype)
        for column in (task.features, task.label)
    )
    _partitions[key] = (x, y)
    return x, y


def _result_batch(partition: int, rows: int, steps: int, state: ModelState | None, metrics: dict) -> pa.RecordBatch:
    weights = optimizer = None
    if state is not None:
        weights = encode_arrays(state.weights)
        optimizer = encode_arrays(state.optimizer) if state.optimizer is not None else None
    return pa.RecordBatch.from_pylist(
        [{"partition": partition, "rows": rows, "steps": steps, "weights": weights, "optimizer": optimizer, "metrics": json.dumps(metrics)}],
        schema=RESULT_SCHEMA,
    )


def train_partition(task: TaskSpec, round_task: RoundTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Run one worker's share of a round on its partition and yield its update as one Arrow row.

    Args:
        task: the fit's plain-value settings.
        round_task: master state and schedule position.
        batches: the partition's rows (feature column ``array<T>``, label column).

    Yields:
        One record batch of :data:`RESULT_SCHEMA`: rows and steps trained, the weights and
        optimizer state as Arrow IPC bytes (null when rows == 0), metrics as JSON.
    """
    from sparkdl.keras import runtime

    context = TaskContext.get()
    runtime.configure(context.cpus())
    from sparkdl.keras.replica import get_replica

    partition = context.partitionId()
    x, y = _partition_arrays(task, partition, batches)
    rows = len(x)
    plan = task.plan
    start, stop = plan.row_range(partition, round_task.round_in_epoch) if partition < len(plan.partition_rows) else (0, 0)
    start, stop = min(start, rows), min(stop, rows)
    if stop <= start:
        yield _result_batch(partition, 0, 0, None, {})
        return
    replica = get_replica(task.fit_id, task.spec, task.compile_spec, task.seed)
    master = ModelState(
        decode_arrays(round_task.weights).arrays,
        decode_arrays(round_task.optimizer).arrays if round_task.optimizer is not None else None,
    )
    replica.set_state(master)
    order = epoch_order(rows, task.seed, round_task.epoch, partition, task.shuffle)[start:stop]
    metrics = replica.train(x[order], y[order], task.batch_size)
    steps = -(-(stop - start) // task.batch_size)
    yield _result_batch(partition, stop - start, steps, replica.get_state(), metrics)


# ---- driver side -----------------------------------------------------------------------------


def _updates(table: pa.Table) -> list[WorkerUpdate]:
    updates = []
    for row in table.to_pylist():
        state = None
        if row["weights"] is not None:
            optimizer = decode_arrays(row["optimizer"]).arrays if row["optimizer"] is not None else None
            state = ModelState(decode_arrays(row["weights"]).arrays, optimizer)
        updates.append(WorkerUpdate(row["partition"], row["rows"], row["steps"], state, json.loads(row["metrics"])))
    return updates


class RoundsBackend:
    """One Spark job per round over cached data; see the module docstring."""

    name = "rounds"

    def run(self, job: TrainJob, policy: ModePolicy, state: ModelState, on_epoch_end: EpochCallback | None = None) -> FitResult:
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
        )
        spark = job.data.df.sparkSession
        result = FitResult(state=state)
        rounds_per_epoch = job.plan.rounds_per_epoch
        total_rounds = config.epochs * rounds_per_epoch
        for epoch in range(config.epochs):
            started = time.perf_counter()
            means = MetricMeans()
            for r in range(rounds_per_epoch):
                round_task = RoundTask(
                    epoch=epoch,
                    round_in_epoch=r,
                    weights=encode_arrays(result.state.weights),
                    optimizer=encode_arrays(result.state.optimizer) if result.state.optimizer is not None else None,
                )
                description = f"sparkdl fit {job.fit_id[:8]}: round {result.rounds + 1}/{total_rounds} (epoch {epoch + 1})"
                updates = self._run_round(spark, job, task, round_task, description)
                result.state = policy.apply(result.state, updates)
                result.rounds += 1
                for update in updates:
                    means.add(update.metrics, update.rows)
            epoch_metrics = means.means()
            seconds = time.perf_counter() - started
            append_epoch(result.history, epoch_metrics)
            result.epoch_seconds.append(seconds)
            if on_epoch_end is not None:
                on_epoch_end(epoch, epoch_metrics, seconds)
        return result

    def _run_round(self, spark: SparkSession, job: TrainJob, task: TaskSpec, round_task: RoundTask, description: str) -> list[WorkerUpdate]:
        """Run one round's Spark job in a helper thread; cancel it after ``round_timeout_s`` seconds."""
        group = f"sparkdl-{job.fit_id}-{round_task.epoch}-{round_task.round_in_epoch}"
        df = job.data.df.mapInArrow(lambda batches: train_partition(task, round_task, batches), RESULT_DDL)
        outcome: dict = {}

        def collect() -> None:
            try:
                spark.sparkContext.setJobGroup(group, description, interruptOnCancel=True)
                outcome["table"] = df.toArrow()
            except BaseException as exc:  # handed to the driver thread below
                outcome["error"] = exc

        thread = threading.Thread(target=collect, name=group, daemon=True)
        thread.start()
        thread.join(job.config.round_timeout_s)
        if thread.is_alive():
            spark.sparkContext.cancelJobGroup(group)
            thread.join(30.0)
            raise RoundTimeoutError(
                f"each round must finish within roundTimeout={job.config.round_timeout_s} s. "
                f"Received: {description} still running; its Spark jobs were cancelled"
            )
        if "error" in outcome:
            error = outcome["error"]
            if isinstance(error, PySparkException):
                raise WorkerError(f"{description} failed on an executor: {error}") from error
            raise error
        return _updates(outcome["table"])
