"""Transports: how a round's start states reach the workers and their updates come back.

The driver loop (:mod:`sparkdl.spark.training.loop`) owns a fit's state and its rounds; a
transport only runs them:

- ``rounds`` (:mod:`~sparkdl.spark.transports.rounds`): each round is a Spark job; the start state
  goes out as a broadcast, the updates come back as task results (combined on the executors when
  large). Needs no server; works with dynamic allocation; Spark retries failed tasks.
- ``ps`` (:mod:`~sparkdl.spark.transports.ps`): long-lived tasks (one per worker) talk to a
  parameter server on the driver (Arrow Flight, TLS, a per-fit token); the driver opens each
  round on the server and collects its pushes; the asynchronous modes push to it as they go.

A new transport implements :class:`Transport` and is added to :func:`get_transport`; the loop,
the modes and the callbacks do not change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sparkdl.core.state import FitState, ModelState, RoundUpdates, WorkerLocal
from sparkdl.errors import ConfigError


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
    """

    epoch: int
    round_in_epoch: int
    index: int
    last: bool
    starts: ModelState | list[ModelState]
    learning_rate: float | None
    collect: bool
    description: str


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


class Transport(Protocol):
    """Runs the rounds of one fit for the driver loop.

    Attributes:
        name: ``"rounds"`` or ``"ps"``.
        rounds_per_epoch: the rounds the loop runs per epoch (the plan's; 1 for the asynchronous
            modes, whose round is the epoch's pushes).
    """

    name: str
    rounds_per_epoch: int

    def start(self, fit: FitState) -> None:
        """Get ready to run rounds from ``fit`` (a fresh fit, or one restored from a snapshot)."""

    def run_round(self, orders: RoundOrders) -> RoundReport:
        """Run one round and return what it brought.

        Raises:
            WorkerError: a task failed for good (after Spark's retries); RoundTimeoutError: the
            round ran past its time; InvariantError: what came back breaks an invariant.
        """

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


def preflight(spark, config, model, validation: bool = False) -> str:
    """The fit's transport (``backend="auto"``: ``rounds`` for the round modes, ``ps`` for the
    asynchronous ones), checked before any job: ``ps`` needs a task slot per worker and a driver
    the executors reach; ``rounds`` needs its updates to fit ``spark.driver.maxResultSize`` (and
    Spark Connect's message limit).

    Raises:
        ConfigError: naming the setting to change.
    """
    backend = config.resolved_backend
    if backend == "ps":
        from sparkdl.spark.transports.ps import check_ready

        check_ready(spark, config)
    else:
        from sparkdl.spark.transports.rounds import check_results

        check_results(spark, config, model)
    return backend


def get_transport(name: str, job, policy, options: TransportOptions) -> Transport:
    """The transport ``name`` for a fit.

    Raises:
        ConfigError: for an unknown transport name.
    """
    if name == "rounds":
        from sparkdl.spark.transports.rounds import RoundsTransport

        return RoundsTransport(job, policy)
    if name == "ps":
        from sparkdl.spark.transports.ps import PSTransport

        return PSTransport(job, policy, options)
    raise ConfigError(f"backend must be one of ['rounds', 'ps']. Received: {name!r}")
