"""Executor-side task code of backend ``ps``: one long-lived task per worker, talking to the
parameter server on the driver (:mod:`sparkdl.server`).

A task runs its worker's slots ``[first, last)`` of the fit's schedule (a slot is a round:
(epoch, round), the same rows and seeds as backend ``rounds``: :class:`~sparkdl.core.schedule.RoundPlan`,
``epoch_order``, ``Replica.seed_round``), keeping its partition and its Keras replica:

* round modes (``sync``, ``bmuf``, ``easgd``, ``gossip``): in each slot where it has rows the
  worker waits until the driver opened the round (``wait_round``), pulls its start state
  (``state:<partition>``), trains τ steps and pushes its state, or its fp16 / 1bit / threshold
  update, its rows and metric sums. A round the driver closed without it (a straggler) is skipped.
* asynchronous modes: in each slot where it has rows the worker pulls the master weights
  (keeping its own optimizer state), trains τ steps and pushes Δ = new − pulled weights, applied
  by the mode's rule as it arrives; ``ssp`` first waits until it is at most ``staleness`` clocks
  ahead of the slowest worker.

Every push carries (worker = partition, attempt, seq = slot + 1): the server applies each slot
once. A retried task (Spark retries a failed one) asks the server which slot of its worker was
applied last and skips those; its own state (1bit/threshold residual, its optimizer state) comes
back from this executor's disk (asynchronous modes: saved after every slot), else from the
server (a resumed fit), else starts afresh (counted in ``fitInfo["local_state_resets"]``). A thread of its own sends a heartbeat every ``heartbeat_s`` seconds from the task's
start, so the driver's ``workerTimeout`` measures a dead or stopped worker, not a slow step, a
TensorFlow import or a replica build.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.pandas.types import from_arrow_schema

from sparkdl.core.board import encode_metric_sums
from sparkdl.core.compression import QUANTIZED, encode_update, quantize_update
from sparkdl.core.state import ModelState, WorkerLocal
from sparkdl.server.tls import TLSPin
from sparkdl.spark.partitions import release, split_validation
from sparkdl.spark.training import recovery, worker_state
from sparkdl.spark.training.tasks import TaskSpec, evaluate_rows, hook_point, prepare_worker, replica_for
from sparkdl.spark.training.worker import Heartbeat, SupersededAttempt, load_rows, load_validation, train_slot

RESULT_SCHEMA = pa.schema([(name, pa.int32() if name == "partition" else pa.int64()) for name in
                           ("partition", "attempt", "rows", "steps", "pushes", "dropped", "skipped", "late", "local_resets")])
RESULT_SPARK_SCHEMA = from_arrow_schema(RESULT_SCHEMA)
WAIT_CHUNK_S = 5.0  # a server-side wait lasts at most this long before the worker asks again


@dataclass(frozen=True)
class PSTaskSpec:
    """What travels to the ps tasks: the fit's plain settings, the server's address, token and
    pinned certificate (no weights), the mode, the slots ``[first, last)`` this stage runs, and
    the clients' timeouts (seconds).

    ``snapshots``: the fit writes snapshots, so a worker of a quantized round mode puts its own
    state on the server after its last slot of each epoch (a snapshot after a later round of the
    epoch needs it); ``final``: whether ``last`` is the fit's last slot; ``validation_rows``: the
    validation rows of each partition, when the workers evaluate the master in their tasks (their
    partitions hold those rows beside the training rows), else None.
    """

    task: TaskSpec
    mode: str
    rounds_mode: bool
    location: str
    token: str
    tls: TLSPin | None
    staleness: int
    first: int
    last: int
    final: bool
    snapshots: bool = False
    call_timeout_s: float = 30.0
    retries: int = 3
    heartbeat_s: float = 2.0  # FitConfig.heartbeat_s: a tenth of workerTimeout, at most 2 s
    validation_rows: tuple[int, ...] | None = None  # per partition; set: each worker validates its share in its task


def _nbytes(state: ModelState) -> int:
    """Bytes of a pulled state's arrays (what the pull brought)."""
    return sum(np.asarray(a).nbytes for a in [*state.weights, *(state.optimizer or [])])


def ps_partition(spec: PSTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ps task: heartbeats from the start, load the partition, run :class:`Worker`, yield one
    result row. A failure is reported to the server (heartbeat ``"error"`` with the message)
    before it is raised, for the driver's message; Spark retries the task."""
    from sparkdl.server import ParameterServerClient

    context = TaskContext.get()
    partition = context.partitionId()
    attempt = context.taskAttemptId()  # unique in the application and rising: a retry supersedes
    heartbeat = Heartbeat(spec.location, spec.token, spec.tls, spec.heartbeat_s, partition, attempt, spec.call_timeout_s).start()
    client = ParameterServerClient(spec.location, spec.token, tls=spec.tls, timeout_s=spec.call_timeout_s, retries=spec.retries)
    task = spec.task
    try:
        prepare_worker(context, task)
        kept: list = []
        data = load_rows(task, partition, split_validation(batches, kept) if spec.validation_rows else batches)
        expected = len(data)
        val_rows = spec.validation_rows[partition] if spec.validation_rows else 0
        worker = Worker(spec, client, partition, attempt, context.attemptNumber(), superseded=heartbeat.superseded)
        if val_rows:
            worker.validation = load_validation(task, partition, iter(kept), val_rows)
        del kept
        counts = worker.run(data) if expected or val_rows else worker.counts
        if spec.final or worker.stopped:
            worker_state.drop(task.fit_id, partition)
            release(task.fit_id, "train", partition)
            release(task.fit_id, "val", partition)
        client.heartbeat(partition, "done", attempt=attempt)
    except BaseException as exc:
        try:
            client.heartbeat(partition, "error", f"{type(exc).__name__}: {exc}", attempt=attempt)
        except Exception:  # noqa: BLE001 - the task's own error is the one to raise
            pass
        raise
    finally:
        heartbeat.stop()
        client.close()
    yield pa.RecordBatch.from_pylist([{"partition": partition, "attempt": attempt, **counts}], schema=RESULT_SCHEMA)


class Worker:
    """One worker's slots ``[spec.first, spec.last)`` against the parameter server.

    Args:
        spec: the stage's settings.
        client: a :class:`~sparkdl.server.ParameterServerClient` of the fit's server.
        partition: this worker's partition (its id on the server).
        attempt: this task's attempt id (higher supersedes lower).
        attempt_number: Spark's attempt number of the task (0 first), for the fault hooks.
        superseded: set when a later attempt of this worker has started (by :class:`Heartbeat`):
            the worker then raises :class:`SupersededAttempt` at its next slot or wait.
    """

    def __init__(self, spec: PSTaskSpec, client, partition: int, attempt: int, attempt_number: int = 0,
                 superseded: threading.Event | None = None) -> None:
        self.spec, self.client, self.partition, self.attempt = spec, client, partition, attempt
        self.attempt_number = attempt_number
        self.superseded = superseded if superseded is not None else threading.Event()
        task = spec.task
        self.plan, self.quantized = task.plan, task.compression in QUANTIZED
        self.counts = {"rows": 0, "steps": 0, "pushes": 0, "dropped": 0, "skipped": 0, "late": 0, "local_resets": 0}
        self.stopped = False
        self.local: WorkerLocal | None = None
        self.validation = None  # this worker's validation rows (a Partition), when it validates in its task
        self.validated: set[int] = set()  # the epochs whose validation this attempt ran

    def slots(self) -> list[int]:
        """The slots of ``[first, last)`` in which this worker has rows."""
        rounds = self.plan.rounds_per_epoch
        out = []
        for g in range(self.spec.first, self.spec.last):
            begin, stop = self.plan.row_range(self.partition, g % rounds)
            if stop > begin:
                out.append(g)
        return out

    def run(self, data) -> dict:
        """Run the slots; returns the counts: ``rows`` and ``steps`` trained, ``pushes`` sent,
        ``dropped`` (pushes the server did not apply), ``skipped`` (slots an earlier attempt had
        pushed), ``late`` (round-mode slots whose round closed without this worker), and
        ``local_resets`` (1 when this worker's own state was found nowhere)."""
        spec, client = self.spec, self.client
        self.replica = replica_for(spec.task)
        self.exact = [not t for t in self.replica.trainable]  # quantized updates: the non-trainable weights travel exactly
        highest, last_seq = client.progress(self.partition)
        if highest is None or highest > self.attempt:
            last_seq = 0  # a first attempt (or a zombie of an older attempt: its pushes are dropped anyway)
        slots = self.slots()
        applied = [g for g in slots if g + 1 <= (last_seq or 0)]
        self.counts["skipped"] = len(applied)
        self.local = self._own_state(max(applied[-1] if applied else -1, self._before_first(slots)))
        self.data = data
        for g in slots[len(applied):]:
            if self.stopped:
                break
            self._check_current()
            if spec.rounds_mode:
                self._round_slot(g, slots)
            else:
                self._async_slot(g, slots)
        if not spec.rounds_mode and not self.stopped and slots:
            self._put_local(slots[-1])  # the optimizer state (and residual) it keeps, for a snapshot or the next stage
        if self.validation is not None and not self.stopped:
            self._last_validation()
        return self.counts

    def _before_first(self, slots: list[int]) -> int:
        """The slot this worker last trained before this stage (its own state's version), -1 for none."""
        rounds = self.plan.rounds_per_epoch
        for g in range(self.spec.first - 1, -1, -1):
            begin, stop = self.plan.row_range(self.partition, g % rounds)
            if stop > begin:
                return g
        return -1

    def _own_state(self, version: int) -> WorkerLocal | None:
        """This worker's own state after slot ``version``: from this Python worker or executor's
        disk, else from the server (a resumed fit), else None (counted when one was expected)."""
        needed = self.quantized if self.spec.rounds_mode else True
        if version < 0 or not needed:
            return None
        local = worker_state.load(self.spec.task.fit_id, self.partition, version)
        if local is None:
            served = self.client.pull_local(self.partition)
            local = served if served is not None and served.version == version else None
        if local is None:  # a retry on another executor: it starts afresh (counted in fitInfo["local_state_resets"])
            self.counts["local_resets"] = 1
        return local

    # ---- a slot ----------------------------------------------------------------------------------

    def _train(self, g: int) -> dict:
        metrics, self.rows, self.steps = train_slot(self.spec.task, self.replica, self.data, self.partition, g, self.attempt_number)
        return metrics

    def _applied(self, reply: dict) -> bool:
        self.counts["pushes"] += 1
        if not reply.get("applied"):
            self.counts["dropped"] += 1
            return False
        self.counts["rows"] += self.rows
        self.counts["steps"] += self.steps
        return True

    def _check_current(self) -> None:
        # recovery's owner decides (the parameter server holds the state: nothing to hand off, the attempt just ends)
        if recovery.supersession(later_attempt=self.superseded.is_set(), newer_stage=False) != recovery.GO_ON:
            raise SupersededAttempt(f"task attempt {self.attempt} of worker {self.partition} is superseded by a later attempt "
                                    "(Spark resubmitted the stage while it ran); it ends to free its task slot")

    def _wait_open(self, g: int) -> dict:
        while True:
            self._check_current()
            reply = self.client.wait_round(g, WAIT_CHUNK_S, worker=self.partition)
            if reply.get("validate") is not None and self.validation is not None:
                self._validate(reply["validate"])  # the master after an epoch this worker is done with
                continue
            if reply["open"] or reply["late"] or reply["stop"]:
                return reply

    # ---- validation in the task ------------------------------------------------------------------

    def _validate(self, epoch: int) -> None:
        """Evaluate the master the driver posted for ``epoch`` on this worker's validation rows and report the sums."""
        weights = self.client.validation_weights(epoch)
        hook_point(self.spec.task, self.partition, epoch, -1, -(epoch + 1), self.attempt_number)  # (fault injection: index -(epoch + 1))
        sums = evaluate_rows(self.spec.task, self.replica, self.validation, weights)
        self.client.report_validation(self.partition, self.attempt, epoch, len(self.validation), encode_metric_sums(sums))
        self.validated.add(epoch)

    def _last_validation(self) -> None:
        """After this stage's last slot: run the validations still asked of this worker, up to the
        one of the stage's last epoch (or the fit's stop)."""
        last_epoch = (self.spec.last - 1) // self.plan.rounds_per_epoch
        while True:
            self._check_current()
            reply = self.client.wait_validation(self.partition, last_epoch, WAIT_CHUNK_S)
            if reply.get("validate") is not None:
                self._validate(reply["validate"])
            elif reply.get("done") or reply.get("stop"):
                return

    def _round_slot(self, g: int, slots: list[int]) -> None:
        spec, client, task = self.spec, self.client, self.spec.task
        reply = self._wait_open(g)
        if reply["stop"]:
            self.stopped = True
            return
        if reply["late"]:
            self.counts["late"] += 1  # the round closed without this worker (straggler-tolerant rounds)
            return
        version, start = client.pull(worker=self.partition)
        pulled = _nbytes(start)
        own = self.local.optimizer if self.quantized and self.local is not None and self.local.optimizer is not None else start.optimizer
        self.replica.set_state(ModelState(start.weights, own))
        if reply.get("learning_rate") is not None:
            self.replica.set_learning_rate(reply["learning_rate"])
        metrics = self._train(g)
        state = self.replica.get_state()
        names, encoding, local = None, None, self.local
        if task.compression is None:
            update = state
        elif task.compression == "fp16":
            update, encoding = encode_update(state, start, "fp16"), "fp16"
        else:
            payload, residual = quantize_update(state.weights, start.weights, self.local.residual if self.local else None,
                                                task.compression, task.threshold, exact=self.exact)
            update, names, encoding = ModelState([np.frombuffer(payload, np.uint8)]), ["payload"], task.compression
            local = WorkerLocal(g, [np.asarray(a) for a in residual], list(state.optimizer))
            worker_state.save(task.fit_id, self.partition, local)
            if reply.get("collect"):
                client.push_local(local, worker=self.partition, attempt=self.attempt, seq=g + 1)
        epoch = g // self.plan.rounds_per_epoch
        pushed = client.push(update, worker=self.partition, attempt=self.attempt, seq=g + 1, base_version=version, rows=self.rows,
                             extra={"epoch": epoch, "metrics": encode_metric_sums(metrics), "pulled": pulled}, names=names, encoding=encoding)
        if self._applied(pushed):
            self.local = local
        elif pushed.get("dropped") == "late":
            self.counts["late"] += 1  # dropped whole: the residual and optimizer state stay as before this slot
        if self.quantized and spec.snapshots and self.local is not None and self._last_of_epoch(g, slots):
            self._put_local(g)  # a snapshot after a later round of this epoch finds this worker's state

    def _last_of_epoch(self, g: int, slots: list[int]) -> bool:
        """Whether ``g`` is this worker's last slot of its epoch while the epoch has later rounds."""
        rounds = self.plan.rounds_per_epoch
        epoch_end = (g // rounds + 1) * rounds - 1
        later = [s for s in slots if g < s <= epoch_end]
        return g < epoch_end and not later

    def _put_local(self, g: int) -> None:
        if self.local is None and self.spec.rounds_mode:
            return
        local = self.local if self.local is not None else WorkerLocal(g, None, None)
        self.client.push_local(local, worker=self.partition, attempt=self.attempt, seq=local.version + 1)

    def _async_slot(self, g: int, slots: list[int]) -> None:
        spec, client, task = self.spec, self.client, self.spec.task
        if spec.mode == "ssp":
            while True:
                self._check_current()
                reply = client.wait_clock(self.partition, spec.staleness, WAIT_CHUNK_S)
                if reply.get("stop"):
                    self.stopped = True
                    return
                if reply.get("reached"):
                    break
        own = self.local is not None and self.local.optimizer is not None
        version, master = client.pull(weights_only=own)
        pulled = _nbytes(master)
        if client.control.get("stop"):
            self.stopped = True
            return
        if own:
            self.replica.set_state(ModelState(master.weights, self.local.optimizer))
        else:
            self.replica.set_state(master)  # the optimizer state stays the worker's after the first pull
        if client.control.get("learning_rate") is not None:
            self.replica.set_learning_rate(client.control["learning_rate"])
        metrics = self._train(g)
        state = self.replica.get_state()
        rounds = self.plan.rounds_per_epoch
        epoch = g // rounds
        final = spec.final and g == slots[-1]
        epoch_end = final or not [s for s in slots if g < s < (epoch + 1) * rounds]
        residual = self.local.residual if self.local is not None else None
        update, names, encoding, residual = self._async_update(state, master, residual, final)
        if epoch_end:  # the worker's optimizer state: the server keeps its latest (snapshots, the fitted model)
            update = ModelState(update.weights, list(state.optimizer)) if encoding is None else update
        extra = {"epoch": epoch, "clock": g + 1, "metrics": encode_metric_sums(metrics), "final": final, "pulled": pulled,
                 "worker_rows": int(self.plan.partition_rows[self.partition])}
        pushed = client.push(update, worker=self.partition, attempt=self.attempt, seq=g + 1, base_version=version, rows=self.rows,
                             extra=extra, names=names, encoding=encoding)
        self._applied(pushed)
        self.local = WorkerLocal(g, residual, list(state.optimizer))
        worker_state.save(task.fit_id, self.partition, self.local)  # its optimizer state (and residual), for a retry here

    def _async_update(self, state: ModelState, master: ModelState, residual, final: bool):
        """What an asynchronous worker pushes: ``(update, names, encoding, new residual)``: Δ = its
        weights − the pulled ones, as they are, as float16 (fp16), or quantized with the residual kept
        here (1bit, threshold). The last push goes in full precision with the residual added (nothing
        of the worker's updates is left behind)."""
        deltas = [np.subtract(w, b, dtype=w.dtype) if w.dtype.kind == "f" else w for w, b in zip(state.weights, master.weights, strict=True)]
        compression = self.spec.task.compression
        if final or compression is None:
            if residual is not None:  # (arrays sent exactly, and non-float ones, keep an empty residual)
                deltas = [(d + r).astype(d.dtype) if d.dtype.kind == "f" and r.size == d.size else d
                          for d, r in zip(deltas, residual, strict=True)]
            return ModelState(deltas, None), None, None, None
        if compression == "fp16":
            return encode_update(ModelState(state.weights), ModelState(master.weights), "fp16"), None, "fp16", residual
        payload, residual = quantize_update(state.weights, master.weights, residual, compression, self.spec.task.threshold, exact=self.exact)
        return ModelState([np.frombuffer(payload, np.uint8)]), ["payload"], compression, [np.asarray(a) for a in residual]
