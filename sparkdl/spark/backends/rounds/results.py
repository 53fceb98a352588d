"""The rows a round's tasks return to the driver (backend ``rounds``), and their reading.

A training task yields one *meta* row (rows and steps trained, the partition's row count, the
Keras metric variable sums), then its update as *pieces* of at most 16 MiB
(:mod:`sparkdl.core.pieces`): its weights (group 0) and optimizer state (group 1), or, quantized
(1bit, threshold), its payload's bytes in chunks; in a collected round also its own state
(group 2 residual, group 3 optimizer kept by the worker). The driver checks them
(:func:`read_round`): one meta row per partition, each with its counted rows, every piece
combined over every trained row, and combines them (unless the executors did, see
:mod:`sparkdl.spark.backends.rounds.reduce`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pyspark.sql.pandas.types import from_arrow_schema

from sparkdl.core.pieces import Piece, PieceMean, assemble, assemble_groups
from sparkdl.core.schedule import RoundPlan
from sparkdl.core.state import ModelState, WorkerLocal
from sparkdl.errors import InvariantError
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays

RESULT_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),  # the worker's partition
        ("piece", pa.int32()),  # META: the worker's meta row; COMPRESSED: a quantized chunk; >= 0: the piece's index, the reduction key
        ("rows", pa.int64()),  # rows trained (meta and pieces alike: the piece's weight)
        ("partition_rows", pa.int64()),  # meta: rows the partition holds
        ("steps", pa.int64()),  # meta: local steps run
        ("missing", pa.bool_()),  # meta: the partition was not in this worker's cache (nothing trained)
        ("grp", pa.int32()),  # piece: 0 weights, 1 optimizer state, 2 residual, 3 the worker's own optimizer state
        ("arr", pa.int32()),  # piece: array index in its group
        ("offset", pa.int64()),  # piece: first element; chunk: first byte
        ("shape", pa.string()),  # piece: the whole array's shape, JSON
        ("dtype", pa.string()),  # piece: numpy dtype.str
        ("payload", pa.binary()),  # piece: raw values; meta: Arrow IPC of the metric variable sums
        ("nbytes", pa.int64()),  # meta: bytes of the worker's update (what it sends)
        ("local_reset", pa.bool_()),  # meta: 1bit/threshold: the worker's residual and optimizer state were not found
        ("version", pa.int64()),  # meta of a collected round: the round its own state follows
        ("val_rows", pa.int64()),  # meta of a round that also validated: the partition's validation rows evaluated
        ("val_payload", pa.binary()),  # meta of such a round: Arrow IPC of their metric variable sums (null for no rows)
    ]
)
RESULT_SPARK_SCHEMA = from_arrow_schema(RESULT_SCHEMA)  # the jobs' return type: no DDL string for the JVM to parse
META = -1
COMPRESSED = -2  # a quantized update's bytes (1bit, threshold)
LOCAL = -3  # a piece of the worker's own state (a collected round): not combined
RESIDUAL, LOCAL_OPTIMIZER = 2, 3


def meta_row(partition: int, rows: int, partition_rows: int, steps: int, missing: bool = False, metrics=None, nbytes: int = 0,
             local_reset: bool = False, version: int | None = None, validation: tuple | None = None) -> pa.RecordBatch:
    """A task's meta row as a one-row batch of :data:`RESULT_SCHEMA` (``validation``: ``(rows,
    metric sums or None)`` of the validation the task ran with its round)."""
    row = {
        "partition": partition, "piece": META, "rows": rows, "partition_rows": partition_rows, "steps": steps, "missing": missing,
        "payload": encode_arrays(metrics) if metrics is not None else None, "nbytes": nbytes, "local_reset": local_reset,
        "version": version, "val_rows": validation[0] if validation is not None else None,
        "val_payload": encode_arrays(validation[1]) if validation is not None and validation[1] is not None else None,
    }
    return pa.RecordBatch.from_pylist([row], schema=RESULT_SCHEMA)


def chunk_batch(partition: int, rows: int, offset: int, chunk: bytes) -> pa.RecordBatch:
    """One chunk of a quantized update as a one-row batch of :data:`RESULT_SCHEMA`."""
    return pa.RecordBatch.from_pylist(
        [{"partition": partition, "piece": COMPRESSED, "rows": rows, "offset": offset, "payload": chunk}], schema=RESULT_SCHEMA
    )


def piece_batch(partition: int, rows: int, index: int, piece: Piece) -> pa.RecordBatch:
    """One piece as a one-row batch of :data:`RESULT_SCHEMA`, its payload the array's own memory
    (``index`` :data:`LOCAL` for a piece of the worker's own state)."""
    data = pa.py_buffer(piece.values)
    payload = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(np.array([0, data.size], np.int32)), data])
    columns = [
        pa.array([partition], pa.int32()), pa.array([index], pa.int32()), pa.array([rows], pa.int64()),
        pa.nulls(1, pa.int64()), pa.nulls(1, pa.int64()), pa.nulls(1, pa.bool_()),
        pa.array([piece.group], pa.int32()), pa.array([piece.array], pa.int32()), pa.array([piece.offset], pa.int64()),
        pa.array([piece.shape_json], pa.string()), pa.array([piece.dtype], pa.string()), payload, pa.nulls(1, pa.int64()),
        pa.nulls(1, pa.bool_()), pa.nulls(1, pa.int64()), pa.nulls(1, pa.int64()), pa.nulls(1, pa.binary()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=RESULT_SCHEMA)


def pieces_of(table: pa.Table) -> Iterator[tuple[Piece, int]]:
    """``(piece, rows)`` for each update piece row of ``table`` (not meta, chunks or own state),
    payloads read without a copy."""
    columns = {name: table.column(name).to_pylist() for name in ("piece", "grp", "arr", "offset", "shape", "dtype", "rows")}
    payloads = table.column("payload")
    for i, kind in enumerate(columns["piece"]):
        if kind < 0:
            continue
        values = payloads[i].as_buffer()
        piece = Piece(columns["grp"][i], columns["arr"][i], columns["offset"][i], tuple(json.loads(columns["shape"][i])),
                      columns["dtype"][i], values if values is not None else b"")
        yield piece, columns["rows"][i]


def _local_pieces(table: pa.Table) -> Iterator[Piece]:
    kinds = table.column("piece").to_numpy()
    for i in np.flatnonzero(kinds == LOCAL):
        row = table.slice(int(i), 1).to_pylist()[0]
        yield Piece(row["grp"], row["arr"], row["offset"], tuple(json.loads(row["shape"])), row["dtype"], row["payload"] or b"")


def meta_rows(table: pa.Table) -> pa.Table:
    """The meta rows of ``table``."""
    return table.take(np.flatnonzero(table.column("piece").to_numpy() == META))


@dataclass
class RoundOutcome:
    """What the driver takes from one round of backend ``rounds``.

    Attributes:
        workers: per partition ``(partition, rows, steps)``, sorted by partition.
        mean: the row-weighted mean of the trained workers' states (or of their fp16 updates,
            before decoding), None when no worker trained or when ``states`` is used.
        rows: rows trained in the round.
        metrics: each trained worker's metric variable sums.
        missing: partitions that were in no cache (the round must be run again over the data).
        nbytes: bytes of update pieces the workers sent (compressed when compression is on).
        states: per trained partition its own update (a state, an fp16 update, or a quantized
            payload's bytes), when the round is not combined into ``mean`` (per-worker modes,
            1bit/threshold, straggler-tolerant rounds).
        local_resets: 1bit/threshold workers that found no residual and optimizer state of theirs.
        local: a collected round: each trained worker's own state after it.
        dropped: straggler-tolerant rounds: the partitions whose updates came late and were dropped.
        rows_dropped: the rows those partitions trained in vain.
        validation: a round that also validated: per partition ``(validation rows, metric sums or None)``.
    """

    workers: list[tuple[int, int, int]]
    mean: ModelState | None
    rows: int
    metrics: list[list[np.ndarray]]
    missing: list[int]
    nbytes: int = 0
    states: dict | None = None
    local_resets: int = 0
    local: dict[int, WorkerLocal] = field(default_factory=dict)
    dropped: list[int] = field(default_factory=list)
    rows_dropped: int = 0
    validation: dict | None = None


def read_round(table: pa.Table, plan: RoundPlan, description: str, reduced: bool, partitions: list[int] | None = None,
               separate: bool = False) -> RoundOutcome:
    """Check a round's rows (one meta row per partition of ``partitions``, default all, each with
    its counted rows) and combine its pieces (already means when ``reduced`` on the executors), or
    with ``separate`` keep each partition's update apart (:attr:`RoundOutcome.states`).

    Raises:
        InvariantError: a partition missing or repeated, a partition that holds other rows than
            counted, a piece not combined over every trained row.
    """
    meta = meta_rows(table).to_pydict()
    expected = list(range(len(plan.partition_rows))) if partitions is None else sorted(partitions)
    if sorted(meta["partition"]) != expected:
        named = f"0..{len(expected) - 1}" if partitions is None else str(expected)
        raise InvariantError(f"{description} must return one update per partition {named}. Received partitions {sorted(meta['partition'])}")
    missing = sorted(p for p, m in zip(meta["partition"], meta["missing"], strict=True) if m)
    workers, metrics = [], []
    for i, partition in enumerate(meta["partition"]):
        if meta["partition_rows"][i] != plan.partition_rows[partition]:
            raise InvariantError(
                f"partition {partition} must hold the {plan.partition_rows[partition]} rows counted before "
                f"training. Received: {meta['partition_rows'][i]} rows in {description}"
            )
        workers.append((partition, meta["rows"][i], meta["steps"][i]))
        if meta["payload"][i] is not None:
            metrics.append(decode_arrays(meta["payload"][i]).arrays)
    workers.sort()
    rows = sum(w[1] for w in workers)
    nbytes = sum(n or 0 for n in meta["nbytes"])
    resets = sum(1 for r in meta["local_reset"] if r)
    if missing:
        return RoundOutcome(workers, None, rows, metrics, missing, nbytes, local_resets=resets)
    validation = {p: (n, decode_arrays(v).arrays if v is not None else None)
                  for p, n, v in zip(meta["partition"], meta["val_rows"], meta["val_payload"], strict=True) if n is not None} or None
    versions = {p: v for p, v in zip(meta["partition"], meta["version"], strict=True) if v is not None}
    if separate:
        trained = {p: n for p, n, _ in workers if n}
        states, local = _separate(table, trained, versions, description)
        return RoundOutcome(workers, None, rows, metrics, missing, nbytes, states=states, local_resets=resets, local=local,
                            validation=validation)
    if reduced:
        pieces = pieces_of(table)
    else:
        combined = PieceMean()
        for piece, piece_rows in pieces_of(table):
            combined.add(piece, piece_rows)
        del table  # the combined sums hold what is needed
        pieces = combined.results()  # each sum freed as it is assembled

    def checked(pairs):
        # Every piece must be the mean over every worker that trained: a piece a worker's update
        # lacks (lost, or recomputed differently after a fetch failure) breaks the total.
        for piece, piece_rows in pairs:
            if piece_rows != rows:
                raise InvariantError(
                    f"{description} must combine every piece over the {rows} rows trained. Received: piece "
                    f"{piece.key} combined over {piece_rows:g} rows"
                )
            yield piece

    mean = assemble(checked(pieces))
    return RoundOutcome(workers, mean if mean.weights else None, rows, metrics, missing, nbytes, local_resets=resets, validation=validation)


def _separate(table: pa.Table, trained: dict[int, int], versions: dict[int, int], description: str) -> tuple[dict, dict[int, WorkerLocal]]:
    """Each trained partition's own update from its rows (the state assembled from its pieces, or
    the bytes of its quantized payload, chunks in offset order), and the own state of each
    partition that sent one."""
    kinds = table.column("piece").to_numpy()
    partition_of = table.column("partition").to_numpy()
    states, local = {}, {}
    for partition in trained:
        rows = table.take(np.flatnonzero((partition_of == partition) & (kinds != META)))
        update = rows.take(np.flatnonzero(rows.column("piece").to_numpy() != LOCAL))
        if not update.num_rows:
            raise InvariantError(f"{description} must return the update of partition {partition}, which trained. Received: none")
        if update.column("piece")[0].as_py() == COMPRESSED:
            order = np.argsort(update.column("offset").to_numpy())
            states[partition] = b"".join(update.column("payload")[int(i)].as_py() for i in order)
        else:
            states[partition] = assemble(piece for piece, _ in pieces_of(update))
        if partition in versions:
            groups = assemble_groups(_local_pieces(rows))
            local[partition] = WorkerLocal(int(versions[partition]), groups.get(RESIDUAL), groups.get(LOCAL_OPTIMIZER))
    return states, local
