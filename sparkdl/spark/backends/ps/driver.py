"""Transport ``ps``: long-lived tasks and a parameter server on the driver (Arrow Flight).

The driver starts a :class:`sparkdl.server.ParameterServer` (TLS with a per-fit certificate the
workers pin, a per-fit bearer token) and runs the workers as one Spark stage of ordinary tasks
(:func:`~sparkdl.spark.backends.ps.task.ps_partition`, one per partition of the cached training
data), each keeping its partition and replica for the stage's slots.

- **Round modes** (``sync``, ``bmuf``, ``easgd``, ``gossip``): the driver loop opens each round on
  the server's :class:`~sparkdl.core.board.RoundBoard` with the workers' start states, waits until
  the round's workers pushed (or, straggler-tolerant, the minimum did and ``roundDeadline``
  passed), closes it, applies the policy and runs the callbacks, then opens the next: the same
  rounds as backend ``rounds``, and no worker starts round g + 1 before the callbacks of round g
  returned.
- **Asynchronous modes**: the server applies each push with the mode's rule as it arrives
  (:class:`~sparkdl.core.board.EpochLedger` records each epoch); the loop's round is an epoch,
  done when all of its rows were pushed. ``stop_training`` and a learning rate reach every worker
  at its next slot.

**Failures.** The stage is not a barrier stage: Spark retries a failed task (a killed Python
worker, a lost executor, an exception; ``spark.task.maxFailures``, 4 on a cluster) on its own
while the other workers wait at the round; the retried task skips the slots its worker had pushed
(``(worker, attempt, seq)``: each slot is applied once) and rejoins. A barrier stage would lose
every worker's progress in the stage on any fault, and Spark never retries a failed barrier
result stage. When the retries are spent the fit fails with :class:`~sparkdl.errors.WorkerError`
naming the cause. Each task sends heartbeats from a thread of its own; a worker silent for
``workerTimeout`` seconds (dead, or stopped) has its attempt killed and retried. Without a barrier,
Spark does not start the tasks together: the driver checks before any job that the cluster has a
task slot per worker, and a worker that never starts is caught by the same timeout.

**A node lost for good** (its executor removed, no replacement within a minute:
:mod:`~sparkdl.spark.training.nodes`) leaves a retried task no slot. A round mode goes on with the
executors that are left: the stage is cancelled and the round it was in, and every round after it,
run on backend ``rounds`` (:class:`~sparkdl.spark.backends.rounds.driver.RoundsTransport`: a Spark job a
round, the lost worker's rows trained by a task on an executor that is left), the same rounds as
on ``ps``, so the same model; the console and ``fitInfo["node_lost"]`` say so. An asynchronous
mode whose workers wait for each other (``ssp``; it runs only on ``ps``) fails with
:class:`~sparkdl.errors.NodeLostError` naming the executor and what to do; in the other
asynchronous modes the lost worker's task runs on the slot another worker frees when its slots are
done (the console says so).

**Validation.** In a round mode each worker's partition holds its share of the validation rows
(:func:`~sparkdl.spark.data.prepare_with_validation`): after an epoch's last round the driver posts
the master on the board (:meth:`~sparkdl.core.board.RoundBoard.post_validation`), each worker with
validation rows evaluates it in its task (woken from its wait for the next round, or after its last
slot) and reports its summed metric variables; the driver adds them up: no job, and the stage goes
on. A retried task evaluates what its worker had not reported.

**Stages.** For the asynchronous modes with validation or snapshots (and a round mode whose
validation rows are not in its partitions) the workers' tasks end at each epoch's end, freeing every
slot for the validation job, and new ones start for the next epoch (each Python worker keeps the
partition and the replica, so a stage costs a Spark job, not a reload); otherwise one stage runs the
whole fit.

Where the server binds and what the executors dial: :meth:`~sparkdl.spark.cluster.ClusterFacts.server_addresses`
(``spark.sparkdl.ps.host``, the driver's addresses; on Spark Connect this client's).
"""

from __future__ import annotations

import shutil
import time

import pyarrow as pa

from sparkdl.core.board import EpochLedger, RoundBoard
from sparkdl.core.state import FitState, ModelState, RoundUpdates, WorkerLocal, WorkerUpdate
from sparkdl.errors import ConfigError, InvariantError, NodeLostError, ServerError
from sparkdl.server.tls import tls_identity
from sparkdl.spark.backends.ps.task import RESULT_SPARK_SCHEMA, PSTaskSpec, ps_partition
from sparkdl.spark.partitions import spill_dir
from sparkdl.spark.training.contract import LocalMaster, RoundOrders, RoundReport, TransportOptions
from sparkdl.spark.training.job import TrainJob
from sparkdl.spark.training.nodes import SlotWatch, tell
from sparkdl.spark.training.membership import Membership
from sparkdl.spark.training.stage import StageWatch


# ---- before any job ---------------------------------------------------------------------------


# ---- the stage --------------------------------------------------------------------------------


def transport(job: TrainJob, policy, options: TransportOptions) -> PSTransport:
    """The ``ps`` transport of ``job``'s mode: :class:`PSRoundsTransport` for a round mode,
    :class:`PSAsyncTransport` for an asynchronous one."""
    cls = PSAsyncTransport if policy.asynchronous else PSRoundsTransport
    return cls(job, policy, options)


class PSTransport:
    """What both ``ps`` transports share: the parameter server on the driver and the stages of
    long-lived worker tasks (see the module docstring). A subclass gives the server's rule
    (:meth:`_rule`) and runs the rounds (:meth:`run_round`)."""

    name = "ps"
    rides_validation = False  # the workers validate in their tasks, or a job does
    rounds_mode = True  # whether the workers run round slots (a round mode) or push as they go

    def __init__(self, job: TrainJob, policy, options: TransportOptions) -> None:
        self.job, self.policy, self.options = job, policy, options
        self.handle = LocalMaster(policy, job.names)  # the driver loop applies the mode's policy
        config = job.config
        self.plan_rounds = job.plan.rounds_per_epoch
        self.rounds_per_epoch = self.plan_rounds if self.rounds_mode else 1
        self.total_slots = config.epochs * self.plan_rounds
        self.task = job.task_spec(per_worker=bool(policy.per_worker))
        self.bind, self.advertise = job.cluster.server_addresses()
        self.identity = tls_identity(config.server_cert_file, config.server_key_file, config.server_tls)
        self.server = None
        self.stages: StageWatch | None = None
        self.segment_end = 0
        self.results: list[pa.Table] = []
        self._last_weights = None
        self._learning_rate = None
        self._epoch_done = time.monotonic()
        # the workers validate in their tasks where their partitions hold the validation rows (a round mode); the stage
        # then runs the whole fit, else it ends at each epoch's end for the validation job
        validation = job.validation
        self.validation_rows = validation.partition_rows if self.rounds_mode and validation is not None and validation.role == "val" else None
        self.pause_at_epochs = options.pause_at_epochs and self.validation_rows is None

    # ---- the loop's calls ------------------------------------------------------------------------

    def start(self, fit: FitState) -> None:
        from sparkdl.server import ParameterServer

        job, config = self.job, self.job.config
        self.rule = self._rule()
        self.fit = fit
        self.server = ParameterServer(fit.master, self.rule, names=list(job.names), host=self.bind, advertise=self.advertise,
                                      port=config.server_port, tls=self.identity, local={str(p): v for p, v in fit.local.items()},
                                      workers=job.workers, max_seq=self.total_slots)  # ids and slots of this fit only
        try:
            self.server.start()
        except ServerError as exc:
            raise ServerError(f"{exc} (serverPort={config.server_port})") from exc
        members = Membership(job.spark, self.server.contacts, self.server.attempts, config.worker_timeout_s,
                             nodes=SlotWatch.for_job(job, "ps workers", decides=self.rounds_mode or config.mode == "ssp"))
        self.stages = StageWatch(job.spark, members, config.round_timeout_s, "ps worker", lost_advice=self._lost_advice())
        self._last_weights = fit.master.weights
        self._epoch_done = time.monotonic()

    def _rule(self):
        """The server's update rule (a :class:`RoundBoard` or an :class:`EpochLedger`)."""
        raise NotImplementedError

    def _lost_advice(self) -> str:
        """What a user does when a node is lost for good and the fit cannot go on (the error's end)."""
        config = self.job.config
        resume = (" With checkpointDir set, the fit run again resumes from its last snapshot." if config.checkpoint_dir
                  else " Set checkpointDir for a fit run again to resume from its last snapshot.")
        return (f"Mode {config.mode!r} runs only on backend 'ps': run the fit again once the node is back, or with "
                f"numWorkers at most the task slots left.{resume}")

    def run_round(self, orders: RoundOrders) -> RoundReport:
        raise NotImplementedError

    def _follow_learning_rate(self, orders: RoundOrders) -> None:
        if orders.learning_rate is not None and orders.learning_rate != self._learning_rate:
            self._learning_rate = orders.learning_rate
            self.server.set_control(learning_rate=orders.learning_rate)

    def validate(self, weights: list, epoch: int, last: bool) -> dict | None:
        return None  # asynchronous modes: the stage ends at the epoch's end, a validation job evaluates

    def pause(self) -> None:
        """Let the running stage end (its tasks end at this epoch's end) and check what it returned."""
        self._end_stage()

    def finish(self, stopped: bool) -> None:
        if self.server is None:
            return
        if stopped:
            self._stop()
            self.server.set_control(stop=True)
        self._end_stage()
        if stopped:
            self.job.release_executors()

    def _stop(self) -> None:
        """A callback stopped the fit: no more rounds."""

    def close(self) -> None:
        if self.stages is not None:
            self.stages.close()
        if self.server is not None:
            self.server.shutdown()
        # A failed task leaves its on-disk partition behind (local mode: all of them here);
        # Spark deletes other executors' copies with the application's directory.
        shutil.rmtree(spill_dir(self.job.fit_id), ignore_errors=True)

    def info(self) -> dict:
        if self.server is None:
            return {}
        stats = self.server.stats()
        out = {
            "server_version": stats["version"], "updates_applied": stats["updates_applied"],
            "duplicates_dropped": stats["duplicates_dropped"], "late_dropped": stats["late_dropped"],
            "staleness_mean": stats["staleness_mean"], "staleness_max": stats["staleness_max"],
            "bytes_pushed": stats["bytes_pushed"], "bytes_pulled": stats["bytes_pulled"],
            "server_bind": self.bind, "server_location": self.server.location, "server_tls": self.identity is not None,
            **self.stages.members.info(),
        }
        if self.results:
            rows = pa.concat_tables(self.results).to_pydict()
            per = {}
            for i, partition in enumerate(rows["partition"]):
                entry = per.setdefault(partition, {"steps": 0, "pushes": 0, "late": 0})
                for key in entry:
                    entry[key] += rows[key][i]
            out["worker_steps"] = [per[p]["steps"] for p in sorted(per)]
            if not self.rounds_mode:  # round modes count theirs round by round (the loop)
                out["local_state_resets"] = int(sum(rows["local_resets"]))
            out["worker_pushes"] = [per[p]["pushes"] for p in sorted(per)]
            if self.job.config.min_workers(self.job.workers) < self.job.workers:
                out["worker_late"] = [per[p]["late"] for p in sorted(per)]
        return out

    # ---- stages ----------------------------------------------------------------------------------

    def _stage_for(self, slot: int) -> None:
        """Make sure a stage runs slot ``slot``: start one at it when none runs."""
        if self.stages.running and slot < self.segment_end:
            return
        self._end_stage()
        job, config = self.job, self.job.config
        last = ((slot // self.plan_rounds) + 1) * self.plan_rounds if self.pause_at_epochs else self.total_slots
        snapshots = self.options.snapshots
        spec = PSTaskSpec(task=self.task, mode=config.mode, rounds_mode=self.rounds_mode, location=self.server.location,
                          token=self.server.token, tls=self.identity.pin() if self.identity is not None else None,
                          staleness=config.staleness, first=slot, last=last, final=last == self.total_slots,
                          snapshots=snapshots, call_timeout_s=max(30.0, 2 * 5.0), retries=3,
                          heartbeat_s=config.heartbeat_s, validation_rows=self.validation_rows)
        self._before_stage(slot)
        out = job.data.df.mapInArrow(lambda batches: ps_partition(spec, batches), RESULT_SPARK_SCHEMA)
        tag = f"sparkdl-{job.fit_id}-ps-{slot}"
        epochs = f"epochs {slot // self.plan_rounds + 1}-{(last - 1) // self.plan_rounds + 1}"
        description = f"sparkdl fit {job.fit_id[:8]}: {config.mode} on ps, {epochs} ({last - slot} rounds)"
        self.segment_end = last
        self.stages.run(out.toArrow, description, tag, config.round_timeout_s * max(1, last - slot),
                        [p for p in range(job.workers) if job.plan.partition_rows[p]])

    def _before_stage(self, slot: int) -> None:
        """A stage is about to start at ``slot``."""

    def _end_stage(self) -> None:
        """Wait for the running stage to end (its workers ran their slots, or were told to stop)."""
        if self.stages is None or self.stages.stage is None:
            return
        table = self.stages.end(f"the end of {self.stages.stage.description}")
        partitions = sorted(table.column("partition").to_pylist())
        if partitions != list(range(self.job.workers)):
            raise InvariantError(f"the ps stage must return one result per partition 0..{self.job.workers - 1}. Received partitions {partitions}")
        self.results.append(table)



class PSRoundsTransport(PSTransport):
    """A round mode on the parameter server: the loop opens each round on the server's
    :class:`RoundBoard`, the workers push, the loop closes it (see the module docstring)."""

    rounds_mode = True

    def __init__(self, job: TrainJob, policy, options: TransportOptions) -> None:
        super().__init__(job, policy, options)
        self.fallback = None  # backend rounds, for the rounds after a node was lost for good
        self.node_lost: dict | None = None
        self.validations_in_tasks = 0

    def _rule(self):
        return RoundBoard(self.job.workers, per_worker=bool(self.policy.per_worker))

    def _lost_advice(self) -> str:
        return "Run the fit again once the node is back, or with numWorkers at most the task slots left."

    def _stop(self) -> None:
        self.rule.stop()

    def run_round(self, orders: RoundOrders) -> RoundReport:
        if self.fallback is not None:
            return self.fallback.run_round(orders)
        self._follow_learning_rate(orders)
        try:
            return self._round(orders)
        except NodeLostError as lost:
            self._hand_over(lost, orders.index)
        return self.fallback.run_round(orders)

    def _hand_over(self, lost: NodeLostError, index: int) -> None:
        """A node was lost for good: cancel the stage and run round ``index`` and the rest on backend
        ``rounds`` (the same rounds: the round's pushes so far are dropped, its start is the same).

        Raises:
            NodeLostError: ``rounds`` cannot run this fit (its updates would not fit
            ``spark.driver.maxResultSize``), with that cause.
        """
        from sparkdl.spark.backends import backend

        successor = backend(backend(self.name).hands_over_to)  # the registry names who takes over
        self.stages.abandon()
        try:
            fallback = successor.transport(self.job, self.policy, TransportOptions())
        except ConfigError as exc:
            raise NodeLostError(f"{lost} The fit cannot go on on backend {successor.name!r}: {exc}", lost.loss) from exc
        fallback.start(self.fit)
        # each worker's own state (1bit/threshold residuals) is the one its ps task kept on its executor after
        # its last slot before this round; a task on another executor finds none and counts a reset
        plan = self.job.plan
        for p in range(self.job.workers):
            last = next((g for g in range(index - 1, -1, -1) if plan.partition_rows[p] and
                         plan.row_range(p, g % self.plan_rounds)[1] > plan.row_range(p, g % self.plan_rounds)[0]), -1)
            fallback.restart_from(p, last)
        self.fallback = fallback
        self._ps_info = super().info()  # the parameter server's counters up to now; its port and memory go
        self.rule.stop()
        self.server.shutdown()
        loss, total = lost.loss, self.total_slots
        self.node_lost = {**(loss.info() if loss is not None else {}), "continued_on": "rounds", "from_round": index + 1}
        line = (f"sparkdl: {loss.describe('ps workers') if loss is not None else 'a node was lost'}; the fit goes on on "
                f"backend 'rounds' from round {index + 1} of {total}: a Spark job a round over the executors left, the "
                "lost worker's rows trained by a task on one of them (the same rounds as on 'ps')")
        tell(line, bool(self.job.config.verbose))

    def validate(self, weights: list, epoch: int, last: bool) -> dict | None:
        """The workers evaluate ``weights`` in their tasks (each on its partition's validation rows):
        the driver posts them on the board, waits for every worker with validation rows to report
        (the stage watched as in a round), and returns their reports; None without validation rows
        in the partitions, or once the fit went on on backend ``rounds`` after a lost node."""
        if self.validation_rows is None or self.fallback is not None or self.stages is None or self.stages.stage is None:
            return None
        board = self.rule
        board.post_validation(epoch, weights, {p for p, n in enumerate(self.validation_rows) if n})
        try:
            self.stages.wait(board.validation_complete, f"the validation after epoch {epoch + 1} in the ps workers' tasks",
                             block=board.wait_change)
        except NodeLostError as lost:  # the validation job evaluates, on the executors left
            self._hand_over(lost, (epoch + 1) * self.plan_rounds)
            return None
        self.validations_in_tasks += 1
        return board.close_validation()

    def pause(self) -> None:
        if self.fallback is not None:
            self.fallback.pause()
        super().pause()

    def finish(self, stopped: bool) -> None:
        if self.fallback is None:
            return super().finish(stopped)
        if self.server is not None:
            self.server.set_control(stop=True)
        self.fallback.finish(stopped)

    def close(self) -> None:
        try:
            if self.fallback is not None:
                self.fallback.close()
        finally:
            super().close()

    def info(self) -> dict:
        out = super().info() if self.fallback is None else {**self._ps_info, "node_lost": {**self.node_lost, "rounds": self.fallback.info()}}
        if self.validation_rows is not None:  # the epochs validated in the workers' tasks (the others: a job)
            out["validations_in_tasks"] = self.validations_in_tasks
        return out

    def _round(self, orders: RoundOrders) -> RoundReport:
        job, config, board = self.job, self.job.config, self.rule
        plan, r = job.plan, orders.round_in_epoch
        expected = {p for p in range(job.workers) if plan.row_range(p, r)[1] > plan.row_range(p, r)[0]}
        board.open(orders.index, orders.starts, expected, orders.learning_rate, orders.collect)
        self._stage_for(orders.index)
        need = min(config.min_workers(job.workers), len(expected))
        opened = time.monotonic()

        def closable() -> bool:
            pushed = board.pushed()
            return expected <= pushed or (len(pushed & expected) >= need and time.monotonic() - opened >= config.round_deadline_s)

        self.stages.wait(closable, orders.description, block=board.wait_change)
        collection = board.close()
        local = self._collect_local(orders) if orders.collect and job.quantized else {}
        rows_dropped = sum(int(plan.row_range(p, r)[1] - plan.row_range(p, r)[0]) for p in collection.missing)
        return RoundReport(
            updates=RoundUpdates(collection.rows, mean=collection.mean, updates=collection.updates), workers=collection.workers,
            metrics=collection.metrics, nbytes=collection.nbytes, dropped=collection.missing, rows_dropped=rows_dropped,
            local=local, rows_expected=plan.round_rows(r),
        )

    def _collect_local(self, orders: RoundOrders) -> dict[int, WorkerLocal]:
        """Each worker's own state as of this round: its last trained slot up to it (a snapshot follows)."""
        plan, index = self.job.plan, orders.index
        want = {}
        for p in range(self.job.workers):
            for g in range(index, -1, -1):
                begin, stop = plan.row_range(p, g % self.plan_rounds)
                if stop > begin:
                    want[p] = g
                    break
        fresh = lambda: all((self.server.local(str(p)) or WorkerLocal(-2)).version >= v for p, v in want.items())  # noqa: E731
        self.stages.wait(fresh, f"the workers' own state after {orders.description}")
        return {p: self.server.local(str(p)) for p in want}



class PSAsyncTransport(PSTransport):
    """An asynchronous mode on the parameter server: the server applies each push with the mode's
    rule as it arrives (:class:`EpochLedger` records each epoch); the loop's round is an epoch."""

    rounds_mode = False

    def _rule(self):
        return EpochLedger(self.policy.rule(), self.job.config.epochs)

    def _before_stage(self, slot: int) -> None:
        job = self.job
        if job.config.mode == "ssp":
            self.server.register_clocks({str(p): slot for p in range(job.workers) if job.plan.partition_rows[p]})

    def info(self) -> dict:
        out = super().info()
        if self.server is not None:
            out["ps_epochs"] = self.rule.summaries()
            if self.job.config.mode == "ssp":
                out["staleness"] = self.job.config.staleness
                out["clock_gap_max"] = self.server.clock_gap_max
        return out

    def run_round(self, orders: RoundOrders) -> RoundReport:
        self._follow_learning_rate(orders)
        return self._epoch(orders)

    def _epoch(self, orders: RoundOrders) -> RoundReport:
        job, epoch, ledger = self.job, orders.epoch, self.rule
        if orders.starts.weights is not self._last_weights:  # a callback set the weights: the server's master becomes them
            self.server.set_state(orders.starts)
        self._stage_for(epoch * self.plan_rounds)
        total = job.data.total_rows
        self.stages.wait(lambda: ledger.rows(epoch) >= total, orders.description, timeout_s=job.config.round_timeout_s * self.plan_rounds,
                   block=ledger.wait_change)
        done = time.monotonic()
        seconds, self._epoch_done = done - self._epoch_done, done
        if self.pause_at_epochs:
            self._end_stage()  # every worker at the epoch's end: a consistent state for validation and snapshots
        _, master = self.server.state()
        # each worker's latest optimizer state, for the policy's fitted optimizer state (weighted by its rows)
        optimizers = [WorkerUpdate(int(w), int(job.plan.partition_rows[int(w)]), 0, ModelState([], o))
                      for w, o in sorted(ledger.optimizers.items(), key=lambda item: int(item[0]))]
        self._last_weights = master.weights
        stats = ledger.epochs[epoch]
        local = {}
        if self.pause_at_epochs:
            local = {p: self.server.local(str(p)) for p in range(job.workers) if self.server.local(str(p)) is not None}
        sums = stats.sums.total()
        return RoundReport(
            updates=RoundUpdates(stats.rows, master=master, updates=optimizers or None), workers=[(-1, stats.rows)], metrics=[sums] if sums is not None else [],
            nbytes=stats.bytes_pushed, local=local, rows_expected=total, seconds=seconds,
        )
