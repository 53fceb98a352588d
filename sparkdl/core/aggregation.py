"""Row-weighted averaging of weight lists, the reduction of synchronous model averaging.

The rule is W = Σᵢ nᵢ·Wᵢ / Σᵢ nᵢ, where nᵢ is the number of rows worker i trained on in
the round (SparkNet, Moritz et al. 2016, "SparkNet: Training Deep Networks in Spark";
Su & Chen 2015, "Experiments on parallel training of deep neural network using model
averaging"). It is applied to every variable alike, trainable or not (BatchNorm moving
statistics), and to optimizer state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class WeightedMean:
    """Streaming row-weighted mean of lists of arrays; holds one float64 sum, not N copies.

    Each call to :meth:`add` takes one worker's list of arrays (any shapes, any numeric or
    bool dtypes) and its weight (rows, >= 0). :meth:`result` returns the mean in the first
    list's dtypes: floats are cast back, integers rounded to nearest, bools thresholded at 0.5.

    Raises:
        ValueError: on a negative weight, or a list whose length, shapes or dtypes differ from
            the first one's.
    """

    def __init__(self) -> None:
        self._sums: list[np.ndarray] | None = None
        self._dtypes: list[np.dtype] = []
        self.total_weight = 0.0

    def add(self, arrays: Sequence[np.ndarray], weight: float) -> None:
        if weight < 0:
            raise ValueError(f"weight must be >= 0 rows. Received: {weight!r}")
        if weight == 0:
            return
        if self._sums is None:
            self._dtypes = [np.asarray(a).dtype for a in arrays]
            # out=: a 0-d array times a number would become a numpy scalar, and later in-place
            # additions to it would be lost. dtype=float64: n·w exact for float32 w and n < 2**29.
            self._sums = [np.multiply(a, weight, dtype=np.float64, out=np.empty(np.shape(a), np.float64)) for a in arrays]
        else:
            if len(arrays) != len(self._sums):
                raise ValueError(
                    f"every worker must send the same number of arrays. "
                    f"Received: {len(arrays)}, expected {len(self._sums)}"
                )
            for i, (acc, a, dtype) in enumerate(zip(self._sums, arrays, self._dtypes, strict=True)):
                a = np.asarray(a)
                if a.shape != acc.shape or a.dtype != dtype:
                    raise ValueError(
                        f"array {i} must have shape {acc.shape} and dtype {dtype}. "
                        f"Received: shape {a.shape}, dtype {a.dtype}"
                    )
                np.add(acc, np.multiply(a, weight, dtype=np.float64), out=acc)
        self.total_weight += float(weight)

    def means(self) -> list[np.ndarray] | None:
        """The weighted means in float64, before any cast (``None`` when nothing was added)."""
        return None if self._sums is None else [acc / self.total_weight for acc in self._sums]

    def result(self) -> list[np.ndarray] | None:
        """The weighted mean, or ``None`` when nothing with a positive weight was added."""
        if self._sums is None:
            return None
        out = []
        for acc, dtype in zip(self._sums, self._dtypes, strict=True):
            mean = acc / self.total_weight
            if dtype == np.bool_:
                value = mean >= 0.5
            elif np.issubdtype(dtype, np.integer):
                value = np.rint(mean).astype(dtype)
            else:
                value = mean.astype(dtype)
            out.append(np.asarray(value))  # a 0-d mean comes back from numpy as a scalar
        return out
