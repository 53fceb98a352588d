"""What every backend's worker tasks share: the fit's settings that travel to them
(:class:`TaskSpec`), the replica a Python worker keeps (:func:`replica_for`), the worker's set-up
(:func:`prepare_worker`), the fault hooks' points (:func:`hook_point`) and the evaluation of a
partition's validation rows. Each backend's own task code is in its package
(``sparkdl.spark.backends.<name>.task``). Nothing here runs on the driver.
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

from sparkdl.core.pieces import DEFAULT_PIECE_BYTES
from sparkdl.core.schedule import RoundPlan
from sparkdl.core.state import ModelState
from sparkdl.errors import InvariantError
from sparkdl.keras.runtime import keras_backend
from sparkdl.keras.spec import CompileSpec, ModelSpec
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays
from sparkdl.serialization.columns import ModelColumns
from sparkdl.spark.partitions import WORKER_CACHE, Partition, load_partition, release
from sparkdl.spark.training.faults import Point, TaskHooks

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


RELEASE_SPARK_SCHEMA = from_arrow_schema(pa.schema([("partition", pa.int32())]))  # the release job returns no rows


def release_partition(task: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """After an early stop, what the fit's last round and last validation would have freed on this
    partition's executor: its cached training and validation rows, its own state on disk, and this
    Python worker's copies of the fit's partitions. ``batches`` is drained unread; yields nothing."""
    from sparkdl.spark.training import worker_state

    partition = TaskContext.get().partitionId()
    for _ in batches:
        pass
    worker_state.drop(task.fit_id, partition)
    release(task.fit_id, "train", partition)
    release(task.fit_id, "val", partition)
    WORKER_CACHE.release(task.fit_id)  # this Python worker may hold other partitions' copies too: the fit is over
    return
    yield  # a generator for mapInArrow
