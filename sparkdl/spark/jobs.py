"""Running one Spark action of a fit: in an inheriting thread, under a job tag, with a timeout,
and with Spark's failures turned into sparkdl errors that name the cause and the setting to change.

A task that cannot import a module says so first: sparkdl or one of its dependencies missing (or a
Python of another version, or none at the path) means the executors run another Python than the
driver, fixed by ``PYSPARK_PYTHON`` / ``spark.pyspark.python``; any other module is the user's
(a custom object's, a decoder's) and must be shipped with ``--py-files``, ``SparkContext.addPyFile``
or a wheel installed on the cluster. The message names the Python an executor runs, asked with a
one-task job that needs nothing but pyspark (:func:`executors_python`).

The action runs in a :class:`pyspark.InheritableThread`, so its jobs keep the caller's
scheduler pool, job group and job tags (a notebook's "cancel" reaches them), and gets one more
job tag of its own. A timeout cancels only that tag's jobs (``cancelJobsWithTag``), never the
user's job group. On Spark Connect the tag is a session tag (``SparkSession.addTag``, inherited
by the thread as the caller's tags are) and a timeout interrupts it (``interruptTag``); Connect
has no job descriptions (:mod:`sparkdl.spark.session`).
"""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import pyarrow as pa
from pyspark import InheritableThread
from pyspark.sql import SparkSession

import sparkdl.errors as errors
from sparkdl.errors import FitCancelledError, RoundTimeoutError, SparkDLError, WorkerError
from sparkdl.spark.session import cancel_tag, conf_get, tag_jobs
from sparkdl.spark.session import master as master_url

T = TypeVar("T")
INTERRUPT_JOIN_S = 10.0  # how long an interrupted action's thread is given to return once its jobs are cancelled (seconds)

# (pattern in Spark's failure text, what happened, the setting that changes it, whether another attempt may pass)
_CAUSES = (
    (
        r"maxResultSize",
        "the results of the job's tasks exceed spark.driver.maxResultSize",
        "raise spark.driver.maxResultSize (e.g. --conf spark.driver.maxResultSize=4g) or lower numWorkers",
        False,
    ),
    (
        r"Python worker exited unexpectedly|crashed|EOFException",
        "a Python worker died (killed by a signal, which is how an out-of-memory kill looks, or by a native crash or "
        "os._exit)",
        "if it ran out of memory, give Python workers more: spark.executor.pyspark.memory or spark.executor.memoryOverhead; "
        "the executor's log tells the signal",
        True,
    ),
    (
        r"ExecutorLostFailure|[Ee]xecutor \S* ?lost|Container killed|exit code 137|OutOfMemoryError",
        "an executor was lost (often killed for memory)",
        "raise spark.executor.memory / spark.executor.memoryOverhead, or check the executor's log",
        True,
    ),
)
# Spark's count of a failed task's attempts, in its abort reason ("Task 1 in stage 7.0 failed 4 times")
_ATTEMPTS = re.compile(r"\bfailed (\d+) times?\b")
# Lines that wrap the cause without saying it (a py4j call's first line, a thread's awaitResult)
_WRAPPER = re.compile(r"Exception thrown in awaitResult|^An error occurred while calling")
_LOCAL_MASTER = re.compile(r"^local(?:\[(\*|[0-9]+)(?:,([0-9]+))?\])?$")


def retry_advice(master: str, max_failures: str | None, text: str = "") -> str:
    """How often Spark ran the failed task on ``master`` and the setting that gives it more
    attempts: ``local`` and ``local[N]`` run each task once (no retry: ``spark.task.maxFailures``
    does not apply to local masters, ``local[N,F]`` sets F attempts); other masters make
    ``spark.task.maxFailures`` attempts (4 by default).

    Args:
        master: the master URL (``"local[2]"``, ``"yarn"``, ``""`` when unknown).
        max_failures: ``spark.task.maxFailures`` as set, or None.
        text: Spark's failure text, for the attempts it counted (``failed 4 times``).
    """
    counted = _ATTEMPTS.search(text)
    ran = f"the task ran {counted.group(1)} time{'' if counted.group(1) == '1' else 's'}" if counted else "the task's attempts were spent"
    local = _LOCAL_MASTER.match(master or "")
    if local is not None and local.group(2) is None:
        threads = local.group(1) or "1"
        return (f"{ran}: a {master} master runs each task once, without retries (spark.task.maxFailures does not apply to "
                f"local masters); the master local[{threads},4] gives each task 4 attempts")
    if local is not None:
        return (f"{ran}: the master {master} gives each task {local.group(2)} attempts; raise its second number for more "
                "(spark.task.maxFailures does not apply to local masters)")
    return (f"{ran}: spark.task.maxFailures={max_failures or 4} attempts per task; raise it (e.g. --conf "
            "spark.task.maxFailures=8) for more")
_CANCELLED = re.compile(r"cancell?ed", re.IGNORECASE)
# A task that could not import a module, or whose Python cannot run pyspark's worker.
_MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'")  # on a last exception line
_DAEMON_MODULE = re.compile(r"Error while finding module specification for '[\w.]+' \((?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'\)")
_OTHER_PYTHON = re.compile(r"PYTHON_VERSION_MISMATCH|Python in worker has different version|Cannot run program \"([^\"]+)\"")
#: top-level modules of sparkdl, its dependencies (setup.cfg) and pyspark's: missing on an executor, they mean
#: the executors run another Python than the driver's
SPARKDL_MODULES = frozenset({"sparkdl", "pyspark", "py4j", "numpy", "pyarrow", "pandas", "keras", "tensorflow", "jax",
                             "torch", "yaml", "rich", "google", "h5py", "ml_dtypes", "optree"})
# The last line of a Python traceback raised by one of sparkdl's own errors inside a task.
_TASK_ERROR = re.compile(r"sparkdl\.errors\.(\w+): (.+)")


def task_error(exc: BaseException, description: str, executors: str | None = None, master: str | None = None,
               max_failures: str | None = None) -> BaseException:
    """The sparkdl error to raise for ``exc``, a failure of the Spark job ``description``.

    A sparkdl error raised inside a task (``SchemaError`` while scoring, say) comes back as its own
    class with its own message; a task that could not import a module as :class:`WorkerError`
    naming the setting that ships it (:func:`import_error`); a cancelled job as
    :class:`FitCancelledError`; any other Spark failure as :class:`WorkerError` naming Spark's
    reason and, where known, the setting to change. Errors that are not Spark's
    (``KeyboardInterrupt``, sparkdl's own) are returned unchanged.

    Args:
        exc: what the Spark action raised.
        description: the job's description, e.g. ``"sparkdl fit 1a2b: round 3/8"``.
        executors: the Python an executor runs (:func:`executors_python`), named by an import
            failure's message; None: the configured one is named instead.
        master, max_failures: the session's master URL and ``spark.task.maxFailures``, for how the
            failed task was retried (:func:`retry_advice`); None: not said.
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
    failed, module = _failed_import(text)
    if failed:
        return import_error(module, text, description, executors)
    if _CANCELLED.search(text) and "Job aborted due to stage failure" not in text:
        return FitCancelledError(f"{description} was cancelled; the master weights are unchanged. Received: {_first_line(text)}")
    retries = f"; {retry_advice(master, max_failures, text)}" if master is not None else ""
    for pattern, what, setting, retried in _CAUSES:
        if re.search(pattern, text):
            return WorkerError(f"{description} failed: {what}{retries if retried else ''}. To fix: {setting}. "
                               f"Received: {_reason(text)}")
    return WorkerError(f"{description} failed on an executor{retries}. Received: {_reason(text)}")


def is_import_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a Spark failure of a task that could not import a module or could not run
    its Python (the failures :func:`import_error` explains)."""
    if isinstance(exc, SparkDLError) or not _is_spark_failure(exc):
        return False
    text = str(exc)
    return _failed_import(text)[0] and not _TASK_ERROR.search(text)


_PYTHON_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b:")
_JAVA = ("org.", "java.", "scala.", "py4j.", "Caused by")


def _failed_import(text: str) -> tuple[bool, str | None]:
    """``(True, module)`` when the task's last Python exception is an import of ``module`` that
    failed, ``(True, None)`` when its Python could not run pyspark's worker (another version, no
    program at the path), else ``(False, None)``. Only the last exception counts: an import caught
    inside a task and followed by another failure is not the cause."""
    if _OTHER_PYTHON.search(text):
        return True, None
    daemon = _DAEMON_MODULE.search(text)  # python -m sparkdl.spark.daemon where sparkdl is not installed
    if daemon:
        return True, daemon.group(1)
    lines = [line.strip() for line in text.splitlines()]
    raised = [line for line in lines if _PYTHON_EXCEPTION.match(line) and not line.startswith(_JAVA)]
    missing = _MISSING_MODULE.match(raised[-1]) if raised else None
    return (True, missing.group(1)) if missing else (False, None)


def configured_python() -> str:
    """The Python the executors are told to run: ``spark.pyspark.python`` (read from the active
    session where there is one), else ``PYSPARK_PYTHON``, else pyspark's default ``python3``."""
    import os

    try:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        conf = spark.conf.get("spark.pyspark.python", None) if spark is not None else None
    except Exception:  # noqa: BLE001 - a stopped or remote session: the environment decides
        conf = None
    if conf:
        return f"{conf} (spark.pyspark.python)"
    if os.environ.get("PYSPARK_PYTHON"):
        return f"{os.environ['PYSPARK_PYTHON']} (PYSPARK_PYTHON)"
    return "python3 (the default: neither PYSPARK_PYTHON nor spark.pyspark.python is set)"


def import_error(module: str | None, text: str, description: str, executors: str | None = None) -> WorkerError:
    """The :class:`WorkerError` of a task that could not import ``module`` (None: its Python could
    not run pyspark's worker: another version, or no program at the path).

    Its first words name the fix: for sparkdl, a dependency of it, pyspark itself (:data:`SPARKDL_MODULES`)
    or a foreign Python, ``PYSPARK_PYTHON`` / ``spark.pyspark.python`` set to a Python that has them,
    as the driver's has; for any other module (a custom object's, a decoder's), ``--py-files``,
    ``SparkContext.addPyFile`` or a wheel installed on the cluster. Then which Python the executors
    run (``executors``, else the configured one) and the driver's, then Spark's reason.

    Args:
        module: the dotted module name that could not be imported, e.g. ``"sparkdl"``, or None.
        text: Spark's failure text.
        description: the failed job's description.
        executors: the Python an executor runs (:func:`executors_python`), or None.
    """
    ran = f"an executor runs {executors}" if executors else f"the executors run {configured_python()}"
    pythons = f"{ran}; the driver runs {sys.executable} (Python {sys.version.split()[0]})"
    reason = _reason(text)
    if module is None or module.split(".")[0] in SPARKDL_MODULES:
        what = f"cannot import {module!r}" if module else "cannot run pyspark's worker with its Python"
        return WorkerError(
            f"the executors' Python must have sparkdl and its dependencies installed, as the driver's: set PYSPARK_PYTHON "
            f"or spark.pyspark.python to such a Python on every executor (e.g. --conf spark.pyspark.python=/path/to/python). "
            f"{description} failed: an executor {what}; {pythons}. Received: {reason}"
        )
    return WorkerError(
        f"module {module!r} must be importable on the executors: ship your own code with --py-files (of spark-submit or "
        f"sparkdl-train), SparkContext.addPyFile(path) or a wheel installed on the cluster (a package: pip install it there). "
        f"{description} failed: an executor cannot import {module!r}; {pythons}. Received: {reason}"
    )


def failed_import_error(text: str, description: str) -> WorkerError:
    """The error of a check task that could not import a module (``text``: ``"ModuleNotFoundError:
    No module named 'x'"``, which the task reported instead of raising: no attempt of Spark's
    ``spark.task.maxFailures`` could import it): :func:`import_error`, naming the module and how
    to ship it (``--py-files``, ``spark.submit.pyFiles``, ``addPyFile``), and that no task was retried."""
    module = _failed_import(text)[1]
    error = import_error(module, text, description)
    return WorkerError(f"{error} (the fit failed at the first attempt: the check job's tasks unpickle the custom objects "
                       "as the training tasks would; spark.submit.pyFiles ships modules as --py-files does)")


def executors_python(spark: SparkSession, timeout_s: float = 60.0) -> str | None:
    """``"<sys.executable> (Python <version>)"`` of an executor's Python worker, from a one-task job
    whose function needs nothing but pyspark there; None on Spark Connect or when the job fails or
    runs past ``timeout_s`` seconds."""
    from sparkdl.spark.session import is_connect

    if is_connect(spark):
        return None

    def where(_):  # nested, importing nothing of sparkdl: cloudpickle ships it by value
        import sys

        return [f"{sys.executable} (Python {sys.version.split()[0]})"]

    def probe():
        return spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()[0]

    try:
        return run_job(spark, probe, "sparkdl: which Python an executor runs", f"sparkdl-probe-{uuid.uuid4().hex[:12]}",
                       timeout_s, explain_imports=False)
    except Exception:  # noqa: BLE001 - a probe: its own failure leaves the message as it was
        return None


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
    where TensorFlow puts the detail), if any. The abort reason is the line that says "Job
    aborted", else the deepest Spark cause that is not a wrapper ("Exception thrown in
    awaitResult:", a py4j call's first line), else the first line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    abort = next((line for line in lines if "Job aborted" in line), None)
    if abort is None:
        causes = [line for line in lines if ("SparkException" in line or line.startswith("Caused by:")) and not _WRAPPER.search(line)]
        plain = [line for line in lines if not _WRAPPER.search(line) and not line.startswith("at ")]
        abort = causes[-1] if causes else plain[0][:500] if plain else _first_line(text)
    reason = abort.removeprefix("Caused by: ")[:600]
    raised = [i for i, line in enumerate(lines) if re.match(r"^[\w.]+(Error|Exception|Exit)\b:?", line) and not line.startswith("at ")]
    if raised:
        i = raised[-1]
        task = " ".join(lines[i : i + 3])[:600]
        if task not in reason:
            reason += f" | task: {task}"
    return reason


def run_job(spark: SparkSession, action: Callable[[], T], description: str, tag: str, timeout_s: float,
            explain_imports: bool = True) -> T:
    """Run ``action`` (a Spark action such as ``df.toArrow``) and return its result.

    Args:
        spark: the session whose jobs ``action`` starts.
        action: a callable that runs Spark jobs, called once in a helper thread.
        description: the jobs' description in the Spark UI, e.g. ``"sparkdl fit 1a2b: round 3/8"``.
        tag: a job tag added to the caller's (no commas), used to cancel these jobs alone.
        timeout_s: seconds to wait before the tagged jobs are cancelled.
        explain_imports: on a task that could not import a module, run one more job to name the
            Python the executors run (:func:`executors_python`).

    Raises:
        RoundTimeoutError: the action ran longer than ``timeout_s`` seconds; its jobs were cancelled.
        KeyboardInterrupt: re-raised after cancelling the action's jobs.
        FitCancelledError: the jobs were cancelled from outside (job group, tag, UI).
        WorkerError: a task failed for good, naming Spark's reason and the setting to change; a task
            that could not import sparkdl or a user module names ``PYSPARK_PYTHON`` /
            ``spark.pyspark.python`` or ``--py-files`` / ``addPyFile`` first, and the executors' Python.
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
    except BaseException:  # KeyboardInterrupt (a notebook's interrupt, Ctrl-C): stop this action's jobs too
        cancel_tag(spark, tag)
        # and let the action's thread leave py4j before the interrupt ends the interpreter: a daemon thread
        # still inside a py4j call while Python finalizes aborts it ("PyGILState_Release ... finalizing")
        thread.join(INTERRUPT_JOIN_S)
        raise
    if thread.is_alive():
        cancel_tag(spark, tag)
        thread.join(30.0)
        raise RoundTimeoutError(f"each Spark job of a fit must finish within {timeout_s} s (roundTimeout). Received: {description} still running; its jobs were cancelled")
    if "error" in outcome:
        error = outcome["error"]
        executors = executors_python(spark) if explain_imports and is_import_failure(error) else None
        try:
            url, max_failures = master_url(spark), conf_get(spark, "spark.task.maxFailures")
        except Exception:  # noqa: BLE001 - a stopped session: the message goes without the retries
            url, max_failures = None, None
        mapped = task_error(error, description, executors, url or None, max_failures)
        if mapped is error:
            raise error
        raise mapped from error
    return outcome["value"]


# How long an interrupted fit waits for its cancelled jobs to end (seconds), and how often it looks.
CANCEL_WAIT_S, CANCEL_POLL_S = 30.0, 0.25


def cancel_jobs_tagged(spark: SparkSession, prefix: str, wait_s: float = CANCEL_WAIT_S) -> set[str]:
    """Cancel every running job whose job tag starts with ``prefix`` (a fit's jobs are all tagged
    ``sparkdl-<fit id>-...``: :func:`run_job`'s tags) and wait until none runs, cancelling any that
    starts meanwhile (an action's thread that had not yet seen the interrupt); two empty looks in a
    row end the wait. Returns the tags of jobs still running after ``wait_s`` seconds (empty when
    none is left). On Spark Connect the running jobs cannot be listed: nothing is done, and an
    empty set returned (each action's own tag was interrupted by :func:`run_job`)."""
    import time

    from sparkdl.spark.internals import context_stopped, running_job_tags
    from sparkdl.spark.session import is_connect

    if is_connect(spark) or context_stopped(spark.sparkContext):
        return set()
    deadline, empty, running = time.monotonic() + wait_s, 0, set()
    sc = spark.sparkContext
    while time.monotonic() < deadline:
        running = running_job_tags(sc, prefix)
        for tag in running:
            sc.cancelJobsWithTag(tag)  # cancel_tag's classic case: a Connect session returned above
        empty = 0 if running else empty + 1
        if empty >= 2:
            return set()
        time.sleep(CANCEL_POLL_S)
    return running


def interrupted_fit(spark: SparkSession, fit_id: str | None, who: str = "KerasEstimator.fit") -> FitCancelledError:
    """The error of a fit interrupted on the driver (Ctrl-C, a notebook's stop: a ``KeyboardInterrupt``):
    the fit's jobs (tags ``sparkdl-<fit_id>-``) cancelled and waited for (:func:`cancel_jobs_tagged`),
    its message saying so and that the session is usable. ``fit_id`` None: interrupted before its
    first job."""
    left = cancel_jobs_tagged(spark, f"sparkdl-{fit_id}-") if fit_id else set()
    jobs = ("its Spark jobs were cancelled and none is left running" if not left
            else f"its Spark jobs were cancelled; {len(left)} still stopping after {CANCEL_WAIT_S:g} s (tags {sorted(left)})")
    where = f"fit {fit_id[:8]}" if fit_id else "the fit's checks, before any job"
    return FitCancelledError(f"{who} was cancelled by an interrupt (Ctrl-C or a notebook's stop): {jobs}; the SparkSession "
                             f"is usable and the estimator unchanged. Received: KeyboardInterrupt during {where}")


def run_on_partitions(df, produce: Callable[[Iterator], Iterator[pa.RecordBatch]], partitions: list[int], schema: pa.Schema) -> pa.Table:
    """Run ``produce`` as one task on each of ``partitions`` of ``df`` (and on no other partition),
    where the partition's data lives (its cache locality is kept), and return what the tasks
    yielded as one table of ``schema``. Call it through :func:`run_job` (tags, timeout, errors).

    ``produce(rows)`` receives the partition's rows as an iterator (drain it) and yields record
    batches of ``schema``; each task sends them back as one Arrow IPC stream, as raw bytes (the
    RDD's serializer is bypassed: nothing is pickled). Classic sessions only (Spark Connect has no
    RDDs).
    """
    from sparkdl.spark.internals import run_job_raw

    def task(rows):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            for batch in produce(rows):
                writer.write_batch(batch)
        yield sink.getvalue().to_pybytes()

    tables = [pa.ipc.open_stream(chunk).read_all() for chunk in run_job_raw(df.rdd, task, partitions)]
    return pa.concat_tables(tables) if tables else schema.empty_table()
