"""The plain-value record of one fit that the driver loop and the transports share."""

from __future__ import annotations

from dataclasses import dataclass

from sparkdl.config import FitConfig
from sparkdl.core.compression import QUANTIZED
from sparkdl.core.pieces import DEFAULT_PIECE_BYTES
from sparkdl.core.schedule import RoundPlan
from sparkdl.keras.spec import CompileSpec, ModelSpec
from sparkdl.spark.data import PreparedData
from sparkdl.spark.training.faults import TaskHooks
from sparkdl.spark.training.tasks import TaskSpec

PIECE_BYTES = DEFAULT_PIECE_BYTES  # the largest piece of an update a task returns (bytes)


@dataclass(frozen=True)
class TrainJob:
    """Everything a fit's rounds need, as values resolved on the driver.

    Never holds a SparkSession, a live Keras model or the estimator itself (``reader`` is the
    driver's metric reader; it never travels to a task).

    Attributes:
        fit_id: unique id of this fit (cache key for replicas and partitions on workers).
        spec: architecture and initial weights.
        compile_spec: optimizer, loss, metrics.
        data: the prepared, cached training data.
        plan: which rows each worker trains on in each round.
        config: the fit's settings.
        reader: the driver's :class:`~sparkdl.keras.metrics.MetricReader`.
        names: one name per weight array (messages, the server's signature).
        trainable: per weight array, whether it is trainable (the others are statistics).
        validation: the prepared, cached validation data, or None.
        budget_bytes: a task's memory budget for its partition (bytes); larger ones stay on disk.
        custom_objects: the driver's registered Keras objects, shipped to every task.
        hooks: fault-injection hooks (tests), None in a production fit.
        cluster: the cluster's facts, read once before any job (:class:`~sparkdl.spark.cluster.ClusterFacts`).
        state_bytes: the model's state in bytes (weights and optimizer state: one worker's update).
    """

    fit_id: str
    spec: ModelSpec
    compile_spec: CompileSpec
    data: PreparedData
    plan: RoundPlan
    config: FitConfig
    reader: object
    names: tuple[str, ...]
    trainable: tuple[bool, ...]
    validation: PreparedData | None = None
    budget_bytes: int = 2**62
    custom_objects: dict | None = None
    hooks: TaskHooks | None = None
    cluster: object | None = None
    state_bytes: int = 0

    @property
    def spark(self):
        return self.data.df.sparkSession

    @property
    def workers(self) -> int:
        return len(self.plan.partition_rows)

    @property
    def quantized(self) -> bool:
        """Whether workers keep state of their own between rounds (1bit/threshold residuals)."""
        return self.config.compression in QUANTIZED

    def placeholder_rows(self):
        """The cached training data as one byte column (``_``, ByteType): a job over it runs each
        task where the partition's cached block is (cache locality) and hands it a byte per row
        instead of the rows (the rows come from the task's Python worker or its executor's disk)."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        return self.data.rows_df.select(F.lit(0).cast(T.ByteType()).alias("_"))

    def release_executors(self) -> None:
        """After an early stop: one job over the partition ids that frees what the last round would
        have (each partition's cached rows, validation rows, 1bit/threshold state and, with them, the
        replica), so that no executor keeps the fit until its cache's idle timeout. Best effort: a
        failure is logged, the fit's result stands."""
        import logging

        from sparkdl.spark.jobs import run_job
        from sparkdl.spark.training.tasks import RELEASE_SPARK_SCHEMA, release_partition

        task = self.task_spec()
        out = self.placeholder_rows().mapInArrow(lambda batches: release_partition(task, batches), RELEASE_SPARK_SCHEMA)
        try:
            run_job(self.spark, out.toArrow, f"sparkdl fit {self.fit_id[:8]}: release the executors' caches after an early stop",
                    f"sparkdl-{self.fit_id}-release", self.config.round_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the caches also expire on their own (LRU, idle timeout)
            logging.getLogger("sparkdl").warning("fit %s: releasing the executors' caches failed: %s", self.fit_id[:8], exc)

    def task_spec(self, per_worker: bool = False) -> TaskSpec:
        """The settings the fit's tasks receive (plain values)."""
        config = self.config
        return TaskSpec(
            fit_id=self.fit_id, spec=self.spec.architecture_only(), compile_spec=self.compile_spec, columns=self.data.columns,
            plan=self.plan, batch_size=config.batch_size, seed=config.seed, shuffle=config.shuffle,
            custom_objects=dict(self.custom_objects or {}), idle_s=max(3600.0, 2 * config.round_timeout_s),
            canonical_order=not config.keep_partitioning, piece_bytes=PIECE_BYTES, budget_bytes=self.budget_bytes,
            validation=self.validation.columns if self.validation is not None else None,
            compression=config.compression, threshold=config.compression_threshold, per_worker=per_worker,
            mixed_precision=config.mixed_precision, hooks=self.hooks,
        )
