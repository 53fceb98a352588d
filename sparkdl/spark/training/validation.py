"""Validation between epochs, and the reading of any evaluation job's summed metric variables.

One job over the cached validation data evaluates the master weights (each partition's task:
:func:`~sparkdl.spark.training.tasks.evaluate_partition`); the partitions' summed metric
variables are added up on the driver and read as Keras reads them (exact: never a mean of
per-partition means). ``KerasModel.evaluate`` reads its job the same way.
"""

from __future__ import annotations

import pyarrow as pa

from sparkdl.core.metrics import MetricSums
from sparkdl.errors import InvariantError
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays
from sparkdl.spark.jobs import run_job
from sparkdl.spark.session import share
from sparkdl.spark.training.tasks import VALIDATION_SPARK_SCHEMA, TaskSpec, evaluate_partition


class Validator:
    """Validates a fit's master weights on its prepared validation data.

    Args:
        spark: the fit's session.
        data: the prepared, cached validation data (:class:`~sparkdl.spark.data.PreparedData`).
        task: the fit's task settings (with ``validation`` columns).
        reader: the driver's :class:`~sparkdl.keras.metrics.MetricReader`.
        timeout_s: seconds one validation job may run (a whole pass over the validation rows).
    """

    def __init__(self, spark, data, task: TaskSpec, reader, timeout_s: float) -> None:
        self.spark, self.data, self.task, self.reader, self.timeout_s = spark, data, task, reader, timeout_s

    def __call__(self, weights: list, epoch: int, last: bool) -> dict:
        """The ``val_*`` loss and metrics of ``weights`` (the master after ``epoch``); ``last``
        releases the executors' copies of the validation data."""
        task = self.task
        description = f"sparkdl fit {task.fit_id[:8]}: validation after epoch {epoch + 1}"
        table = evaluation_job(self.spark, self.data, task, encode_arrays(weights), last, description,
                               f"sparkdl-{task.fit_id}-val-{epoch}", self.timeout_s)
        values = summed_evaluation(table, len(self.data.partition_rows), self.data.total_rows, self.reader,
                                   f"validation after epoch {epoch + 1}")
        return {f"val_{name}": value for name, value in values.items()}


def evaluation_job(spark, data, task: TaskSpec, weights: bytes, last: bool, description: str, tag: str, timeout_s: float) -> pa.Table:
    """One job over the prepared ``data`` evaluating ``weights`` (Arrow IPC bytes, shared with the
    executors as a broadcast, destroyed when the job ends): one row per partition."""
    rows = data.partition_rows
    broadcast = share(spark, weights, "the weights to evaluate")
    try:
        out = data.df.mapInArrow(lambda batches: evaluate_partition(task, rows, broadcast, last, batches), VALIDATION_SPARK_SCHEMA)
        return run_job(spark, out.toArrow, description, tag, timeout_s)
    finally:
        broadcast.destroy()


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
