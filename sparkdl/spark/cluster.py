"""The facts about a fit's cluster, read once before any job into one object: what backend ``auto``,
the transports' checks and their servers decide from (the master, local mode, dynamic allocation,
task slots, where the executors reach the driver, the result-size limit).

Before this object each module read the Spark conf itself: ``spark.dynamicAllocation.enabled`` in
two modules and the task slots counted twice per fit, which could disagree while executors
register. Now a fit's :class:`~sparkdl.spark.session.FitPlan` reads them once and gives them as
:attr:`~sparkdl.spark.session.FitPlan.cluster`; only :meth:`~sparkdl.spark.session.FitPlan.with_slots_for`
counts the slots again, while it waits for executors still registering.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkdl.errors import ConfigError

PS_HOST_CONF = "spark.sparkdl.ps.host"  # where the driver's servers bind, when set (needed on a remote Connect server)
# How long a fit waits for executors still registering (a session's start, a lost executor's
# replacement) before it refuses a cluster with fewer task slots than workers (not in local mode,
# whose slots are fixed), in seconds.
SLOT_WAIT_S = 60.0



def slots_from(connect: bool, cores: int | None, task_cpus: str | None, max_tasks: int | None, parallelism: int | None) -> int | None:
    """Tasks the cluster can run at once, from the facts read. Classic: Spark's own count with the
    default resource profile (``max_tasks``; ``parallelism // spark.task.cpus`` when that was
    unreadable, None). Spark Connect: the ``cores`` its settings tell
    (:func:`~sparkdl.spark.session.cluster_cores`) divided by ``spark.task.cpus``, or None when they
    do not tell. ``task_cpus``: ``spark.task.cpus`` as set (None: 1)."""
    cpus = max(1, int(task_cpus or "1"))
    if connect:
        return None if cores is None else cores // cpus
    return max_tasks if max_tasks is not None else max(0, parallelism // cpus)


def physical_memory() -> int:
    """This machine's physical memory in bytes (0 when the system does not say)."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


@dataclass(frozen=True)
class ClusterFacts:
    """A fit's cluster as it was when the fit started (see the module docstring).

    Attributes:
        master: the master URL (``local[2]``, ``yarn``, ``""`` when a Connect server does not say).
        connect: a Spark Connect session; ``local_server``: its executors run on this machine.
        local: a ``local`` master (task slots fixed for the session).
        dynamic_allocation: ``spark.dynamicAllocation.enabled``.
        slots: tasks the cluster can run at once now (None: a Connect cluster whose settings do not tell).
        ps_host: ``spark.sparkdl.ps.host``, when set.
        driver_host, driver_bind: ``spark.driver.host`` and ``spark.driver.bindAddress`` (classic).
        session: the session in words, for messages.
        driver_memory_bytes: the physical memory of the machine this process (the driver, or the
            Connect client) runs on, in bytes (0 when it cannot be read).
        removed_executors: the ids of the executors the application had lost or released when the
            fit started: a node lost later is named apart from them.
    """

    master: str
    connect: bool
    local_server: bool
    local: bool
    dynamic_allocation: bool
    slots: int | None
    ps_host: str | None
    driver_host: str | None
    driver_bind: str | None
    session: str
    driver_memory_bytes: int = 0
    removed_executors: frozenset[str] = frozenset()

    def check_slots(self, workers: int, backend: str) -> None:
        """Refuse a fit whose ``workers`` cannot all run at once on a long-lived-task backend.

        Raises:
            ConfigError: naming both numbers and what to change.
        """
        if self.slots is not None and self.slots < workers and not self.dynamic_allocation:
            raise ConfigError(
                f"backend {backend!r} needs one task slot per worker at once (its workers wait for each other): numWorkers={workers} "
                f"workers, but the cluster has {self.slots} free task slots. Lower numWorkers to {self.slots} or less, add "
                f"executors or cores, or use backend='rounds'. Received: numWorkers={workers}, task slots={self.slots}"
            )

    def server_addresses(self) -> tuple[str, str]:
        """``(bind, advertise)``: the address the driver's servers (the parameter server, the
        coordinator) bind and the one the executors dial. ``spark.sparkdl.ps.host`` for both when
        set; on a classic session, loopback for a ``local`` master, else ``spark.driver.bindAddress``
        (or ``spark.driver.host``) bound and ``spark.driver.host`` advertised; on Spark Connect (the
        server runs in this client process) loopback when the Connect server runs on this machine.

        Raises:
            ConfigError: on Spark Connect with a remote server and no ``spark.sparkdl.ps.host``.
        """
        if self.ps_host is not None:
            return self.ps_host, self.ps_host
        if self.connect:
            if self.local_server:
                return "127.0.0.1", "127.0.0.1"
            raise ConfigError(
                "backends 'ps' and 'sharded' on Spark Connect run a server in this client process, which the executors of a "
                f"remote Connect server must reach: set {PS_HOST_CONF} to an address of this machine they can connect to "
                f"(spark.conf.set({PS_HOST_CONF!r}, '10.0.0.5')), or use backend='rounds' (mode 'sync'), which needs no server. "
                f"Received: {self.session} with master {self.master or 'unknown'!r} and no {PS_HOST_CONF}"
            )
        host = self.driver_host or "127.0.0.1"
        if self.master.startswith("local") and self.driver_bind is None:
            return "127.0.0.1", "127.0.0.1"
        return self.driver_bind or host, host

    @property
    def driver_reachable(self) -> bool:
        """Whether the executors can reach a server in this process without a setting: always on a
        classic session, on Connect when its server runs here or ``spark.sparkdl.ps.host`` is set."""
        return not self.connect or self.local_server or self.ps_host is not None
