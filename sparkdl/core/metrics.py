"""Exact epoch metrics: the workers' Keras metric variables summed, and a Keras-style history.

Keras computes an epoch's metrics by resetting each metric's variables once and updating them
batch after batch; every built-in metric's state is additive (a Mean's ``total``/``count``,
AUC's confusion-matrix buckets, Precision/Recall's true/false positive counts), so the state
after an epoch split across workers and rounds is the element-wise sum of each piece's state
started from zero. :class:`MetricSums` holds that sum; ``sparkdl.keras.metrics.MetricReader``
turns it into values as Keras would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from sparkdl.errors import CodecError


class MetricSums:
    """Element-wise sum of metric variable lists, one list per worker and round.

    Each list holds the values of ``keras.Model.metrics_variables`` in model order, e.g. for
    ``metrics=["accuracy", "AUC"]`` eight arrays: ``loss/total`` ``()``, ``loss/count`` ``()``,
    ``accuracy/total``, ``accuracy/count``, then AUC's four ``(200,)`` buckets. Sums are kept in
    float64 (integer variables in int64) so row counts stay exact.
    """

    def __init__(self, sums: Sequence[np.ndarray] | None = None) -> None:
        self._sums: list[np.ndarray] | None = None if sums is None else [np.array(s) for s in sums]

    def add(self, variables: Sequence[np.ndarray]) -> None:
        """Add one worker's metric variables.

        Raises:
            CodecError: (a ``ValueError``) when the count or a shape differs from what was added before.
        """
        arrays = [np.asarray(v) for v in variables]
        if self._sums is None:
            self._sums = [a.astype(np.int64 if a.dtype.kind in "iub" else np.float64, copy=True) for a in arrays]
            return
        if len(arrays) != len(self._sums):
            raise CodecError(
                f"every worker must return as many metric variables as the others ({len(self._sums)}). "
                f"Received: {len(arrays)} arrays"
            )
        for i, (total, array) in enumerate(zip(self._sums, arrays)):
            if array.shape != total.shape:
                raise CodecError(
                    f"metric variable {i} must have the same shape from every worker ({total.shape}). "
                    f"Received: shape {array.shape}"
                )
        self._sums = [total + array for total, array in zip(self._sums, arrays)]

    def total(self) -> list[np.ndarray] | None:
        """The element-wise sums (copies), or None when nothing was added."""
        return None if self._sums is None else [s.copy() for s in self._sums]


def append_epoch(history: dict[str, list[float]], metrics: Mapping[str, float]) -> None:
    """Append one epoch's metric values to a ``{"loss": [...], ...}`` history, as ``keras.callbacks.History``."""
    for name, value in metrics.items():
        history.setdefault(name, []).append(float(value))
