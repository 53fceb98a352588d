"""Transport ``rounds``: each round is a Spark job (SparkNet, Moritz et al. 2016).

Per round the driver encodes the start state as Arrow IPC bytes and sends it once as a Spark
broadcast (torrent-distributed, destroyed when the round ends); the task closure carries only
plain settings (:class:`~sparkdl.spark.training.tasks.TaskSpec`,
:class:`~sparkdl.spark.training.tasks.RoundTask`). On Spark Connect, which has no broadcast, the
bytes ride in the round's task closure instead, inside the plan
(:func:`sparkdl.spark.session.share`; the fit is refused before any job when they cannot fit
Connect's message limit). Each task trains its partition's rows of the round
(:func:`~sparkdl.spark.training.tasks.train_partition`) and returns its update as rows of
:mod:`sparkdl.spark.backends.rounds.results`.

- **Reduction**: with more than two workers and updates over 64 MiB in all, or when
  ``spark.driver.maxResultSize`` would not hold every update, a second stage combines each
  piece across workers on the executors (:mod:`sparkdl.spark.backends.rounds.reduce`), so the driver
  receives one combined update per round whatever ``numWorkers`` is; otherwise the driver
  combines the pieces as they come.
- **Data read once**: the first round runs over the cached training data; each task converts its
  partition once and keeps it in its Python worker's cache and on its executor's disk. Later
  rounds run over one literal byte column of the cached data (the cache's locality places each
  task where its copies are); a task whose partition is in neither copy (a new Python worker on
  another executor, a lost executor) reports it missing and the round runs again over the cached
  data, with the same result. The last round releases the partitions.
- **Straggler-tolerant rounds** (``minWorkersPerRound``): each worker's share of a round is a job
  of one task (:func:`~sparkdl.spark.jobs.run_on_partitions`), started as soon as its
  partition's job of an earlier round ended; the round closes when every worker returned, or once
  the minimum returned and ``roundDeadline`` passed. A late job goes on in the background (its
  update is dropped); jobs still running when the fit ends are cancelled. On Spark Connect, which
  has no RDDs, each such job runs a task on every partition (all but one return at once).

A failed task is retried by Spark like any other; it never touches the master state, which only
changes once a whole round has returned. Works with dynamic allocation: no barrier, no server.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import shutil
import threading
import time
import warnings

from sparkdl.core.compression import QUANTIZED, decode_mean, dequantize
from sparkdl.core.modes.averaging import row_weighted_mean
from sparkdl.core.state import FitState, ModelState, RoundUpdates, WorkerLocal, WorkerUpdate
from sparkdl.errors import FitCancelledError, InvariantError
from sparkdl.keras.replica import state_nbytes
from sparkdl.serialization.arrow_codec import encode_arrays
from sparkdl.spark.jobs import run_job, run_on_partitions
from sparkdl.spark.partitions import spill_dir
from sparkdl.spark.session import cancel_tag, check_inline, is_connect, share
from sparkdl.spark.backends.rounds.reduce import check_separate, plan_reduction, reduce_pieces, result_limit_bytes
from sparkdl.spark.backends.rounds.results import RESULT_SCHEMA, RESULT_SPARK_SCHEMA, RoundOutcome, read_round
from sparkdl.spark.backends.rounds.task import RoundTask, train_partition
from sparkdl.spark.training.contract import LocalMaster, RoundOrders, RoundReport, TransportOptions
from sparkdl.spark.training.job import TrainJob

log = logging.getLogger("sparkdl")


def _reduction(spark, config, nbytes: int, workers: int, per_worker: bool) -> bool:
    """Whether a round's updates (``nbytes``: one worker's state) are combined on the executors,
    after checking they can reach the driver.

    Raises:
        ConfigError: naming ``spark.driver.maxResultSize`` and the value to set.
    """
    limit = result_limit_bytes(spark)
    if config.compression in QUANTIZED:
        return False  # quantized payloads come to the driver one per worker, a few percent of the state each
    if per_worker or config.min_workers(workers) < workers:
        check_separate(limit, nbytes, workers)  # every worker's update comes to the driver apart
        return False
    return plan_reduction(limit, nbytes, workers)


def check_results(spark, config, model) -> int:
    """Before any job: a round's updates fit ``spark.driver.maxResultSize``, and on Spark Connect
    (no broadcast) its start state fits a plan. Returns the state's bytes (weights and optimizer
    state, what one worker returns a round).

    Raises:
        ConfigError: naming the setting to change.
    """
    from sparkdl.core.modes import policy_class

    per_worker = policy_class(config.mode).per_worker  # each worker's update comes apart (easgd, gossip)
    nbytes = state_nbytes(model)
    _reduction(spark, config, nbytes, config.num_workers, per_worker)
    check_inline(spark, nbytes * (config.num_workers if per_worker else 1), "a round's start weights and optimizer state")
    return nbytes


class _SharedBroadcast:
    """A round's broadcast, destroyed when its last user released it: the round itself and each
    straggler job still running after the round closed (a task that reads it later would fail).
    On Spark Connect it holds an inlined value (:class:`sparkdl.spark.session.Inline`), whose
    destroy does nothing."""

    def __init__(self, broadcast) -> None:
        self.value, self._users, self._lock = broadcast, 1, threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self.value.destroy()


def _state_bytes(state: ModelState) -> tuple[bytes, bytes | None]:
    return encode_arrays(state.weights), encode_arrays(state.optimizer) if state.optimizer is not None else None


def _local_bytes(local: WorkerLocal) -> tuple[int, bytes | None, bytes | None]:
    encode = lambda arrays: encode_arrays(arrays) if arrays is not None else None  # noqa: E731
    return local.version, encode(local.residual), encode(local.optimizer)


def _decode_update(update, start: ModelState, compression: str | None) -> ModelState:
    """A worker's state from what it sent: its state itself, start + its fp16 update, or start + its
    dequantized update (1bit/threshold; weights only, the optimizer state stayed on the worker)."""
    if compression in QUANTIZED:
        update = ModelState(dequantize(update, start.weights), None)
    return decode_mean(update, start) if compression is not None else update


class RoundsTransport:
    """One Spark job per round; see the module docstring.

    Per-worker modes (``easgd``, ``gossip``) broadcast each worker's own start state (every
    executor fetches all of them: workers × state bytes down per round) and receive each worker's
    state apart; so do 1bit/threshold (each payload decoded on the driver) and straggler-tolerant
    rounds.
    """

    name = "rounds"

    def __init__(self, job: TrainJob, policy) -> None:
        self.job, self.policy = job, policy
        self.handle = LocalMaster(policy, job.names)  # the driver loop applies the mode's policy
        config = job.config
        self.per_worker = bool(policy.per_worker)
        self.rounds_per_epoch = job.plan.rounds_per_epoch
        self.task = job.task_spec(per_worker=self.per_worker)
        self.min_workers = config.min_workers(job.workers)
        self.separate = self.per_worker or config.compression in QUANTIZED or self.min_workers < job.workers
        self.reduced = _reduction(job.spark, config, job.state_bytes, job.workers, self.per_worker)
        self.ids = job.placeholder_rows()  # rounds after the first: at the cached blocks, a byte per row
        self._busy: dict[int, str] = {}  # straggler-tolerant rounds: partition -> tag of its running job
        self._busy_lock = threading.Lock()
        self._late_errors: list[str] = []
        self._info = {"reduced_on_executors": self.reduced, "rounds_reading_data": 0}
        # an epoch's validation rides the next epoch's first round where the partitions hold the validation rows, and a
        # round run ahead of the callbacks leaves nothing behind when dropped (no worker state of its own kept, no straggler jobs)
        validation = job.validation
        self.validation_rows = validation.partition_rows if validation is not None and validation.role == "val" else None
        self.rides_validation = self.validation_rows is not None and config.compression not in QUANTIZED and self.min_workers == job.workers
        self.accepted = [-1] * job.workers  # per partition: the round whose update was last applied (1bit/threshold)
        self._restored: dict[int, WorkerLocal] = {}
        self._rounds_run = 0

    # ---- the loop's calls ------------------------------------------------------------------------

    def start(self, fit: FitState) -> None:
        for partition, local in fit.local.items():  # a resumed fit: each worker's own state, until it trains again
            self.accepted[partition] = local.version
            self._restored[partition] = local

    def restart_from(self, partition: int, version: int) -> None:
        """Backend ``ps`` hands its remaining rounds over (a node lost): ``partition``'s worker last
        trained slot ``version`` there, and its own state (1bit/threshold) is the one of that slot."""
        self.accepted[partition] = version
        restored = self._restored.get(partition)
        if restored is not None and restored.version != version:
            del self._restored[partition]

    def run_round(self, orders: RoundOrders) -> RoundReport:
        job = self.job
        restored = {p: _local_bytes(local) for p, local in self._restored.items() if self.accepted[p] == local.version}
        local_share = share(job.spark, restored, "the workers' own restored state") if restored else None
        evaluate = None
        if orders.evaluate is not None:
            start = orders.starts if isinstance(orders.starts, ModelState) else None
            evaluate = "start" if start is not None and start.weights is orders.evaluate else \
                share(job.spark, encode_arrays(orders.evaluate), "the master weights to validate")
        round_task = RoundTask(orders.epoch, orders.round_in_epoch, orders.last, None, index=orders.index,
                               accepted=tuple(self.accepted), learning_rate=orders.learning_rate, collect=orders.collect,
                               local=local_share, validation_rows=self.validation_rows if self.rides_validation else None,
                               evaluate=evaluate)
        started = time.perf_counter()
        try:
            outcome = self._round(round_task, orders)
        finally:
            for shared in (local_share, evaluate):
                if shared is not None and shared != "start":
                    shared.destroy()
        if self._rounds_run == 0:
            self._info["first_round_s"] = time.perf_counter() - started
        self._rounds_run += 1
        for partition, rows, _ in outcome.workers:
            if rows:
                self.accepted[partition] = orders.index
        return RoundReport(
            updates=outcome.updates, workers=[(p, n) for p, n, _ in outcome.workers if n], metrics=outcome.metrics,
            nbytes=outcome.nbytes, dropped=list(outcome.dropped), rows_dropped=outcome.rows_dropped, local=outcome.local,
            local_resets=outcome.local_resets, rows_expected=job.plan.round_rows(orders.round_in_epoch),
            validation=outcome.validation if orders.evaluate is not None else None,
        )

    def validate(self, weights: list, epoch: int, last: bool) -> None:
        return None  # a validation job evaluates

    def pause(self) -> None:
        """Rounds hold no slot between jobs."""

    def finish(self, stopped: bool) -> None:
        if stopped and self._rounds_run:
            self.job.release_executors()

    def close(self) -> None:
        self._cancel_stragglers()
        if self._late_errors:
            warnings.warn(f"{len(self._late_errors)} late straggler job(s) failed after their round closed: "
                          f"{self._late_errors[0]}", stacklevel=2)
        # The last round's tasks delete their partitions' disk copies; after a failed fit, or
        # for copies another executor made, this removes the ones on the driver's machine (all
        # of them in local mode); Spark deletes the rest with the application's directory.
        shutil.rmtree(spill_dir(self.job.fit_id), ignore_errors=True)

    def info(self) -> dict:
        out = dict(self._info)
        if self._late_errors:
            out["late_job_errors"] = list(self._late_errors)
        return out

    # ---- one round -------------------------------------------------------------------------------

    def _round(self, round_task: RoundTask, orders: RoundOrders):
        """One round: the start state(s) broadcast once (destroyed however the round ends); the job over
        the partition-id DataFrame after the first round, and over the cached data for the first round
        or when a partition was in no worker's cache; each worker's update decoded on the driver."""
        starts = orders.starts
        value = [_state_bytes(s) for s in starts] if self.per_worker else _state_bytes(starts)
        broadcast = _SharedBroadcast(share(self.job.spark, value, "the round's start weights and optimizer state"))
        try:
            round_task = dataclasses.replace(round_task, state=broadcast.value)
            if self.min_workers < self.job.workers:
                outcome = self._straggler_round(round_task, orders.description, broadcast)
            else:
                outcome = self._job(self.ids, False, round_task, self.reduced, orders.description) if self._rounds_run else None
                if outcome is None or outcome.missing:
                    self._info["rounds_reading_data"] += 1
                    outcome = self._job(self.job.data.df, True, round_task, self.reduced, orders.description)
        finally:
            broadcast.release()  # destroyed once no late job of the round still needs it
        if outcome.missing:
            raise InvariantError(f"{orders.description} must find every partition in the training data. Received: partitions {outcome.missing} missing")
        outcome.updates = self._updates(outcome, starts)
        if outcome.updates.mean is not None and len(outcome.updates.mean.weights) != len(self.job.names):
            raise InvariantError(f"{orders.description} must return all {len(self.job.names)} weight arrays of the model. "
                                 f"Received: {len(outcome.updates.mean.weights)}")
        return outcome

    def _updates(self, outcome: RoundOutcome, starts) -> RoundUpdates:
        compression = self.task.compression
        if outcome.states is not None:
            trained = {p: n for p, n, _ in outcome.workers if n}
            steps = {p: k for p, _, k in outcome.workers}
            states = {p: _decode_update(u, starts[p] if self.per_worker else starts, compression) for p, u in outcome.states.items()}
            updates = [WorkerUpdate(p, trained[p], steps[p], states[p]) for p in sorted(states)]
            if self.per_worker:
                return RoundUpdates(outcome.rows, updates=updates)
            mean, rows = row_weighted_mean(updates)
            return RoundUpdates(rows, mean=mean)
        mean = outcome.mean
        if compression and mean is not None:  # the workers sent fp16 updates: the mean state is start + their mean
            mean = decode_mean(mean, starts)
        return RoundUpdates(outcome.rows, mean=mean)

    def _straggler_round(self, round_task: RoundTask, description: str, broadcast: _SharedBroadcast) -> RoundOutcome:
        """A straggler-tolerant round: one job per partition with rows in it, each started as soon as
        its partition's job of an earlier round has ended. The round closes when every such
        partition returned, or once ``min_workers`` of them returned and ``roundDeadline`` seconds
        passed since it started. A job still running then goes on in the background (its Python
        worker and replica are kept, and the round's broadcast until it ends) and its update is
        dropped when it comes; a partition whose job had not started sits out the round. Both are
        counted in :attr:`RoundOutcome.dropped`; jobs still running when the fit ends are
        cancelled, and a late job's failure is reported in ``fitInfo["late_job_errors"]``."""
        from pyspark import InheritableThread

        plan, config, spark = self.job.plan, self.job.config, self.job.spark
        r = round_task.round_in_epoch
        with_rows = [p for p in range(len(plan.partition_rows)) if plan.row_range(p, r)[1] > plan.row_range(p, r)[0]]
        need = min(self.min_workers, len(with_rows))
        arrived: queue.Queue = queue.Queue()
        reading_data, launched, closed = [], set(), threading.Event()
        first = self._rounds_run == 0

        def one(partition: int) -> None:
            orders = dataclasses.replace(round_task, only=partition)
            label = f"{description}, partition {partition}"
            try:
                out = None if first else self._partition_job(orders, label, partition)
                if out is None or out.missing:
                    reading_data.append(partition)
                    out = self._job(self.job.data.df, True, orders, False, label, [partition])
                arrived.put((partition, out, None))
            except BaseException as exc:  # handed to the driver's thread, or recorded when the round has closed
                arrived.put((partition, None, exc))
                if closed.is_set() and not isinstance(exc, FitCancelledError):
                    self._late_errors.append(f"partition {partition}, {description}: {type(exc).__name__}: {exc}"[:500])
            finally:
                with self._busy_lock:
                    self._busy.pop(partition, None)
                broadcast.release()

        started = time.monotonic()
        done: dict[int, RoundOutcome] = {}
        while len(done) < len(with_rows):
            with self._busy_lock:  # start the partitions whose earlier job has ended
                ready = [p for p in with_rows if p not in launched and p not in self._busy]
                for partition in ready:
                    self._busy[partition] = self._tag(round_task, partition)
            for partition in ready:
                launched.add(partition)
                broadcast.acquire()
                InheritableThread(lambda p=partition: one(p), session=spark, daemon=True).start()
            now = time.monotonic()
            deadline = started + config.round_deadline_s
            if len(done) >= need and now >= deadline:
                break
            waiting_for_busy = len(launched) < len(with_rows)
            wait = (deadline - now) if len(done) >= need else 1.0
            try:
                partition, out, error = arrived.get(timeout=max(0.005, min(wait, 0.05) if waiting_for_busy else wait))
            except queue.Empty:
                continue
            if error is not None:
                raise error
            done[partition] = out
        closed.set()
        if reading_data:
            self._info["rounds_reading_data"] += 1
        late = [p for p in with_rows if p not in done]
        workers, metrics, states, local, nbytes, resets = [], [], {}, {}, 0, 0
        for partition in range(len(plan.partition_rows)):
            out = done.get(partition)
            if out is None:
                workers.append((partition, 0, 0))
                continue
            workers.extend(out.workers)
            metrics.extend(out.metrics)
            states.update(out.states or {})
            local.update(out.local)
            nbytes += out.nbytes
            resets += out.local_resets
        dropped_rows = 0
        for partition in late:
            begin, stop = plan.row_range(partition, r)
            dropped_rows += int(stop - begin)
        return RoundOutcome(workers, None, sum(w[1] for w in workers), metrics, [], nbytes, states=states, local_resets=resets,
                            local=local, dropped=late, rows_dropped=dropped_rows)

    def _cancel_stragglers(self) -> None:
        """Cancel the jobs of straggler-tolerant rounds still running (the fit has ended)."""
        with self._busy_lock:
            tags = list(self._busy.values())
            self._busy.clear()
        for tag in tags:
            cancel_tag(self.job.spark, tag)

    def _tag(self, round_task: RoundTask, partition: int | None = None) -> str:
        tag = f"sparkdl-{self.job.fit_id}-round-{round_task.epoch}-{round_task.round_in_epoch}"
        return tag if partition is None else f"{tag}-p{partition}"

    def _job(self, df, from_data: bool, round_task: RoundTask, reduced: bool, description: str,
             partitions: list[int] | None = None) -> RoundOutcome:
        """Run one round's Spark job over ``df`` (the training data when ``from_data``, else the
        partition-id DataFrame), combining the updates on the executors when ``reduced``; with
        ``partitions``, the job of a straggler-tolerant round that trains only those."""
        task = self.task
        out = df.mapInArrow(lambda batches: train_partition(task, round_task, batches, from_data), RESULT_SPARK_SCHEMA)
        if reduced:
            out = out.groupBy("piece").applyInArrow(reduce_pieces, RESULT_SPARK_SCHEMA)
        tag = self._tag(round_task, round_task.only)
        table = run_job(self.job.spark, out.toArrow, description, tag, self.job.config.round_timeout_s)
        return read_round(table, self.job.plan, description, reduced, partitions, separate=self.separate)

    def _partition_job(self, round_task: RoundTask, description: str, partition: int) -> RoundOutcome:
        """A straggler-tolerant round's job for one partition after the first round: one task, on
        the partition-id DataFrame (its cache locality kept); on Spark Connect, a task per
        partition, all but one returning at once."""
        spark, task = self.job.spark, self.task
        if is_connect(spark):
            return self._job(self.ids, False, round_task, False, description, [partition])

        def produce(rows):
            for _ in rows:  # the placeholder column, unread
                pass
            return train_partition(task, round_task, iter(()), False)

        table = run_job(spark, lambda: run_on_partitions(self.ids, produce, [partition], RESULT_SCHEMA), description,
                        self._tag(round_task, partition), self.job.config.round_timeout_s)
        return read_round(table, self.job.plan, description, False, [partition], separate=self.separate)


def transport(job: TrainJob, policy, options: TransportOptions | None = None) -> RoundsTransport:
    """The ``rounds`` transport of a fit (the registry's entry point; ``options`` change nothing here)."""
    return RoundsTransport(job, policy)
