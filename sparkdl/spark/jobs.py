"""Running one Spark action of a fit: in an inheriting thread, under a job tag, with a timeout,
and with Spark's failures turned into sparkdl errors that name the cause and the setting to change.

The action runs in a :class:`pyspark.InheritableThread`, so its jobs keep the caller's
scheduler pool, job group and job tags (a notebook's "cancel" reaches them), and gets one more
job tag of its own. A timeout cancels only that tag's jobs (``cancelJobsWithTag``), never the
user's job group. On Spark Connect the tag is a session tag (``SparkSession.addTag``, inherited
by the thread as the caller's tags are) and a timeout interrupts it (``interruptTag``); Connect
has no job descriptions (:mod:`sparkdl.spark.session`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import TypeVar

import pyarrow as pa
from pyspark import InheritableThread
from pyspark.sql import SparkSession

import sparkdl.errors as errors
from sparkdl.errors import FitCancelledError, RoundTimeoutError, SparkDLError, WorkerError
from sparkdl.spark.session import cancel_tag, tag_jobs

T = TypeVar("T")

# (pattern in Spark's failure text, what happened, the setting that changes it)
_CAUSES = (
    (
        r"maxResultSize",
        "the results of the job's tasks exceed spark.driver.maxResultSize",
        "raise spark.driver.maxResultSize (e.g. --conf spark.driver.maxResultSize=4g) or lower numWorkers",
    ),
    (
        r"Python worker exited unexpectedly|crashed|EOFException",
        "a Python worker died (killed by a signal, which is how an out-of-memory kill looks, or by a native crash or "
        "os._exit), and the task's retries (spark.task.maxFailures) were spent",
        "if it ran out of memory, give Python workers more: spark.executor.pyspark.memory or spark.executor.memoryOverhead; "
        "the executor's log tells the signal",
    ),
    (
        r"ExecutorLostFailure|[Ee]xecutor \S* ?lost|Container killed|exit code 137|OutOfMemoryError",
        "an executor was lost (often killed for memory)",
        "raise spark.executor.memory / spark.executor.memoryOverhead, or check the executor's log",
    ),
)
_CANCELLED = re.compile(r"cancell?ed", re.IGNORECASE)
# The last line of a Python traceback raised by one of sparkdl's own errors inside a task.
_TASK_ERROR = re.compile(r"sparkdl\.errors\.(\w+): (.+)")


def task_error(exc: BaseException, description: str) -> BaseException:
    """The sparkdl error to raise for ``exc``, a failure of the Spark job ``description``.

    A sparkdl error raised inside a task (``SchemaError`` while scoring, say) comes back as its own
    class with its own message; a cancelled job as :class:`FitCancelledError`; any other Spark
    failure as :class:`WorkerError` naming Spark's reason and, where known, the setting to change.
    Errors that are not Spark's (``KeyboardInterrupt``, sparkdl's own) are returned unchanged.
    """
    if isinstance(exc, SparkDLError) or not _is_spark_failure(exc):
        return exc
    text = str(exc)
    raised = _TASK_ERROR.findall(text)
    if raised:
        name, message = raised[-1]
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, SparkDLError):
            return cls(message.strip())
    if _CANCELLED.search(text) and "Job aborted due to stage failure" not in text:
        return FitCancelledError(f"{description} was cancelled; the master weights are unchanged. Received: {_first_line(text)}")
    for pattern, what, setting in _CAUSES:
        if re.search(pattern, text):
            return WorkerError(f"{description} failed: {what}. To fix: {setting}. Received: {_reason(text)}")
    return WorkerError(f"{description} failed on an executor. Received: {_reason(text)}")


def _is_spark_failure(exc: BaseException) -> bool:
    """A failure of the job (a JVM exception, a task's Python exception, a Spark Connect server
    error), not a driver-side analysis error, which keeps its own class."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import AnalysisException
    from pyspark.errors.exceptions.captured import CapturedException

    failures: tuple[type, ...] = (CapturedException,)
    try:
        from pyspark.errors.exceptions.connect import SparkConnectGrpcException

        failures += (SparkConnectGrpcException,)
    except ImportError:  # no Spark Connect client installed (grpc): no Connect errors either
        pass
    return isinstance(exc, Py4JJavaError) or (isinstance(exc, failures) and not isinstance(exc, AnalysisException))


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text)[:500]


def _reason(text: str) -> str:
    """Spark's abort reason plus the task's last Python exception (with up to two following lines,
    where TensorFlow puts the detail), if any."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    abort = next((line for line in lines if "Job aborted" in line or "SparkException" in line), _first_line(text))
    reason = abort[:600]
    raised = [i for i, line in enumerate(lines) if re.match(r"^[\w.]+(Error|Exception|Exit)\b:?", line) and not line.startswith("at ")]
    if raised:
        i = raised[-1]
        task = " ".join(lines[i : i + 3])[:600]
        if task not in reason:
            reason += f" | task: {task}"
    return reason


def run_job(spark: SparkSession, action: Callable[[], T], description: str, tag: str, timeout_s: float) -> T:
    """Run ``action`` (a Spark action such as ``df.toArrow``) and return its result.

    Args:
        spark: the session whose jobs ``action`` starts.
        action: a callable that runs Spark jobs, called once in a helper thread.
        description: the jobs' description in the Spark UI, e.g. ``"sparkdl fit 1a2b: round 3/8"``.
        tag: a job tag added to the caller's (no commas), used to cancel these jobs alone.
        timeout_s: seconds to wait before the tagged jobs are cancelled.

    Raises:
        RoundTimeoutError: the action ran longer than ``timeout_s`` seconds; its jobs were cancelled.
        KeyboardInterrupt: re-raised after cancelling the action's jobs.
        FitCancelledError: the jobs were cancelled from outside (job group, tag, UI).
        WorkerError: a task failed for good, naming Spark's reason and the setting to change.
        SchemaError, ...: a sparkdl error raised inside a task, as its own class.
    """
    outcome: dict = {}

    def target() -> None:
        try:
            tag_jobs(spark, tag, description)
            outcome["value"] = action()
        except BaseException as exc:  # handed to the calling thread below
            outcome["error"] = exc

    thread = InheritableThread(target, session=spark, name=tag, daemon=True)  # session: its tags too
    thread.start()
    try:
        thread.join(timeout_s)
    except BaseException:  # KeyboardInterrupt (a notebook's interrupt): stop this action's jobs too
        cancel_tag(spark, tag)
        raise
    if thread.is_alive():
        cancel_tag(spark, tag)
        thread.join(30.0)
        raise RoundTimeoutError(f"each Spark job of a fit must finish within {timeout_s} s (roundTimeout). Received: {description} still running; its jobs were cancelled")
    if "error" in outcome:
        error = outcome["error"]
        mapped = task_error(error, description)
        if mapped is error:
            raise error
        raise mapped from error
    return outcome["value"]


def run_on_partitions(df, produce: Callable[[Iterator], Iterator[pa.RecordBatch]], partitions: list[int], schema: pa.Schema) -> pa.Table:
    """Run ``produce`` as one task on each of ``partitions`` of ``df`` (and on no other partition),
    where the partition's data lives (its cache locality is kept), and return what the tasks
    yielded as one table of ``schema``. Call it through :func:`run_job` (tags, timeout, errors).

    ``produce(rows)`` receives the partition's rows as an iterator (drain it) and yields record
    batches of ``schema``; each task sends them back as one Arrow IPC stream, as raw bytes (the
    RDD's serializer is bypassed: nothing is pickled). Classic sessions only (Spark Connect has no
    RDDs).
    """
    from pyspark.rdd import _load_from_socket  # the reader runJob uses; here with the raw-bytes serializer

    def task(rows):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            for batch in produce(rows):
                writer.write_batch(batch)
        yield sink.getvalue().to_pybytes()

    sc = df.sparkSession.sparkContext
    mapped = df.rdd.mapPartitions(task)
    mapped._bypass_serializer = True  # each task's bytes travel as they are (NoOpSerializer), not pickled
    sock_info = sc._jvm.PythonRDD.runJob(sc._jsc.sc(), mapped._jrdd, list(partitions))
    with _load_from_socket(sock_info, mapped._jrdd_deserializer) as stream:
        tables = [pa.ipc.open_stream(bytes(chunk)).read_all() for chunk in stream]
    return pa.concat_tables(tables) if tables else schema.empty_table()
