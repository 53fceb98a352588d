"""Python workers warmed while a fit's data is prepared.

A cold Python worker spends seconds importing TensorFlow and building the fit's replica. The data's
check job cannot start its Python tasks before its shuffle (the ``repartition``) and the driver's
planning end, so a warm-up inside those tasks alone follows them. :class:`WorkerWarmUp` starts, beside
the check job, a job of one task per worker whose task starts that import and build on a thread of its
Python worker (:func:`sparkdl.keras.runtime.warm_up`) and returns at once, freeing its slot for the
shuffle: the import overlaps the shuffle and the planning, and the check tasks, reusing those Python
workers (``spark.python.worker.reuse``), find it done or wait for it. Every task that configures Keras
in such a worker waits for the thread first (:func:`sparkdl.keras.runtime.configure`), so an import or
replica build never runs twice at once. Best effort: a failure is logged (debug) and left to the
training tasks, which meet it again and report it. Not with ``spark.python.worker.reuse=false`` (a
worker ends with its task) nor with GPUs per task (a worker that never trains would hold GPU memory).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark import InheritableThread

from sparkdl.spark.session import cancel_tag, tag_jobs

log = logging.getLogger("sparkdl")


def _start_warm_up(batches: Iterator[pa.RecordBatch], backend: str | None, warm: Callable[[], None] | None) -> Iterator[pa.RecordBatch]:
    """A warm-up task: drains its partition (one id), starts this Python worker's warm-up thread and returns nothing."""
    from pyspark import TaskContext

    from sparkdl.keras.runtime import warm_up

    for _ in batches:
        pass
    context = TaskContext.get()
    warm_up(context.cpus(), context.resources(), backend, warm)  # the thread goes on after the task returns
    return iter(())


class WorkerWarmUp:
    """A warm-up job of ``workers`` tasks, run on a thread of its own under ``tag`` (see the module docstring).

    Args:
        spark: the fit's session.
        workers: tasks (the fit's workers), one per partition of ``spark.range``.
        backend: the driver's Keras backend, selected in each task before the import.
        warm: run after the import on each worker's warm-up thread (the fit's replica built into the
            worker's cache: :func:`sparkdl.spark.training.tasks.warm_replica`); None: import only.
        tag: the job tag the job runs under (:meth:`stop` cancels it).
        description: the job's description in the Spark UI.
    """

    def __init__(self, spark, workers: int, backend: str | None, warm: Callable[[], None] | None, tag: str,
                 description: str) -> None:
        self._spark, self._tag, self._thread = spark, tag, None
        try:
            df = spark.range(0, workers, 1, workers).mapInArrow(lambda batches: _start_warm_up(batches, backend, warm), "_ int")
        except Exception as exc:  # noqa: BLE001 - a warm-up only
            log.debug("sparkdl: the workers' warm-up job could not be planned: %s", exc)
            return

        def run() -> None:
            try:
                tag_jobs(spark, tag, description)
                df.collect()
            except Exception as exc:  # noqa: BLE001 - a warm-up only: the check job meets the cause again and reports it
                log.debug("sparkdl: the workers' warm-up job failed: %s", exc)

        self._thread = InheritableThread(run, session=spark, name=tag, daemon=True)
        self._thread.start()

    def stop(self, cancel: bool = False, timeout_s: float = 30.0) -> None:
        """End the job: wait at most ``timeout_s`` seconds for it (its tasks return at once), then
        cancel it if it still runs; with ``cancel`` (the fit failed), cancel it at once."""
        if self._thread is None:
            return
        try:
            if not cancel:
                self._thread.join(timeout_s)
        finally:
            if self._thread.is_alive():
                cancel_tag(self._spark, self._tag)
                self._thread.join(timeout_s)
