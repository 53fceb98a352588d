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


def epoch_order(rows: int, seed: int, epoch: int, partition: int, shuffle: bool) -> np.ndarray:
    """Row order of one partition in one epoch: a seeded permutation, or ``arange`` without shuffle.

    Returns:
        int64 array of shape ``(rows,)``.
    """
    if not shuffle:
        return np.arange(rows, dtype=np.int64)
    rng = np.random.default_rng([seed & 0xFFFFFFFF, epoch, partition])
    return rng.permutation(rows).astype(np.int64)
