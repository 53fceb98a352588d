"""A piece of the state encoded against the round's start with error feedback (backend ``sharded``):
1bit and threshold through the same seam as int8 / int4."""

import numpy as np
import pytest

from sparkdl.core import piece_codec
from sparkdl.core.state import ModelState
from sparkdl.errors import CodecError


def _piece(rng, shift=0.0, n=300):
    return ModelState([rng.normal(size=(n,)).astype(np.float32) + shift, rng.normal(size=(4, 3)).astype(np.float32) + shift,
                       np.array([7, 9], np.int64)], None)


@pytest.mark.parametrize("method", ["1bit", "threshold", "int8", "int4"])
def test_error_feedback_sends_every_update_in_the_end(method):
    """Over rounds, the sum of what the owner decoded plus the worker's last residual equals the sum
    of the true updates (to float32 rounding), for every encoding of the seam."""
    rng = np.random.default_rng(0)
    start = _piece(rng)
    residual, sent, true = None, None, None
    for _ in range(5):
        state = ModelState([w + rng.normal(scale=0.05, size=w.shape).astype(np.float32) if w.dtype.kind == "f" else w + 1
                            for w in start.weights], None)
        wire, residual = piece_codec.encode(state, start, residual, method, threshold=0.02)
        got = piece_codec.decode(wire, start, method)
        assert [g.dtype for g in got.weights] == [w.dtype for w in state.weights]
        assert np.array_equal(got.weights[2], state.weights[2])  # an integer array travels as it is
        step = [g.astype(np.float64) - s for g, s in zip(got.weights[:2], start.weights[:2], strict=True)]
        truth = [w.astype(np.float64) - s for w, s in zip(state.weights[:2], start.weights[:2], strict=True)]
        sent = step if sent is None else [a + b for a, b in zip(sent, step, strict=True)]
        true = truth if true is None else [a + b for a, b in zip(true, truth, strict=True)]
        assert not all(np.allclose(a, b, atol=1e-6) for a, b in zip(step, truth, strict=True))  # it is lossy
    for s, t, r in zip(sent, true, residual.weights[:2], strict=True):
        np.testing.assert_allclose(s + r, t, atol=1e-4)


def test_1bit_sends_a_bit_a_value_and_exact_arrays_in_full():
    rng = np.random.default_rng(1)
    start = _piece(rng, n=40_000)
    state = _piece(rng, 0.1, n=40_000)
    wire, _ = piece_codec.encode(state, start, None, "1bit", exact=[False, True, False])
    assert len(wire.weights) == 1 and wire.weights[0].dtype == np.uint8 and wire.optimizer is None
    full = sum(w.nbytes for w in state.weights)
    assert wire.weights[0].nbytes < full / 20  # 40,000 values in bits, 12 exact values, the Arrow IPC header
    got = piece_codec.decode(wire, start, "1bit")
    np.testing.assert_allclose(got.weights[1], state.weights[1], atol=1e-6)  # non-trainable: exact
    assert not np.allclose(got.weights[0], state.weights[0], atol=1e-3)


def test_threshold_moves_each_value_by_t_at_most():
    rng = np.random.default_rng(2)
    start = _piece(rng)
    state = _piece(rng, 0.5)
    wire, residual = piece_codec.encode(state, start, None, "threshold", threshold=0.25)
    got = piece_codec.decode(wire, start, "threshold")
    moved = np.abs(got.weights[0] - start.weights[0])
    assert set(np.round(np.unique(moved), 6)) <= {0.0, 0.25}
    np.testing.assert_allclose(got.weights[0] - start.weights[0] + residual.weights[0], state.weights[0] - start.weights[0], atol=1e-5)


def test_1bit_and_threshold_refuse_optimizer_arrays_and_unknown_methods():
    rng = np.random.default_rng(3)
    start = _piece(rng)
    with_optimizer = ModelState(start.weights, [np.zeros(3, np.float32)])
    with pytest.raises(CodecError, match=r"1bit piece carries weights only .*Received: 1 optimizer arrays"):
        piece_codec.encode(with_optimizer, with_optimizer, None, "1bit")
    with pytest.raises(CodecError, match=r"piece's encoding must be one of .*Received: 'fp16'"):
        piece_codec.encode(start, start, None, "fp16")
    with pytest.raises(CodecError, match=r"threshold contribution must be one uint8 payload. Received: 3 arrays"):
        piece_codec.decode(start, start, "threshold")
