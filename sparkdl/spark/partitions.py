"""A training task's partition on the executor: read once, kept for the fit, in memory or on disk.

The first round converts the partition's Arrow batches, one at a time, into arrays preallocated
to the rows counted by the check job (:class:`PartitionArrays`: one array per model input and
output, and the sample weights), hashing each batch's rows as it goes when they must be put in
canonical order (they came through the round-robin repartition,
:class:`~sparkdl.core.schedule.RowFingerprints`): the order is kept as a permutation (``base``),
never applied by copying. The partition stays in the Python worker's cache for the fit, plus a
copy as ``.npy`` files in Spark's per-application directory on the executor's disk, so another
Python worker of the same executor finds it without the data.

A partition larger than the task's memory budget (``maxTaskMemoryMB``) is never held in memory:
each converted batch is appended to the ``.npy`` files with plain writes, and training reads each
batch of rows from them with ``pread`` (:class:`FileArray`), so a worker's memory grows by a
batch, not by the partition. (Not ``numpy.memmap``: a page fault maps a whole page-cache folio,
and one random batch of 1,024 rows had 473 MB of a 514 MB file resident. Not Arrow IPC either:
one contiguous array per column lets a batch gather rows by index.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
from pyspark import SparkFiles

from sparkdl.core.cache import WorkerCache
from sparkdl.core.schedule import RowFingerprints
from sparkdl.errors import InvariantError
from sparkdl.serialization.columns import ModelColumns, PartitionArrays, class_weights_to_sample_weights, table_to_arrays
from sparkdl.spark.session import conf_get, default_parallelism, master, parse_size

WORKER_CACHE = WorkerCache(max_fits=4)
VALIDATION_FLAG = "__sparkdl_val"  # a boolean column: a validation row, where a fit's training and validation rows share a DataFrame


def split_validation(batches, kept: list):
    """``batches`` as they are, their validation rows (:data:`VALIDATION_FLAG`) also appended to
    ``kept`` as they go by: one pass over a partition that holds both a worker's training rows and
    its validation rows feeds both loads."""
    for batch in batches:
        if VALIDATION_FLAG in batch.schema.names:
            rows = batch.filter(batch.column(VALIDATION_FLAG))
            if rows.num_rows:
                kept.append(rows)
        yield batch


def role_rows(batches: Iterator[pa.RecordBatch], key: str) -> Iterator[pa.RecordBatch]:
    """``batches`` with the rows of ``key`` only (``"val"``: the validation rows, else the training
    rows) where a :data:`VALIDATION_FLAG` column tells them apart; unchanged otherwise."""
    for batch in batches:
        if VALIDATION_FLAG in batch.schema.names:
            flag = batch.column(VALIDATION_FLAG)
            batch = batch.filter(flag if key == "val" else pa.compute.invert(flag))
        yield batch


class FileArray:
    """A ``.npy`` file read by rows with ``os.pread``, never mapped: ``a[i:j]`` and ``a[indices]``
    return numpy arrays of those rows only (indices sorted, runs of consecutive rows read at once).

    Attributes:
        shape, dtype: the array's, from the file's header.
    """

    def __init__(self, path: str) -> None:
        with open(path, "rb") as file:
            version = np.lib.format.read_magic(file)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(file)
            self._offset = file.tell()
        if fortran:
            raise InvariantError(f"a partition file must be in C order. Received: {path} in Fortran order")
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self._row_shape = self.shape[1:]
        self._row_bytes = int(np.prod(self._row_shape, dtype=np.int64)) * self.dtype.itemsize
        self._fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.shape[0]

    def _read(self, start: int, count: int) -> np.ndarray:
        data = os.pread(self._fd, count * self._row_bytes, self._offset + start * self._row_bytes)
        return np.frombuffer(data, self.dtype, count=count * (self._row_bytes // self.dtype.itemsize) if self._row_bytes else 0).reshape((count, *self._row_shape))

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return self[np.arange(start, stop, step)]
            return self._read(start, max(0, stop - start)).copy()
        rows = np.asarray(key, dtype=np.int64)
        if rows.ndim == 0:
            return self._read(int(rows), 1)[0].copy()
        out = np.empty((len(rows), *self._row_shape), self.dtype)
        if not len(rows):
            return out
        if rows.min() < 0 or rows.max() >= len(self):
            raise IndexError(f"rows must be in [0, {len(self)}). Received: {rows.min()}..{rows.max()}")
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        breaks = np.flatnonzero(np.diff(ordered) != 1) + 1
        starts = ordered[np.concatenate(([0], breaks))].tolist()
        counts = np.diff(np.concatenate(([0], breaks, [len(rows)]))).tolist()
        size, base = self._row_bytes, self._offset
        # Every run of consecutive rows in one pread, joined once and scattered once (a random batch
        # is mostly one-row runs: per-run numpy work would cost more than the reads).
        joined = b"".join([os.pread(self._fd, n * size, base + start * size) for start, n in zip(starts, counts, strict=True)])
        out[order] = np.frombuffer(joined, self.dtype).reshape((len(rows), *self._row_shape))
        return out

    def __array__(self, dtype=None, copy=None):
        values = self._read(0, len(self))
        return values.astype(dtype) if dtype is not None else values.copy()

    def __del__(self) -> None:
        try:
            os.close(self._fd)
        except (OSError, AttributeError):
            pass


@dataclass
class Partition:
    """A partition ready to train on: ``arrays`` (numpy or :class:`FileArray`) and ``base``, the
    row permutation to read them through (None: the arrays are in training order already)."""

    arrays: PartitionArrays
    base: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrays)

    def rows(self, order: np.ndarray) -> np.ndarray:
        """Array indices of the positions ``order`` of the training order."""
        return order if self.base is None else self.base[order]


def row_bytes(columns: ModelColumns) -> int:
    """Bytes of one row once converted (every input, output and the weight), e.g. 3,144 for 784 float32 features and an int64 label."""
    tensors = (*columns.inputs, *columns.outputs)
    total = sum(int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize for t in tensors)
    return total + (4 if columns.weight is not None or columns.class_weight else 0)


def spill_dir(fit_id: str) -> str:
    """This executor's directory for the fit's partitions (inside Spark's per-application files
    directory, which Spark deletes when the application ends)."""
    return os.path.join(SparkFiles.getRootDirectory(), f"sparkdl-{fit_id}")


def _path(fit_id: str, key: str, partition: int, name: str) -> str:
    return os.path.join(spill_dir(fit_id), f"{key}-{partition}-{name}.npy")


def _layout(columns: ModelColumns) -> list[tuple[tuple, np.dtype]]:
    """Per array of :class:`PartitionArrays` (inputs, outputs, the weight column) its row shape and dtype."""
    arrays = [(tuple(t.shape), np.dtype(t.dtype)) for t in (*columns.inputs, *columns.outputs)]
    return arrays + ([((), np.dtype(np.float32))] if columns.weight is not None else [])


def _save(path: str, array: np.ndarray) -> None:
    """``np.save`` to a temporary name, renamed: readers never see half a file."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as file:  # a file object: np.save would append ".npy" to a name
        np.save(file, array)
    os.replace(temporary, path)


def _mark_complete(fit_id: str, key: str, partition: int, count: int, has_base: bool) -> None:
    _save(_path(fit_id, key, partition, "manifest"), np.array([count, int(has_base)], np.int64))


def _read(fit_id: str, key: str, partition: int, columns: ModelColumns) -> Partition | None:
    """The executor's disk copy of the partition, read by rows (:class:`FileArray`), or None."""
    try:
        count, has_base = np.load(_path(fit_id, key, partition, "manifest"))
        arrays = [FileArray(_path(fit_id, key, partition, f"a{i}")) for i in range(int(count))]
        base = np.load(_path(fit_id, key, partition, "base")) if has_base else None
    except (OSError, ValueError):
        return None
    return Partition(PartitionArrays.of(arrays, len(columns.inputs), len(columns.outputs)), base)


class _Sink:
    """Where converted batches go: arrays preallocated in memory, or ``.npy`` files appended to."""

    def __init__(self, layout, rows: int, paths: list[str] | None) -> None:
        self.rows, self.paths, self.filled = rows, paths, 0
        if paths is None:
            self.arrays = [np.empty((rows, *shape), dtype) for shape, dtype in layout]
            self.files = []
        else:
            self.files = []
            for path, (shape, dtype) in zip(paths, layout, strict=True):
                file = open(f"{path}.{os.getpid()}.tmp", "wb")
                header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (rows, *shape)}
                np.lib.format.write_array_header_2_0(file, header)
                self.files.append(file)

    def add(self, arrays: list[np.ndarray], partition: int) -> None:
        n = len(arrays[0])
        if self.filled + n > self.rows:
            self.close()
            raise InvariantError(
                f"partition {partition} must hold the {self.rows} rows counted before training. Received: more than "
                f"{self.rows} rows (the cached training data changed; is the input non-deterministic?)"
            )
        if self.paths is None:
            for target, values in zip(self.arrays, arrays, strict=True):
                target[self.filled : self.filled + n] = values
        else:
            for file, values in zip(self.files, arrays, strict=True):
                file.write(np.ascontiguousarray(values).data)  # the buffer itself, no copy
        self.filled += n

    def finish(self, partition: int) -> list:
        if self.filled != self.rows:
            self.close()
            raise InvariantError(
                f"partition {partition} must hold the {self.rows} rows counted before training. Received: {self.filled} rows "
                "(the cached training data changed; is the input non-deterministic?)"
            )
        if self.paths is None:
            return self.arrays
        self.close()
        for path in self.paths:
            os.replace(f"{path}.{os.getpid()}.tmp", path)
        return [FileArray(path) for path in self.paths]

    def close(self) -> None:
        for file in self.files:
            file.close()
        self.files = []


def _convert(fit_id: str, key: str, partition: int, columns: ModelColumns, batches, rows: int, on_disk: bool, ordered: bool):
    """Convert the partition's batches one at a time into a :class:`_Sink`; hash the rows on the way
    when ``ordered``. Returns ``(arrays, base)``."""
    layout = _layout(columns)
    if on_disk:
        os.makedirs(spill_dir(fit_id), exist_ok=True)
    sink = _Sink(layout, rows, [_path(fit_id, key, partition, f"a{i}") for i in range(len(layout))] if on_disk else None)
    fingerprints = RowFingerprints(layout, exact=len(columns.inputs)) if ordered else None
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            part = table_to_arrays(batch, columns).arrays
            if not len(part[0]):
                continue
            sink.add(part, partition)
            if fingerprints is not None:
                fingerprints.add(part)
    finally:
        for _ in batches:  # drain what is left (after an error), so Spark can reuse this Python worker
            pass
        if sink.filled != rows:
            sink.close()
    arrays = sink.finish(partition)
    return arrays, (fingerprints.order() if fingerprints is not None and rows else None)


def load_partition(fit_id: str, key: str, partition: int, columns: ModelColumns, batches: Iterator[pa.RecordBatch] | None,
                   rows: int, budget_bytes: int, ordered: bool, share: bool = True) -> Partition | None:
    """The partition's arrays: from this Python worker's cache, else from this executor's disk
    copy, else (with ``batches``, the cached data) converted, ordered and kept in both.

    Args:
        fit_id: the fit (cache and directory key).
        key: ``"train"`` or ``"val"``.
        partition: the partition id.
        columns: how to read the columns.
        batches: the partition's Arrow batches, or None when only a kept copy may be used.
        rows: rows the check job counted in this partition.
        budget_bytes: above ``rows × row_bytes(columns)`` of this, the partition stays on disk.
        ordered: order rows by content (they came through a round-robin repartition).
        share: keep a disk copy for the executor's other Python workers.

    Returns:
        :class:`Partition`, or None when ``batches`` is None and no copy exists (a new Python
        worker on another executor, a lost executor).

    Raises:
        InvariantError: the batches hold another number of rows than ``rows``.
    """
    cache_key = (key, partition)
    cached = WORKER_CACHE.get(fit_id, cache_key)
    if cached is None and share:
        cached = _read(fit_id, key, partition, columns)
        if cached is not None:
            WORKER_CACHE.put(fit_id, cache_key, cached)
    if cached is not None or batches is None:
        for _ in batches or ():  # drain the unread input, so Spark can reuse this Python worker
            pass
        return cached
    on_disk = rows * row_bytes(columns) > budget_bytes
    arrays, base = _convert(fit_id, key, partition, columns, role_rows(batches, key), rows, on_disk, ordered)
    data = PartitionArrays.of(arrays, len(columns.inputs), len(columns.outputs))
    if columns.class_weight:  # Keras class_weight as per-row sample weights, as keras.Model.fit derives them
        data.w = class_weights_to_sample_weights(np.asarray(data.y[0]), columns.class_weight)
    if on_disk or share:
        os.makedirs(spill_dir(fit_id), exist_ok=True)
        if not on_disk:
            for i, array in enumerate(data.arrays):
                _save(_path(fit_id, key, partition, f"a{i}"), array)
        elif columns.class_weight:  # the derived weights are small: kept with the files
            _save(_path(fit_id, key, partition, f"a{len(data.arrays) - 1}"), data.w)
        if base is not None:
            _save(_path(fit_id, key, partition, "base"), base)
        _mark_complete(fit_id, key, partition, len(data.arrays), base is not None)
    loaded = Partition(data, base)
    WORKER_CACHE.put(fit_id, cache_key, loaded)
    return loaded


def release(fit_id: str, key: str, partition: int) -> None:
    """Drop this partition (memory and disk); the fit's whole cache once no partition is left in
    this Python worker."""
    WORKER_CACHE.release(fit_id, (key, partition))
    directory = spill_dir(fit_id)
    prefix = f"{key}-{partition}-"
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
    except OSError:
        names = []
    for name in names:
        try:
            os.remove(os.path.join(directory, name))
        except OSError:
            pass
    try:
        os.rmdir(directory)
    except OSError:
        pass  # other partitions' files still there, or already gone
    if not any(isinstance(k, tuple) and k[0] in ("train", "val") for k in WORKER_CACHE.keys(fit_id)):
        WORKER_CACHE.release(fit_id)


def task_budget(spark, max_task_memory_mb: float | None) -> int:
    """A task's memory budget for its partition (bytes), read from ``spark``'s settings: see
    :func:`memory_budget`. Settings are read through ``spark.conf`` (classic and Spark Connect alike).

    Raises:
        ConfigError: a memory setting that is not a size such as ``512m`` or ``2g``.
    """
    if max_task_memory_mb is not None:
        return memory_budget(False, lambda key: None, 1, max_task_memory_mb)
    local = master(spark).startswith("local")
    return memory_budget(local, lambda key: conf_get(spark, key), default_parallelism(spark) if local else 1, None)


def memory_budget(local: bool, get, parallelism: int, max_task_memory_mb: float | None) -> int:
    """A task's memory budget for its partition (bytes): ``maxTaskMemoryMB`` when set; else the
    Python memory of an executor (``spark.executor.pyspark.memory``, else ``spark.executor.memory``;
    in local mode ``spark.driver.memory``; default 1g) divided by its task slots
    (``spark.executor.cores`` / ``spark.task.cpus``; in local mode ``parallelism``, Spark's default
    parallelism). Sizes are read as Spark reads them (a bare number in MiB).

    Args:
        local: a ``local`` master (any URL starting ``local``).
        get: ``key -> value as set, or None`` over the session's settings.
        parallelism: the default parallelism (read in local mode only).
        max_task_memory_mb: the ``maxTaskMemoryMB`` Param (MB), or None.

    Raises:
        ConfigError: a memory setting that is not a size such as ``512m`` or ``2g``.
    """
    if max_task_memory_mb is not None:
        return max(1, int(max_task_memory_mb * 2**20))

    def size_mb(key: str) -> int | None:
        value = get(key)
        return None if value is None else parse_size(value, "m", key) // 2**20

    if local:
        memory = size_mb("spark.driver.memory") or 1024
        slots = parallelism
    else:
        memory = size_mb("spark.executor.pyspark.memory") or size_mb("spark.executor.memory") or 1024
        slots = int(get("spark.executor.cores") or "1") // max(1, int(get("spark.task.cpus") or "1"))
    return max(1, memory * 2**20 // max(1, slots))
