"""A fit's plan on the driver: its session read once, then one data preparation.

``KerasEstimator._fit`` makes one :class:`FitPlan` from the training DataFrame's session before any
job (:meth:`FitPlan.read`): every fact of the session and its cluster that the fit decides from
(the master, local mode, Spark Connect, where its server runs, the default parallelism, the cores
and task slots, the settings the fit reads, the program the Python workers run and their daemon's
settings, the driver's addresses, the executors removed so far, the Connect client's message
limit), read once into a
frozen object. The later steps receive the plan, not the SparkSession: what they decide from it (the
backend's :class:`~sparkdl.spark.cluster.ClusterFacts`, a task's memory budget, whether bytes fit a
Spark Connect plan, the GPU settings' warnings) are properties of the facts, and no step asks the
session again, except two that must see it change: :meth:`FitPlan.with_slots_for` counts the task
slots again while executors register, and the jobs themselves run on the session the plan carries
(:attr:`FitPlan.spark`).

:meth:`FitPlan.prepare` then runs the fit's one data preparation
(:func:`~sparkdl.spark.data.prepare`: the check and caching jobs) under the fit's job tag and
``dataTimeout``, and returns the prepared data with the warnings it found.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

from sparkdl.core.gpu import EXECUTOR_AMOUNT_CONF, REUSE_CONF, TASK_AMOUNT_CONF
from sparkdl.spark import internals
from sparkdl.spark.daemon import conf_facts
from sparkdl.spark.cluster import PS_HOST_CONF, SLOT_WAIT_S, ClusterFacts, physical_memory, slots_from
from sparkdl.spark.session import (CONNECT_MESSAGE_CONF, conf_get, cores_from, inline_bytes, is_connect, is_loopback, local_threads,
                                   master, parse_size, python_exec)

#: the settings a fit reads through ``spark.conf`` (an unset or blank one reads as None)
SETTINGS = ("spark.task.cpus", "spark.executor.instances", "spark.executor.cores", "spark.default.parallelism",
            "spark.dynamicAllocation.enabled", PS_HOST_CONF, CONNECT_MESSAGE_CONF, "spark.driver.memory",
            "spark.executor.pyspark.memory", "spark.executor.memory", TASK_AMOUNT_CONF)
#: the settings read as ``spark.conf.get(key, None)`` gives them (a blank value kept): the GPU warnings' and Python worker reuse
RAW_SETTINGS = (REUSE_CONF, TASK_AMOUNT_CONF, EXECUTOR_AMOUNT_CONF)


@dataclass(frozen=True)
class FitPlan:
    """A fit's session and cluster as they were when the fit started (see the module docstring).

    Attributes:
        spark: the session the fit's jobs run on (no fact is read from it after :meth:`read`, but
            the slots by :meth:`with_slots_for`).
        connect: a Spark Connect session.
        master: the master URL (``local[2]``, ``yarn``; ``""`` when a Connect server does not say).
        settings: :data:`SETTINGS` -> value as set, or None.
        raw_settings: :data:`RAW_SETTINGS` -> ``spark.conf.get(key, None)``.
        context_parallelism: ``SparkContext.defaultParallelism`` (classic), None on Connect.
        python_exec: the program the Python workers run (classic), None on Connect.
        ships_files: the session ships Python files (``spark.submit.pyFiles``, ``addPyFile``; classic).
        driver_host, driver_bind: ``spark.driver.host`` and ``spark.driver.bindAddress`` (classic).
        connect_host: the Connect server's host, None when unknown (or classic).
        local_remote: ``SPARK_LOCAL_REMOTE`` set (pyspark started the Connect server in this process).
        client_limit: the Connect client's ``grpc.max_send_message_length`` (bytes), None when unset.
        max_tasks: Spark's own count of the tasks that run at once (classic), None when unreadable.
        removed_executors: ids of the executors lost or released before the fit (classic, not local).
        driver_memory_bytes: this machine's physical memory (bytes; 0 when unknown).
        max_task_memory_mb: the ``maxTaskMemoryMB`` Param (MB), None for the settings' budget.
        app_id: the application's id (classic), None on Connect.
        daemon_conf: the Python worker daemon's settings in the running context's conf
            (:func:`~sparkdl.spark.daemon.conf_facts`; classic), empty on Connect.
    """

    spark: object
    connect: bool
    master: str
    settings: dict
    raw_settings: dict
    context_parallelism: int | None = None
    python_exec: str | None = None
    ships_files: bool = False
    driver_host: str | None = None
    driver_bind: str | None = None
    connect_host: str | None = None
    local_remote: bool = False
    client_limit: int | None = None
    max_tasks: int | None = None
    removed_executors: frozenset = frozenset()
    driver_memory_bytes: int = 0
    max_task_memory_mb: float | None = None
    app_id: str | None = None
    daemon_conf: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def read(cls, spark, max_task_memory_mb: float | None = None) -> FitPlan:
        """Read the facts of ``spark`` (classic or Connect) once; no job runs.

        Args:
            spark: the training DataFrame's session.
            max_task_memory_mb: the ``maxTaskMemoryMB`` Param (MB), or None.
        """
        connect, url = is_connect(spark), master(spark)
        settings = {key: conf_get(spark, key) for key in SETTINGS}
        raw = {key: spark.conf.get(key, None) for key in RAW_SETTINGS}
        program = python_exec(spark)
        facts = {"spark": spark, "connect": connect, "master": url, "settings": settings, "raw_settings": raw,
                 "python_exec": program, "driver_memory_bytes": physical_memory(), "max_task_memory_mb": max_task_memory_mb}
        if connect:
            facts["local_remote"] = bool(os.environ.get("SPARK_LOCAL_REMOTE"))
            try:  # the client's internals: unknown when unreadable
                facts["connect_host"] = internals.connect_host(spark)
            except Exception:  # noqa: BLE001
                pass
            try:  # a private attribute of the client: Connect's default when unreadable
                option = internals.connect_channel_option(spark, "grpc.max_send_message_length")
                facts["client_limit"] = None if option is None else int(option)
            except Exception:  # noqa: BLE001
                pass
            return cls(**facts)
        sc = spark.sparkContext
        conf = sc.getConf()
        facts.update(app_id=sc.applicationId, daemon_conf=conf_facts(conf))
        facts.update(context_parallelism=sc.defaultParallelism, driver_host=conf.get("spark.driver.host", None),
                     driver_bind=conf.get("spark.driver.bindAddress", None),
                     ships_files=bool(conf.get("spark.submit.pyFiles", "")) or any(
                         f.endswith((".zip", ".egg", ".whl", ".py")) for f in (sc.listFiles or [])))
        try:
            facts["max_tasks"] = internals.max_concurrent_tasks(sc)
        except Exception:  # noqa: BLE001 - older or other schedulers: the settings' count (slots_from)
            pass
        if local_threads(url) is None:  # a local master neither loses nor releases executors
            try:
                facts["removed_executors"] = frozenset(e["id"] for e in internals.executors(sc) if not e["active"])
            except Exception:  # noqa: BLE001 - Spark's list unreadable: the executors go unnamed
                pass
        return cls(**facts)

    # ---- what the fit decides from the facts (no session read) ---------------------------------

    @property
    def local(self) -> bool:
        """A ``local`` master (``local``, ``local[N]``, ``local[N,F]``, ``local[*]``): task slots fixed."""
        return local_threads(self.master) is not None

    @property
    def local_server(self) -> bool:
        """Whether the executors run on this machine (see :func:`~sparkdl.spark.session.is_local_server`)."""
        if not self.connect:
            return self.master.startswith("local")
        return self.local_remote or (is_loopback(self.connect_host) and self.master.startswith("local"))

    @property
    def cores(self) -> int | None:
        """A Connect cluster's cores as its settings tell (:func:`~sparkdl.spark.session.cluster_cores`)."""
        return cores_from(self.master, self.local_server, self.settings["spark.executor.instances"],
                          self.settings["spark.executor.cores"])

    @property
    def default_parallelism(self) -> int:
        """Spark's default parallelism (:func:`~sparkdl.spark.session.default_parallelism`)."""
        if not self.connect:
            return self.context_parallelism
        configured = self.settings["spark.default.parallelism"]
        return max(1, int(configured)) if configured is not None else self.cores or 2

    @property
    def slots(self) -> int | None:
        """Tasks the cluster can run at once (:func:`~sparkdl.spark.cluster.task_slots`)."""
        return slots_from(self.connect, self.cores if self.connect else None, self.settings["spark.task.cpus"], self.max_tasks,
                          self.context_parallelism)

    @property
    def session(self) -> str:
        """The session in words, for messages (:func:`~sparkdl.spark.session.describe`)."""
        return f"Spark Connect session sc://{self.connect_host or '?'}" if self.connect else "classic session"

    @property
    def cluster(self) -> ClusterFacts:
        """The facts the backends decide from (:class:`~sparkdl.spark.cluster.ClusterFacts`)."""
        host = self.settings[PS_HOST_CONF]
        return ClusterFacts(
            master=self.master, connect=self.connect, local_server=self.local_server, local=self.local,
            dynamic_allocation=(self.settings["spark.dynamicAllocation.enabled"] or "false").strip().lower() == "true",
            slots=self.slots, ps_host=host.strip() if host is not None else None, driver_host=self.driver_host,
            driver_bind=self.driver_bind, session=self.session, driver_memory_bytes=self.driver_memory_bytes,
            removed_executors=self.removed_executors)

    @property
    def budget(self) -> int:
        """A task's memory budget for its partition (bytes; :func:`~sparkdl.spark.partitions.memory_budget`).

        Raises:
            ConfigError: a memory setting that is not a size such as ``512m`` or ``2g``.
        """
        from sparkdl.spark.partitions import memory_budget

        local = self.master.startswith("local")
        return memory_budget(local, self.settings.get, self.default_parallelism if local else 1, self.max_task_memory_mb)

    @property
    def inline_limit(self) -> int | None:
        """Bytes a Connect plan may inline (:func:`~sparkdl.spark.session.inline_limit`); None on a
        classic session, which broadcasts instead.

        Raises:
            ConfigError: ``spark.connect.grpc.maxInboundMessageSize`` that is not a size.
        """
        if not self.connect:
            return None
        server = self.settings[CONNECT_MESSAGE_CONF]
        return inline_bytes(None if server is None else parse_size(server, "b", CONNECT_MESSAGE_CONF), self.client_limit)

    @property
    def task_gpus(self) -> bool:
        """Whether each task asks for GPUs (``spark.task.resource.gpu.amount`` > 0)."""
        return float(self.settings[TASK_AMOUNT_CONF] or "0") > 0

    @property
    def warnings(self) -> list[str]:
        """What the settings make a fit warn of before any job: Python workers not reused, GPUs
        shared or switched by tasks (:func:`~sparkdl.core.gpu.gpu_conf_warnings`)."""
        from sparkdl.core.gpu import gpu_conf_warnings

        out = []
        reuse = self.raw_settings[REUSE_CONF]
        if (reuse if reuse is not None else "true").lower() != "true":
            out.append("spark.python.worker.reuse is false: every task re-imports TensorFlow and rebuilds its replica")
        return out + gpu_conf_warnings(self.raw_settings.get)

    # ---- the two steps that go back to the session ---------------------------------------------

    def with_slots_for(self, workers: int, timeout_s: float = SLOT_WAIT_S) -> FitPlan:
        """This plan with the task slots counted again, once per second for up to ``timeout_s``
        seconds, while the cluster has fewer than ``workers`` and executors may still register (a
        cluster master with static allocation: not Connect, ``local`` or dynamic allocation);
        itself otherwise."""
        plan = self
        if self.connect or self.local or self.cluster.dynamic_allocation:
            return plan
        deadline = time.monotonic() + timeout_s
        while plan.slots is not None and plan.slots < workers and time.monotonic() < deadline:
            time.sleep(1.0)
            sc = self.spark.sparkContext
            try:
                max_tasks = internals.max_concurrent_tasks(sc)
            except Exception:  # noqa: BLE001 - the settings' count (slots_from)
                max_tasks = None
            plan = dataclasses.replace(plan, max_tasks=max_tasks, context_parallelism=sc.defaultParallelism)
        return plan
