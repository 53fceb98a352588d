"""Which GPUs a Spark task may use, as the ``CUDA_VISIBLE_DEVICES`` value to set before a backend starts.

Spark assigns GPUs to tasks when ``spark.task.resource.gpu.amount`` is set (Spark's resource
scheduling: ``spark.executor.resource.gpu.amount``, ``spark.executor.resource.gpu.discoveryScript``);
a task reads its addresses from ``TaskContext.get().resources()["gpu"].addresses``. Spark only
schedules them: nothing stops TensorFlow from taking every GPU the executor can see. So each task
restricts its Python worker to its own addresses through ``CUDA_VISIBLE_DEVICES`` before the
backend initialises CUDA; inside the process they are then device ordinals ``0 .. n-1``
(``/GPU:0``), whatever their physical numbers.

Addresses and an inherited ``CUDA_VISIBLE_DEVICES`` (set by YARN, Kubernetes' device plugin or the
administrator, e.g. ``4,5,6,7``): an address that appears in the inherited list is that device's
own id (Spark's ``getGpusResources.sh`` prints ``nvidia-smi`` indices, which ignore the variable),
so with ``2,3`` inherited, address ``3`` is device ``3``; otherwise addresses are positions in the
inherited list (a discovery script that numbers the visible devices ``0 .. n-1``), so with
``4,5,6,7`` inherited, addresses ``1, 3`` are devices ``5, 7``. The whole list is read one way.
Numeric addresses are normalised (``"01"`` is ``1``); ``GPU-<uuid>``/``MIG-<uuid>`` addresses
are absolute and kept as they are.

A Python worker pins once: TensorFlow reads ``CUDA_VISIBLE_DEVICES`` when it initialises CUDA and
never again. Spark reuses Python workers between tasks (``spark.python.worker.reuse``, on by
default), and with several GPUs per executor a reused worker may get a task with other addresses:
:func:`check_reuse` then refuses it, naming both lists, instead of training on another task's GPU.

Pure functions: no Spark, no TensorFlow, no numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sparkdl.errors import ConfigError

GPU_RESOURCE = "gpu"
TASK_AMOUNT_CONF = "spark.task.resource.gpu.amount"
EXECUTOR_AMOUNT_CONF = "spark.executor.resource.gpu.amount"
DISCOVERY_CONF = "spark.executor.resource.gpu.discoveryScript"
REUSE_CONF = "spark.python.worker.reuse"
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
_UUID_PREFIXES = ("GPU-", "MIG-")


class GpuPlan(NamedTuple):
    """The devices one task pins.

    Attributes:
        visible_devices: the ``CUDA_VISIBLE_DEVICES`` value to set (comma-separated device ids, e.g.
            ``"5,7"``), or ``None``: no GPU resource, leave the variable as it is (CPU task).
        ordinals: the in-process device ordinals of those devices, ``(0, 1, ..., n-1)``; ``()`` on CPU.
        addresses: the task's Spark addresses, normalised, in Spark's order; ``()`` on CPU.
    """

    visible_devices: str | None
    ordinals: tuple[int, ...]
    addresses: tuple[str, ...] = ()

    @property
    def on_gpu(self) -> bool:
        return self.visible_devices is not None


CPU = GpuPlan(None, (), ())


def _no_gpu_error(addresses) -> ConfigError:
    return ConfigError(
        f"a task that requests GPUs ({TASK_AMOUNT_CONF}) must be given at least one GPU address by Spark; check that "
        f"{EXECUTOR_AMOUNT_CONF} is set and that the discovery script ({DISCOVERY_CONF}, e.g. "
        "$SPARK_HOME/examples/src/main/scripts/getGpusResources.sh) prints the executor's GPUs as "
        '{"name": "gpu", "addresses": ["0", ...]}. Received: '
        f"TaskContext.resources()['gpu'].addresses={list(addresses) if addresses is not None else None}"
    )


def _normalise(address: str, addresses) -> str:
    text = str(address).strip()
    if text.startswith(_UUID_PREFIXES) and len(text) > 4:
        return text
    if not text.isdigit():  # also refuses "-1" and "": no device ordinal
        if text == "":
            raise _no_gpu_error(addresses)
        raise ConfigError(
            "a GPU address must be a device index (a non-negative integer) or a GPU-/MIG- UUID, as the discovery script "
            f"({DISCOVERY_CONF}) prints it. Received: {address!r} in {list(addresses)}"
        )
    return str(int(text))


# How a task's numeric GPU addresses read under an inherited CUDA_VISIBLE_DEVICES that is not 0..n-1,
# when an address could be either: set on the executors (spark.executorEnv.SPARKDL_GPU_ADDRESSES).
ADDRESS_MODE_ENV = "SPARKDL_GPU_ADDRESSES"
ADDRESS_MODES = ("ids", "positions")


def plan_gpus(addresses: Sequence[str] | None, inherited: str | None, required: bool, mode: str | None = None) -> GpuPlan:
    """The ``CUDA_VISIBLE_DEVICES`` value and in-process ordinals of a task's GPU addresses.

    Args:
        addresses: ``TaskContext.resources()["gpu"].addresses`` (strings, e.g. ``["1", "3"]``), or
            ``None``/``[]`` when the task has no GPU resource.
        inherited: the executor's own ``CUDA_VISIBLE_DEVICES`` before any pinning (``None``: unset),
            a comma-separated list of device indices or UUIDs.
        required: whether the task requested GPUs (``spark.task.resource.gpu.amount`` set: Spark then
            puts ``"gpu"`` in its resources).
        mode: ``"ids"`` (addresses are device ids in ``inherited``) or ``"positions"`` (indices into
            it); ``None`` decides from the addresses and refuses an address that could be either and
            would pick another device each way, so that sibling tasks never read one list two ways
            and share a GPU (the executors' ``SPARKDL_GPU_ADDRESSES`` environment variable sets it).

    Returns:
        :class:`GpuPlan`: ``visible_devices`` the devices in Spark's order (mapped through
        ``inherited``, see the module docstring), ``ordinals`` ``(0, ..., n-1)``; :data:`CPU`
        (nothing to pin) when there are no addresses and GPUs are not required.

    Raises:
        ConfigError: GPUs required but no address, or an empty address (``[""]``: naming
            ``spark.task.resource.gpu.amount`` and the discovery script); an address that is neither
            an index nor a UUID; the same device twice; a position beyond the inherited list (naming both).

    Examples:
        ``plan_gpus(["1", "3"], None, True)`` is ``("1,3", (0, 1))``;
        ``plan_gpus(["1", "3"], "4,5,6,7", True)`` is ``("5,7", (0, 1))``;
        ``plan_gpus(["3"], "2,3", True)`` is ``("3", (0,))``.
    """
    if addresses is None or len(addresses) == 0:
        if required:
            raise _no_gpu_error(addresses)
        return CPU
    names = [_normalise(a, addresses) for a in addresses]
    if len(set(names)) != len(names):
        raise ConfigError(f"a task's GPU addresses must be distinct devices. Received: {list(addresses)}")
    devices = names
    if inherited is not None:
        visible = [d.strip() for d in inherited.split(",") if d.strip()]
        canonical = [str(int(d)) if d.isdigit() else d for d in visible]
        if mode not in (None, *ADDRESS_MODES):
            raise ConfigError(f"{ADDRESS_MODE_ENV} must be one of {list(ADDRESS_MODES)}. Received: {mode!r}")
        ambiguous = [n for n in names if n in canonical and n.isdigit() and int(n) < len(visible) and canonical[int(n)] != n]
        if mode is None and ambiguous:
            raise ConfigError(
                f"a task's GPU addresses must read one way under the executor's {VISIBLE_DEVICES}={inherited!r}: "
                f"{ambiguous} are both device ids in it and positions of other devices, so tasks of one executor could "
                f"share a GPU. Set spark.executorEnv.{ADDRESS_MODE_ENV}=ids (the discovery script prints device ids, as "
                f"getGpusResources.sh does) or =positions (it numbers the visible devices from 0). Received: addresses {list(addresses)}"
            )
        if mode == "ids" or (mode is None and all(n in canonical for n in names)):  # device ids, as nvidia-smi prints them
            missing = [n for n in names if n not in canonical]
            if missing:
                raise ConfigError(
                    f"a task's GPU addresses must be device ids in the executor's {VISIBLE_DEVICES} ({ADDRESS_MODE_ENV}=ids). "
                    f"Received: addresses {list(addresses)} with {VISIBLE_DEVICES}={inherited!r} ({missing} not in it)"
                )
            devices = [visible[canonical.index(n)] for n in names]
        else:
            outside = [n for n in names if not n.isdigit() or int(n) >= len(visible)]
            if outside:
                raise ConfigError(
                    f"a task's GPU addresses must be devices of the executor's {VISIBLE_DEVICES}: ids in it, or positions "
                    f"0..{len(visible) - 1} in it. Received: addresses {list(addresses)} with {VISIBLE_DEVICES}={inherited!r} "
                    f"({outside} neither)"
                )
            devices = [visible[int(n)] for n in names]
    return GpuPlan(",".join(devices), tuple(range(len(devices))), tuple(names))


def check_reuse(pinned: GpuPlan | None, wanted: GpuPlan, backend_started: bool) -> bool:
    """Whether a Python worker must set ``CUDA_VISIBLE_DEVICES`` now for a task that wants ``wanted``.

    Args:
        pinned: what this process pinned for an earlier task (``None``: nothing yet).
        wanted: this task's plan (:func:`plan_gpus`).
        backend_started: whether a Keras backend (TensorFlow, JAX, torch) is already imported in
            this process: it has read the variable and will not read it again.

    Returns:
        ``True``: set the variable to ``wanted.visible_devices``; ``False``: nothing to do (a CPU
        task, or the devices already pinned, or a CPU task in a worker pinned earlier: it keeps them).

    Raises:
        ConfigError: the backend started with other devices than this task's (a reused Python
            worker, or a backend imported before sparkdl pinned), naming ``spark.python.worker.reuse``
            and both address lists.
    """
    if not wanted.on_gpu:
        return False
    current = pinned.visible_devices if pinned is not None else None
    if current == wanted.visible_devices:
        return False
    if not backend_started:
        return True
    before = list(pinned.addresses) if pinned is not None and pinned.on_gpu else "none (the backend started unpinned)"
    raise ConfigError(
        f"a Python worker must keep the GPUs its backend started with: TensorFlow reads {VISIBLE_DEVICES} once per "
        f"process. Set {REUSE_CONF}=false when an executor has several GPUs (one GPU per executor can keep reuse on). "
        f"Received: a task with GPU addresses {list(wanted.addresses)} in a worker that started on GPU addresses {before}"
    )


def gpu_conf_warnings(get) -> list[str]:
    """Spark GPU settings that make tasks share or switch GPUs, read before a fit.

    Args:
        get: ``key -> value or None`` over the application's Spark conf (``lambda k: spark.conf.get(k, None)``).

    Returns:
        One message per problem (``[]`` when none): ``spark.executor.resource.gpu.amount`` set without
        ``spark.task.resource.gpu.amount`` (tasks get no address, so every task's backend sees every GPU of
        its executor and they all start on the first), and several GPUs and several GPU tasks per executor with
        ``spark.python.worker.reuse`` on (a reused Python worker may be handed another GPU than the one its
        backend started on: :func:`check_reuse` then fails the task).
    """

    def number(key: str) -> float | None:
        value = get(key)
        try:
            return float(value) if value not in (None, "") else None
        except ValueError:
            return None

    executor, task = number(EXECUTOR_AMOUNT_CONF), number(TASK_AMOUNT_CONF)
    problems = []
    if executor and not task:
        problems.append(
            f"{EXECUTOR_AMOUNT_CONF}={get(EXECUTOR_AMOUNT_CONF)} but {TASK_AMOUNT_CONF} is not set: Spark gives the tasks no "
            f"GPU address, so sparkdl pins none and every task's TensorFlow sees all GPUs of its executor; set {TASK_AMOUNT_CONF}=1"
        )
    reuse = str(get(REUSE_CONF) or "true").strip().lower() == "true"
    if executor and task and executor > 1 and executor / task > 1 and reuse:  # tasks on one GPU share its address: fine
        problems.append(
            f"{EXECUTOR_AMOUNT_CONF}={get(EXECUTOR_AMOUNT_CONF)} with {TASK_AMOUNT_CONF}={get(TASK_AMOUNT_CONF)} runs several GPU tasks "
            f"per executor, and with {REUSE_CONF}=true a reused Python worker may be handed another GPU than the one TensorFlow "
            f"started on (that task then fails): use one GPU per executor ({EXECUTOR_AMOUNT_CONF}=1), or {REUSE_CONF}=false"
        )
    return problems
