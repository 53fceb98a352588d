"""What a worker keeps of its own between rounds: with ``compression`` ``"1bit"`` or
``"threshold"``, the error-feedback residual and the optimizer state that stays on the worker
(a :class:`~sparkdl.core.state.WorkerLocal`), on either backend.

A round's tasks are placed by cache locality but may run in any Python worker of the executor,
so the state is kept in this Python worker's cache and written to this executor's disk (Arrow
IPC, next to the partition's copy in :func:`~sparkdl.spark.partitions.spill_dir`). Each save is
a version: the global index of the round whose update it follows. A task reads the version the
driver names (the last round whose update from this partition the driver applied), so a retried
task, or a round whose update was dropped (a straggler), starts from the state the driver's
master reflects, never from an attempt the driver did not take. Versions older than the one
read are deleted. A partition run on another executor finds no state: the caller starts afresh
(zero residual, the master's optimizer state) and reports it.
"""

from __future__ import annotations

import os

from sparkdl.core.state import WorkerLocal
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays
from sparkdl.spark.partitions import WORKER_CACHE, spill_dir

PREFIX = "local"


START = "start"  # overlap: the start of a worker's next round (sharded)


def _path(fit_id: str, partition: int, version: int, kind: str = PREFIX) -> str:
    return os.path.join(spill_dir(fit_id), f"{kind}-{partition}-v{version}.arrow")


def save(fit_id: str, partition: int, local: WorkerLocal, kind: str = PREFIX) -> None:
    """Keep ``local`` as ``partition``'s state after round ``local.version`` (memory and disk; the
    file is written whole, then renamed, so a killed task never leaves half a version)."""
    WORKER_CACHE.put(fit_id, (kind, partition), local)
    path = _path(fit_id, partition, local.version, kind)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    names = [f"r/{i}" for i in range(len(local.residual or []))] + [f"o/{i}" for i in range(len(local.optimizer or []))]
    with open(temporary, "wb") as f:
        f.write(encode_arrays([*(local.residual or []), *(local.optimizer or [])], names))
    os.replace(temporary, path)


def load(fit_id: str, partition: int, version: int, kind: str = PREFIX) -> WorkerLocal | None:
    """``partition``'s state saved after round ``version``, or None when neither this Python
    worker nor this executor's disk holds it. Older versions are deleted."""
    held = WORKER_CACHE.get(fit_id, (kind, partition))
    local = held if held is not None and held.version == version else None
    if local is None:
        try:
            with open(_path(fit_id, partition, version, kind), "rb") as f:
                decoded = decode_arrays(f.read())
        except FileNotFoundError:
            decoded = None
        if decoded is not None:
            residual = [a for n, a in zip(decoded.names, decoded.arrays, strict=True) if n.startswith("r/")]
            optimizer = [a for n, a in zip(decoded.names, decoded.arrays, strict=True) if n.startswith("o/")]
            local = WorkerLocal(version, residual or None, optimizer or None)
    _prune(fit_id, partition, version, kind)
    return local


def _prune(fit_id: str, partition: int, keep_from: int, kind: str = PREFIX) -> None:
    directory = spill_dir(fit_id)
    prefix = f"{kind}-{partition}-v"
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith(prefix) and name.endswith(".arrow"):
            try:
                if int(name[len(prefix):-len(".arrow")]) < keep_from:
                    os.remove(os.path.join(directory, name))
            except (ValueError, FileNotFoundError):
                pass


def drop(fit_id: str, partition: int) -> None:
    """Forget ``partition``'s state (the fit's last round)."""
    for kind in (PREFIX, START):
        WORKER_CACHE.release(fit_id, (kind, partition))
        _prune(fit_id, partition, 2**62, kind)


def save_start(fit_id: str, partition: int, version: int, state) -> None:
    """``overlap``: keep the start of ``partition``'s round ``version`` + 1 (its carried contribution
    to round ``version``, a :class:`~sparkdl.core.state.ModelState`) as :func:`save` keeps its
    state; versions before ``version`` − 1 are deleted."""
    save(fit_id, partition, WorkerLocal(version, list(state.weights), None if state.optimizer is None else list(state.optimizer)), START)
    _prune(fit_id, partition, version - 1, START)


def load_start(fit_id: str, partition: int, version: int):
    """What :func:`save_start` kept for round ``version`` (a ``ModelState``), or None."""
    from sparkdl.core.state import ModelState

    local = load(fit_id, partition, version, START)
    return None if local is None else ModelState(list(local.residual or []), local.optimizer)
