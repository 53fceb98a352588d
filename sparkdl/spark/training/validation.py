"""Validation between epochs, and the reading of any evaluation job's summed metric variables.

Where the transport's long-lived worker tasks hold the validation rows (backend ``ps``, a round
mode: each worker's partition holds its share of them), the workers evaluate the master weights
inside their tasks (:meth:`~sparkdl.spark.training.contract.Transport.validate`): no Spark job, and the
stage goes on. Otherwise one job over the cached validation data evaluates them (each partition's
task: :func:`~sparkdl.spark.training.tasks.evaluate_partition`), after the transport freed its
task slots. Either way the partitions' summed metric variables are added up on the driver and read
as Keras reads them (exact: never a mean of per-partition means). ``KerasModel.evaluate`` reads
its job the same way.
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

    def __call__(self, weights: list, epoch: int, last: bool, transport) -> dict:
        """The ``val_*`` loss and metrics of ``weights`` (the master after ``epoch``), evaluated in
        ``transport``'s worker tasks where it can, else by a job after it freed its slots; ``last``
        releases the executors' copies of the validation data.

        Raises:
            InvariantError: the evaluations do not cover every validation row exactly once.
        """
        task, data = self.task, self.data
        what = f"validation after epoch {epoch + 1}"
        reports = transport.validate(weights, epoch, last)
        if reports is None:
            transport.pause()
            table = evaluation_job(self.spark, data, task, encode_arrays(weights), last, f"sparkdl fit {task.fit_id[:8]}: {what}",
                                   f"sparkdl-{task.fit_id}-val-{epoch}", self.timeout_s)
            reports = table_reports(table)
        return self.read(reports, epoch)

    def read(self, reports: dict[int, tuple[int, list | None]], epoch: int) -> dict:
        """The ``val_*`` logs of an evaluation after ``epoch`` from its ``{partition: (rows, metric
        sums)}`` (a job's, the workers' tasks', or a round's that carried it); partitions without
        validation rows may be left out.

        Raises:
            InvariantError: they do not cover every validation row exactly once.
        """
        data = self.data
        reports = {**{p: (0, None) for p, n in enumerate(data.partition_rows) if not n}, **reports}
        values = summed(reports, len(data.partition_rows), data.total_rows, self.reader, f"validation after epoch {epoch + 1}")
        return {f"val_{name}": value for name, value in values.items()}


def evaluation_job(spark, data, task: TaskSpec, weights: bytes, last: bool, description: str, tag: str, timeout_s: float) -> pa.Table:
    """One job over the prepared ``data`` evaluating ``weights`` (Arrow IPC bytes, shared with the
    executors as a broadcast, destroyed when the job ends): one row per partition."""
    rows = data.partition_rows
    broadcast = share(spark, weights, "the weights to evaluate")
    try:
        out = data.rows_df.mapInArrow(lambda batches: evaluate_partition(task, rows, broadcast, last, batches), VALIDATION_SPARK_SCHEMA)
        return run_job(spark, out.toArrow, description, tag, timeout_s)
    finally:
        broadcast.destroy()


def table_reports(table: pa.Table) -> dict[int, tuple[int, list | None]]:
    """An evaluation job's rows (:func:`evaluate_partition`'s) as ``{partition: (rows, metric sums or None)}``.

    Raises:
        InvariantError: a partition reported twice.
    """
    found = table.to_pydict()
    out = {}
    for partition, rows, payload in zip(found["partition"], found["rows"], found["payload"], strict=True):
        if partition in out:
            raise InvariantError(f"an evaluation must report each partition once. Received partition {partition} twice")
        out[partition] = (rows, decode_arrays(payload).arrays if payload is not None else None)
    return out


def summed(reports: dict[int, tuple[int, list | None]], partitions: int, total_rows: int, reader, what: str) -> dict:
    """The loss and metrics of an evaluation's ``reports`` (``{partition: (rows, summed metric
    variables)}``): added up and read as Keras reads them.

    Raises:
        InvariantError: when the reports do not cover every partition and all ``total_rows`` rows (``what`` names the evaluation).
    """
    if sorted(reports) != list(range(partitions)) or sum(rows for rows, _ in reports.values()) != total_rows:
        raise InvariantError(
            f"{what} must cover the {total_rows} rows of every partition. Received "
            f"partitions {sorted(reports)} with {sum(rows for rows, _ in reports.values())} rows"
        )
    sums = MetricSums()
    for _, arrays in reports.values():
        if arrays is not None:
            sums.add(arrays)
    return reader.results(sums.total())


def summed_evaluation(table: pa.Table, partitions: int, total_rows: int, reader, what: str) -> dict:
    """:func:`summed` of an evaluation job's result (:func:`evaluate_partition`'s rows)."""
    return summed(table_reports(table), partitions, total_rows, reader, what)
