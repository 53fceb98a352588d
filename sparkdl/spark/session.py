"""What differs between a classic SparkSession and a Spark Connect session, in one place.

sparkdl runs on both: a classic session (``SparkSession.builder.master(...)``, a SparkContext in
this process, py4j to the driver's JVM) and a Spark Connect session
(``SparkSession.builder.remote(...)``, ``pyspark.sql.connect.session.SparkSession``: DataFrames
are plans sent over gRPC; no SparkContext, no ``_jvm``, no RDDs, no broadcast variables). The
call sites ask this module instead of touching ``spark.sparkContext``:

- :func:`is_connect`, :func:`is_local_server`: which kind of session, and whether its Spark
  server runs on this machine.
- :func:`conf_get`, :func:`conf_size`, :func:`parse_size`, :func:`master`,
  :func:`default_parallelism`: settings read through ``spark.conf`` (which sees the SparkConf
  entries on both kinds), sizes parsed as Spark parses them ("512m", "1g").
- :func:`share`, :class:`Inline`, :func:`check_inline`: bytes every task reads (``.value``), a
  broadcast on classic; on Connect carried inside the task closure, which travels in the plan and
  must fit the gRPC message limit (checked before any job).
- :func:`tag_jobs`, :func:`cancel_tag`: a job tag on the calling thread's jobs and cancelling
  them from any thread (``SparkContext.addJobTag``/``cancelJobsWithTag`` on classic, where
  ``SparkSession.interruptTag`` only reaches tags added by the calling thread;
  ``SparkSession.addTag``/``interruptTag`` on Connect).
- :class:`FitPlan`: a fit's session and cluster read once, before any job (:meth:`FitPlan.read`),
  and what the fit decides from them, as properties (its section below).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import time
from dataclasses import dataclass

from sparkdl.core.gpu import EXECUTOR_AMOUNT_CONF, REUSE_CONF, TASK_AMOUNT_CONF
from sparkdl.errors import ConfigError
from sparkdl.spark import internals
from sparkdl.spark.cluster import PS_HOST_CONF, SLOT_WAIT_S, ClusterFacts, physical_memory, slots_from
from sparkdl.spark.daemon import conf_facts

CONNECT_MESSAGE_CONF = "spark.connect.grpc.maxInboundMessageSize"
DEFAULT_CONNECT_MESSAGE_BYTES = 128 * 2**20  # Spark Connect's default gRPC message limit, server and client
INLINE_RESERVE_BYTES = 4 * 2**20  # room in a plan for what travels besides the inlined bytes (closure, schema)

_UNITS = {"b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30,
          "t": 2**40, "tb": 2**40, "p": 2**50, "pb": 2**50}
_SIZE = re.compile(r"^([0-9]+)\s*([a-z]*)$")


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (``pyspark.sql.connect.session.SparkSession``).

    Judged by the session's class, so the Connect client (which needs grpc) is never imported
    for a classic session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _connect_host(spark) -> str | None:
    """The host of a Connect session's server URL (``sc://host:port``), or None when unknown."""
    try:
        return internals.connect_host(spark)
    except Exception:  # noqa: BLE001 - the client's internals: treat as unknown
        return None


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a name or an address, IPv6 in brackets or not) is this machine's loopback."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_local_server(spark) -> bool:
    """Whether the executors of ``spark`` run on this machine and see its filesystem and loopback
    address: a classic session with a ``local`` master; a Connect session whose server pyspark
    started in this process (``remote("local[...]")``), or whose URL names a loopback host while
    its master is ``local`` (a server started on this machine; a tunnel to a cluster has another
    master)."""
    if not is_connect(spark):
        return master(spark).startswith("local")
    if os.environ.get("SPARK_LOCAL_REMOTE"):
        return True
    return is_loopback(_connect_host(spark)) and master(spark).startswith("local")


def describe(spark) -> str:
    """The session in words, for messages: ``Spark Connect session sc://host`` or ``classic session``."""
    if is_connect(spark):
        return f"Spark Connect session sc://{_connect_host(spark) or '?'}"
    return "classic session"


# ---- settings ----------------------------------------------------------------------------------


def conf_get(spark, key: str, default: str | None = None) -> str | None:
    """The value of ``key`` set on the session or its SparkConf, else ``default``.

    ``spark.conf`` sees the SparkConf entries on a classic session and the server's on Connect; a
    setting left at Spark's built-in default reads as ``default`` (pass Spark's default)."""
    try:
        value = spark.conf.get(key, None)
    except Exception:  # noqa: BLE001 - Connect refuses some static keys: the same as unset
        value = None
    return default if value is None or str(value).strip() == "" else str(value)


def parse_size(text: str, unit: str = "b", key: str = "size") -> int:
    """A Spark size string in bytes, as Spark's ``JavaUtils.byteStringAs`` reads it: an integer
    with an optional binary suffix (``b``, ``k``/``kb``, ``m``/``mb``, ``g``/``gb``, ``t``/``tb``,
    ``p``/``pb``, any case); a bare integer counts in ``unit`` (``"b"`` for
    ``spark.driver.maxResultSize``, ``"m"`` for ``spark.driver.memory``).

    Raises:
        ConfigError: not an integer with a known suffix (Spark refuses fractions too), naming ``key``.
    """
    match = _SIZE.match(str(text).strip().lower())
    if match is None or (match.group(2) and match.group(2) not in _UNITS):
        raise ConfigError(f"{key} must be a whole size such as 512m or 1g. Received: {text!r}")
    number, suffix = int(match.group(1)), match.group(2) or unit
    return number * _UNITS[suffix]


def conf_size(spark, key: str, default: str | None, unit: str = "b") -> int | None:
    """``key``'s size in bytes (:func:`parse_size`; a bare number counts in ``unit``), else ``default``'s, or None."""
    value = conf_get(spark, key, default)
    return None if value is None else parse_size(value, unit, key)


def master(spark) -> str:
    """The session's master URL (``local[2]``, ``yarn``, ...); ``""`` when the server does not say."""
    if not is_connect(spark):
        return spark.sparkContext.master
    return conf_get(spark, "spark.master", "") or ""


def python_exec(spark) -> str | None:
    """The program the session's Python workers run (``SparkContext.pythonExec``: ``PYSPARK_PYTHON``
    when the context started, else ``python3``), or None on Spark Connect (the server decides)."""
    if is_connect(spark):
        return None
    return getattr(spark.sparkContext, "pythonExec", None)


def local_mode(spark) -> bool:
    """Whether the master is ``local`` (``local``, ``local[N]``, ``local[N,F]``, ``local[*]``): task
    slots fixed for the session, no executors to come or go (``local-cluster`` is not)."""
    return local_threads(master(spark)) is not None


def local_threads(url: str) -> int | None:
    """Task threads of a ``local`` master: ``local`` 1, ``local[N]``/``local[N,F]`` N, ``local[*]``
    this machine's cores; None for another master."""
    if url == "local":
        return 1
    match = re.match(r"^local\[(\*|[0-9]+)(?:,[0-9]+)?\]$", url)
    if match is None:
        return None
    return (os.cpu_count() or 1) if match.group(1) == "*" else int(match.group(1))


def default_parallelism(spark) -> int:
    """Spark's default parallelism: ``SparkContext.defaultParallelism`` on classic; on Connect
    ``spark.default.parallelism`` when set, else the cores of a ``local``/``local-cluster`` master or
    of ``spark.executor.instances`` × ``spark.executor.cores``, else 2 (Spark's floor)."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    configured = conf_get(spark, "spark.default.parallelism")
    if configured is not None:
        return max(1, int(configured))
    return cluster_cores(spark) or 2


def cluster_cores(spark) -> int | None:
    """Cores of a Connect session's cluster as its settings tell: a ``local`` master's threads
    (``local[*]``: this machine's cores, only when the server runs here), ``local-cluster[n,c,m]``'s
    n × c, else ``spark.executor.instances`` × ``spark.executor.cores`` when both are set; None when
    the settings do not tell (dynamic allocation, a standalone master with unset instances)."""
    url = master(spark)
    local_server = url.startswith("local[*") and is_local_server(spark)  # asked only where it decides
    return cores_from(url, local_server, conf_get(spark, "spark.executor.instances"), conf_get(spark, "spark.executor.cores"))


def cores_from(url: str, local_server: bool, instances: str | None, cores: str | None) -> int | None:
    """:func:`cluster_cores` from the values it reads: the master URL, whether the server runs on
    this machine (it decides ``local[*]`` alone), ``spark.executor.instances`` and
    ``spark.executor.cores`` as set (None: unset). No session is read."""
    threads = local_threads(url)
    if threads is not None:
        return threads if not url.startswith("local[*") or local_server else None
    match = re.match(r"^local-cluster\[\s*([0-9]+)\s*,\s*([0-9]+)\s*,", url)
    if match is not None:
        return int(match.group(1)) * int(match.group(2))
    if instances is None or cores is None:
        return None
    return int(instances) * int(cores)


def task_slots(spark) -> int | None:
    """Tasks the cluster can run at once (:func:`slots_from` over ``spark``'s facts, read now)."""
    connect = is_connect(spark)
    cores = cluster_cores(spark) if connect else None
    max_tasks = parallelism = None
    if not connect:
        sc = spark.sparkContext
        parallelism = sc.defaultParallelism
        try:
            max_tasks = internals.max_concurrent_tasks(sc)
        except Exception:  # noqa: BLE001 - older or other schedulers: the settings' count
            pass
    return slots_from(connect, cores, conf_get(spark, "spark.task.cpus"), max_tasks, parallelism)


# ---- bytes every task reads --------------------------------------------------------------------


class Inline:
    """Bytes carried inside the task closure, read as ``.value`` on the executors like a
    broadcast's. ``destroy`` and ``unpersist`` do nothing: the bytes go with the plan.

    Attributes:
        value: the shared value (bytes, or a tuple/list of them).
        nbytes: the bytes it holds (the sum over its parts).
    """

    __slots__ = ("value", "nbytes")

    def __init__(self, value, nbytes: int) -> None:
        self.value, self.nbytes = value, nbytes

    def destroy(self) -> None:
        pass

    def unpersist(self) -> None:
        pass


def _nbytes(value) -> int:
    """Bytes held by ``value``: bytes, None, or (nested) tuples/lists of them."""
    if value is None:
        return 0
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    return sum(_nbytes(v) for v in value)


def inline_limit(spark) -> int:
    """Bytes a Connect plan may inline (bytes): the smaller of the server's
    ``spark.connect.grpc.maxInboundMessageSize`` and the client channel's send limit (both 128 MiB
    by default), less :data:`INLINE_RESERVE_BYTES` for the rest of the plan."""
    server = conf_size(spark, CONNECT_MESSAGE_CONF, None)
    return inline_bytes(server, client_send_limit(spark))


def client_send_limit(spark) -> int | None:
    """The Connect client channel's ``grpc.max_send_message_length`` (bytes), or None when unset or
    unreadable (a private attribute of the client)."""
    try:
        option = internals.connect_channel_option(spark, "grpc.max_send_message_length")
        return None if option is None else int(option)
    except Exception:  # noqa: BLE001 - a private attribute of the client: Connect's default
        return None


def inline_bytes(server: int | None, client: int | None) -> int:
    """:func:`inline_limit` from the two limits it reads (bytes; None: Connect's default of 128 MiB):
    the smaller, less :data:`INLINE_RESERVE_BYTES`; a client limit <= 0 (none) leaves the server's."""
    server = server or DEFAULT_CONNECT_MESSAGE_BYTES
    client = DEFAULT_CONNECT_MESSAGE_BYTES if client is None else client
    limit = min(server, client) if client > 0 else server
    return max(0, limit - INLINE_RESERVE_BYTES)


def check_inline(spark, nbytes: int, what: str) -> None:
    """On Connect, refuse ``nbytes`` of ``what`` that cannot ride in a task closure; nothing on classic.

    Raises:
        ConfigError: naming Spark Connect, the size, the limit and the alternatives.
    """
    if is_connect(spark):
        check_inline_bytes(nbytes, inline_limit(spark), what)


def check_inline_bytes(nbytes: int, limit: int, what: str) -> None:
    """Refuse ``nbytes`` of ``what`` over ``limit``, a Connect plan's :func:`inline_limit` (bytes).

    Raises:
        ConfigError: naming Spark Connect, the size, the limit and the alternatives.
    """
    if nbytes > limit:
        raise ConfigError(
            f"on Spark Connect {what} travel inside the task closure in the plan (Spark Connect has no broadcast), "
            f"so they must fit {CONNECT_MESSAGE_CONF} less {INLINE_RESERVE_BYTES} bytes for the rest of the plan "
            f"({limit} bytes): raise {CONNECT_MESSAGE_CONF} where the Connect server starts (and the client's "
            "grpc.max_send_message_length), or use a classic SparkSession, where they travel as a Spark broadcast. "
            f"Received: {nbytes} bytes"
        )


def share(spark, value, what: str = "the model's weights"):
    """``value`` (bytes, or a tuple/list of bytes and None) for every task to read as ``.value``.

    Classic: a Spark broadcast (torrent-distributed; the caller destroys or unpersists it). Connect:
    an :class:`Inline` in the task closure (Connect sends the pickled closure in the plan), after
    :func:`check_inline`.

    Raises:
        ConfigError: on Connect, ``value`` too large for the plan (see :func:`check_inline`).
    """
    if not is_connect(spark):
        return spark.sparkContext.broadcast(value)
    nbytes = _nbytes(value)
    check_inline(spark, nbytes, what)
    return Inline(value, nbytes)


# ---- job tags ----------------------------------------------------------------------------------


def tag_jobs(spark, tag: str, description: str) -> None:
    """Tag the jobs this thread starts with ``tag`` (added to the tags it inherited) and, where the
    session supports it, name them ``description`` in the Spark UI (classic only: Connect has no
    job descriptions). Call it in the thread that runs the action."""
    if is_connect(spark):
        spark.addTag(tag)
        return
    sc = spark.sparkContext
    sc.addJobTag(tag)
    sc.setJobDescription(description)
    # The call site names the stages in the UI (else every one reads "copy_local_properties").
    sc.setLocalProperty("callSite.short", description)
    sc.setLocalProperty("callSite.long", description)
    sc.setInterruptOnCancel(True)


def cancel_tag(spark, tag: str) -> None:
    """Cancel the running jobs tagged ``tag``, from any thread (``SparkContext.cancelJobsWithTag``
    on classic, ``SparkSession.interruptTag`` on Connect, which interrupts the tagged operations)."""
    if is_connect(spark):
        spark.interruptTag(tag)
    else:
        spark.sparkContext.cancelJobsWithTag(tag)


# ---- a fit's plan: its session read once ------------------------------------------------------
#
# ``KerasEstimator._fit`` makes one :class:`FitPlan` from the training DataFrame's session before any
# job (:meth:`FitPlan.read`): every fact of the session and its cluster that the fit decides from
# (the master, local mode, Spark Connect, where its server runs, the default parallelism, the cores
# and task slots, the settings the fit reads, the program the Python workers run and their daemon's
# settings, the driver's addresses, the executors removed so far, the Connect client's message
# limit), read once into a frozen object. The later steps receive the plan, not the SparkSession:
# what they decide from it (the backend's :class:`~sparkdl.spark.cluster.ClusterFacts`, a task's
# memory budget, whether bytes fit a Spark Connect plan, the GPU settings' warnings) are properties
# of the facts, and no step asks the session again, except two that must see it change:
# :meth:`FitPlan.with_slots_for` counts the task slots again while executors register, and the jobs
# themselves run on the session the plan carries (:attr:`FitPlan.spark`).

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
        """Whether the executors run on this machine (see :func:`is_local_server`)."""
        if not self.connect:
            return self.master.startswith("local")
        return self.local_remote or (is_loopback(self.connect_host) and self.master.startswith("local"))

    @property
    def cores(self) -> int | None:
        """A Connect cluster's cores as its settings tell (:func:`cluster_cores`)."""
        return cores_from(self.master, self.local_server, self.settings["spark.executor.instances"],
                          self.settings["spark.executor.cores"])

    @property
    def default_parallelism(self) -> int:
        """Spark's default parallelism (:func:`default_parallelism`)."""
        if not self.connect:
            return self.context_parallelism
        configured = self.settings["spark.default.parallelism"]
        return max(1, int(configured)) if configured is not None else self.cores or 2

    @property
    def slots(self) -> int | None:
        """Tasks the cluster can run at once (:func:`task_slots`)."""
        return slots_from(self.connect, self.cores if self.connect else None, self.settings["spark.task.cpus"], self.max_tasks,
                          self.context_parallelism)

    @property
    def session(self) -> str:
        """The session in words, for messages (:func:`describe`)."""
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
        """Bytes a Connect plan may inline (:func:`inline_limit`); None on a
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
