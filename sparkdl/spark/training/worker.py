"""What a long-lived worker task does whatever its transport (``ps``, ``sharded``): heartbeats from a
thread of its own, its partition's rows loaded and counted, one slot of the schedule trained, and
the signal that a later attempt of it took over. Executor-side; nothing here runs on the driver.
"""

from __future__ import annotations

import threading

from sparkdl.core.schedule import epoch_order
from sparkdl.errors import InvariantError
from sparkdl.server.tls import TLSPin
from sparkdl.spark.partitions import load_partition, release
from sparkdl.spark.training.tasks import TaskSpec, hook_point, validation_columns


class SupersededAttempt(RuntimeError):
    """This task attempt's worker has a later attempt (Spark resubmitted the stage, e.g. after an
    executor was lost, while this attempt still ran): this one ends, freeing its task slot for the
    resubmitted tasks. Spark does not count a failure of a superseded stage attempt's task."""


class Heartbeat:
    """A thread that tells a server of the fit (the driver's parameter server or coordinator), every
    ``interval_s`` seconds, that this task is alive, and learns from the reply whether a later
    attempt of its worker has started (:attr:`superseded`). The last reply is :attr:`reply`.

    Args:
        location, token, tls: the server's address, the fit's token, its pinned certificate.
        interval_s: seconds between beats (``FitConfig.heartbeat_s``: a tenth of ``workerTimeout``).
        partition, attempt: this worker and its task attempt id.
        call_timeout_s: the longest a beat's call may take; capped at 2.5 beats (a quarter of
            ``workerTimeout``), so one stuck call cannot silence the worker.
    """

    def __init__(self, location: str, token: str, tls: TLSPin | None, interval_s: float, partition: int, attempt: int,
                 call_timeout_s: float = 30.0) -> None:
        self.location, self.token, self.tls, self.interval_s = location, token, tls, interval_s
        self.partition, self.attempt = partition, attempt
        self.call_timeout_s = min(call_timeout_s, 2.5 * interval_s)
        self.superseded = threading.Event()
        self.reply: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sparkdl-heartbeat-{partition}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _run(self) -> None:
        from sparkdl.server import ParameterServerClient

        client = None
        while not self._stop.is_set():
            try:
                if client is None:
                    client = ParameterServerClient(self.location, self.token, tls=self.tls, timeout_s=self.call_timeout_s, retries=0)
                self.reply = client.heartbeat(self.partition, attempt=self.attempt)
                if self.reply.get("superseded"):
                    self.superseded.set()
            except Exception:  # noqa: BLE001 - the next beat tries again; the task's own calls report real failures
                pass
            self._stop.wait(self.interval_s)
        if client is not None:
            client.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.call_timeout_s + 1)


def load_rows(task: TaskSpec, partition: int, batches):
    """This worker's partition (:func:`~sparkdl.spark.partitions.load_partition`: from this Python
    worker, this executor's disk, or ``batches``), checked against the rows the driver counted.

    Raises:
        InvariantError: the partition holds another number of rows (a non-deterministic input).
    """
    plan = task.plan
    expected = plan.partition_rows[partition] if partition < len(plan.partition_rows) else 0
    data = load_partition(task.fit_id, "train", partition, task.columns, batches, expected, task.budget_bytes, task.canonical_order)
    if len(data) != expected:
        release(task.fit_id, "train", partition)
        raise InvariantError(
            f"partition {partition} must hold the {expected} rows counted before training. Received: {len(data)} rows "
            "(the cached training data changed; is the input non-deterministic?)"
        )
    return data


def load_validation(task: TaskSpec, partition: int, batches, expected: int):
    """This worker's validation rows (from this Python worker's cache, or ``batches``), checked
    against the ``expected`` rows the driver counted.

    Raises:
        InvariantError: another number of rows (a non-deterministic input).
    """
    data = load_partition(task.fit_id, "val", partition, validation_columns(task), batches, expected, task.budget_bytes, True, share=False)
    if len(data) != expected:
        release(task.fit_id, "val", partition)
        raise InvariantError(f"validation partition {partition} must hold the {expected} rows counted. Received: {len(data)}")
    return data


def train_slot(task: TaskSpec, replica, data, partition: int, g: int, attempt_number: int) -> tuple[list, int, int]:
    """Train slot ``g`` (the fit's round index) of ``partition`` on ``replica``: the rows, order and
    seeds of backend ``rounds`` (:class:`~sparkdl.core.schedule.RoundPlan`, ``epoch_order``,
    ``Replica.seed_round``), after the fault hooks. Returns ``(metric sums, rows, steps)``."""
    plan = task.plan
    epoch, r = divmod(g, plan.rounds_per_epoch)
    begin, stop = plan.row_range(partition, r)
    expected = plan.partition_rows[partition]
    replica.seed_round(task.seed, epoch, r, partition)
    order = epoch_order(expected, task.seed, epoch, partition, task.shuffle)[begin:stop]
    hook_point(task, partition, epoch, r, g, attempt_number)
    arrays = data.arrays
    metrics = replica.train(arrays.x, arrays.y, task.batch_size, sample_weight=arrays.w, rows=data.rows(order),
                            pads=task.columns.input_pads)
    rows = int(stop) - int(begin)
    return metrics, rows, -(-rows // task.batch_size)
