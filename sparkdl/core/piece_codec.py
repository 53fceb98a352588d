"""How a worker's piece of the state travels to its owner on backend ``sharded`` when it is encoded
against the round's start with error feedback: one seam over the blockwise integers
(:mod:`sparkdl.core.blockwise`: ``int8``, ``int4``) and the quantizers of the other backends
(:mod:`sparkdl.core.compression`: ``1bit``, ``threshold``).

A piece is a :class:`~sparkdl.core.state.ModelState` of 1-d or n-d arrays, the part of each array
that one owner holds (:class:`~sparkdl.core.slices.SliceLayout`). The worker encodes piece j of its
state against piece j of the round's start with its own residual of piece j (what earlier rounds'
quantization left, kept between rounds), and the owner decodes it back to a state (the start plus
the update, float32 arithmetic) before the row-weighted mean. So every mode's rule is unchanged.

``1bit`` and ``threshold`` carry weights only (the optimizer state stays on the workers:
``keepLocalOptimizer`` is implied, as with ``int8``/``int4``). On the wire a piece is one 1-d uint8
array, the Arrow IPC payload of :func:`sparkdl.core.compression.quantize` (nothing is pickled).
Bytes per float32 value, each piece on its own: ``1bit`` 1/8, plus 8 per piece of an array (the
layout flattens every array, so a piece is a vector: one pair of reconstruction values for the whole
piece, where ``ps`` and ``rounds`` keep one per column); ``threshold`` about 4.1 per value at or above
t, none for the others.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sparkdl.core.blockwise import BLOCKWISE, decode_piece, encode_piece
from sparkdl.core.compression import QUANTIZED, dequantize, quantize_update
from sparkdl.core.state import ModelState
from sparkdl.errors import CodecError

PIECEWISE = (*BLOCKWISE, *QUANTIZED)  # the encodings a piece travels in with a residual of its own


def encode(piece: ModelState, start: ModelState, residual: ModelState | None, method: str, threshold: float | None = None,
           exact: Sequence[bool] | None = None) -> tuple[ModelState, ModelState]:
    """One piece as it travels, and the residual to keep.

    Args:
        piece: the worker's piece after its local steps (weights; with ``int8``/``int4`` the
            optimizer's arrays too).
        start: the round's start, the same piece.
        residual: what the previous round's quantization left of this piece (None: zeros).
        method: one of :data:`PIECEWISE`.
        threshold: ``threshold``'s t (``compressionThreshold``, in weight units).
        exact: per weight array of the piece, whether it travels in full precision (the model's
            non-trainable weights; ``1bit``/``threshold`` only).

    Returns:
        ``(wire, residual)``.

    Raises:
        CodecError: an unknown method, or optimizer arrays with ``1bit``/``threshold``.
        InvariantError: a non-finite update.
    """
    if method in BLOCKWISE:
        return encode_piece(piece, start, residual, method)
    _check(method, piece)
    payload, left = quantize_update(piece.weights, start.weights, residual.weights if residual is not None else None, method,
                                    threshold, exact=exact)
    return ModelState([np.frombuffer(payload, np.uint8)], None), ModelState(left, None)


def decode(wire: ModelState, start: ModelState, method: str) -> ModelState:
    """The piece :func:`encode` sent: the round's ``start`` plus the decoded update, in ``start``'s
    dtypes; integer and bool arrays as they came.

    Raises:
        CodecError: an unknown method, or a message that is not one payload.
        InvariantError: a payload that does not fit ``start``.
    """
    if method in BLOCKWISE:
        return decode_piece(wire, start, method)
    _check(method, wire)
    if len(wire.weights) != 1 or np.asarray(wire.weights[0]).dtype != np.uint8:
        raise CodecError(f"a {method} contribution must be one uint8 payload. Received: {len(wire.weights)} arrays")
    updates = dequantize(np.asarray(wire.weights[0]).tobytes(), start.weights)
    weights = [(np.asarray(old).astype(np.float32) + delta).astype(np.asarray(old).dtype) if np.asarray(old).dtype.kind == "f"
               else np.asarray(delta).reshape(np.shape(old)) for old, delta in zip(start.weights, updates, strict=True)]
    return ModelState(weights, None)


def _check(method: str, state: ModelState) -> None:
    if method not in QUANTIZED:
        raise CodecError(f"a piece's encoding must be one of {list(PIECEWISE)}. Received: {method!r}")
    if state.optimizer is not None:
        raise CodecError(f"a {method} piece carries weights only (the workers keep their optimizer state). Received: "
                         f"{len(state.optimizer)} optimizer arrays")
