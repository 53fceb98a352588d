"""Compressed updates: what a worker sends instead of its full-precision state.

With compression on, a worker sends its update Δ = W_worker − W_start (weights and optimizer state,
each relative to the state the round started from) instead of its state; the row-weighted mean of
the updates plus W_start equals the row-weighted mean of the states (the mean is linear), so every
mode's rule is unchanged. Pure numpy (and pyarrow for the quantized payloads).

``"fp16"``: floating-point updates travel as float16 (half the bytes of float32); they are summed
in float64 and the mean is kept in float32 (:class:`~sparkdl.core.pieces.PieceMean`), so no
partial sum is ever held in float16 and summing many workers cannot overflow (Horovod's issue
1699). Values beyond float16's range (±65,504) cannot be sent: :func:`encode_update` refuses
them. Integer and bool arrays (an optimizer's iteration counter) travel as they are.

``"1bit"`` and ``"threshold"`` (:data:`QUANTIZED`) quantize each float update with error feedback
(:func:`quantize`, :func:`dequantize`): the worker adds the residual it kept from its previous
round, v = Δ + residual, sends q = Q(v) and keeps v − q as its next residual, so what quantization
drops in one round is sent in a later one (over any number of rounds, the sum of the sent updates
plus the last residual equals the sum of the true updates). The residual never travels; the worker
holds it between rounds, with its optimizer state, which the quantized modes do not send (Adam's
second moments must stay positive, which a quantized difference does not guarantee). Integer and
bool arrays travel as they are, and so do the arrays marked ``exact`` (the backends mark the
model's non-trainable weights, e.g. BatchNorm's moving statistics: a shared reconstruction value
could turn a small variance negative).

- ``"1bit"`` (Seide et al. 2014): each array is viewed as a matrix of columns (shape
  ``(-1, shape[-1])``; a vector is one value per row, a scalar one value); each value sends one
  bit, v ≥ 0, and each column two float32 reconstruction values, the mean of its values with bit 1
  and the mean of those with bit 0 (the values minimising the squared error for that sign split).
  A float32 array of n values in c columns sends ⌈n/8⌉ + 8c bytes instead of 4n.
- ``"threshold"`` (Strom 2015): with threshold t (``compressionThreshold``), the values with
  |v| ≥ t are sent as ±t, as their flat indices (uint32, ascending) and one sign bit each; the
  others send nothing and stay in the residual. About 4.1 bytes per sent value.

A quantized payload is one Arrow IPC stream (:func:`~sparkdl.serialization.arrow_codec.encode_arrays`;
nothing is pickled): a header array ``"method:<method>"`` holding each entry's number of values, for
``"threshold"`` an array ``"threshold"`` holding t as float32, then per entry ``i`` either
``"i:bits"`` and ``"i:scales"`` (1bit), ``"i:idx"`` and ``"i:sign"`` (threshold), or ``"i:raw"``.

References:
    Seide, Fu, Droppo, Li, Yu. "1-Bit Stochastic Gradient Descent and its Application to
    Data-Parallel Distributed Training of Speech DNNs", Interspeech 2014 (1-bit quantization
    with error feedback; per-column reconstruction values).

    Strom. "Scalable Distributed DNN Training Using Commodity GPU Cloud Computing",
    Interspeech 2015 (threshold quantization with error feedback; sparse index + sign messages).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sparkdl.core.blockwise import BLOCKWISE
from sparkdl.core.state import ModelState
from sparkdl.errors import ConfigError, InvariantError
from sparkdl.param_specs import BY_NAME
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays

QUANTIZED = ("1bit", "threshold")
COMPRESSIONS = ("fp16", *QUANTIZED, *BLOCKWISE)  # int8, int4: backend sharded's blockwise differences (sparkdl.core.blockwise)
_FP16_MAX = float(np.finfo(np.float16).max)


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
        raise ConfigError(
            f"compression must be one of ['fp16'] for encode_update (the quantized methods {list(QUANTIZED)} "
            f"go through quantize). Received: {method!r}"
        )
    weights = _encode(state.weights, start.weights, "weight")
    if state.optimizer is None:
        return ModelState(weights, None)
    optimizer = _encode(state.optimizer, start.optimizer, "optimizer") if start.optimizer is not None else list(state.optimizer)
    return ModelState(weights, optimizer)


def _decode(mean: Sequence[np.ndarray], start: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = []
    for delta, old in zip(mean, start, strict=True):
        old = np.asarray(old)
        out.append(np.asarray((old + np.asarray(delta, np.float64)).astype(old.dtype)) if old.dtype.kind == "f" else np.asarray(delta))
    return out


def decode_mean(mean: ModelState, start: ModelState) -> ModelState:
    """The row-weighted mean of the workers' states from the mean of their updates: start + Δ̄, in
    the start state's dtypes (the optimizer state as it came when the round started without one)."""
    weights = _decode(mean.weights, start.weights)
    if mean.optimizer is None or start.optimizer is None:
        return ModelState(weights, mean.optimizer)
    return ModelState(weights, _decode(mean.optimizer, start.optimizer))


_MAX_INDEXED = 2**32  # threshold indices travel as uint32


def check_threshold(value) -> float:
    """``compressionThreshold`` as a float, held to the Param's declared rule
    (:mod:`sparkdl.param_specs`): a positive, finite real number within float32's range, since the
    sent values ±t travel as float32.

    Raises:
        ConfigError: for anything else (0, negatives, nan, inf, non-numbers).
    """
    BY_NAME["compressionThreshold"].check(value)
    return float(value)


def _columns(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, columns) of the matrix 1bit views an array of ``shape`` as."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], 1
    return math.prod(shape[:-1]), shape[-1]


def _quantize_1bit(i: int, v: np.ndarray, names: list[str], wire: list[np.ndarray]) -> np.ndarray:
    """Appends entry ``i``'s bits and scales; returns q (float32, v's shape)."""
    m = v.reshape(_columns(v.shape))
    pos = m >= 0
    n_pos = pos.sum(axis=0)
    n_neg = m.shape[0] - n_pos
    scales = np.zeros((2, m.shape[1]), np.float64)
    np.sum(m, axis=0, where=pos, out=scales[0])
    np.sum(m, axis=0, where=~pos, out=scales[1])
    np.divide(scales[0], n_pos, out=scales[0], where=n_pos > 0)
    np.divide(scales[1], n_neg, out=scales[1], where=n_neg > 0)
    scales = scales.astype(np.float32)
    names += [f"{i}:bits", f"{i}:scales"]
    wire += [np.packbits(pos.reshape(-1)), scales]
    return np.where(pos, scales[0], scales[1]).reshape(v.shape)


def _quantize_threshold(i: int, v: np.ndarray, t: np.float32, names: list[str], wire: list[np.ndarray]) -> None:
    """Appends entry ``i``'s indices and signs; subtracts the sent ±t from v in place (v: the new residual)."""
    if v.size > _MAX_INDEXED:
        raise InvariantError(f"a threshold-quantized array must hold at most 2**32 values. Received: array {i} of {v.size}")
    flat = v.reshape(-1)
    idx = np.flatnonzero(np.abs(flat) >= t)
    positive = flat[idx] > 0
    flat[idx] -= np.where(positive, np.float64(t), -np.float64(t))
    names += [f"{i}:idx", f"{i}:sign"]
    wire += [idx.astype(np.uint32), np.packbits(positive)]


def quantize(
    deltas: Sequence[np.ndarray], residual: Sequence[np.ndarray] | None, method: str, threshold: float | None = None,
    exact: Sequence[bool] | None = None,
) -> tuple[bytes, list[np.ndarray]]:
    """Encode one worker's update with error feedback.

    Args:
        deltas: the worker's update per array; float arrays are quantized, the others (an int64
            iteration counter, bool) travel as they are.
        residual: the residual this worker kept from its previous round, aligned with ``deltas``
            (``None``, or ``None`` entries: zeros; entries for non-float arrays are ignored).
        method: ``"1bit"`` or ``"threshold"``.
        threshold: t for ``"threshold"`` (required there, ignored by ``"1bit"``).
        exact: per array, whether it travels in full precision instead (the model's non-trainable
            weights: BatchNorm's moving variance must stay positive, which a quantized difference
            does not guarantee); default none.

    Returns:
        ``(payload, new_residual)``: the Arrow IPC bytes to send (read them with :func:`dequantize`)
        and the residual to keep for the next round: v − q in float32 for float arrays, an empty
        float32 array for the others. The inputs are not modified.

    Raises:
        ConfigError: an unknown method, or a missing or invalid threshold.
        InvariantError: a residual that does not match ``deltas``, or a non-finite update.
    """
    if method not in QUANTIZED:
        raise ConfigError(f"quantize's method must be one of {list(QUANTIZED)}. Received: {method!r}")
    if residual is not None and len(residual) != len(deltas):
        raise InvariantError(f"the residual must hold one array per update array. Received: {len(residual)} for {len(deltas)}")
    names: list[str] = [f"method:{method}"]
    wire: list[np.ndarray] = [np.array([np.size(d) for d in deltas], np.int64)]  # each entry's size
    t = None
    if method == "threshold":
        if threshold is None:
            raise ConfigError("compressionThreshold must be set for compression='threshold'. Received: None")
        t = np.float32(check_threshold(threshold))
        names.append("threshold")
        wire.append(np.array([t], np.float32))
    if exact is not None and len(exact) != len(deltas):
        raise InvariantError(f"exact must hold one flag per update array. Received: {len(exact)} for {len(deltas)}")
    new_residual: list[np.ndarray] = []
    for i, delta in enumerate(deltas):
        delta = np.asarray(delta)
        if delta.dtype.kind != "f" or (exact is not None and exact[i]):
            names.append(f"{i}:raw")
            wire.append(delta)
            new_residual.append(np.zeros(0, np.float32))
            continue
        old = None if residual is None else residual[i]
        if old is None:
            v = np.array(delta, dtype=np.float64)  # always a copy: v is modified in place below
        else:
            old = np.asarray(old)
            if old.shape != delta.shape:
                raise InvariantError(f"residual array {i} must have the update's shape {delta.shape}. Received: {old.shape}")
            v = np.add(delta, old, dtype=np.float64)
        if not np.isfinite(v).all():
            raise InvariantError(f"a quantized update must be finite. Received: non-finite values in array {i}")
        if method == "1bit":
            v -= _quantize_1bit(i, v, names, wire)
        else:
            _quantize_threshold(i, v, t, names, wire)
        new_residual.append(v.astype(np.float32))
    return encode_arrays(wire, names), new_residual


def quantize_update(weights: Sequence[np.ndarray], start: Sequence[np.ndarray], residual: Sequence[np.ndarray] | None,
                    method: str, threshold: float | None = None, exact: Sequence[bool] | None = None) -> tuple[bytes, list[np.ndarray]]:
    """:func:`quantize` of a worker's weight update Δ = ``weights`` − ``start`` (float arrays, in
    float32; the others as their values): ``(payload, new residual)``."""
    deltas = [np.subtract(new, old, dtype=np.float32) if np.asarray(new).dtype.kind == "f" else np.asarray(new)
              for new, old in zip(weights, start, strict=True)]
    return quantize(deltas, residual, method, threshold, exact=exact)


def dequantize(payload: bytes, like: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Decode a :func:`quantize` payload into one dense array per entry of ``like``.

    Args:
        payload: the bytes :func:`quantize` returned.
        like: one array (or anything with ``shape`` and ``dtype``) per entry, e.g. the round's
            start state: float entries decode to float32 updates of that shape, the others to the
            values that were sent, in their own dtype.

    Raises:
        CodecError: the payload is not an Arrow IPC stream of sparkdl arrays.
        InvariantError: the payload does not match ``like`` (number of entries, float vs raw,
            sizes), or is not a quantize payload.
    """
    decoded = decode_arrays(payload, copy=False)
    if not decoded.names or not decoded.names[0].startswith("method:"):
        raise InvariantError(f"a quantized payload must start with its method header. Received: {decoded.names[:1]}")
    method = decoded.names[0].split(":", 1)[1]
    if method not in QUANTIZED:
        raise InvariantError(f"a quantized payload's method must be one of {list(QUANTIZED)}. Received: {method!r}")
    sizes = decoded.arrays[0].reshape(-1)
    if sizes.size != len(like):
        raise InvariantError(f"the payload must hold {len(like)} arrays, one per entry of like. Received: {sizes.size}")
    t = None
    parts: dict[int, dict[str, np.ndarray]] = {}
    for name, array in zip(decoded.names[1:], decoded.arrays[1:], strict=True):
        if name == "threshold" and method == "threshold":
            t = np.float32(array.reshape(-1)[0]) if array.size == 1 else None
            continue
        index, _, part = name.partition(":")
        if not index.isdigit() or int(index) >= len(like):
            raise InvariantError(f"the payload's arrays must be named <entry>:<part> for {len(like)} entries. Received: {name!r}")
        parts.setdefault(int(index), {})[part] = array
    if method == "threshold" and (t is None or not (np.isfinite(t) and t > 0)):
        raise InvariantError("a threshold payload must carry its positive threshold")
    expected = {"1bit": {"bits", "scales"}, "threshold": {"idx", "sign"}}[method]
    out = []
    for i, ref in enumerate(like):
        shape, dtype = tuple(ref.shape), np.dtype(ref.dtype)
        got = parts.get(i, {})
        n = math.prod(shape)
        if int(sizes[i]) != n:
            raise InvariantError(f"entry {i} of the payload must hold {n} values for shape {shape}. Received: {int(sizes[i])}")
        if dtype.kind != "f" or set(got) == {"raw"}:  # a non-float array, or a float one sent exactly
            raw = got.get("raw")
            if set(got) != {"raw"} or raw.shape != shape or (dtype.kind == "f") != (raw.dtype.kind == "f"):
                raise InvariantError(
                    f"entry {i} of the payload must be a raw array of shape {shape}. Received: "
                    f"{sorted(got)}{'' if raw is None else f' of shape {raw.shape}'}"
                )
            out.append(np.array(raw))  # a writable copy, not a view of the payload
            continue
        if set(got) != expected:
            raise InvariantError(f"entry {i} of the payload must hold {sorted(expected)} ({method}). Received: {sorted(got)}")
        if method == "1bit":
            rows, cols = _columns(shape)
            bits, scales = got["bits"], got["scales"]
            if bits.dtype != np.uint8 or bits.size != (n + 7) // 8 or scales.shape != (2, cols):
                raise InvariantError(
                    f"entry {i} of the payload must hold {(n + 7) // 8} bit bytes and scales of shape (2, {cols}) "
                    f"for shape {shape}. Received: {bits.size} bytes, scales {scales.shape}"
                )
            pos = np.unpackbits(bits.reshape(-1), count=n).reshape(rows, cols).view(bool)
            scales = scales.astype(np.float32, copy=False)
            out.append(np.where(pos, scales[0], scales[1]).reshape(shape))
        else:
            idx, sign = got["idx"].reshape(-1), got["sign"].reshape(-1)
            k = idx.size
            if (
                idx.dtype != np.uint32
                or sign.size != (k + 7) // 8
                or (k and int(idx[-1]) >= n)
                or (k > 1 and np.any(idx[1:] <= idx[:-1]))
            ):
                raise InvariantError(
                    f"entry {i} of the payload must hold ascending uint32 indices below {n} and one sign bit each "
                    f"for shape {shape}. Received: {k} indices ({idx.dtype}), {sign.size} sign bytes"
                )
            dense = np.zeros(n, np.float32)
            dense[idx] = np.where(np.unpackbits(sign, count=k).view(bool), t, -t)
            out.append(dense.reshape(shape))
    return out
