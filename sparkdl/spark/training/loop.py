"""THE driver loop of a fit: epochs, rounds, callbacks, metric sums, invariants, validation and
snapshots, for every mode on every transport.

The loop owns the fit's state (:class:`~sparkdl.core.state.FitState`) and has one shape for
every backend. Each round it asks the transport's master handle
(:class:`~sparkdl.spark.training.contract.MasterHandle`) where the workers start, has the
transport run the round (:meth:`~sparkdl.spark.training.contract.Transport.run_round`), has the
handle advance the master (on the driver: the mode's policy applied and checked finite; in the
slice owners' hands: the version they applied), then runs the callbacks' round hooks. No round starts before the callbacks of the previous one
returned, so a callback's decision (stop, a learning rate, weights it set) reaches every worker
in the same round, on either transport. At each epoch's end: the rows invariant, validation,
``on_epoch_end`` (weights or optimizer variables a callback set become the master, as in Keras),
the history, and the snapshots that are due (``checkpointDir``, ``BackupAndRestore``).

Validation costs no Spark job of its own where it can: on ``ps`` the workers evaluate the master
in their tasks (:meth:`~sparkdl.spark.training.contract.Transport.validate`); on ``rounds`` the next
epoch's first round runs ahead of the callbacks, its tasks also evaluating the master
(:meth:`TrainingLoop._validate`), and is kept only when the callbacks left its orders unchanged
(else it runs again: the one exception to the rule above, and it changes nothing of the result);
otherwise, and for the fit's last epoch on ``rounds``, one job evaluates it once the transport freed
its task slots. The asynchronous modes run as one "round" per epoch
from the loop's point of view: the epoch's pushes, applied by the parameter server as they came.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from sparkdl.core.invariants import check_epoch_rows, check_finite
from sparkdl.core.metrics import append_epoch
from sparkdl.core.state import EpochProgress, FitState, ModelState
from sparkdl.spark.training.job import TrainJob
from sparkdl.spark.training.contract import RoundOrders, RoundReport, Transport

log = logging.getLogger("sparkdl")


def resumed_line(info: dict, epochs: int) -> str:
    """The console's line for a resumed fit, from its ``fitInfo`` (``resumed_from_epoch``: epochs done,
    ``resumed_from_round``, ``resumed_from``: the snapshots' folder), e.g. ``sparkdl: resumed from epoch
    12 of 40 (round 36) with the snapshot in s3a://bucket/ckpt; epochs 13-40 to train``."""
    done, where = info["resumed_from_epoch"], info.get("resumed_from")
    source = f"the snapshot in {where}" if where else "a Keras BackupAndRestore backup (weights and epoch)"
    at_round = f" (round {info['resumed_from_round']})" if info.get("resumed_from_round") is not None else ""
    rest = ("no epoch left to train" if done >= epochs else f"epoch {epochs} to train" if done + 1 == epochs
            else f"epochs {done + 1}-{epochs} to train")
    return f"sparkdl: resumed from epoch {done} of {epochs}{at_round} with {source}; {rest}"


class TrainingLoop:
    """Runs a fit's epochs and rounds (see the module docstring).

    Args:
        job: the fit's plain values.
        transport: how rounds run, and where the master lives (its ``handle``) (:mod:`sparkdl.spark.training.contract`).
        callbacks: the driver's callbacks (:class:`~sparkdl.keras.callbacks.DriverCallbacks`).
        validator: validates the master after each epoch (:class:`~sparkdl.spark.training.validation.Validator`), or None.
        snapshots: the fit's snapshots (:class:`~sparkdl.spark.training.checkpoint.Snapshots`).
    """

    def __init__(self, job: TrainJob, transport: Transport, callbacks, validator, snapshots) -> None:
        self.job, self.transport = job, transport
        self.callbacks, self.validator, self.snapshots = callbacks, validator, snapshots
        self.epoch_seconds: list[float] = []
        self.first_round_s: float | None = None
        self.first_round_end: float | None = None  # time.perf_counter() when the first round came back
        self.round_seconds: list[float] = []  # each round's transport time, in order
        self._ahead = None  # (orders, report, master, mode, seconds): the next epoch's first round, run with a validation
        self._riding = True  # validations ride rounds until a callback changed a round run ahead
        self.transport_info: dict = {}  # the transport's facts for fitInfo, once trained (:meth:`train`)

    @classmethod
    def for_fit(cls, job: TrainJob, policy, backend: str, reason: str, callbacks: list, observers: list) -> TrainingLoop:
        """A fit's loop with its parts built from ``job``: the snapshots (``checkpointDir``, a Keras
        ``BackupAndRestore`` among ``callbacks``), the validator (when ``job`` has validation data),
        the transport of ``backend`` (:func:`~sparkdl.spark.backends.get_transport`) and the driver's
        callbacks (:class:`~sparkdl.keras.callbacks.DriverCallbacks`: ``callbacks``, the trackers
        among them, and the fit's progress display, which is appended to ``observers``).

        Args:
            job: the fit's plain values; ``policy``: its mode (:mod:`sparkdl.core.modes`).
            backend, reason: the backend chosen and why (:func:`~sparkdl.spark.backends.preflight`).
            callbacks: the user's callbacks and the trackers, in order.
            observers: the fit's progress displays and trackers, aborted if the fit fails.
        """
        from sparkdl.keras.callbacks import DriverCallbacks
        from sparkdl.keras.progress import FitProgress
        from sparkdl.spark.backends import backend as declared
        from sparkdl.spark.backends import get_transport
        from sparkdl.spark.training.checkpoint import Snapshots, fit_identity
        from sparkdl.spark.training.contract import TransportOptions
        from sparkdl.spark.training.validation import Validator

        config, data, validation = job.config, job.data, job.validation
        asynchronous = policy.asynchronous
        snapshots = Snapshots(job.spark, fit_identity(job, policy), config.checkpoint_dir, config.checkpoint_every,
                              epochs_only=asynchronous, warn_inexact=config.mode != "sync" or config.compression is not None,
                              keep_sliced=declared(backend).sliced)  # its owners' slices beside each snapshot
        validator = Validator(job.spark, validation, job.task_spec(), job.reader, config.data_timeout_s) if validation else None
        backups = any(type(c).__name__ == "BackupAndRestore" for c in callbacks)
        snapshot = config.checkpoint_dir is not None or backups
        pause_at_epochs = validation is not None or (asynchronous and snapshot)
        transport = get_transport(backend, job, policy, TransportOptions(pause_at_epochs=pause_at_epochs, snapshots=snapshot))
        progress = FitProgress(config.verbose, data.total_rows, f"sparkdl fit {job.fit_id[:8]}")  # verbose=0: the DEBUG log only
        observers.append(progress)
        every = [*callbacks, progress]
        reader = job.reader
        # the callbacks get the model itself when one reads it (its weights, its summary); else the metrics' probe,
        # and the driver drops the model: its weights (and its optimizer's) are not kept through the fit
        needs_model = reader.probe is None or any(getattr(c, "needs_weights", True) or getattr(c, "needs_model", False) for c in every)
        driver_callbacks = DriverCallbacks(every, reader.model if needs_model else reader.probe, config.epochs, transport.rounds_per_epoch)
        if not needs_model:
            reader.release_model()
        log.info("fit %s: %d rows on %d workers, mode %s on backend %s (%s), %d epochs x %d rounds", job.fit_id[:8], data.total_rows,
                 job.workers, config.mode, transport.name, reason, config.epochs, transport.rounds_per_epoch)
        if config.verbose:
            print(f"sparkdl fit {job.fit_id[:8]}: backend {transport.name} ({reason})", flush=True)
        return cls(job, transport, driver_callbacks, validator, snapshots)

    def train(self, start) -> FitState:
        """:meth:`run` from ``start`` (a :class:`~sparkdl.core.state.ModelState`, the fit's start
        master), then the state the callbacks left at ``on_train_end`` (``EarlyStopping(restore_best_weights=True)``
        and the like) taken as the master (``fitInfo["weights_from_callbacks"]``), the master's dtypes
        checked against the start's, and the transport's facts kept (:attr:`transport_info`).

        Raises:
            InvariantError: as :meth:`run`, and a fitted weight of another dtype than the start's.
        """
        from sparkdl.keras.replica import check_state_dtypes

        fit = self.run(FitState(identity=self.snapshots.identity, master=start))
        changed = self.callbacks.changed_state()
        if changed is not None:
            fit.master = ModelState([np.asarray(w) for w in changed.weights], fit.master.optimizer)
            fit.info["weights_from_callbacks"] = True
        check_state_dtypes(start.weights, fit.master.weights, "the fitted master weights")  # float32 in, float32 out
        self.transport_info = self.transport.info()
        return fit

    def run(self, fit: FitState) -> FitState:
        """Train from ``fit`` (or from a snapshot the snapshots or a ``BackupAndRestore`` hold) to the
        last epoch or a callback's stop; returns the final state.

        Raises:
            InvariantError: a round or an epoch breaks an invariant (rows, finite weights).
            WorkerError, RoundTimeoutError, FitCancelledError: from the transport.
        """
        job, callbacks = self.job, self.callbacks
        rounds_per_epoch = self.transport.rounds_per_epoch
        epochs = job.config.epochs
        callbacks.train_begin(fit.master)
        fit = self.snapshots.resume(fit, callbacks, rounds_per_epoch)
        if "resumed_from_epoch" in fit.info and job.config.verbose:
            print(resumed_line(fit.info, epochs), flush=True)
        self.snapshots.attach(self, callbacks, fit)
        self.transport.start(fit)
        logs: dict = {}
        stopped = "stopped" in fit.info  # a snapshot of a fit a callback stopped: it is over
        try:
            while fit.epochs < epochs and not stopped:
                logs, stopped = self._epoch(fit, rounds_per_epoch)
            callbacks.train_end(logs)
            self.transport.finish(stopped)
            self.transport.handle.final(fit)  # the final master, read from where it lives, once
        finally:
            self.transport.close()
        self.snapshots.finish(fit)
        return fit

    # ---- one epoch -----------------------------------------------------------------------------

    def _epoch(self, fit: FitState, rounds_per_epoch: int) -> tuple[dict, bool]:
        job, callbacks, epoch = self.job, self.callbacks, fit.epochs
        first = fit.rounds - epoch * rounds_per_epoch  # > 0 when resumed inside the epoch
        if first == 0:
            fit.epoch = EpochProgress()
        callbacks.epoch_begin(epoch)
        started = time.perf_counter()
        reported_seconds = 0.0
        stopped = False
        for r in range(first, rounds_per_epoch):
            callbacks.round_begin(r)
            report = self._round(fit, epoch, r, rounds_per_epoch)
            reported_seconds += report.seconds
            stopped = callbacks.stop_training
            if stopped:
                break
            self.snapshots.after_round(fit, epoch_end=r + 1 == rounds_per_epoch)
        check_epoch_rows(epoch, fit.epoch.rows, fit.epoch.dropped, fit.epoch.expected, job.data.total_rows, stopped)
        metrics = job.reader.results(fit.epoch.sums) if fit.epoch.sums is not None else {}
        if self.validator is not None:
            metrics.update(self._validate(fit, epoch, epoch + 1 == job.config.epochs or stopped, rounds_per_epoch))
        seconds = reported_seconds or (time.perf_counter() - started)
        self._pending = (epoch, metrics)
        logs = callbacks.epoch_end(epoch, metrics, fit.master)
        self._pending = None
        self._adopt(fit)
        append_epoch(fit.history, logs)
        fit.info.setdefault("update_bytes_per_epoch", []).append(fit.epoch.nbytes)  # what the workers sent (bytes)
        fit.info["update_bytes"] = fit.info.get("update_bytes", 0) + fit.epoch.nbytes
        self.epoch_seconds.append(seconds)
        fit.epochs += 1
        stopped = stopped or callbacks.stop_training
        if stopped:
            fit.info["stopped"] = {"epoch": epoch + 1, "round": fit.rounds, "rows_in_epoch": fit.epoch.expected}
        else:
            self.snapshots.after_epoch(fit)
        return logs, stopped

    # ---- one round -----------------------------------------------------------------------------

    def _orders(self, fit: FitState, epoch: int, r: int, rounds_per_epoch: int, evaluate: list | None = None) -> RoundOrders:
        """The orders of round ``r`` of ``epoch`` (the fit's next round) as ``fit`` and the callbacks stand now."""
        job, total = self.job, self.job.config.epochs * rounds_per_epoch
        description = (f"sparkdl fit {job.fit_id[:8]}: round {fit.rounds + 1}/{total} "
                       f"(epoch {epoch + 1}/{job.config.epochs}, round {r + 1}/{rounds_per_epoch})")
        return RoundOrders(epoch, r, fit.rounds, fit.rounds + 1 == total, self.transport.handle.starts(fit),
                           self.callbacks.learning_rate, self.snapshots.collects(fit.rounds, r, r + 1 == rounds_per_epoch), description,
                           evaluate)

    def _validate(self, fit: FitState, epoch: int, last: bool, rounds_per_epoch: int) -> dict:
        """The ``val_*`` logs of the master after ``epoch``. Where the transport's tasks can validate
        with a round (:attr:`~sparkdl.spark.training.contract.Transport.rides_validation`), the next
        epoch's first round runs now, ahead of the callbacks, its tasks also evaluating this master:
        no job of its own. That round is kept only if the callbacks leave its orders as they were
        (no stop, no learning rate, weights or optimizer state set, :meth:`_round`); otherwise it is
        dropped and runs again, so the fit is the one an ordinary validation gives."""
        if not last and self.transport.rides_validation and self._riding:
            orders = self._orders(fit, epoch + 1, 0, rounds_per_epoch, evaluate=fit.master.weights)
            if not orders.last and not orders.collect:  # (a last round releases the workers' caches; a collected one feeds a snapshot)
                started = time.perf_counter()
                report = self.transport.run_round(orders)
                if report.validation is not None:
                    self._ahead = (orders, report, fit.master, fit.mode, time.perf_counter() - started)
                    fit.info["validations_riding_rounds"] = fit.info.get("validations_riding_rounds", 0) + 1
                    return self.validator.read(report.validation, epoch)
        return self.validator(fit.master.weights, epoch, last, self.transport)

    def _ran_ahead(self, fit: FitState, r: int) -> tuple[RoundOrders, RoundReport, float] | None:
        """The round :meth:`_validate` ran ahead, when it is round ``r`` and the callbacks left its
        orders as they were (None otherwise: it is dropped, counted in ``fitInfo``, and no round runs
        ahead any more in this fit: its callbacks change what rounds train with)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        orders, report, master, mode, seconds = ahead
        if (r == orders.round_in_epoch and fit.rounds == orders.index and fit.master is master and fit.mode is mode
                and self.callbacks.learning_rate == orders.learning_rate and not self.callbacks.stop_training):
            return dataclasses.replace(orders, evaluate=None), report, seconds
        fit.info["rounds_run_again"] = fit.info.get("rounds_run_again", 0) + 1
        self._riding = False
        return None

    def _round(self, fit: FitState, epoch: int, r: int, rounds_per_epoch: int) -> RoundReport:
        job, callbacks = self.job, self.callbacks
        ahead = self._ran_ahead(fit, r)
        if ahead is not None:
            orders, report, seconds = ahead
            ended = time.perf_counter()
        else:
            orders = self._orders(fit, epoch, r, rounds_per_epoch)
            started = time.perf_counter()
            report = self.transport.run_round(orders)
            ended = time.perf_counter()
            seconds = ended - started
        description = orders.description
        self.round_seconds.append(seconds)
        if self.first_round_s is None:
            self.first_round_s, self.first_round_end = seconds, ended
        not_finite = self.transport.handle.advance(fit, report, description)  # None, or the master kept its last finite state
        fit.rounds += 1
        self._count(fit, report)
        if callbacks.wants_rounds:  # the epoch's running metrics, for the callbacks' round hooks
            callbacks.round_end(r, job.reader.results(fit.epoch.sums) if fit.epoch.sums is not None else {})
            self._adopt(fit)
        if orders.learning_rate is not None:  # what the replicas trained with, read back from their optimizer state
            exact = job.config.compression is None  # compressed updates carry the optimizer state approximately, or not at all
            fit.info.setdefault("learning_rates", []).append(
                [fit.rounds - 1, orders.learning_rate, callbacks.master_learning_rate(fit.master) if exact else None])
        if not_finite is not None:
            if not callbacks.stop_training:
                raise not_finite
            fit.info["stopped_reason"] = f"not finite: {not_finite}"[:300]
        return report

    def _count(self, fit: FitState, report: RoundReport) -> None:
        progress = fit.epoch
        for variables in report.metrics:
            progress.add_sums(variables)
        progress.rows += sum(rows for _, rows in report.workers)
        progress.dropped += report.rows_dropped
        progress.nbytes += report.nbytes
        progress.expected += report.rows_expected
        fit.local.update(report.local)
        info = fit.info
        if report.local_resets or self.job.quantized:
            info["local_state_resets"] = info.get("local_state_resets", 0) + report.local_resets
        if self.job.config.min_workers(self.job.workers) < self.job.workers:
            info["updates_dropped"] = info.get("updates_dropped", 0) + len(report.dropped)
            info["rows_dropped"] = info.get("rows_dropped", 0) + report.rows_dropped
            info.setdefault("dropped_per_round", []).append(list(report.dropped))

    def _adopt(self, fit: FitState) -> None:
        """Weights or optimizer variables a callback set on the driver's model become the master."""
        changed = self.callbacks.changed_state()
        if changed is not None:
            check_finite(changed, self.job.names, "a callback set the weights")
            self.transport.handle.adopt(fit, changed)
            fit.master = ModelState(changed.weights, changed.optimizer if changed.optimizer is not None else fit.master.optimizer)
            fit.info["weights_from_callbacks"] = True
            self.callbacks.set_master(fit.master)

    def pending_state(self, fit: FitState) -> FitState:
        """``fit`` as a snapshot taken now should hold it: inside ``on_epoch_end`` (a
        ``BackupAndRestore`` saving), the epoch counts as done, its logs in the history, and
        weights a callback set before it are the master."""
        pending = getattr(self, "_pending", None)
        changed = self.callbacks.changed_state()
        if pending is None and changed is None:
            return fit
        import copy

        out = copy.copy(fit)
        out.history = {k: list(v) for k, v in fit.history.items()}
        out.info = dict(fit.info)
        if changed is not None:
            out.master = ModelState(changed.weights, changed.optimizer if changed.optimizer is not None else fit.master.optimizer)
        if pending is not None:
            epoch, logs = pending
            append_epoch(out.history, logs)
            out.epochs = epoch + 1
            out.epoch = EpochProgress()
        return out

