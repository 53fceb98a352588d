"""Process-wide Keras set-up for executor Python workers, for each Keras 3 backend.

The backend is the driver's: every task carries the driver's ``keras.backend.backend()``
(:func:`keras_backend`) and :func:`configure` sets ``KERAS_BACKEND`` to it before ``keras`` is
imported in the worker; ``tensorflow`` (the default), ``jax`` and ``torch`` are supported. A
reused Python worker whose Keras already runs on another backend fails (:func:`check_backend_reuse`).

Backends create their thread pools once per process. Two workers on two cores that each start a
pool as large as the machine fight over the cores, so each worker sizes its pools to the CPUs its
Spark task was given (``spark.task.cpus``) before the backend starts: TensorFlow through
``tf.config.threading`` (intra-op = the task's CPUs, inter-op = 1); torch through
``torch.set_num_threads`` and ``torch.set_num_interop_threads(1)``; JAX (current jaxlib honours
no thread-count flag: its pool follows the process's CPU affinity) through
``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`` for a one-CPU task, which runs each op on the
calling thread.

Quiet start-up: TensorFlow 2.17+ prints lines while it loads, before its logging honours
``TF_CPP_MIN_LOG_LEVEL`` (``oneDNN custom operations are on ...``, the CPU-feature notice, absl's
``WARNING: All log messages before absl::InitializeLog() ...``), from every Python worker.
:func:`import_tensorflow` (called by :func:`configure` and :func:`keras_module`, so on the
executors before anything else imports TensorFlow) captures the process's stderr while TensorFlow
loads and writes back the lines that ``TF_CPP_MIN_LOG_LEVEL`` lets through (:func:`startup_lines`;
the workers' default is 2: warnings and info hidden, errors shown). ``TF_CPP_MIN_LOG_LEVEL=0`` shows
them all.

GPUs: a task that Spark gave GPU addresses (``spark.task.resource.gpu.amount``) pins them before
the backend starts: ``CUDA_VISIBLE_DEVICES`` is set to those devices (see
:func:`sparkdl.core.gpu.plan_gpus`), so the backend sees them as devices ``0 .. n-1`` and no
other. A GPU's memory is taken as needed: TensorFlow's memory growth is turned on, JAX gets
``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (torch allocates as needed by itself). A task without a GPU
resource pins nothing: it uses the devices its executor sees (all of them, or none with
``CUDA_VISIBLE_DEVICES=""`` in ``spark.executorEnv``). A reused Python worker handed other GPU
addresses than it pinned fails (:func:`sparkdl.core.gpu.check_reuse`).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping

from sparkdl.core.gpu import ADDRESS_MODE_ENV, GPU_RESOURCE, REUSE_CONF, VISIBLE_DEVICES, GpuPlan, check_reuse, plan_gpus
from sparkdl.errors import ConfigError

_configured_threads: int | None = None
_pinned: GpuPlan | None = None  # what this process set CUDA_VISIBLE_DEVICES to, for a task's GPUs
_UNSET = object()
_inherited = _UNSET  # the executor's CUDA_VISIBLE_DEVICES before the first pin (None: unset)
_BACKENDS = ("tensorflow", "jax", "torch")
_DEFAULT_BACKEND = "tensorflow"
_SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false"


_LOG_RECORD = re.compile(r"^([IWEF])\d{4} ")  # absl/glog: I0000 00:00:1796164113.959617   29248 file.cc:227] ...
_LOG_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def startup_lines(text: str, min_level: int) -> str:
    """The lines of ``text`` (what a process wrote to stderr while TensorFlow loaded) that
    ``TF_CPP_MIN_LOG_LEVEL=min_level`` lets through, as TensorFlow applies it once its logging starts.

    A log record (``I0000 ...``, ``W``, ``E``, ``F``: severities 0 to 3) is kept when its severity
    is at least ``min_level`` (a fatal one always), with its continuation lines (those that do not
    start a record); absl's ``WARNING: All log messages before absl::InitializeLog() ...`` notice
    only with ``min_level`` 0; other lines before the first record are kept.
    """
    kept, keep = [], True
    for line in text.splitlines(keepends=True):
        record = _LOG_RECORD.match(line)
        if record:
            keep = _LOG_SEVERITY[record.group(1)] >= min(min_level, 3)
        elif line.rstrip("\r\n") == _ABSL_NOTICE:
            if min_level <= 0:
                kept.append(line)
            continue
        if keep:
            kept.append(line)
    return "".join(kept)


def _min_log_level() -> int:
    """``TF_CPP_MIN_LOG_LEVEL`` as a number (0 when unset or not a number: show everything)."""
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def import_tensorflow():
    """Import and return ``tensorflow`` with its start-up lines filtered by ``TF_CPP_MIN_LOG_LEVEL``.

    While TensorFlow loads, file descriptor 2 goes to a temporary file; then the lines
    :func:`startup_lines` keeps are written to the real stderr (everything, when the import
    raises). An already imported TensorFlow is returned as it is; with ``TF_CPP_MIN_LOG_LEVEL``
    0 (or unset), or a stderr that cannot be duplicated, it is imported plainly. A crash of the
    process while TensorFlow loads loses the captured lines: rerun with ``TF_CPP_MIN_LOG_LEVEL=0``.

    Raises:
        ImportError: TensorFlow is not installed (nothing is hidden then).
    """
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    level = _min_log_level()
    try:
        saved = os.dup(2) if level > 0 else None
    except OSError:
        saved = None
    if saved is None:
        import tensorflow

        return tensorflow
    with tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow
        except BaseException:
            level = 0  # the whole story of a failed import
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            shown = startup_lines(captured.read().decode("utf-8", "replace"), level)
            if shown:
                os.write(2, shown.encode("utf-8"))
    return tensorflow


def _backend_started() -> bool:
    return any(name in sys.modules for name in _BACKENDS)


def pin_gpus(resources: Mapping | None) -> GpuPlan:
    """Restrict this process to the GPUs of a Spark task's resources, before the backend starts.

    Args:
        resources: ``TaskContext.get().resources()`` (``BarrierTaskContext`` too): resource name ->
            ``ResourceInformation`` (``.addresses``: a list of str), or ``None``/``{}`` for none.

    Returns:
        The task's :class:`~sparkdl.core.gpu.GpuPlan`: ``visible_devices`` (now in
        ``CUDA_VISIBLE_DEVICES``) and ``ordinals``; ``visible_devices`` None for a task without GPUs.

    Raises:
        ConfigError: no usable GPU address although the task requested GPUs (naming
            ``spark.task.resource.gpu.amount`` and the discovery script), an address outside the
            inherited ``CUDA_VISIBLE_DEVICES``, or a reused Python worker whose backend started on
            other GPUs (naming ``spark.python.worker.reuse`` and both address lists).
    """
    global _pinned, _inherited
    gpu = (resources or {}).get(GPU_RESOURCE)
    addresses = None if gpu is None else [str(a) for a in getattr(gpu, "addresses", gpu)]
    inherited = os.environ.get(VISIBLE_DEVICES) if _inherited is _UNSET else _inherited
    plan = plan_gpus(addresses, inherited, required=gpu is not None, mode=os.environ.get(ADDRESS_MODE_ENV) or None)
    if check_reuse(_pinned, plan, _backend_started()):
        _inherited = inherited
        os.environ[VISIBLE_DEVICES] = plan.visible_devices
        _pinned = plan
    return plan


def pinned() -> GpuPlan | None:
    """What this process pinned (``None``: no task with GPUs configured it)."""
    return _pinned


def check_backend(name) -> str:
    """``name`` as a supported Keras backend name.

    Raises:
        ConfigError: ``name`` is not ``"tensorflow"``, ``"jax"`` or ``"torch"``.
    """
    if name not in _BACKENDS:
        raise ConfigError(f"the Keras backend must be one of {', '.join(_BACKENDS)} (KERAS_BACKEND). Received: {name!r}")
    return name


def check_backend_reuse(loaded: str | None, wanted: str) -> None:
    """Refuse a task whose Keras backend is not the one Keras already runs on in this Python worker.

    Keras picks its backend once, when it is imported; Spark reuses Python workers between tasks
    (``spark.python.worker.reuse``), e.g. for two Spark Connect clients on different backends.

    Args:
        loaded: the backend of the ``keras`` imported in this process, ``None`` when it is not imported.
        wanted: the task's backend (the driver's).

    Raises:
        ConfigError: ``loaded`` is set and differs from ``wanted``, naming both and ``spark.python.worker.reuse``.
    """
    if loaded is not None and loaded != wanted:
        raise ConfigError(
            f"a Python worker must run the driver's Keras backend, and Keras chooses its backend once per process. "
            f"Use one backend per Spark application or set {REUSE_CONF}=false. Received: a task for backend {wanted!r} "
            f"in a worker whose Keras already runs on backend {loaded!r}"
        )


def jax_xla_flags(existing: str | None, num_threads: int) -> str | None:
    """``XLA_FLAGS`` for a JAX worker given ``num_threads`` CPUs: ``existing`` plus
    ``--xla_cpu_multi_thread_eigen=false`` when ``num_threads`` is 1 and the flag is not there yet
    (``None`` when nothing is to be set). Larger tasks keep XLA's pool (sized by the CPU affinity)."""
    if int(num_threads) != 1 or "xla_cpu_multi_thread_eigen" in (existing or ""):
        return existing
    return f"{existing} {_SINGLE_THREAD_XLA}".strip() if existing else _SINGLE_THREAD_XLA


def _loaded_backend() -> str | None:
    keras = sys.modules.get("keras")
    if keras is None:
        return None
    try:
        return str(keras.backend.backend())
    except AttributeError:  # keras still importing
        return os.environ.get("KERAS_BACKEND", _DEFAULT_BACKEND)


def keras_backend() -> str:
    """This process's Keras backend, what the driver ships to its tasks: ``keras.backend.backend()``
    when Keras is imported, else ``KERAS_BACKEND`` (default ``"tensorflow"``)."""
    return _loaded_backend() or os.environ.get("KERAS_BACKEND") or _DEFAULT_BACKEND


def configure(num_threads: int | None = None, resources: Mapping | None = None, backend: str | None = None) -> None:
    """Pin the task's GPUs, select the Keras backend and size its thread pools, once per process.

    Args:
        num_threads: intra-op threads (the task's CPUs, ``TaskContext.cpus()``); ``None`` keeps
            the backend's default. Inter-op threads are set to 1 in that case: a training step is a
            chain of ops. Later calls with another value are ignored, as the backends allow one setting.
        resources: the task's ``TaskContext.resources()``; its ``"gpu"`` addresses are pinned with
            :func:`pin_gpus` on every call (a reused worker is checked each time). ``None``: no GPUs.
        backend: the Keras backend (``"tensorflow"``, ``"jax"``, ``"torch"``; the tasks pass the
            driver's :func:`keras_backend`), set as ``KERAS_BACKEND`` before Keras is imported.
            ``None``: the backend of the Keras already imported, else ``KERAS_BACKEND``, else tensorflow.

    Raises:
        ConfigError: from :func:`pin_gpus`, before the backend is imported; an unknown backend; a
            worker whose Keras runs on another backend than ``backend`` (:func:`check_backend_reuse`).
    """
    global _configured_threads
    if resources is not None:
        pin_gpus(resources)
    if backend is None:
        backend = keras_backend()
    check_backend(backend)
    check_backend_reuse(_loaded_backend(), backend)
    os.environ["KERAS_BACKEND"] = backend
    if backend == "tensorflow":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    elif backend == "jax":
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if _configured_threads is not None or num_threads is None:
        return
    if backend == "tensorflow":
        tf = import_tensorflow()
        try:
            tf.config.threading.set_intra_op_parallelism_threads(int(num_threads))
            tf.config.threading.set_inter_op_parallelism_threads(1)
            for gpu in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:
            pass  # TensorFlow already started in this process; keep its pools.
    elif backend == "jax":
        if "jax" not in sys.modules:  # XLA reads its flags once, when JAX starts
            flags = jax_xla_flags(os.environ.get("XLA_FLAGS"), int(num_threads))
            if flags:
                os.environ["XLA_FLAGS"] = flags
    else:
        import torch

        torch.set_num_threads(int(num_threads))
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # torch already ran inter-op work in this process; keep its pool.
    _configured_threads = int(num_threads)


def warm_up(num_threads: int | None, resources: Mapping | None, backend: str | None,
            then: Callable[[], None] | None = None) -> threading.Thread | None:
    """Start importing Keras and its backend in this Python worker, on a thread of its own, so
    that the training task this reused worker runs next finds them imported (a cold TensorFlow
    import takes seconds). :func:`configure` pins the task's GPUs and selects the backend on the
    calling thread; the thread sizes the backend's pools to ``num_threads`` (as a training task
    sizes them) and imports Keras.

    ``then`` runs on the thread after the import (the fit's replica built into this worker's cache:
    :func:`sparkdl.spark.training.tasks.warm_replica`), and also when Keras was imported before.

    Returns the thread (join it before the task ends), or None when there is nothing to do. A
    failure on it is left to the training task, which meets it again and reports it (a warm-up only).

    Raises:
        ConfigError: from :func:`configure`.
    """
    configure(None, resources, backend)
    if "keras" in sys.modules and then is None:
        return None

    def load() -> None:
        try:
            configure(num_threads, None, backend)
            import keras  # noqa: F401 - imports the backend too

            if then is not None:
                then()
        except Exception:  # noqa: BLE001 - the training task meets it again and reports the failure
            pass

    thread = threading.Thread(target=load, name="sparkdl-keras-import", daemon=True)
    thread.start()
    return thread


def describe() -> dict:
    """What :func:`configure` set in this process, read back from the environment and the active backend.

    Returns:
        ``{"backend": str`` (``keras.backend.backend()`` once Keras is imported, else what
        :func:`keras_backend` says), ``"cuda_visible_devices": str | None`` (the variable now),
        ``"gpu_addresses": [str]`` and ``"ordinals": [int]`` (the pinned task's; ``[]`` when nothing
        was pinned), ``"intra_op_threads": int``, ``"inter_op_threads": int`` (TensorFlow's settings,
        0 = its default; torch's ``get_num_threads``/``get_num_interop_threads``; JAX: both 1
        when ``XLA_FLAGS`` has ``--xla_cpu_multi_thread_eigen=false``, else 0 = its default),
        ``"gpus": int`` (GPUs the backend sees), ``"pid": int}``. Imports only the active backend.
    """
    backend = keras_backend()
    if backend == "jax":
        import jax

        single = _SINGLE_THREAD_XLA in os.environ.get("XLA_FLAGS", "")
        intra = inter = 1 if single else 0  # one op at a time, on the calling thread
        gpus = sum(1 for d in jax.devices() if d.platform in ("gpu", "cuda", "rocm"))
    elif backend == "torch":
        import torch

        intra, inter = int(torch.get_num_threads()), int(torch.get_num_interop_threads())
        gpus = int(torch.cuda.device_count())
    else:
        import tensorflow as tf

        intra = int(tf.config.threading.get_intra_op_parallelism_threads())
        inter = int(tf.config.threading.get_inter_op_parallelism_threads())
        gpus = len(tf.config.list_physical_devices("GPU"))
    plan = _pinned
    return {
        "backend": backend,
        "cuda_visible_devices": os.environ.get(VISIBLE_DEVICES),
        "gpu_addresses": list(plan.addresses) if plan else [],
        "ordinals": list(plan.ordinals) if plan else [],
        "intra_op_threads": intra,
        "inter_op_threads": inter,
        "gpus": gpus,
        "pid": os.getpid(),
    }


def keras_module():
    """Import and return ``keras`` after :func:`configure` has selected the backend (the one of an
    already imported Keras, else ``KERAS_BACKEND``, else tensorflow)."""
    configure()
    if keras_backend() == "tensorflow" and "keras" not in sys.modules:
        try:
            import_tensorflow()  # its start-up lines filtered before Keras imports it
        except ImportError:
            pass  # Keras' own import names what is missing
    import keras

    return keras
