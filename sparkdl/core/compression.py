"""Compressed updates: what a worker sends instead of its full-precision state.

With compression on, a worker sends its update Δ = W_worker − W_start (weights and optimizer state,
each relative to the state the round started from) instead of its state; the row-weighted mean of
the updates plus W_start equals the row-weighted mean of the states (the mean is linear), so every
mode's rule is unchanged. Pure numpy.

``"fp16"``: floating-point updates travel as float16 (half the bytes of float32); they are summed
in float64 and the mean is kept in float32 (:class:`~sparkdl.core.pieces.PieceMean`), so no
partial sum is ever held in float16 and summing many workers cannot overflow (Horovod's issue
1699). Values beyond float16's range (±65,504) cannot be sent: :func:`encode_update` refuses
them. Integer and bool arrays (an optimizer's iteration counter) travel as they are.

References:
    Seide, Fu, Droppo, Li, Yu. "1-Bit Stochastic Gradient Descent and its Application to
    Data-Parallel Distributed Training of Speech DNNs", Interspeech 2014 (compressed updates;
    its 1-bit quantizer with error feedback is not implemented yet).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sparkdl.core.state import ModelState
from sparkdl.errors import ConfigError, InvariantError

COMPRESSIONS = ("fp16",)
_FP16_MAX = float(np.finfo(np.float16).max)


def check_compression(value) -> str | None:
    """``None`` or a name of :data:`COMPRESSIONS`.

    Raises:
        ConfigError: for anything else.
    """
    if value is None or value in COMPRESSIONS:
        return value
    raise ConfigError(f"compression must be None or one of {list(COMPRESSIONS)}. Received: {value!r}")


def _encode(arrays: Sequence[np.ndarray], start: Sequence[np.ndarray], group: str) -> list[np.ndarray]:
    out = []
    for i, (new, old) in enumerate(zip(arrays, start, strict=True)):
        new = np.asarray(new)
        if new.dtype.kind != "f":
            out.append(new)
            continue
        delta = np.subtract(new, old, dtype=np.float64)
        if delta.size and np.abs(delta).max() > _FP16_MAX:
            raise InvariantError(
                f"an fp16 update must stay within ±{_FP16_MAX:g}. Received: {group} array {i} changed by up to "
                f"{np.abs(delta).max():g} in one round (use compression=None, or fewer local steps)"
            )
        out.append(delta.astype(np.float16))
    return out


def encode_update(state: ModelState, start: ModelState, method: str) -> ModelState:
    """The update a worker sends: float arrays as Δ = state − start in float16, the others as they are.

    Args:
        state: the worker's weights and optimizer state after its local steps.
        start: the state the round started from (``start.optimizer`` None: a fresh optimizer,
            whose state then travels uncompressed).
        method: ``"fp16"``.

    Raises:
        InvariantError: a change beyond float16's range.
    """
    if method != "fp16":
        raise ConfigError(f"compression must be one of {list(COMPRESSIONS)}. Received: {method!r}")
    weights = _encode(state.weights, start.weights, "weight")
    if state.optimizer is None:
        return ModelState(weights, None)
    optimizer = _encode(state.optimizer, start.optimizer, "optimizer") if start.optimizer is not None else list(state.optimizer)
    return ModelState(weights, optimizer)


def _decode(mean: Sequence[np.ndarray], start: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = []
    for delta, old in zip(mean, start, strict=True):
        old = np.asarray(old)
        out.append((old + np.asarray(delta, np.float64)).astype(old.dtype) if old.dtype.kind == "f" else np.asarray(delta))
    return out


def decode_mean(mean: ModelState, start: ModelState) -> ModelState:
    """The row-weighted mean of the workers' states from the mean of their updates: start + Δ̄, in
    the start state's dtypes (the optimizer state as it came when the round started without one)."""
    weights = _decode(mean.weights, start.weights)
    if mean.optimizer is None or start.optimizer is None:
        return ModelState(weights, mean.optimizer)
    return ModelState(weights, _decode(mean.optimizer, start.optimizer))
