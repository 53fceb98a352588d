"""Which rows each worker trains on in each round: a stateless, seeded schedule.

Every worker derives its batches from (seed, epoch, partition, round) alone, so a task
that is retried, or runs in another Python worker, trains on exactly the same rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RoundPlan:
    """The round layout of one fit.

    Each epoch, worker i passes once over its nᵢ rows in Sᵢ = ceil(nᵢ / batch_size) local
    steps (the last batch may be partial, as in ``keras.Model.fit``). An epoch is cut into
    ``rounds_per_epoch`` = ceil(max Sᵢ / τ) rounds of τ steps; a worker whose partition is
    exhausted runs 0 steps in the remaining rounds of the epoch.

    Args:
        partition_rows: nᵢ, rows of each partition, indexed by Spark partition id.
        batch_size: rows per step.
        local_steps: τ; ``None`` for one pass over the largest partition (one round per epoch).
    """

    partition_rows: tuple[int, ...]
    batch_size: int
    local_steps: int | None = None

    def steps_per_epoch(self, partition: int) -> int:
        return math.ceil(self.partition_rows[partition] / self.batch_size)

    @property
    def max_steps_per_epoch(self) -> int:
        return max(self.steps_per_epoch(p) for p in range(len(self.partition_rows)))

    @property
    def tau(self) -> int:
        """τ, the local steps per round (>= 1)."""
        return self.local_steps or max(1, self.max_steps_per_epoch)

    @property
    def rounds_per_epoch(self) -> int:
        return max(1, math.ceil(self.max_steps_per_epoch / self.tau))

    def row_range(self, partition: int, round_in_epoch: int) -> tuple[int, int]:
        """Positions [start, stop) in the epoch's row order that ``partition`` trains on in a round."""
        n = self.partition_rows[partition]
        start = min(n, round_in_epoch * self.tau * self.batch_size)
        stop = min(n, (round_in_epoch + 1) * self.tau * self.batch_size)
        return start, stop

    def round_rows(self, round_in_epoch: int) -> int:
        """Rows all workers together train on in round ``round_in_epoch`` of an epoch."""
        return sum(stop - start for start, stop in (self.row_range(p, round_in_epoch) for p in range(len(self.partition_rows))))


def epoch_order(rows: int, seed: int, epoch: int, partition: int, shuffle: bool) -> np.ndarray:
    """Row order of one partition in one epoch: a seeded permutation, or ``arange`` without shuffle.

    Returns:
        int64 array of shape ``(rows,)``.
    """
    if not shuffle:
        return np.arange(rows, dtype=np.int64)
    rng = np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, epoch, partition])  # all 64 bits, as seed_round
    return rng.permutation(rows).astype(np.int64)


_FINGERPRINT_SEED = 0x5EED5D1


class RowFingerprints:
    """Per-row 64-bit fingerprints of several arrays, fed a chunk of rows at a time, and the row
    order they give: an order that depends only on the rows' values, not on the order they arrived
    in. Rows that reach a partition through a shuffle come in fetch order, which varies from run to
    run; sorting them by fingerprint, the first array first, makes the seeded epoch order, and so
    training, repeatable. Equal rows are interchangeable, so their relative order does not matter.

    Each array's rows are hashed by a random linear hash over their 64-bit words (coefficients
    drawn from a fixed seed, array by array), so the same rows give the same fingerprints however
    they are chunked: a partition can be ordered while its batches are converted, without a
    second pass.

    Args:
        rows_like: per array ``(per-row shape, dtype)``, e.g. ``[((784,), "float32"), ((), "int64")]``.
        exact: how many leading arrays are hashed in their own dtype; the others as float64.
    """

    def __init__(self, rows_like, exact: int = 1) -> None:
        rng = np.random.default_rng(_FINGERPRINT_SEED)
        self._arrays = []
        for i, (shape, dtype) in enumerate(rows_like):
            cast = None if i < exact else np.dtype(np.float64)
            row_bytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(cast or dtype).itemsize
            width = -(-row_bytes // 8) * 8
            coefficients = rng.integers(1, 2**63, size=width // 8, dtype=np.uint64) | np.uint64(1)
            self._arrays.append((cast, row_bytes, width, coefficients))
        self._parts: list[list[np.ndarray]] = [[] for _ in self._arrays]

    def add(self, arrays, chunk_rows: int = 4096) -> None:
        """Hash the next rows of every array (``arrays[i]`` of shape ``(n, *shape_i)``)."""
        for (cast, row_bytes, width, coefficients), array, parts in zip(self._arrays, arrays, self._parts, strict=True):
            for start in range(0, len(array), chunk_rows):
                part = np.asarray(array[start : start + chunk_rows])
                raw = np.ascontiguousarray(part if cast is None else part.astype(cast)).reshape(len(part), -1).view(np.uint8)
                block = np.zeros((len(part), width), np.uint8)
                block[:, :row_bytes] = raw.reshape(len(part), -1)
                parts.append((block.view(np.uint64) * coefficients).sum(axis=1, dtype=np.uint64))

    def order(self) -> np.ndarray:
        """The permutation sorting the rows by fingerprint, the first array first (int64, ``(rows,)``)."""
        keys = [np.concatenate(parts) if parts else np.zeros(0, np.uint64) for parts in self._parts]
        if not keys or len(keys[0]) == 0:
            return np.zeros(0, np.int64)
        return np.lexsort(keys[::-1]).astype(np.int64)
