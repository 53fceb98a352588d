"""Spark's Python worker daemon with TensorFlow and Keras imported once, before it forks workers.

Spark starts a daemon per executor (``python -m pyspark.daemon``; one for RDD tasks and one for
DataFrame tasks, whose workers' environments differ) and forks a Python worker from it for each
task that needs one; every worker of a fit then imports TensorFlow and Keras itself (4–6 s each on
a CPU core, all of them at once when a stage starts). With :func:`session_conf`'s settings

    spark.python.daemon.module                    sparkdl.spark.daemon
    spark.executorEnv.SPARKDL_DAEMON_PRELOAD      tensorflow   (the driver's Keras backend)

(static settings: the session builder before the session starts, ``--conf`` of spark-submit or
``spark-defaults.conf``; ``sparkdl-train`` and ``jobs/train.py`` set them) the daemon imports them
once, before it listens, and the workers forked from it start with them imported: a stage's Python
workers no longer pay the import, and neither does a worker Spark starts after another ended (a
retried task, a worker Spark retired after a minute idle).

What is imported: TensorFlow (start-up lines filtered as :func:`sparkdl.keras.runtime.import_tensorflow`
filters them) and Keras on it, only when ``SPARKDL_DAEMON_PRELOAD`` (the driver's backend when the
session started, given to every Python worker's environment by ``spark.executorEnv``) is
``tensorflow``, TensorFlow is installed, and the machine shows no NVIDIA GPU (``/dev/nvidiactl``,
``/dev/nvidia0`` or ``nvidia-smi``: a GPU task pins its devices before TensorFlow loads in its
worker). Otherwise the daemon imports nothing and is pyspark's: a fit on JAX or torch, or a driver
whose backend is not known, never finds Keras preloaded on another backend. TensorFlow's runtime
(its thread pools, its devices) is not started by the import, so each worker still sizes its pools
to its task's CPUs (:func:`sparkdl.keras.runtime.configure`). Each forked worker reseeds numpy's
global random state (a fork would copy the daemon's to every worker; Python's ``random`` reseeds
itself). A failed import (any exception) is written to the daemon's stderr (the executor's log) and
the daemon runs on as pyspark's. The daemon's stdout carries its port to the JVM, so everything the
import writes to file descriptor 1 goes to stderr.

Memory: a daemon that imported TensorFlow holds about 0.9 GB resident (0.4 GB of it its own), which
its workers share until they write to it; count it in ``spark.executor.memoryOverhead`` (or
``spark.executor.pyspark.memory``) on YARN and Kubernetes, twice when both RDD and DataFrame Python
tasks run on an executor.

A daemon starts with its executor's first Python task, and a fit's first Python tasks come after its
data is planned, scanned and shuffled: :func:`start_workers`, called right after the session starts
and before the driver imports Keras and builds the model, has the executors start their daemons
meanwhile.

The program the workers run is this module's too: before a fit's first job :func:`prepare_workers`
checks that a ``local`` or ``local-cluster`` master's Python workers can run sparkdl's tasks
(:func:`check_workers_python`: a missing ``PYSPARK_PYTHON`` said first, not after a failed job),
then switches a plain local session to this daemon.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import os
import shutil
import sys
import threading
import traceback
from dataclasses import dataclass

from sparkdl.errors import ConfigError

MODULE = "sparkdl.spark.daemon"
DAEMON_CONF = "spark.python.daemon.module"
PRELOAD_ENV = "SPARKDL_DAEMON_PRELOAD"


def session_conf(backend: str | None = None) -> dict[str, str]:
    """The static Spark settings of a session whose Python workers start with TensorFlow and Keras
    imported: ``{"spark.python.daemon.module": "sparkdl.spark.daemon",
    "spark.executorEnv.SPARKDL_DAEMON_PRELOAD": backend}``. Pass them to
    ``SparkSession.builder.config(map=...)`` before the session starts (or to spark-submit's
    ``--conf``); a running session keeps its daemon.

    Args:
        backend: the Keras backend the session's fits will use; default: the driver's now (the
            imported Keras' backend, else ``KERAS_BACKEND``, else ``keras.json``'s, else
            ``"tensorflow"``). Only ``"tensorflow"`` is preloaded.
    """
    if backend is None:
        keras = sys.modules.get("keras")
        backend = str(keras.backend.backend()) if keras is not None and hasattr(keras, "backend") else backend_from_environment()
    return {DAEMON_CONF: MODULE, f"spark.executorEnv.{PRELOAD_ENV}": backend}


_started: set[str] = set()  # applications whose workers start_workers has started
_started_lock = threading.Lock()
START_TIMEOUT_S = 300.0  # a worker's start (TensorFlow's import) takes seconds, more on a loaded machine
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0")
#: sparkdl's task modules, imported by :func:`preload` after Keras (their own imports, pandas, Arrow
#: Flight, pyspark's SQL types: about a second a worker): nothing in them starts a thread or a runtime
WORKER_MODULES = ("sparkdl.spark.backends.rounds.task", "sparkdl.spark.backends.ps.task",
                  "sparkdl.spark.backends.sharded.task", "sparkdl.spark.inference")


def _warm_task(backend: str, arrow: bool):
    """The start job's task: configure Keras' backend for this task's CPUs and import Keras, in the
    task itself (two threads importing TensorFlow at once can leave modules half imported); a task
    given GPUs imports nothing (the worker's training task pins its GPUs first). With the daemon's
    preload both are done already. Yields the process id of the worker's parent, its daemon (an int;
    a one-row record batch of column ``daemon`` where ``arrow``, a ``mapInArrow`` task)."""

    def warm(batches):
        import os

        from pyspark import TaskContext

        from sparkdl.keras.runtime import configure, keras_module

        for _ in batches:
            pass
        context = TaskContext.get()
        if "gpu" not in (context.resources() or {}):  # a GPU task pins its GPUs before the backend starts: nothing imported
            try:
                configure(context.cpus(), None, backend)
                keras_module()
            except Exception:  # noqa: BLE001 - a head start only: the fit's tasks import and report it
                pass
        if arrow:
            import pyarrow as pa

            yield pa.RecordBatch.from_pydict({"daemon": [os.getppid()]}, schema=pa.schema([("daemon", pa.int64())]))
        else:
            yield os.getppid()

    return warm


class DaemonStart:
    """The job :func:`start_workers` runs on a thread of its own (a daemon thread: it ends with the
    job, or with the session when the session stops first)."""

    def __init__(self, spark, tasks: int, backend: str) -> None:
        self._spark = spark
        self._tag = f"sparkdl-start-workers-{spark.sparkContext.applicationId}"
        self.daemons: list[int] = []  # the process ids of the daemons its tasks forked from, once it ended
        self._thread = threading.Thread(target=self._run, args=(tasks, backend), name=self._tag, daemon=True)
        self._thread.start()

    def _run(self, tasks: int, backend: str) -> None:
        from sparkdl.spark import internals
        from sparkdl.spark.jobs import run_job

        # An RDD job launches its executor's daemon seconds sooner than a DataFrame's on a fresh JVM (no
        # plan, code generation or Arrow to load first: about 1 s against 5 s); given the DataFrame runners'
        # worker environment it starts the daemon their tasks fork from. Where that is not known: mapInArrow.
        try:
            env = internals.dataframe_worker_env(self._spark)
            if env is None:
                df = self._spark.range(0, tasks, numPartitions=tasks).mapInArrow(_warm_task(backend, True), "daemon long")
                action = lambda: [row.daemon for row in df.collect()]  # noqa: E731
            else:
                rdd = self._spark.sparkContext.parallelize(range(tasks), tasks).mapPartitions(_warm_task(backend, False))
                action = internals.with_worker_env(rdd, env).collect
            self.daemons = run_job(self._spark, action, "sparkdl: start the Python workers (TensorFlow and Keras imported)",
                                   self._tag, START_TIMEOUT_S, explain_imports=False)
        except Exception:  # noqa: BLE001 - a head start only: the fit's tasks start their workers themselves
            pass

    def join(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """Wait up to ``timeout_s`` seconds for the start job; returns whether it ended."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


@dataclass(frozen=True)
class DaemonFacts:
    """What decides whether a running session's Python workers can be switched to sparkdl's daemon,
    read once: from the session (:meth:`of`) or from a fit's plan, which read them already
    (:meth:`from_plan`).

    Attributes:
        connect: a Spark Connect session.
        app: the application's id (``"connect"`` on Connect): what a reason is told once for.
        master: the master URL.
        use_daemon: ``spark.python.use.daemon`` (default true).
        module: ``spark.python.daemon.module`` as set, or None.
        gpu_conf: a GPU resource setting in the session's conf.
        python: the program the executors' Python workers run, or None (the driver's).
    """

    connect: bool
    app: str
    master: str = ""
    use_daemon: bool = True
    module: str | None = None
    gpu_conf: bool = False
    python: str | None = None

    @classmethod
    def of(cls, spark) -> DaemonFacts:
        """The facts of ``spark`` (a SparkSession, classic or Connect)."""
        from sparkdl.spark.session import is_connect, python_exec

        if is_connect(spark):
            return cls(connect=True, app="connect")
        sc = spark.sparkContext
        return cls(connect=False, app=sc.applicationId, master=sc.master, python=python_exec(spark), **conf_facts(sc.getConf()))

    @classmethod
    def from_plan(cls, plan) -> DaemonFacts:
        """The facts a fit's :class:`~sparkdl.spark.session.FitPlan` read (no session call)."""
        if plan.connect:
            return cls(connect=True, app="connect")
        return cls(connect=False, app=plan.app_id or "", master=plan.master, python=plan.python_exec, **plan.daemon_conf)


def conf_facts(conf) -> dict:
    """The daemon's facts in a classic context's ``SparkConf`` (``sc.getConf()``: the running
    context's own, where a module set by ``set_running_conf`` shows): ``use_daemon``, ``module``,
    ``gpu_conf`` (:class:`DaemonFacts`' fields)."""
    return {"use_daemon": conf.get("spark.python.use.daemon", "true").lower() != "false",
            "module": conf.get(DAEMON_CONF, None),
            "gpu_conf": any(".resource.gpu." in key for key, _ in conf.getAll())}


def preload_decision(facts: DaemonFacts) -> tuple[bool, str | None]:
    """Whether the session of ``facts`` is to be switched to sparkdl's daemon now, and the reason it
    cannot be (None when there is nothing to tell the user), as :func:`use_preloading_daemon`
    describes. Pure but for the one-time check that the executors' Python has sparkdl installed."""
    from sparkdl.keras.runtime import keras_backend

    settings = f"{DAEMON_CONF}={MODULE} and spark.executorEnv.{PRELOAD_ENV}=tensorflow"
    if facts.connect:
        return False, f"a Spark Connect session's Python workers are the server's: set {settings} in the server's Spark config"
    if not facts.use_daemon:
        return False, "spark.python.use.daemon is false: every Python worker starts on its own and imports TensorFlow itself"
    if facts.module is not None:
        return False, None  # sparkdl's already, or the session's own choice (pyspark.daemon to turn sparkdl's off), kept
    if keras_backend() != "tensorflow" or gpu_machine() or facts.gpu_conf:  # tasks pin GPUs before TensorFlow loads
        return False, None  # nothing would be preloaded: pyspark's daemon serves as well
    url = facts.master
    if not (url == "local" or url.startswith("local[")):
        return False, (f"the executors ({url}) started with pyspark's daemon and keep it: set {settings} in the cluster's "
                       "Spark config (docs/user-guide/deployment.md#a-session-that-exists-already)")
    program = facts.python or sys.executable
    with _started_lock:
        if program not in _installed:  # asked once per program: found without importing it
            _installed[program] = python_problem(shutil.which(program) or program, ["sparkdl"]) is None
    if not _installed[program]:
        return False, (f"the executors' Python ({program}) does not have sparkdl installed (shipped with the session's files, "
                       "which reach a worker only after its daemon started): install it there")
    return True, None


def _switch(sc) -> None:
    """Switch the running local context ``sc`` to sparkdl's daemon (see :func:`use_preloading_daemon`)."""
    from sparkdl.spark import internals

    sc.environment[PRELOAD_ENV] = "tensorflow"  # before the conf: a task that sees the module finds the marker
    internals.set_running_conf(sc, DAEMON_CONF, MODULE)
    logging.getLogger("sparkdl").info("this session's Python workers started from now on fork from sparkdl's daemon "
                                      "(TensorFlow imported once): %s=%s set on the running %s session", DAEMON_CONF, MODULE,
                                      sc.master)


def use_preloading_daemon(spark) -> tuple[bool, str | None]:
    """Have ``spark``'s Python workers started from now on fork from sparkdl's daemon (TensorFlow
    and Keras imported once per executor), where Spark allows it in a running session. Returns
    ``(switched now, reason)``: the reason is None when there is nothing to tell the user (they
    do: the session started with :func:`session_conf`'s settings, or was switched now; or the
    session chose a daemon of its own; or nothing would be preloaded), else the reason they
    cannot, as a sentence.

    A session started the ordinary way (``SparkSession.builder...getOrCreate()``, a notebook's)
    runs pyspark's daemon: each Python worker imports TensorFlow itself (4–6 s a worker), and Spark
    ends a worker idle for 60 s, so a fit a minute after the last pays the imports again. On a
    ``local`` master the executor is the driver's JVM, which reads ``spark.python.daemon.module``
    each time a task starts a Python runner: setting it in the running context's conf
    (:func:`sparkdl.spark.internals.set_running_conf`) and ``SPARKDL_DAEMON_PRELOAD`` in the
    context's worker environment (``sc.environment``) makes every later task's workers fork from
    sparkdl's daemon, which Spark starts beside pyspark's (whose workers end as Spark retires them).
    This is done only where nothing was chosen: ``spark.python.daemon.module`` unset, the driver's
    Keras backend ``tensorflow`` (the only one preloaded), no NVIDIA GPU on the machine
    (:func:`gpu_machine`) and no GPU resource in the session's conf (a GPU task pins its devices
    before TensorFlow loads). The daemon and its workers then hold about 0.9 GB more, shared.

    Not possible, with the reason returned: the executors' Python without sparkdl installed (the
    daemon starts before a session's shipped files reach it), Spark Connect (the server's workers),
    executors in JVMs of their own (``local-cluster``, standalone, YARN, Kubernetes, Databricks:
    they keep the conf they started with; set the two settings in the cluster's Spark config), and
    ``spark.python.use.daemon=false`` (no daemon to fork from).
    """
    switch, reason = preload_decision(DaemonFacts.of(spark))
    if switch:
        _switch(spark.sparkContext)
    return switch, reason


# Run by the executors' Python: its version, and which of the modules named after it are missing
# (found without importing them).
_PROBE = ("import sys, json, importlib.util as u; print(json.dumps({'version': '%d.%d' % sys.version_info[:2], "
          "'executable': sys.executable, 'missing': [m for m in sys.argv[1:] if u.find_spec(m) is None]}))")
#: the executors' Pythons that passed :func:`check_executors_python` in this process
_PYTHONS_OK: set = set()


def python_problem(program: str, modules: list[str], timeout_s: float = 30.0) -> str | None:
    """What keeps ``program`` from running sparkdl's tasks, in words, or None: asked of it in a
    subprocess (started with this process's environment, as a local master's Python workers are):
    no program at that path, one that does not run, another Python version than this one (pyspark
    refuses it), or ``modules`` it cannot find (:func:`importlib.util.find_spec`, nothing imported).
    A probe that runs past ``timeout_s`` seconds tells nothing (None)."""
    import json
    import subprocess

    try:
        result = subprocess.run([program, "-c", _PROBE, *modules], capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return "is not a program this machine has"
    except PermissionError:
        return "cannot be run (permission denied)"
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        found = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = " ".join((result.stderr or result.stdout).split())[-300:]
        return f"does not run Python code (exit status {result.returncode}: {tail})"
    ours = "%d.%d" % sys.version_info[:2]
    if found["version"] != ours:
        return f"is Python {found['version']} ({found['executable']}), where pyspark needs the driver's {ours}"
    if found["missing"]:
        return f"cannot import {', '.join(found['missing'])} ({found['executable']}, Python {found['version']})"
    return None


def check_executors_python(spark) -> None:
    """:func:`check_workers_python` with the facts of ``spark`` read now (nothing on Spark Connect).

    Raises:
        ConfigError: see :func:`check_workers_python`.
    """
    from sparkdl.spark.session import python_exec

    program = python_exec(spark)
    if program is None:
        return
    sc = spark.sparkContext
    ships = bool(sc.getConf().get("spark.submit.pyFiles", "")) or any(
        f.endswith((".zip", ".egg", ".whl", ".py")) for f in (sc.listFiles or []))
    check_workers_python(program, sc.master, ships)


def check_workers_python(program: str | None, url: str, ships_files: bool) -> None:
    """Before any job of a ``local`` or ``local-cluster`` master, whose executors run on this machine:
    check that the program the Python workers run (``SparkContext.pythonExec``) can run sparkdl's
    tasks (:func:`python_problem`), so that a missing ``PYSPARK_PYTHON`` is explained first, not
    after a failed job and its Java stack traces. sparkdl itself is not asked for when the session
    ships files (``--py-files``, ``addPyFile``), which may hold it. Nothing is checked on another
    master (the executors' machines decide) or on Spark Connect; the driver's own interpreter passes
    at once, and a Python that passed is not asked again.

    Args:
        program: ``SparkContext.pythonExec``, None on Spark Connect (nothing checked).
        url: the master URL.
        ships_files: the session ships Python files (``spark.submit.pyFiles``, ``SparkContext.listFiles``).

    Raises:
        ConfigError: naming ``PYSPARK_PYTHON`` / ``spark.pyspark.python`` first, then the program,
            what it lacks and the driver's Python.
    """
    from sparkdl.keras.runtime import keras_backend

    if program is None or not (url == "local" or url.startswith(("local[", "local-cluster["))):
        return
    resolved = shutil.which(program) or program
    if os.path.abspath(resolved) == os.path.abspath(sys.executable):
        return
    modules = ["numpy", "pyarrow", "keras", {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}.get(keras_backend(), "keras")]
    if not ships_files:
        modules.insert(0, "sparkdl")
    key = (resolved, tuple(modules))
    if key in _PYTHONS_OK:
        return
    problem = python_problem(resolved, list(dict.fromkeys(modules)))
    if problem is None:
        _PYTHONS_OK.add(key)
        return
    raise ConfigError(
        "the executors' Python must have sparkdl and its dependencies installed, as the driver's: set PYSPARK_PYTHON to such "
        f"a Python before the SparkSession starts (its SparkContext reads it once), e.g. PYSPARK_PYTHON={sys.executable}, "
        f"or spark.pyspark.python with spark-submit. Checked before any job: master {url} runs its Python workers with "
        f"{program!r}, which {problem}; the driver runs {sys.executable} (Python {sys.version.split()[0]}). "
        f"Received: PYSPARK_PYTHON={os.environ.get('PYSPARK_PYTHON')!r} now, {program!r} when the SparkContext started"
    )


_installed: dict[str, bool] = {}  # executors' Python program -> whether it has sparkdl installed
_told: set[str] = set()  # applications told why their workers cannot fork from sparkdl's daemon


def prepare_workers(plan) -> None:
    """Before a fit's first job, from the facts its plan read (:class:`DaemonFacts`): the Python the
    workers run is checked (:func:`check_workers_python`; raises its ``ConfigError``); a plain local
    session is switched to sparkdl's daemon (:func:`use_preloading_daemon`) and has its executor
    start it at once (one task, as :func:`start_workers`: its TensorFlow import overlaps the fit's
    checks on the driver), and a reason (if any) is logged at INFO on the ``sparkdl`` logger once
    per application (a fit on a cluster whose Spark config lacks the settings runs as before, each
    Python worker importing TensorFlow)."""
    from sparkdl.keras.runtime import keras_backend

    check_workers_python(plan.python_exec, plan.master, plan.ships_files)  # a local master's workers without sparkdl: said now
    facts = DaemonFacts.from_plan(plan)
    switch, reason = preload_decision(facts)
    if switch:  # a local master: one executor, the driver's JVM
        _start_once(plan.spark, facts.app, 1, keras_backend(), switch=True)
    if reason is None:
        return
    with _started_lock:
        if facts.app in _told:
            return
        _told.add(facts.app)
    logging.getLogger("sparkdl").info("each Python worker imports TensorFlow itself: %s", reason)


def start_workers(spark) -> DaemonStart | None:
    """Start the Python workers of ``spark``'s executors now, in the background, so that the first
    fit's tasks find them started with TensorFlow and Keras imported: call it right after the
    session starts, before the driver imports Keras and builds the model (seconds in which the
    executors would otherwise wait).

    A session started without :func:`session_conf`'s settings is first switched to sparkdl's daemon
    where Spark allows it (:func:`use_preloading_daemon`: a ``local`` master); where it does not
    (a cluster's executors started with pyspark's daemon), a ``UserWarning`` says why and which
    settings the cluster's Spark config needs, and the workers are still started now: each imports
    TensorFlow itself, and Spark ends a worker idle for 60 s.

    One job of one task per live executor (one on a ``local`` master; executors that register
    later start their daemons with their first task), on a thread of its own, whose tasks fork from
    the daemon the fit's DataFrame tasks fork from: an RDD task given the DataFrame runners' worker
    variables (:func:`sparkdl.spark.internals.dataframe_worker_env`), which a fresh JVM starts
    seconds sooner than a DataFrame's first Python task, or a ``mapInArrow`` task where a setting
    may add a variable that cannot be told. Each task holds its slot while its executor's daemon
    imports (seconds). Its failures are ignored: the fit's own tasks start the daemon then.

    Args:
        spark: a SparkSession.

    Returns:
        The :class:`DaemonStart` (``join()``), or None when nothing was started: Spark Connect (the
        server's workers are not this client's to start) and ``spark.python.use.daemon=false``
        (both with a ``UserWarning`` saying so), or this application's workers already started by
        an earlier call.
    """
    import warnings

    from sparkdl.keras.runtime import keras_backend
    from sparkdl.spark import internals

    facts = DaemonFacts.of(spark)
    switch, reason = preload_decision(facts)
    if switch:
        _switch(spark.sparkContext)
    if reason is not None:
        nothing = facts.connect or not facts.use_daemon
        warnings.warn(f"start_workers: the Python workers cannot fork from sparkdl's daemon: {reason}"
                      + ("; nothing started" if nothing else "; they are started now and import TensorFlow each"), stacklevel=2)
        if nothing:
            return None
    try:
        tasks = len([e for e in internals.executors(spark.sparkContext) if e["active"]])
    except Exception:  # noqa: BLE001 - a JVM without the list: one task
        tasks = 0
    return _start_once(spark, facts.app, max(1, tasks), keras_backend())


def _start_once(spark, app: str, tasks: int, backend: str, switch: bool = False) -> DaemonStart | None:
    """A :class:`DaemonStart` of ``tasks`` tasks, unless application ``app``'s workers were started
    already (None). ``switch``: the running local context is first switched to sparkdl's daemon
    (:func:`_switch`), whether or not its workers start now."""
    if switch:
        _switch(spark.sparkContext)
    with _started_lock:
        if app in _started:
            return None
        _started.add(app)
    return DaemonStart(spark, tasks, backend)


def backend_from_environment() -> str:
    """The Keras backend a worker forked from this daemon will use when nothing tells it otherwise:
    ``KERAS_BACKEND``, else the ``backend`` of ``$KERAS_HOME/keras.json`` (``~/.keras/keras.json``),
    else ``"tensorflow"``; read without importing Keras."""
    name = os.environ.get("KERAS_BACKEND")
    if name:
        return name
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json"), encoding="utf-8") as f:
            return str(json.load(f).get("backend") or "tensorflow")
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def gpu_machine() -> bool:
    """Whether this machine shows an NVIDIA GPU: ``/dev/nvidiactl`` or ``/dev/nvidia0``, or
    ``nvidia-smi`` on the ``PATH`` (device files can appear only once a program opens the driver)."""
    return any(os.path.exists(p) for p in GPU_DEVICE_FILES) or shutil.which("nvidia-smi") is not None


def _reseed_numpy() -> None:
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # from the OS's entropy, as a fresh import seeds it


def preload() -> bool:
    """Import TensorFlow and Keras into this process when ``SPARKDL_DAEMON_PRELOAD`` is
    ``tensorflow``, TensorFlow is installed and :func:`gpu_machine` is False, with file descriptor 1
    sent to stderr meanwhile, then sparkdl's task modules (:data:`WORKER_MODULES`); then have each
    process forked from this one reseed numpy's global random state, and move the imported objects
    out of the garbage collector's sight (``gc.freeze``: the forked workers do not copy their pages
    by collecting them). Returns whether they were imported; any failure is written to stderr and
    returns False (never raises)."""
    try:
        if (os.environ.get(PRELOAD_ENV) != "tensorflow" or gpu_machine()
                or importlib.util.find_spec("tensorflow") is None):
            return False
    except BaseException:  # noqa: BLE001 - a broken installation: the daemon runs as pyspark's
        return False
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        from sparkdl.keras.runtime import keras_module

        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        keras_module()  # TensorFlow first, its start-up lines filtered
        for name in WORKER_MODULES:  # what every fit's and transform's task imports (seconds on a loaded core)
            importlib.import_module(name)
        os.register_at_fork(after_in_child=_reseed_numpy)
        gc.freeze()
        return True
    except BaseException:  # noqa: BLE001 - SystemExit too: the workers import again and report it in their tasks
        print("sparkdl.spark.daemon: TensorFlow/Keras not preloaded; each worker imports them\n"
              + traceback.format_exc(), file=sys.stderr, flush=True)
        return False
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def main() -> None:
    """Preload, then run pyspark's daemon (``pyspark.daemon.manager``): listen, fork workers."""
    preload()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
