"""The facts about a fit's cluster, read once before any job into one object: what backend ``auto``,
the transports' checks and their servers decide from (the master, local mode, dynamic allocation,
task slots, where the executors reach the driver, the result-size limit).

Before this object each module read the Spark conf itself: ``spark.dynamicAllocation.enabled`` in
two modules and the task slots counted twice per fit, which could disagree while executors
register. Now :meth:`ClusterFacts.read` reads them once; only :meth:`ClusterFacts.with_slots_for`
counts the slots again, while it waits for executors still registering.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from sparkdl.errors import ConfigError
from sparkdl.spark.session import cluster_cores, conf_get, describe, is_connect, is_local_server, local_mode, master

PS_HOST_CONF = "spark.sparkdl.ps.host"  # where the driver's servers bind, when set (needed on a remote Connect server)
# How long a fit waits for executors still registering (a session's start, a lost executor's
# replacement) before it refuses a cluster with fewer task slots than workers (not in local mode,
# whose slots are fixed), in seconds.
SLOT_WAIT_S = 60.0


def task_slots(spark) -> int | None:
    """Tasks the cluster can run at once. Classic: Spark's own count with the default resource
    profile (``defaultParallelism // spark.task.cpus`` when that is unavailable). Spark Connect:
    the cores its settings tell (:func:`~sparkdl.spark.session.cluster_cores`) divided by
    ``spark.task.cpus``, or None when they do not tell."""
    cpus = max(1, int(conf_get(spark, "spark.task.cpus", "1")))
    if is_connect(spark):
        cores = cluster_cores(spark)
        return None if cores is None else cores // cpus
    from sparkdl.spark import internals

    sc = spark.sparkContext
    try:
        return internals.max_concurrent_tasks(sc)
    except Exception:  # noqa: BLE001 - older or other schedulers: the settings' count
        return max(0, sc.defaultParallelism // cpus)


def removed_executors(spark) -> frozenset[str]:
    """The ids of the executors the application has lost or released so far (empty on a ``local``
    master, on Spark Connect, or when Spark's list cannot be read)."""
    from sparkdl.spark import internals

    if is_connect(spark) or local_mode(spark):
        return frozenset()
    try:
        return frozenset(e["id"] for e in internals.executors(spark.sparkContext) if not e["active"])
    except Exception:  # noqa: BLE001 - Spark's list unreadable: the executors go unnamed
        return frozenset()


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
            fit started (:func:`removed_executors`): a node lost later is named apart from them.
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

    @classmethod
    def read(cls, spark) -> ClusterFacts:
        """Read the facts of ``spark`` (classic or Connect); no job runs."""
        connect = is_connect(spark)
        driver_host = driver_bind = None
        if not connect:
            conf = spark.sparkContext.getConf()
            driver_host, driver_bind = conf.get("spark.driver.host", None), conf.get("spark.driver.bindAddress", None)
        host = conf_get(spark, PS_HOST_CONF)
        return cls(master=master(spark), connect=connect, local_server=is_local_server(spark), local=local_mode(spark),
                   dynamic_allocation=conf_get(spark, "spark.dynamicAllocation.enabled", "false").strip().lower() == "true",
                   slots=task_slots(spark), ps_host=host.strip() if host is not None else None, driver_host=driver_host,
                   driver_bind=driver_bind, session=describe(spark), driver_memory_bytes=physical_memory(),
                   removed_executors=removed_executors(spark))

    def with_slots_for(self, spark, workers: int, timeout_s: float = SLOT_WAIT_S) -> ClusterFacts:
        """These facts with the slots counted again, once per second for up to ``timeout_s``
        seconds, while the cluster has fewer than ``workers`` and executors may still register
        (a cluster master with static allocation); itself otherwise."""
        facts = self
        if self.connect or self.local or self.dynamic_allocation:
            return facts
        deadline = time.monotonic() + timeout_s
        while facts.slots is not None and facts.slots < workers and time.monotonic() < deadline:
            time.sleep(1.0)
            facts = dataclasses.replace(facts, slots=task_slots(spark))
        return facts

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
