"""Every private PySpark attribute sparkdl uses, one function each, so a Spark upgrade that changes
one fails here and in ``tests/spark/test_internals.py``, not somewhere inside a fit.

Each function names the Spark versions it was checked on (``tests/spark/test_internals.py`` run
against them: the lowest pyspark ``setup.cfg`` allows and the one the project tests) and the
public API used instead where one exists. The rest of the package calls these functions and never
reaches ``_jvm``, ``_jsc``, ``_jrdd``, a Connect client's ``_builder`` or a JVM field by name
(``tests/unit/test_layering.py`` checks that).

One block is built on these functions here because it is nothing but them and a lock:
:func:`progress_bar_hidden`, Spark's console progress bar taken off the context while a fit prints
its own lines.

Not here: pyspark.ml's subclassing protocol (``Params._dummy``, ``_set``, ``_setDefault``,
``_shouldOwn``, ``_paramMap``, ``_copyValues``, ``Identifiable._resetUid``,
``MLWriter._handleOverwrite``), which Spark's own stages and every third-party stage are written
against; ``tests/spark/test_internals.py`` checks the parts sparkdl relies on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

log = logging.getLogger(__name__)

# ---- the driver's JVM (classic sessions) ---------------------------------------------------------


def jvm(sc) -> Any:
    """The py4j view of the driver's JVM (``sc._jvm``): ``jvm.org.apache...`` names a class.

    Checked on Spark 4.0.0 and 4.3.0. No public API: PySpark reaches its JVM only through this
    private attribute.
    """
    return sc._jvm


def submitted_conf() -> Any:
    """The ``SparkConf`` a SparkContext started now would begin from: spark-submit's ``--conf``,
    ``spark-defaults.conf`` and ``PYSPARK_SUBMIT_ARGS``, read from the JVM gateway, which
    ``SparkContext._ensure_initialized()`` (private) launches or joins first: before it, ``SparkConf()``
    is an empty Python-side dictionary and every key reads as unset.

    Checked on Spark 4.0.0 and 4.3.0. No public API reads the submitted conf before a context starts.
    """
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return SparkConf()


def default_log4j() -> bool:
    """Whether the driver's JVM logs with Spark's default log4j profile
    (``org/apache/spark/log4j2-defaults.properties``: INFO, about a hundred lines as a context
    starts), not a configuration of the user's (``-Dlog4j2.configurationFile=...``,
    ``log4j2.properties`` in ``SPARK_CONF_DIR``). Launches or joins the JVM gateway first, as
    :func:`submitted_conf` does; False where the JVM cannot say.

    Checked on Spark 4.0.0 and 4.3.0 (``SparkContext._ensure_initialized``, ``SparkContext._jvm``;
    log4j's public ``LogManager`` inside). No public API tells which log4j configuration Spark read.
    """
    from pyspark import SparkContext

    try:
        SparkContext._ensure_initialized()
        log4j = SparkContext._jvm.org.apache.logging.log4j
        source = log4j.LogManager.getContext(False).getConfiguration().getConfigurationSource().getLocation()
    except Exception:  # noqa: BLE001 - another logging backend, a JVM without log4j-core
        return False
    return str(source or "").endswith("/log4j2-defaults.properties")


def jvm_context(sc) -> Any:
    """The JVM ``org.apache.spark.SparkContext`` behind the Python ``sc`` (``sc._jsc.sc()``).

    Checked on Spark 4.0.0 and 4.3.0. No public API.
    """
    return sc._jsc.sc()


def set_running_conf(sc, key: str, value: str) -> None:
    """Set ``key`` to ``value`` in the running context's own ``SparkConf`` (``sc._jsc.sc().conf()``,
    not the copy ``getConf()`` returns). On a ``local`` master the executor is the driver's JVM and
    its ``SparkEnv`` reads this conf each time a task starts a Python runner, so a setting a runner
    reads per task (``spark.python.daemon.module``) holds for every task submitted afterwards.
    Executors in JVMs of their own (``local-cluster``, a cluster manager) keep the conf they started
    with.

    Checked on Spark 4.3.0. No public API: ``spark.conf.set`` refuses static settings.
    """
    jvm_context(sc).conf().set(key, value)


#: Settings that, set to anything, may have a DataFrame's Python runner give its workers variables
#: :func:`dataframe_worker_env` does not tell (read by the runners of Spark 4.3.0)
_WORKER_ENV_SETTINGS = ("spark.sql.execution.pyspark.udf.hideTraceback.enabled",
                        "spark.sql.execution.pyspark.udf.tracebackWithLocals.enabled",
                        "spark.sql.execution.pyspark.udf.faulthandler.enabled", "spark.python.worker.faulthandler.enabled",
                        "spark.sql.execution.pyspark.udf.tracebackDumpIntervalSeconds",
                        "spark.python.worker.tracebackDumpIntervalSeconds",
                        "spark.sql.execution.pyspark.udf.daemonKillWorkerOnFlushFailure",
                        "spark.python.daemon.killWorkerOnFlushFailure", "spark.python.udf.pipelined.enabled")
_SIMPLIFIED_TRACEBACK = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"
_environment_lock = threading.Lock()


def dataframe_worker_env(spark) -> dict[str, str] | None:
    """The environment variables a DataFrame's Python runner (``mapInArrow``, a pandas UDF) gives
    its worker beyond what an RDD's runner gives under ``spark``'s settings: ``{"SPARK_SIMPLIFIED_TRACEBACK":
    "1"}`` while ``spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled`` is true (its
    default), else ``{}``; None when the session sets one of :data:`_WORKER_ENV_SETTINGS`, whose
    variables this does not tell. An executor keeps one daemon per worker environment
    (``SparkEnv.createPythonWorker``): an RDD task given these variables forks from the daemon the
    DataFrame tasks fork from (:func:`with_worker_env`).

    Checked on Spark 4.3.0 (``BasePythonRunner.compute``). No public API.
    """
    conf = spark.sparkContext.getConf()
    for key in _WORKER_ENV_SETTINGS:
        if conf.contains(key) or spark.conf.get(key, None) is not None:
            return None
    simplified = spark.conf.get(_SIMPLIFIED_TRACEBACK, None) or conf.get(_SIMPLIFIED_TRACEBACK, "true")
    return {"SPARK_SIMPLIFIED_TRACEBACK": "1"} if str(simplified).strip().lower() == "true" else {}


def with_worker_env(rdd, env: dict[str, str]):
    """``rdd`` (a Python RDD not yet run) with ``env`` added to its Python function's worker
    environment, which the function takes from ``SparkContext.environment`` when its JVM RDD is made
    (``rdd._jrdd``): the context's environment holds ``env`` for that moment only, under a lock.
    Returns ``rdd``.

    Checked on Spark 4.3.0 (``PipelinedRDD._jrdd``). No public API sets one RDD's worker environment.
    """
    environment = rdd.ctx.environment
    with _environment_lock:
        saved = {key: environment[key] for key in env if key in environment}
        environment.update(env)
        try:
            rdd._jrdd  # noqa: B018 - made now, with env
        finally:
            for key in env:
                environment.pop(key, None)
            environment.update(saved)
    return rdd


def running_job_tags(sc, prefix: str) -> set[str]:
    """The job tags starting with ``prefix`` of the jobs running now, as the status store (the Spark
    UI's) records them: ``statusStore().jobsList([RUNNING])``, each job's ``jobTags``. The store
    is fed by the listener bus: a job that just started or ended may show a moment later.

    Checked on Spark 4.3.0. No public API: PySpark's status tracker has no job tags.
    """
    jvm = sc._jvm
    statuses = jvm.java.util.ArrayList()
    statuses.add(jvm.org.apache.spark.JobExecutionStatus.RUNNING)
    jobs = jvm_context(sc).statusStore().jobsList(statuses)
    found = set()
    for i in range(jobs.size()):
        found.update(t for t in str(jobs.apply(i).jobTags().mkString("\n")).split("\n") if t.startswith(prefix))
    return found


def context_stopped(sc) -> bool:
    """Whether ``sc`` (a Python SparkContext) was stopped: ``SparkContext.stop`` drops its Java
    context (``sc._jsc`` becomes None).

    Checked on Spark 4.0.0 and 4.3.0. No public API: PySpark has no ``isStopped``; the JVM's
    ``SparkContext.isStopped`` cannot be asked once the Python side let go of it.
    """
    return getattr(sc, "_jsc", None) is None


def max_concurrent_tasks(sc) -> int:
    """Tasks the cluster can run at once with the default resource profile: the JVM's
    ``SparkContext.maxNumConcurrentTasks(defaultResourceProfile)``, which counts each executor's
    slots from its cores, ``spark.task.cpus`` and task resources (the count Spark's own barrier
    stages are checked against). 2 on ``local[2]``.

    Checked on Spark 4.0.0 and 4.3.0 (the method is ``private[spark]`` in Scala, public in the
    bytecode). The nearest public API, ``sc.defaultParallelism // spark.task.cpus``, is wrong when
    executors differ in cores or tasks need GPUs: callers fall back to it when this raises.

    Raises:
        Exception: py4j's error when the JVM no longer has the method.
    """
    context = jvm_context(sc)
    return int(context.maxNumConcurrentTasks(context.resourceProfileManager().defaultResourceProfile()))


def kill_task_attempt(sc, task_id: int, reason: str) -> bool:
    """Kill the running task attempt ``task_id`` (``TaskContext.taskAttemptId()``), interrupting its
    thread: Spark runs the task again (a killed attempt does not count toward
    ``spark.task.maxFailures``). Returns whether Spark found the attempt running.

    The JVM's public ``SparkContext.killTaskAttempt`` (PySpark has no wrapper). Checked on Spark
    4.0.0 and 4.3.0.

    Raises:
        Exception: py4j's error when the JVM no longer has the method.
    """
    return bool(jvm_context(sc).killTaskAttempt(int(task_id), True, reason))


def executors(sc) -> list[dict]:
    """Every executor the application has had, the removed ones too: per executor ``id``,
    ``host_port``, ``active``, ``cores`` and ``remove_reason`` (Spark's words, e.g. ``worker lost:
    10.0.0.7:43239 got disassociated``; None while active). The driver is not listed.

    The JVM's ``SparkContext.statusStore.executorList(false)`` (``private[spark]`` in Scala, public in
    the bytecode), what the UI's Executors page shows; it is kept with the UI off. Checked on Spark
    4.0.0 and 4.3.0. The public ``SparkStatusTracker.getExecutorInfos`` lists only the live ones,
    with no id and no reason.

    Raises:
        Exception: py4j's error when the JVM no longer has the method.
    """
    found = jvm_context(sc).statusStore().executorList(False)
    out = []
    for i in range(found.size()):
        summary = found.apply(i)
        if summary.id() == "driver":
            continue
        reason = summary.removeReason()
        out.append({"id": str(summary.id()), "host_port": str(summary.hostPort()), "active": bool(summary.isActive()),
                    "cores": int(summary.totalCores()), "remove_reason": str(reason.get()) if reason.isDefined() else None})
    return out


def run_job_raw(rdd, produce: Callable[[Iterator], Iterable[bytes]], partitions: list[int]) -> list[bytes]:
    """Run ``produce`` as one task on each of ``partitions`` of ``rdd`` (and on no other partition,
    each where its data is cached) and return every ``bytes`` object the tasks yielded, in the
    order of ``partitions``, as sent: no pickle on either side.

    What ``SparkContext.runJob`` does, with the mapped RDD's serializer bypassed (as PySpark's own
    ``saveAsHadoopDataset`` path does): ``PythonRDD.runJob`` on the JVM, then
    ``_load_from_socket`` with the RDD's ``NoOpSerializer``. Checked on Spark 4.0.0 (where
    ``_load_from_socket`` returns the stream) and 4.3.0 (where it is a context manager that closes
    the socket). The public ``SparkContext.runJob(rdd, f, partitions)`` pickles each result on the
    executor and unpickles it here: not used, because these are Arrow IPC bytes that must arrive
    as they were written.
    """
    from pyspark.rdd import _load_from_socket

    mapped = rdd.mapPartitions(produce)
    mapped._bypass_serializer = True  # each task's bytes travel as they are (NoOpSerializer)
    sc = rdd.context
    sock_info = jvm(sc).PythonRDD.runJob(jvm_context(sc), mapped._jrdd, list(partitions))
    loaded = _load_from_socket(sock_info, mapped._jrdd_deserializer)
    if hasattr(loaded, "__enter__"):
        with loaded as stream:
            return [bytes(chunk) for chunk in stream]
    return [bytes(chunk) for chunk in loaded]


def hadoop_path(sc, path: str) -> Any:
    """A JVM ``org.apache.hadoop.fs.Path`` of ``path`` (a URI or a path string).

    Checked on Spark 4.0.0 and 4.3.0. No public API: PySpark exposes no Hadoop ``FileSystem``
    (Spark Connect sessions use ``pyarrow.fs`` instead).
    """
    return jvm(sc).org.apache.hadoop.fs.Path(path)


def hadoop_configuration(sc) -> Any:
    """The SparkContext's Hadoop ``Configuration`` (``sc._jsc.hadoopConfiguration()``): the one
    Spark's own readers and writers resolve filesystems with (``spark.hadoop.*`` settings in it).

    Checked on Spark 4.0.0 and 4.3.0. No public API.
    """
    return sc._jsc.hadoopConfiguration()


# ---- Spark's console progress bar ----------------------------------------------------------------
#
# Spark draws the bar (``[Stage 21:>    (0 + 2) / 2]``) on the driver's stderr when
# ``spark.ui.showConsoleProgress`` is true, as it is for a session started from Python (a script or a
# notebook; a ``spark-submit`` job has it false). The setting is read once, when the SparkContext
# starts, into ``SparkContext.progressBar`` (a ``ConsoleProgressBar`` with its own refresh thread) and
# has no runtime switch: :func:`progress_bar_hidden` stops the bar and takes it off the context for a
# block, then gives the context a new one (``new ConsoleProgressBar(sc)``, as SparkContext makes it).

_PROGRESS_FIELD = "_progressBar"  # SparkContext's private var behind its ``progressBar`` getter


def _progress_field(context):
    field = context.getClass().getDeclaredField(_PROGRESS_FIELD)
    field.setAccessible(True)
    return field


def progress_bar_running(sc) -> bool:
    """Whether ``sc``'s JVM SparkContext has a console progress bar (``spark.ui.showConsoleProgress``
    was true when it started, and no one took it off).

    Checked on Spark 4.0.0 and 4.3.0 (``SparkContext.progressBar``, ``private[spark]``). No public
    API: the setting is read once, at start.
    """
    return bool(jvm_context(sc).progressBar().isDefined())


def take_progress_bar(sc) -> bool:
    """Stop ``sc``'s console progress bar and take it off the context (its field set to
    ``None``), so no stage line is drawn; False when it had none.

    Checked on Spark 4.0.0 and 4.3.0: the bar is the JVM SparkContext's private field
    ``_progressBar`` (an ``Option[ConsoleProgressBar]``), set by reflection. No public API: there is
    no runtime switch for ``spark.ui.showConsoleProgress``.

    Raises:
        Exception: py4j's error when the field or the getter is gone.
    """
    context = jvm_context(sc)
    bar = context.progressBar()
    if bar.isEmpty():
        return False
    field = _progress_field(context)  # found before the bar stops, so a missing field changes nothing
    bar.get().stop()
    field.set(context, jvm(sc).scala.Option.empty())
    return True


def give_progress_bar(sc) -> bool:
    """Give ``sc``'s JVM SparkContext a new running console progress bar
    (``new ConsoleProgressBar(sc)``, as SparkContext makes it at start); False when the context
    was stopped meanwhile (it gets none).

    Checked on Spark 4.0.0 and 4.3.0, as :func:`take_progress_bar`.

    Raises:
        Exception: py4j's error when the field or the class is gone.
    """
    if context_stopped(sc):
        return False
    context = jvm_context(sc)
    if context.isStopped():
        return False
    bar = jvm(sc).org.apache.spark.ui.ConsoleProgressBar(context)
    _progress_field(context).set(context, jvm(sc).scala.Option.apply(bar))
    return True


_bar_lock = threading.Lock()
_bar_holders = 0  # blocks inside progress_bar_hidden
_bar_hidden_on = None  # the SparkContext whose bar was taken off, while _bar_holders > 0


def _hide_progress_bar(spark):
    """Stop and remove the bar of ``spark``'s SparkContext; returns that SparkContext, or None when
    there was none to hide (Connect, whose session has no SparkContext, no bar, internals not found)."""
    try:
        sc = spark.sparkContext  # a Connect session raises here
        return sc if take_progress_bar(sc) else None
    except Exception as e:  # noqa: BLE001 - Spark internals: keep the bar rather than fail a fit
        log.debug("Spark's console progress bar stays: %s: %s", type(e).__name__, e)
        return None


@contextlib.contextmanager
def progress_bar_hidden(spark, hide: bool = True):
    """A block during which Spark's console progress bar of ``spark`` (a SparkSession) is not drawn,
    so that a fit's own lines are not mixed with stage lines.

    Nested and concurrent blocks (two fits on two threads) share one hiding: the bar comes back when
    the last ends. On a Spark Connect session, a context without a bar, or a Spark whose internals
    differ, it does nothing (a DEBUG log says why).

    Args:
        spark: the session whose SparkContext's bar to hide (classic sessions only).
        hide: False makes the block a no-op (e.g. a fit with ``verbose=0`` prints nothing to
            keep apart from the bar).

    The bar, when the context had one, is running again after the block, also when the block
    raises; a context stopped inside the block gets none.
    """
    global _bar_holders, _bar_hidden_on
    if not hide:
        yield
        return
    with _bar_lock:
        if _bar_holders == 0:
            _bar_hidden_on = _hide_progress_bar(spark)
        _bar_holders += 1
    try:
        yield
    finally:
        with _bar_lock:
            _bar_holders -= 1
            if _bar_holders == 0 and _bar_hidden_on is not None:
                try:
                    give_progress_bar(_bar_hidden_on)
                except Exception as e:  # noqa: BLE001 - Spark internals: a fit's result stands without its bar
                    log.debug("Spark's console progress bar could not be restored: %s: %s", type(e).__name__, e)
                _bar_hidden_on = None


# ---- Spark Connect's client ----------------------------------------------------------------------


def connect_host(spark) -> str | None:
    """The host of a Spark Connect session's server URL (``sc://host:port``), or None when the
    client does not say.

    The public ``SparkConnectClient.host`` (4.0.0 and 4.3.0 have it), else the client's channel
    builder's ``host`` (``client._builder``, private).
    """
    client = getattr(spark, "client", None)
    host = getattr(client, "host", None)
    if host is None:
        host = getattr(getattr(client, "_builder", None), "host", None)
    return None if host is None else str(host)


def connect_channel_option(spark, key: str) -> Any:
    """A gRPC option of a Spark Connect session's channel (e.g. ``grpc.max_send_message_length``),
    or None when it is not set.

    Checked on Spark 4.0.0 and 4.3.0: the client's channel builder's option list
    (``client._builder._channel_options``, which starts from ``ChannelBuilder.GRPC_DEFAULT_OPTIONS``).
    No public API: ``ChannelBuilder.setChannelOption`` sets an option, nothing reads one back.
    """
    options = dict(spark.client._builder._channel_options)
    return options.get(key)
