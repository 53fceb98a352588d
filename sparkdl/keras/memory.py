"""What Keras models hold in bytes, and when a dropped one is collected: numpy alone, so that a replica
imports without pyarrow (``benchmarks/gpu_check.py``)."""

from __future__ import annotations

import gc

import numpy as np


#: Dropped Keras models (each a cycle of layers and model: its variables go back to the backend only
#: with a collection) are collected once they hold this many bytes together (:func:`release_cycles`);
#: until then they are left to the collector's own pace, since a full collection of a driver with
#: pyspark and TensorFlow loaded (some 450,000 objects) takes 0.1–0.8 s, on the fit's path.
COLLECT_BYTES = 64 * 2**20


def variables_nbytes(variables) -> int:
    """Bytes of Keras variables (or arrays): the sum of their shapes' sizes times their items' bytes."""
    return sum(int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize for v in variables)


def weights_nbytes(model) -> int:
    """Bytes of a model's weights (``model.weights``), without building its optimizer."""
    return variables_nbytes(model.weights)


def held_nbytes(model) -> int:
    """Bytes a model holds: its weights and, once built, its optimizer's variables (an Adam's: twice the
    trainable weights more)."""
    optimizer = getattr(model, "optimizer", None)
    built = list(optimizer.variables) if optimizer is not None and getattr(optimizer, "built", False) else []
    return weights_nbytes(model) + variables_nbytes(built)


_skipped = [0]  # bytes of dropped models left to the collector's pace since the last collection here


def release_cycles(nbytes: int) -> bool:
    """A full garbage collection when the models dropped since the last one (this one of ``nbytes``
    bytes, int, included) hold :data:`COLLECT_BYTES` or more together; returns whether it ran."""
    _skipped[0] += nbytes
    if _skipped[0] < COLLECT_BYTES:
        return False
    _skipped[0] = 0
    gc.collect()
    return True
