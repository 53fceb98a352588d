"""Where a round's updates are combined: on the executors (a second stage, one combined update
reaches the driver whatever ``numWorkers`` is) or on the driver as they come; and the check,
before any job, that they fit ``spark.driver.maxResultSize``.

The executor-side reduction (:func:`reduce_pieces`) runs as ``groupBy("piece").applyInArrow``
over a round's rows (:mod:`sparkdl.spark.backends.rounds.results`): each piece of every worker's update
becomes one row holding their row-weighted mean (:class:`~sparkdl.core.pieces.PieceMean`).
"""

from __future__ import annotations

import pyarrow as pa

from sparkdl.core.pieces import PieceMean
from sparkdl.errors import ConfigError
from sparkdl.spark.session import conf_size
from sparkdl.spark.backends.rounds.results import RESULT_SCHEMA, meta_rows, pieces_of

# Rounds whose updates (workers x state bytes) exceed this, with more than two workers, are combined
# on the executors; smaller ones come to the driver as they are (a second stage costs ~0.1 s).
EXECUTOR_REDUCE_MIN_BYTES = 64 * 2**20


def reduce_pieces(table: pa.Table) -> pa.Table:
    """The executor-side reduction of one group of a round's rows (``groupBy("piece")``).

    Meta rows pass through unchanged; the pieces of one key from every worker become one row
    holding their row-weighted mean, with ``rows`` = their total rows and ``partition`` = -1.
    """
    meta = meta_rows(table)
    mean = PieceMean()
    for piece, rows in pieces_of(table):
        mean.add(piece, rows)
    out = [meta.cast(RESULT_SCHEMA)] if meta.num_rows else []
    for piece, rows in mean.results():
        row = {
            "partition": -1, "piece": int(table.column("piece")[0].as_py()), "rows": int(rows), "grp": piece.group,
            "arr": piece.array, "offset": piece.offset, "shape": piece.shape_json, "dtype": piece.dtype,
            "payload": bytes(piece.values),  # a lone worker's piece comes back as it came: an Arrow buffer
        }
        out.append(pa.Table.from_pylist([row], schema=RESULT_SCHEMA))
    return pa.concat_tables(out) if out else RESULT_SCHEMA.empty_table()


def _mib(n: int) -> int:
    return -(-n // 2**20)


def result_limit_bytes(spark) -> int:
    """``spark.driver.maxResultSize`` in bytes (0: no limit; default 1g), parsed as Spark parses
    sizes (a bare number in bytes), read through ``spark.conf`` on classic and Connect sessions.

    Raises:
        ConfigError: a value that is not a size such as ``512m`` or ``4g``.
    """
    return conf_size(spark, "spark.driver.maxResultSize", "1g")


def plan_reduction(limit: int, state_bytes: int, workers: int) -> bool:
    """Decide where a round's updates are combined, and refuse, before any job, a fit whose
    updates cannot reach the driver.

    Each worker returns ``state_bytes`` (weights plus optimizer state). Combined on the driver, a
    round brings ``workers × state_bytes`` to it; combined on the executors (a second stage, about
    0.1 s a round on ``local[2]``), one ``state_bytes``. The executors combine when there are more
    than two workers and the updates exceed :data:`EXECUTOR_REDUCE_MIN_BYTES`, or when
    ``spark.driver.maxResultSize`` would not hold them all.

    Args:
        limit: ``spark.driver.maxResultSize`` in bytes (:func:`result_limit_bytes`; 0: no limit).
        state_bytes: one worker's update (bytes).
        workers: partitions that train.

    Returns:
        True to combine on the executors.

    Raises:
        ConfigError: when even one combined update exceeds ``spark.driver.maxResultSize``, naming
            the size and the value to set.
    """
    total = workers * state_bytes
    on_executors = workers > 2 and total > EXECUTOR_REDUCE_MIN_BYTES
    if limit > 0 and not on_executors and total > limit:
        on_executors = workers > 1
    needed = state_bytes if on_executors else total
    if limit > 0 and needed > limit:
        value = f"{_mib(needed) + 64}m"
        raise ConfigError(
            f"a round's combined update ({needed} bytes of weights and optimizer state) must fit "
            f"spark.driver.maxResultSize ({limit} bytes): raise it to at least {value} "
            f"(--conf spark.driver.maxResultSize={value}, or 0 for no limit). Received: {needed} bytes"
        )
    return on_executors


def check_separate(limit: int, state_bytes: int, workers: int) -> None:
    """Refuse, before any job, a fit whose round brings every worker's whole update to the driver
    (per-worker modes, straggler-tolerant rounds) when they cannot fit ``spark.driver.maxResultSize``.

    Raises:
        ConfigError: naming the size needed and the value to set.
    """
    needed = workers * state_bytes
    if limit > 0 and needed > limit:
        value = f"{_mib(needed) + 64}m"
        raise ConfigError(
            f"this mode brings each worker's update ({state_bytes} bytes) to the driver every round: {workers} workers "
            f"need spark.driver.maxResultSize >= {value} (--conf spark.driver.maxResultSize={value}, or 0 for no limit). "
            f"Received: spark.driver.maxResultSize={limit} bytes"
        )
