"""The loop's contract with a backend: the orders of one round (:class:`RoundOrders`), what the
backend brings back (:class:`RoundReport`), the transport protocol every backend's driver side
implements (:class:`Transport`) and how the loop will use it (:class:`TransportOptions`).

The driver loop (:mod:`sparkdl.spark.training.loop`) owns a fit's state and its rounds; a
transport only runs them. The backends and their registry: :mod:`sparkdl.spark.backends`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sparkdl.core.invariants import check_finite
from sparkdl.core.state import FitState, ModelState, RoundUpdates, WorkerLocal
from sparkdl.errors import InvariantError


@dataclass(frozen=True)
class RoundOrders:
    """One round as the loop orders it.

    Attributes:
        epoch, round_in_epoch: where it is in the schedule (0-based); ``index``: the fit's round count.
        last: whether it is the fit's last round.
        starts: the state every worker starts from, or one per worker (per-worker modes); for the
            asynchronous modes, the master the server should hold (a callback may have set it).
        learning_rate: the rate every replica trains with, when a callback set one (else None).
        collect: whether the workers send their own state with their update (a snapshot follows).
        description: the round's Spark job description.
        evaluate: weights the round's tasks also evaluate on their validation rows (the master of
            the epoch before: its validation riding this round, :attr:`Transport.rides_validation`), or None.
    """

    epoch: int
    round_in_epoch: int
    index: int
    last: bool
    starts: ModelState | list[ModelState]
    learning_rate: float | None
    collect: bool
    description: str
    evaluate: list | None = None


@dataclass
class RoundReport:
    """What a transport brings back from one round.

    Attributes:
        updates: what the mode's policy needs (the mean, each worker's state, or the server's master).
        workers: ``(partition, rows)`` of each worker whose update was applied.
        metrics: each applied update's Keras metric variable sums.
        nbytes: bytes of the updates the workers sent.
        dropped: straggler-tolerant rounds: partitions whose update came late (dropped).
        rows_dropped: the rows those partitions trained in vain.
        local: each worker's own state after the round (collected rounds).
        local_resets: workers that found no state of their own where they expected one.
        rows_expected: rows of this round by the plan (async: the epoch's).
        seconds: the round's own time as the transport measured it (async: the epoch's, by the
            server's clock), 0 when the loop's own clock tells it.
        validation: with :attr:`RoundOrders.evaluate`: per partition ``(validation rows, metric sums or None)``.
    """

    updates: RoundUpdates
    workers: list[tuple[int, int]] = field(default_factory=list)
    metrics: list[list[np.ndarray]] = field(default_factory=list)
    nbytes: int = 0
    dropped: list[int] = field(default_factory=list)
    rows_dropped: int = 0
    local: dict[int, WorkerLocal] = field(default_factory=dict)
    local_resets: int = 0
    rows_expected: int = 0
    seconds: float = 0.0
    validation: dict | None = None


class Transport(Protocol):
    """Runs the rounds of one fit for the driver loop.

    Attributes:
        name: ``"rounds"``, ``"ps"`` or ``"sharded"``.
        rounds_per_epoch: the rounds the loop runs per epoch (the plan's; 1 for the asynchronous
            modes, whose round is the epoch's pushes).
        handle: where the master lives and who applies the mode's policy to it (:class:`LocalMaster`:
            the driver loop, or a backend's own handle: the slice owners, where the state lives); the
            loop runs every round through it, with no branch on the backend.
        rides_validation: a round's tasks can also evaluate weights on the validation rows their
            partitions hold (:attr:`RoundOrders.evaluate`; ``rounds``), so an epoch's validation
            can ride the next epoch's first round.
    """

    name: str
    rounds_per_epoch: int
    handle: MasterHandle
    rides_validation: bool = False

    def start(self, fit: FitState) -> None:
        """Get ready to run rounds from ``fit`` (a fresh fit, or one restored from a snapshot)."""

    def run_round(self, orders: RoundOrders) -> RoundReport:
        """Run one round and return what it brought.

        Raises:
            WorkerError: a task failed for good (after Spark's retries); RoundTimeoutError: the
            round ran past its time; InvariantError: what came back breaks an invariant.
        """

    def validate(self, weights: list, epoch: int, last: bool) -> dict | None:
        """Evaluate ``weights`` (the master after ``epoch``) in the workers' own tasks, each on the
        validation rows its partition holds: ``{partition: (rows, summed metric variables)}`` of
        the partitions with validation rows, or None where the transport cannot (the loop then
        runs :meth:`pause` and a validation job). ``last``: the fit's last validation."""

    def pause(self) -> None:
        """Free every task slot of the fit until the next round (validation jobs need them)."""

    def finish(self, stopped: bool) -> None:
        """No more rounds: the fit ended, or a callback stopped it (``stopped``)."""

    def close(self) -> None:
        """Release everything the transport holds (jobs, server, threads, files); always called."""

    def info(self) -> dict:
        """Facts for ``fitInfo``."""


@dataclass(frozen=True)
class TransportOptions:
    """How the loop will use a transport.

    Attributes:
        pause_at_epochs: the loop needs every task slot free (validation), or every worker at the
            same point (snapshots of an asynchronous fit), at each epoch's end: backend ``ps`` ends
            its tasks there and starts new ones for the next epoch.
        snapshots: the fit writes snapshots (``checkpointDir``, ``BackupAndRestore``).
    """

    pause_at_epochs: bool = False
    snapshots: bool = False


class MasterHandle(Protocol):
    """Where a fit's master lives and who applies the mode's policy to it: the loop's one shape.

    Methods are called by the driver loop, in this order: :meth:`starts` for each round's orders,
    :meth:`advance` once its report came back, :meth:`adopt` when a callback set the weights, and
    :meth:`final` once the transport finished.
    """

    def starts(self, fit: FitState) -> ModelState | list[ModelState] | None:
        """What :attr:`RoundOrders.starts` carries (None where the state's owners know their start)."""

    def advance(self, fit: FitState, report: RoundReport, description: str) -> Exception | None:
        """Make ``fit.master`` (and ``fit.mode``) the state after the round ``report`` brought;
        returns the error of a non-finite master instead of raising it (the master then keeps the
        last finite state, and a callback may stop the fit: ``TerminateOnNaN``)."""

    def adopt(self, fit: FitState, state: ModelState) -> None:
        """A callback set the master mid-fit to ``state``; raises ConfigError where it cannot be taken."""

    def final(self, fit: FitState) -> None:
        """The fit ended: ``fit.master`` becomes the final master (read from where it lives)."""


class LocalMaster:
    """The master on the driver: the driver loop applies the mode's policy (``rounds``, ``ps``).

    Args:
        policy: the mode's policy (:mod:`sparkdl.core.modes`).
        names: the weights' names (messages).
    """

    def __init__(self, policy, names) -> None:
        self.policy, self.names = policy, list(names)

    def starts(self, fit: FitState) -> ModelState | list[ModelState]:
        return self.policy.starts(fit)

    def advance(self, fit: FitState, report: RoundReport, description: str) -> Exception | None:
        transition = self.policy.apply(fit, report.updates)
        try:
            check_finite(transition.master, self.names, description)
        except InvariantError as exc:
            return exc
        fit.master, fit.mode = transition.master, transition.mode
        return None

    def adopt(self, fit: FitState, state: ModelState) -> None:
        """The driver holds the master: the callback's state is the next round's start as it is."""

    def final(self, fit: FitState) -> None:
        """The driver holds the final master already."""


class SlicedMaster:
    """A master whose state lives in its owners' slices: a snapshot has each owner write its slice
    (:meth:`write_slices`) instead of the driver writing the arrays."""

    def write_slices(self, folder: str, name: str) -> dict:
        """Have every owner write its slice next to snapshot ``name`` in ``folder``; returns the manifest."""
        raise NotImplementedError
