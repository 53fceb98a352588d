"""Blockwise int8/int4 quantization with error feedback (``sparkdl.core.blockwise``): what travels,
what the owner reconstructs, and that error feedback loses nothing over rounds."""

import numpy as np
import pytest

from sparkdl.core import blockwise
from sparkdl.core.blockwise import BLOCK, LEVELS, decode_piece, dequantize, encode_piece, quantize
from sparkdl.core.state import ModelState
from sparkdl.errors import CodecError, InvariantError


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("n", [0, 1, 7, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 5])
def test_what_the_owner_reconstructs_is_what_the_worker_kept_back_and_within_half_a_step(method, n):
    v = np.random.default_rng(n).normal(size=(n,)).astype(np.float32) * 3
    codes, scales, sent = quantize(v, method)
    assert np.array_equal(dequantize(codes, scales, (n,), method), sent)  # the residual v - sent is exact on both sides
    assert scales.dtype == np.float32 and scales.size == -(-n // BLOCK)
    assert codes.nbytes == (n if method == "int8" else -(-n // 2))
    for b in range(scales.size):  # each block's error is at most half its step
        block = slice(b * BLOCK, (b + 1) * BLOCK)
        assert np.abs(v[block] - sent[block]).max(initial=0) <= scales[b] / 2 * (1 + 1e-6)
    if n:
        assert np.abs(sent).max() <= np.abs(v).max() * (1 + 1e-6)


def test_bytes_per_value_are_one_and_a_half_for_the_two_methods():
    v = np.ones(1_000_000, np.float32)
    for method, per_value in (("int8", 1 + 4 / BLOCK), ("int4", 0.5 + 4 / BLOCK)):
        codes, scales, _ = quantize(v, method)
        assert (codes.nbytes + scales.nbytes) / v.size == pytest.approx(per_value, rel=1e-3)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_error_feedback_sends_over_rounds_everything_the_updates_held(method):
    """Σ sent + the last residual = Σ true updates: what rounding drops in one round goes in a later one."""
    rng = np.random.default_rng(1)
    start = ModelState([np.zeros((40, 30), np.float32)], [np.array([3], np.int64), np.zeros((40, 30), np.float32)])
    residual, sent_total, true_total = None, np.zeros((40, 30), np.float64), np.zeros((40, 30), np.float64)
    for _ in range(20):
        delta = rng.normal(size=(40, 30)).astype(np.float32) * 1e-3
        state = ModelState([start.weights[0] + delta], [np.array([4], np.int64), start.optimizer[1] + delta])
        wire, residual = encode_piece(state, start, residual, method)
        got = decode_piece(wire, start, method)
        assert got.optimizer[0].dtype == np.int64 and got.optimizer[0].tolist() == [4]  # sent as it is
        sent_total += got.weights[0] - start.weights[0]
        true_total += delta
    np.testing.assert_allclose(sent_total + residual.weights[0], true_total, atol=1e-6)
    assert np.abs(residual.weights[0]).max() < 1e-3 / LEVELS[method] * 4  # bounded, not growing


def test_a_malformed_or_diverged_message_is_refused():
    with pytest.raises(CodecError, match="int8 codes must be 10 int8 values"):
        dequantize(np.zeros(9, np.int8), np.ones(1, np.float32), (10,), "int8")
    with pytest.raises(CodecError, match="must carry 1 float32 scales"):
        dequantize(np.zeros(5, np.uint8), np.ones(2, np.float32), (10,), "int4")
    with pytest.raises(CodecError, match="codes and scales for each of its 1 arrays"):
        decode_piece(ModelState([np.zeros(3, np.int8)]), ModelState([np.zeros(3, np.float32)]), "int8")
    with pytest.raises(CodecError, match="must be one of"):
        quantize(np.zeros(3, np.float32), "int2")
    with pytest.raises(InvariantError, match="must be finite"):
        quantize(np.array([1.0, np.nan], np.float32), "int8")
    assert blockwise.BLOCKWISE == ("int8", "int4")
