"""Transports: how a round's start states reach the workers and their updates come back.

The driver loop (:mod:`sparkdl.spark.training.loop`) owns a fit's state and its rounds; a
transport only runs them:

- ``rounds`` (:mod:`~sparkdl.spark.transports.rounds`): each round is a Spark job; the start state
  goes out as a broadcast, the updates come back as task results (combined on the executors when
  large). Needs no server; works with dynamic allocation; Spark retries failed tasks.
- ``ps`` (:mod:`~sparkdl.spark.transports.ps`): long-lived tasks (one per worker) talk to a
  parameter server on the driver (Arrow Flight, TLS, a per-fit token); the driver opens each
  round on the server and collects its pushes; the asynchronous modes push to it as they go.
- ``sharded`` (:mod:`~sparkdl.spark.transports.sharded`): long-lived tasks own the state's slices
  and serve them to each other; the slice owners apply the mode's policy
  (:attr:`Transport.applies_policy`); the driver only coordinates.

A new transport implements :class:`Transport` and is added to :func:`get_transport`; the loop,
the modes and the callbacks do not change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

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
        logs: more of the epoch's logs (async: the parameter server's counters of the epoch:
            ``updates_applied``, ``staleness_mean``, ``staleness_max``, ``bytes_pushed``, ``bytes_pulled``).
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
    logs: dict = field(default_factory=dict)
    validation: dict | None = None


class Transport(Protocol):
    """Runs the rounds of one fit for the driver loop.

    Attributes:
        name: ``"rounds"``, ``"ps"`` or ``"sharded"``.
        rounds_per_epoch: the rounds the loop runs per epoch (the plan's; 1 for the asynchronous
            modes, whose round is the epoch's pushes).
        applies_policy: the transport applies the mode's policy where the state lives (``sharded``):
            the loop then neither asks the policy for starts nor applies it, and takes the master
            from :meth:`master`. False (the default) for the others.
        rides_validation: a round's tasks can also evaluate weights on the validation rows their
            partitions hold (:attr:`RoundOrders.evaluate`; ``rounds``), so an epoch's validation
            can ride the next epoch's first round.
    """

    name: str
    rounds_per_epoch: int
    applies_policy: bool = False
    rides_validation: bool = False

    def master(self, version: int) -> ModelState:
        """(``applies_policy`` only) The master after ``version`` rounds, its arrays read when used."""

    def adopt(self, state: ModelState) -> None:
        """(``applies_policy`` only) A callback set the master mid-fit: the transport takes it, or raises ConfigError."""

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


class BackendChoice(NamedTuple):
    """The transport a fit runs on and why.

    Attributes:
        backend: ``"rounds"``, ``"ps"`` or ``"sharded"``.
        reason: one sentence for the log, the console and ``fitInfo["backend_reason"]``.
    """

    backend: str
    reason: str


PS_PEAK_STATES = 10.2  # copies of the state the driver holds at a ps round's peak (benchmarks/driver_memory.py, 20M with Adam)


def sliceable(config, validation: bool = False) -> bool:
    """Whether backend ``sharded`` runs ``config`` (:func:`~sparkdl.spark.transports.sharded.check_sliceable` would pass)."""
    from sparkdl.core.modes import SLICED_MODES

    return (config.mode in SLICED_MODES and config.compression in (None, "fp16") and config.min_workers_per_round is None
            and not validation)


def prefers_sharded(cluster, config, state_bytes: int | None) -> str | None:
    """Why auto runs a sliceable round mode on ``sharded`` rather than ``ps``, or None: the driver
    would hold about :data:`PS_PEAK_STATES` copies of the state on ``ps`` (measured), more than a
    third of its machine's memory (the rest is for the executors a ``local`` master runs beside it, and
    for the driver's JVM). Not for speed alone: ``sharded`` was not measured faster than ``ps`` for
    any worker count on one machine (``benchmarks/scaling.py``: equal at N = 2 and 4, 1.25× slower at
    N = 8 with 1M parameters on 2 cores, where its N·(N−1) transfers share the cores)."""
    if state_bytes and cluster.driver_memory_bytes and PS_PEAK_STATES * state_bytes > cluster.driver_memory_bytes / 3:
        return (f"auto: on backend 'ps' the driver would hold about {PS_PEAK_STATES:g} copies of the model's state "
                f"(about {state_bytes / 2**20:,.0f} MB: the weights and, as Adam keeps, two moments of each), more than a "
                f"third of this machine's {cluster.driver_memory_bytes / 2**30:.0f} GB; backend 'sharded' keeps it in the "
                "workers' slices")
    return None


def choose_backend(cluster, config, state_bytes: int | None = None, validation: bool = False) -> BackendChoice:
    """The transport of a fit with ``config`` on a cluster (:class:`~sparkdl.spark.cluster.ClusterFacts`), and why; no job runs.

    ``backend="rounds"``, ``"ps"`` or ``"sharded"`` set by the user is kept. ``backend="auto"`` (the default):

    - an asynchronous mode (:data:`~sparkdl.core.modes.ASYNC_MODES`) runs only on ``ps``, ``diloco``
      (and ``keepLocalOptimizer``) only on ``sharded``;
    - a round mode runs on a long-lived-task backend (no Spark job per round) when the cluster
      allows it, and on ``rounds`` otherwise, the first rule that fails naming why:

      1. ``spark.dynamicAllocation.enabled`` is false (those backends hold their task slots for the
         whole fit; executors that come and go suit ``rounds``);
      2. ``keepPartitioning`` is off (the worker count is then ``numWorkers``, known before any job);
      3. the cluster has a task slot per worker now (counted without waiting for executors still
         registering);
      4. the executors can reach a server in this process: always on a classic session (its
         executors already connect to the driver) and on Spark Connect with a server on this
         machine; with a remote Connect server only when ``spark.sparkdl.ps.host`` names this
         machine's address (its reachability cannot be judged from here);

      then ``sharded`` when the fit can be sliced (:func:`sliceable`) and its state would crowd the
      driver on ``ps`` (:func:`prefers_sharded`), else ``ps``.

    Args:
        cluster: the fit's :class:`~sparkdl.spark.cluster.ClusterFacts`.
        config: the fit's :class:`~sparkdl.config.FitConfig`.
        state_bytes: the model's state in bytes (weights and optimizer state), when known.
        validation: the fit has validation data (``sharded`` refuses it).
    """
    from sparkdl.core.modes import ASYNC_MODES, LOCAL_OPTIMIZER_MODES
    from sparkdl.spark.cluster import PS_HOST_CONF

    if config.backend != "auto":
        return BackendChoice(config.backend, f"backend={config.backend!r} was set")
    if config.mode in ASYNC_MODES:
        return BackendChoice("ps", f"auto: mode {config.mode!r} is asynchronous and runs only on backend 'ps'")
    if config.mode in LOCAL_OPTIMIZER_MODES or config.keep_local_optimizer:
        return BackendChoice("sharded", f"auto: {'mode ' + repr(config.mode) if config.mode in LOCAL_OPTIMIZER_MODES else 'keepLocalOptimizer'} "
                                        "keeps each worker's optimizer and runs only on backend 'sharded'")
    if cluster.dynamic_allocation:
        return BackendChoice("rounds", "auto: spark.dynamicAllocation.enabled is true, and backends 'ps' and 'sharded' hold a task "
                                       "slot per worker for the whole fit")
    if config.keep_partitioning:
        return BackendChoice("rounds", "auto: keepPartitioning=True, so the worker count (the input's partitions) is not "
                                       "known before the data is cached, and backend 'ps' needs a task slot per worker")
    workers, slots = config.num_workers, cluster.slots
    if slots is None:
        return BackendChoice("rounds", f"auto: the task slots of this Spark Connect cluster are unknown (its settings do not "
                                       f"tell its cores), and backend 'ps' needs one per worker ({workers})")
    if slots < workers:
        return BackendChoice("rounds", f"auto: too few task slots for backend 'ps': {slots} for numWorkers={workers} "
                                       "(it runs every worker at once)")
    if not cluster.driver_reachable:
        return BackendChoice("rounds", f"auto: a remote Spark Connect server, whose executors may not reach this client's "
                                       f"parameter server; set {PS_HOST_CONF} to an address of this machine they can reach "
                                       "to use backend 'ps'")
    why = prefers_sharded(cluster, config, state_bytes) if sliceable(config, validation) else None
    if why is not None:
        return BackendChoice("sharded", why)
    return BackendChoice("ps", f"auto: static allocation, {slots} task slots for {workers} workers and a driver the "
                               "executors reach")


def preflight(spark, config, model, validation: bool = False) -> tuple[BackendChoice, object, int]:
    """The fit's cluster facts (:class:`~sparkdl.spark.cluster.ClusterFacts`, read once here) and
    transport (:func:`choose_backend`), checked before any job: ``ps`` and ``sharded`` need a task
    slot per worker (on a cluster, after waiting up to ``SLOT_WAIT_S`` seconds for executors still
    registering) and a driver the executors reach, ``sharded`` a mode it can slice
    (:func:`~sparkdl.spark.transports.sharded.check_sliceable`); ``rounds`` needs its updates to fit
    ``spark.driver.maxResultSize`` (and Spark Connect's message limit). Returns ``(choice, facts,
    state bytes)`` (the state's bytes: weights and optimizer state; estimated as three times the
    weights, Adam's, unless ``rounds`` built the optimizer to count them).

    Raises:
        ConfigError: naming the setting to change.
    """
    from sparkdl.spark.cluster import ClusterFacts

    from sparkdl.keras.replica import weights_nbytes

    cluster = ClusterFacts.read(spark)
    state_bytes = 3 * weights_nbytes(model)
    choice = choose_backend(cluster, config, state_bytes=state_bytes, validation=validation)
    if choice.backend in ("ps", "sharded"):
        if choice.backend == "sharded":
            from sparkdl.spark.transports.sharded import check_sliceable

            check_sliceable(config, validation)
        cluster = cluster.with_slots_for(spark, config.num_workers)
        cluster.check_slots(config.num_workers, choice.backend)
        cluster.server_addresses()  # on Spark Connect: the executors must be able to reach this client
    else:
        from sparkdl.spark.transports.rounds import check_results

        state_bytes = check_results(spark, config, model)
    return choice, cluster, state_bytes


def get_transport(name: str, job, policy, options: TransportOptions) -> Transport:
    """The transport ``name`` for a fit.

    Raises:
        ConfigError: for an unknown transport name.
    """
    if name == "rounds":
        from sparkdl.spark.transports.rounds import RoundsTransport

        return RoundsTransport(job, policy)
    if name == "ps":
        from sparkdl.spark.transports.ps import ps_transport

        return ps_transport(job, policy, options)
    if name == "sharded":
        from sparkdl.spark.transports.sharded import ShardedTransport

        return ShardedTransport(job, policy, options)
    raise ConfigError(f"backend must be one of ['rounds', 'ps', 'sharded']. Received: {name!r}")
