"""The backends: how a fit's state moves between its workers. One package each, holding its driver
side (``driver.py``: the transport the loop runs rounds on) and its executor side (``task.py``),
and this registry of what each declares it can do. Nothing outside a backend's package names it:
the estimator, the plan and the loop ask the registry (:func:`backend`, :func:`check`,
:func:`choose_backend`, :func:`preflight`), and the modes declare their facts on their classes
(:class:`~sparkdl.core.modes.base.Mode`).

- ``rounds`` (:mod:`~sparkdl.spark.backends.rounds`): each round is a Spark job; the start state
  goes out as a broadcast, the updates come back as task results (combined on the executors when
  large). Needs no server; works with dynamic allocation; Spark retries failed tasks.
- ``ps`` (:mod:`~sparkdl.spark.backends.ps`): long-lived tasks (one per worker) talk to a
  parameter server on the driver (Arrow Flight, TLS, a per-fit token); the asynchronous modes.
- ``sharded`` (:mod:`~sparkdl.spark.backends.sharded`): long-lived tasks own the state's slices
  and serve them to each other; the slice owners apply the mode's policy; the driver only
  coordinates.

Adding a backend: its package (``driver.py`` with ``transport(job, policy, options)``, ``task.py``)
and one :class:`Backend` entry in :data:`BACKENDS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import NamedTuple

from sparkdl.core.modes import MODE_NAMES, policy_class
from sparkdl.errors import ConfigError, did_you_mean

PS_PEAK_STATES = 10.2  # copies of the state the driver holds at a ps round's peak (benchmarks/driver_memory.py, 20M with Adam)


@dataclass(frozen=True)
class Backend:
    """What one backend declares it can do.

    Attributes:
        name: ``backend=`` of the estimator.
        driver: the module of its driver side, with ``transport(job, policy, options)``.
        asynchronous: it runs the asynchronous modes (a server applies each push).
        per_worker: it runs the modes that keep a model per worker.
        elementwise_only: it runs only the modes whose rule is elementwise (it applies them slice by slice).
        local_optimizer: it runs the modes (and ``keepLocalOptimizer``) whose workers keep their optimizer state.
        compressions: the ``compression`` values it sends (None: full precision).
        compressions_text: the same, in words, for a refusal.
        validation: it validates with validation data between epochs.
        stragglers: it closes a round without its stragglers (``minWorkersPerRound``).
        long_lived: its workers hold a task slot each for the whole fit and talk to a server in the
            driver's process (or to each other): a slot per worker, executors that reach the driver.
        sliced: the state lives in the workers' slices, not on the driver (snapshots written by the owners).
        hands_over_to: the backend the fit goes on with after a node is lost for good, or None.
        overlap: it runs rounds that never block training (``overlap``: :mod:`sparkdl.core.modes.overlap`).
    """

    name: str
    driver: str
    asynchronous: bool
    per_worker: bool
    elementwise_only: bool
    local_optimizer: bool
    compressions: tuple
    compressions_text: str
    validation: bool
    stragglers: bool
    long_lived: bool
    sliced: bool = False
    hands_over_to: str | None = None
    overlap: bool = False

    def runs_mode(self, mode: str) -> bool:
        """Whether this backend runs mode ``mode``."""
        cls = policy_class(mode)
        if cls.asynchronous and not self.asynchronous:
            return False
        if cls.per_worker and not self.per_worker:
            return False
        if self.elementwise_only and not cls.elementwise:
            return False
        return self.local_optimizer or not cls.local_optimizer

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(m for m in MODE_NAMES if self.runs_mode(m))

    def refusal(self, config, validation: bool = False) -> str | None:
        """Why this backend cannot run ``config`` (a :class:`~sparkdl.config.FitConfig`), in words
        naming the setting and what to use instead; None when it can."""
        mode = config.mode
        if not self.runs_mode(mode):
            cls = policy_class(mode)
            if cls.local_optimizer and not self.local_optimizer:
                why = "keeps each worker's optimizer and applies its outer step on the slices of backend 'sharded'"
            elif self.elementwise_only:
                why = ("cannot be sliced (the asynchronous modes apply each push on one server; easgd and gossip keep a "
                       "model per worker)")
            elif cls.asynchronous:
                why = f"is asynchronous and runs on {_names(running(mode))} (a parameter server applies each push as it arrives)"
            else:
                why = "keeps a model per worker"
            return (f"backend {self.name!r} runs the modes {list(self.modes)}: mode {mode!r} {why}. Use "
                    f"{_names(running(mode))} or 'auto'. Received: mode={mode!r}, backend={self.name!r}")
        if config.keep_local_optimizer and not self.local_optimizer:
            return (f"keepLocalOptimizer is a setting of {_names(b.name for b in BACKENDS.values() if b.local_optimizer)}. "
                    f"Received: keepLocalOptimizer=True, backend={self.name!r}")
        if config.overlap and not self.overlap:
            return (f"overlap (rounds that never block training) is a setting of "
                    f"{_names(b.name for b in BACKENDS.values() if b.overlap)}. Received: overlap=True, backend={self.name!r}")
        if config.compression not in self.compressions:
            return (f"backend {self.name!r} sends updates {self.compressions_text}: compression={config.compression!r} runs on "
                    f"{_names(b.name for b in BACKENDS.values() if config.compression in b.compressions)}. Received: "
                    f"compression={config.compression!r}")
        if config.min_workers_per_round is not None and not self.stragglers:
            return (f"backend {self.name!r} waits for every worker in each round: minWorkersPerRound (straggler-tolerant "
                    f"rounds) runs on {_names(b.name for b in BACKENDS.values() if b.stragglers)}. Received: "
                    f"minWorkersPerRound={config.min_workers_per_round!r}")
        if validation and not self.validation:
            return (f"backend {self.name!r} keeps the state in its workers' tasks for the whole fit, so no validation job can "
                    f"run between its epochs: use {_names(b.name for b in BACKENDS.values() if b.validation)} with validation "
                    "data, or evaluate the fitted model (KerasModel.evaluate). Received: validation data with "
                    f"backend={self.name!r}")
        return None

    def transport(self, job, policy, options):
        """This backend's transport for a fit (its driver module's ``transport``)."""
        return importlib.import_module(self.driver).transport(job, policy, options)


def _names(names) -> str:
    names = sorted(names)
    if not names:
        return "no backend"
    quoted = [repr(n) for n in names]
    return f"backend {quoted[0]}" if len(quoted) == 1 else f"backends {', '.join(quoted[:-1])} and {quoted[-1]}"


BACKENDS: dict[str, Backend] = {
    "rounds": Backend("rounds", "sparkdl.spark.backends.rounds.driver", asynchronous=False, per_worker=True, elementwise_only=False,
                      local_optimizer=False, compressions=(None, "fp16", "1bit", "threshold"),
                      compressions_text="in full precision, fp16, 1bit or threshold", validation=True, stragglers=True,
                      long_lived=False),
    "ps": Backend("ps", "sparkdl.spark.backends.ps.driver", asynchronous=True, per_worker=True, elementwise_only=False,
                  local_optimizer=False, compressions=(None, "fp16", "1bit", "threshold"),
                  compressions_text="in full precision, fp16, 1bit or threshold", validation=True, stragglers=True,
                  long_lived=True, hands_over_to="rounds"),
    "sharded": Backend("sharded", "sparkdl.spark.backends.sharded.driver", asynchronous=False, per_worker=False,
                       elementwise_only=True, local_optimizer=True, compressions=(None, "fp16", "int8", "int4", "1bit", "threshold"),
                       compressions_text="in full precision, as fp16, as int8 / int4 blockwise, or as 1bit / threshold", validation=False, stragglers=False, long_lived=True,
                       sliced=True, overlap=True),
}


def backend(name: str) -> Backend:
    """The registry's entry of backend ``name``.

    Raises:
        ConfigError: for an unknown name.
    """
    if name not in BACKENDS:
        raise ConfigError(f"backend must be one of {list(BACKENDS)}.{did_you_mean(name, BACKENDS)} Received: {name!r}")
    return BACKENDS[name]


def running(mode: str) -> list[str]:
    """The backends that run mode ``mode``."""
    return [b.name for b in BACKENDS.values() if b.runs_mode(mode)]


def check(config, validation: bool = False) -> None:
    """Refuse, before any job, a fit the backend it names cannot run (``backend="auto"``: a fit no
    backend can run).

    Raises:
        ConfigError: naming the setting and what to use instead.
    """
    if config.backend == "auto":
        return
    refusal = backend(config.backend).refusal(config, validation)
    if refusal is not None:
        raise ConfigError(refusal)


class BackendChoice(NamedTuple):
    """The backend a fit runs on and why.

    Attributes:
        backend: a name of :data:`BACKENDS`.
        reason: one sentence for the log, the console and ``fitInfo["backend_reason"]``.
    """

    backend: str
    reason: str


def prefers_sliced(cluster, state_bytes: int | None) -> str | None:
    """Why auto runs a sliceable round mode on a backend that keeps the state in the workers'
    slices rather than ``ps``, or None: the driver would hold about :data:`PS_PEAK_STATES` copies of
    the state on ``ps`` (measured), more than a third of its machine's memory (the rest is for the
    executors a ``local`` master runs beside it, and for the driver's JVM). Not for speed alone."""
    if state_bytes and cluster.driver_memory_bytes and PS_PEAK_STATES * state_bytes > cluster.driver_memory_bytes / 3:
        return (f"auto: on backend 'ps' the driver would hold about {PS_PEAK_STATES:g} copies of the model's state "
                f"(about {state_bytes / 2**20:,.0f} MB: the weights and, as Adam keeps, two moments of each), more than a "
                f"third of this machine's {cluster.driver_memory_bytes / 2**30:.0f} GB; backend 'sharded' keeps it in the "
                "workers' slices")
    return None


def choose_backend(cluster, config, state_bytes: int | None = None, validation: bool = False) -> BackendChoice:
    """The backend of a fit with ``config`` on a cluster (:class:`~sparkdl.spark.cluster.ClusterFacts`), and why; no job runs.

    A backend set by the user is kept. ``backend="auto"`` (the default), by the declared capabilities:

    - a mode (or ``keepLocalOptimizer``, or ``overlap``) only one backend runs runs there;
    - else a long-lived backend (no Spark job per round) when the cluster allows it, and ``rounds``
      otherwise, the first rule that fails naming why:

      1. ``spark.dynamicAllocation.enabled`` is false (long-lived backends hold their task slots for
         the whole fit; executors that come and go suit ``rounds``);
      2. ``keepPartitioning`` is off (the worker count is then ``numWorkers``, known before any job);
      3. the cluster has a task slot per worker now (counted without waiting for executors still
         registering);
      4. the executors can reach a server in this process: always on a classic session (its
         executors already connect to the driver) and on Spark Connect with a server on this
         machine; with a remote Connect server only when ``spark.sparkdl.ps.host`` names this
         machine's address;

      then ``sharded`` when it can run the fit and the state would crowd the driver on ``ps``
      (:func:`prefers_sliced`), else ``ps``.

    Args:
        cluster: the fit's :class:`~sparkdl.spark.cluster.ClusterFacts`.
        config: the fit's :class:`~sparkdl.config.FitConfig`.
        state_bytes: the model's state in bytes (weights and optimizer state), when known.
        validation: the fit has validation data.
    """
    from sparkdl.spark.cluster import PS_HOST_CONF

    if config.backend != "auto":
        return BackendChoice(config.backend, f"backend={config.backend!r} was set")
    able = [b for b in BACKENDS.values() if b.refusal(config, validation) is None]
    if len(able) == 1:
        cls = policy_class(config.mode)
        what = ("overlap=True" if config.overlap else
                "keepLocalOptimizer" if config.keep_local_optimizer and not cls.local_optimizer else f"mode {config.mode!r}")
        why = ("runs" if config.overlap else "is asynchronous and runs" if cls.asynchronous else
               "keeps each worker's optimizer and runs" if cls.local_optimizer or config.keep_local_optimizer else "runs")
        return BackendChoice(able[0].name, f"auto: {what} {why} only on backend {able[0].name!r}")
    if not able:
        raise ConfigError(f"no backend runs this fit: {'; '.join(b.refusal(config, validation) for b in BACKENDS.values())}")
    short = next((b for b in able if not b.long_lived), None)
    if short is not None:
        if cluster.dynamic_allocation:
            return BackendChoice(short.name, "auto: spark.dynamicAllocation.enabled is true, and backends 'ps' and 'sharded' hold "
                                             "a task slot per worker for the whole fit")
        if config.keep_partitioning:
            return BackendChoice(short.name, "auto: keepPartitioning=True, so the worker count (the input's partitions) is not "
                                             "known before the data is cached, and backend 'ps' needs a task slot per worker")
        workers, slots = config.num_workers, cluster.slots
        if slots is None:
            return BackendChoice(short.name, f"auto: the task slots of this Spark Connect cluster are unknown (its settings do not "
                                             f"tell its cores), and backend 'ps' needs one per worker ({workers})")
        if slots < workers:
            return BackendChoice(short.name, f"auto: too few task slots for backend 'ps': {slots} for numWorkers={workers} "
                                             "(it runs every worker at once)")
        if not cluster.driver_reachable:
            return BackendChoice(short.name, f"auto: a remote Spark Connect server, whose executors may not reach this client's "
                                             f"parameter server; set {PS_HOST_CONF} to an address of this machine they can reach "
                                             "to use backend 'ps'")
    sliced = next((b for b in able if b.sliced), None)
    why = prefers_sliced(cluster, state_bytes) if sliced is not None else None
    if why is not None:
        return BackendChoice(sliced.name, why)
    return BackendChoice("ps", f"auto: static allocation, {cluster.slots} task slots for {config.num_workers} workers and a driver "
                               "the executors reach")


class Preflight(NamedTuple):
    """What :func:`preflight` decided and checked before any job.

    Attributes:
        backend: the chosen backend's name; ``reason``: why (:class:`BackendChoice`).
        sliced: the backend keeps the state in the workers' slices (the driver holds no master).
        cluster: the :class:`~sparkdl.spark.cluster.ClusterFacts` as the checks left them (the task
            slots counted again while executors registered).
        state_bytes: the model's state in bytes (weights and optimizer state), estimated as three
            times the weights (Adam's) unless ``rounds`` built the optimizer to count them.
    """

    backend: str
    reason: str
    sliced: bool
    cluster: object
    state_bytes: int


def preflight(plan, config, model, validation: bool = False) -> Preflight:
    """The fit's backend (:func:`choose_backend`, on the cluster facts of ``plan``, a
    :class:`~sparkdl.spark.session.FitPlan`), checked before any job: the chosen backend runs the fit
    (:meth:`Backend.refusal`); ``rounds`` needs its updates to fit ``spark.driver.maxResultSize`` (and
    Spark Connect's message limit); on Spark Connect, validation needs the weights to fit a plan; a
    long-lived backend needs a task slot per worker (on a cluster, after waiting up to
    ``SLOT_WAIT_S`` seconds for executors still registering) and a driver the executors reach.

    Raises:
        ConfigError: naming the setting to change.
    """
    from sparkdl.keras.memory import weights_nbytes
    from sparkdl.spark.session import check_inline_bytes

    weights_bytes = weights_nbytes(model)
    choice = choose_backend(plan.cluster, config, state_bytes=3 * weights_bytes, validation=validation)
    chosen = backend(choice.backend)
    refusal = chosen.refusal(config, validation)
    if refusal is not None:
        raise ConfigError(refusal)
    state_bytes = 3 * weights_bytes if chosen.long_lived else importlib.import_module(chosen.driver).check_results(plan.spark, config, model)
    if validation and plan.connect:  # validation sends the master weights inside its tasks' closure
        check_inline_bytes(weights_bytes, plan.inline_limit, "the master weights to validate")
    if not chosen.long_lived:
        return Preflight(choice.backend, choice.reason, chosen.sliced, plan.cluster, state_bytes)
    cluster = plan.with_slots_for(config.num_workers).cluster
    cluster.check_slots(config.num_workers, chosen.name)
    cluster.server_addresses()  # on Spark Connect: the executors must be able to reach this client
    return Preflight(choice.backend, choice.reason, chosen.sliced, cluster, state_bytes)


def get_transport(name: str, job, policy, options):
    """The transport of backend ``name`` for a fit (:meth:`Backend.transport`).

    Raises:
        ConfigError: for an unknown backend name.
    """
    return backend(name).transport(job, policy, options)
