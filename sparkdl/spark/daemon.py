"""Spark's Python worker daemon with TensorFlow and Keras imported once, before it forks workers.

Spark starts one daemon per executor (``python -m pyspark.daemon``) and forks a Python worker from
it for each task that needs one; every worker of a fit then imports TensorFlow and Keras itself
(4–6 s each on a CPU core, all of them at once when a stage starts). With

    spark.python.daemon.module  sparkdl.spark.daemon

(a static setting: in ``spark-defaults.conf``, ``--conf`` of spark-submit or the session builder
before the session starts; ``sparkdl-train``, ``jobs/train.py`` and :func:`session_conf` set it)
the daemon imports them once, before it listens, and the workers forked from it start with them
imported: a stage's Python workers no longer pay the import, and neither does a worker Spark
starts after another ended (a retried task, a new job without worker reuse).

What is imported: TensorFlow (start-up lines filtered as :func:`sparkdl.keras.runtime.import_tensorflow`
filters them) and Keras, only when Keras' backend is TensorFlow (``KERAS_BACKEND``, else
``keras.json``'s ``backend``, else TensorFlow). JAX and torch start thread pools that a fork does not
carry, so with those backends the daemon imports nothing and the workers import as before. Nothing
is started: TensorFlow's runtime (its thread pools, its devices, a GPU's context) starts in each
worker when its first task configures it, so a task still sizes its pools to its CPUs and pins its
GPUs (:func:`sparkdl.keras.runtime.configure`). A failed import is written to the daemon's stderr
(the executor's log) and the daemon runs on: the workers then import and report the failure in
their tasks.

The daemon's stdout carries its port to the JVM, so everything the import writes to file
descriptor 1 goes to stderr.

A daemon starts with the first Python task of its executor, and a fit's first Python tasks come
after its data is planned, scanned and shuffled: :func:`start_workers`, called when the session
starts (``sparkdl-train`` does), has the executors start their workers (and the daemon its import)
while the driver imports Keras and builds the model.

On a machine with an NVIDIA GPU the daemon imports nothing: a GPU task pins its devices
(``CUDA_VISIBLE_DEVICES``) before TensorFlow is imported in its worker.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback

MODULE = "sparkdl.spark.daemon"
DAEMON_CONF = "spark.python.daemon.module"


def session_conf() -> dict[str, str]:
    """The static Spark settings of a session whose Python workers start with TensorFlow and Keras
    imported: ``{"spark.python.daemon.module": "sparkdl.spark.daemon"}``. Pass each to
    ``SparkSession.builder.config(key, value)`` before the session starts (or to spark-submit's
    ``--conf``); a running session keeps its daemon."""
    return {DAEMON_CONF: MODULE}


_started: set[str] = set()  # applications whose workers start_workers has started
_started_lock = threading.Lock()
START_TIMEOUT_S = 300.0  # a worker's start (TensorFlow's import) takes seconds, more on a loaded machine
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0")


def _warm_task(backend: str):
    """The start job's task: configure Keras' backend for this task's CPUs and import Keras (no GPU
    pinned: the worker's first GPU task pins its own), in the task itself (two threads importing
    TensorFlow at once can leave modules half imported)."""

    def warm(batches):
        from pyspark import TaskContext

        from sparkdl.keras.runtime import configure, keras_module

        for _ in batches:
            pass
        try:
            configure(TaskContext.get().cpus(), None, backend)
            keras_module()
        except Exception:  # noqa: BLE001 - a head start only: the fit's tasks import and report it
            pass
        return iter(())

    return warm


class DaemonStart:
    """The job :func:`start_workers` runs on a thread of its own; :meth:`close` cancels it if it
    still runs and joins the thread (at most ``START_TIMEOUT_S`` seconds)."""

    def __init__(self, spark, tasks: int, backend: str) -> None:
        self._spark = spark
        self._tag = f"sparkdl-start-workers-{spark.sparkContext.applicationId}"
        self._thread = threading.Thread(target=self._run, args=(tasks, backend), name=self._tag, daemon=True)
        self._thread.start()

    def _run(self, tasks: int, backend: str) -> None:
        from sparkdl.spark.jobs import run_job

        df = self._spark.range(0, tasks, numPartitions=tasks).mapInArrow(_warm_task(backend), "id long")
        try:
            run_job(self._spark, df.collect, "sparkdl: start the Python workers (TensorFlow and Keras imported)",
                    self._tag, START_TIMEOUT_S, explain_imports=False)
        except Exception:  # noqa: BLE001 - a head start only: the fit's tasks start their workers themselves
            pass

    @property
    def running(self) -> bool:
        """Whether the start job's thread still runs."""
        return self._thread.is_alive()

    def join(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """Wait up to ``timeout_s`` seconds for the start job; returns whether it ended."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def close(self) -> None:
        """Cancel the start job if it still runs and join its thread."""
        if not self.running:
            return
        from sparkdl.spark.session import cancel_tag

        cancel_tag(self._spark, self._tag)
        self._thread.join(START_TIMEOUT_S)


def start_workers(spark) -> DaemonStart | None:
    """Start the Python workers of ``spark``'s executors now, in the background, with TensorFlow and
    Keras imported, so that the first fit's tasks find them started: call it right after the
    session starts, before the driver imports Keras and builds the model (seconds in which the
    executors would otherwise wait). ``sparkdl-train`` and ``jobs/train.py`` call it.

    One job of ``mapInArrow`` tasks (the kind of task a fit's data runs in, whose Python workers a
    fit reuses), on a thread of its own: with this module's daemon (:func:`session_conf`) one
    task per live executor (one on a ``local`` master), which makes the executor start its daemon,
    which imports TensorFlow and Keras once; without it one task per task slot
    (``defaultParallelism``), each importing them in its own Python worker, which Spark keeps for
    the fit's tasks (``spark.python.worker.reuse``, on by default). Each task holds its slot while
    it starts (seconds). Its failures are ignored: the fit's own tasks start their workers then.

    Args:
        spark: a classic SparkSession (nothing is done on Spark Connect, where the server's
            workers are not this client's to start).

    Returns:
        The :class:`DaemonStart` (``running``, ``join()``, ``close()``), or None when nothing was
        started: Spark Connect, or this application's workers already started by an earlier call.
    """
    from sparkdl.keras.runtime import keras_backend
    from sparkdl.spark import internals
    from sparkdl.spark.session import is_connect

    if is_connect(spark):
        return None
    sc = spark.sparkContext
    with _started_lock:
        if sc.applicationId in _started:
            return None
        _started.add(sc.applicationId)
    if sc.getConf().get(DAEMON_CONF, "") == MODULE:
        try:
            tasks = len([e for e in internals.executors(sc) if e["active"]])
        except Exception:  # noqa: BLE001 - a JVM without the list: one task
            tasks = 0
    else:
        tasks = sc.defaultParallelism
    return DaemonStart(spark, max(1, tasks), keras_backend())


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


def preload() -> bool:
    """Import TensorFlow and Keras into this process when the backend is TensorFlow and the machine
    has no NVIDIA GPU device (``/dev/nvidiactl``, ``/dev/nvidia0``: a GPU task pins its devices
    before TensorFlow is imported in its worker), with file descriptor 1 sent to stderr meanwhile.
    Returns whether they were imported; a failure is written to stderr and returns False (never
    raises)."""
    if backend_from_environment() != "tensorflow" or any(os.path.exists(p) for p in GPU_DEVICE_FILES):
        return False
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        from sparkdl.keras.runtime import keras_module

        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        keras_module()  # TensorFlow first, its start-up lines filtered

        return True
    except Exception:  # noqa: BLE001 - the workers import again and report it in their tasks
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
