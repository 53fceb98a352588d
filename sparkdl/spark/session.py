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
"""

from __future__ import annotations

import ipaddress
import os
import re

from sparkdl.errors import ConfigError
from sparkdl.spark import internals

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
