"""Quantized updates with error feedback: 1-bit (Seide et al. 2014) and threshold (Strom 2015)."""

import math
import subprocess
import sys

import numpy as np
import pytest

from sparkdl.core.compression import (
    COMPRESSIONS,
    QUANTIZED,
    check_threshold,
    dequantize,
    quantize,
)
from sparkdl.errors import ConfigError, InvariantError
from sparkdl.param_specs import BY_NAME

_SHAPES = [(7,), (5, 3), (2, 2, 3, 4)]


@pytest.mark.parametrize("method, threshold", [("1bit", None), ("threshold", 0.8)])
def test_error_feedback_sends_every_update_eventually(method, threshold):
    rng = np.random.default_rng(0)
    like = [np.zeros(s, np.float32) for s in _SHAPES]
    residual = None
    truth = [np.zeros(s, np.float64) for s in _SHAPES]
    sent = [np.zeros(s, np.float64) for s in _SHAPES]
    for _ in range(20):
        deltas = [rng.normal(size=s).astype(np.float32) for s in _SHAPES]
        kept = [d.copy() for d in deltas]
        payload, residual = quantize(deltas, residual, method, threshold)
        for d, k in zip(deltas, kept, strict=True):
            np.testing.assert_array_equal(d, k)  # the inputs are not modified
        got = dequantize(payload, like)
        for i, (d, g, r) in enumerate(zip(deltas, got, residual, strict=True)):
            assert g.shape == _SHAPES[i] and g.dtype == np.float32
            assert r.shape == _SHAPES[i] and r.dtype == np.float32
            truth[i] += d
            sent[i] += g
    for t, s, r in zip(truth, sent, residual, strict=True):
        np.testing.assert_allclose(s + r, t, rtol=1e-5, atol=1e-5 * np.abs(t).max())
        assert np.any(s != 0)  # something was sent


def test_1bit_column_decodes_to_the_means_of_each_sign():
    delta = np.array([3.0, 1.0, -2.0, -4.0], np.float32)
    payload, residual = quantize([delta], None, "1bit")
    (got,) = dequantize(payload, [delta])
    np.testing.assert_array_equal(got, [2.0, 2.0, -3.0, -3.0])  # mean(3, 1), mean(-2, -4)
    np.testing.assert_array_equal(residual[0], [1.0, -1.0, 1.0, -1.0])


def test_1bit_keeps_two_values_per_column_and_handles_one_sided_and_empty_arrays():
    matrix = np.array([[1.0, -1.0, 0.0], [3.0, -3.0, 0.0]], np.float32)  # columns: all ≥ 0, all < 0, zeros
    scalar = np.array(-2.5, np.float64)
    empty = [np.zeros((0, 4), np.float32), np.zeros((3, 0), np.float32), np.zeros(0, np.float64)]
    deltas = [matrix, scalar, *empty]
    payload, residual = quantize(deltas, None, "1bit")
    got = dequantize(payload, deltas)
    np.testing.assert_array_equal(got[0], [[2.0, -2.0, 0.0], [2.0, -2.0, 0.0]])
    np.testing.assert_array_equal(residual[0], [[-1.0, 1.0, 0.0], [1.0, -1.0, 0.0]])
    assert got[1].shape == () and got[1] == -2.5 and residual[1] == 0.0
    for g, r, e in zip(got[2:], residual[2:], empty, strict=True):
        assert g.shape == e.shape and r.shape == e.shape and g.dtype == np.float32


def test_threshold_sends_plus_or_minus_t_and_keeps_the_rest():
    delta = np.array([0.7, -0.2, -0.6, 0.1], np.float32)
    payload, residual = quantize([delta], None, "threshold", threshold=0.5)
    (got,) = dequantize(payload, [delta])
    np.testing.assert_array_equal(got, [0.5, 0.0, -0.5, 0.0])
    np.testing.assert_allclose(residual[0], [0.2, -0.2, -0.1, 0.1], rtol=1e-6)
    # the residual is added next round: 0.2 + 0.4 = 0.6 passes now
    payload, residual = quantize([np.array([0.4, 0.0, 0.0, 0.0], np.float32)], residual, "threshold", 0.5)
    np.testing.assert_array_equal(dequantize(payload, [delta])[0], [0.5, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(residual[0], [0.1, -0.2, -0.1, 0.1], rtol=1e-6)


@pytest.mark.parametrize("method", QUANTIZED)
def test_non_float_arrays_travel_raw(method):
    counter, flags = np.array(41, np.int64), np.array([True, False, True])
    weights = np.array([[0.9, -0.9]], np.float32)
    deltas = [counter, weights, flags]
    payload, residual = quantize(deltas, [None, np.zeros((1, 2), np.float32), "ignored"], method, 0.5)
    got = dequantize(payload, [np.zeros((), np.int64), np.zeros((1, 2), np.float32), np.zeros(3, bool)])
    assert got[0].dtype == np.int64 and got[0].shape == () and got[0] == 41
    assert got[2].dtype == bool and got[2].tolist() == [True, False, True]
    assert got[1].dtype == np.float32 and got[1].shape == (1, 2)
    assert got[0].flags.writeable and got[2].flags.writeable
    assert residual[0].size == 0 and residual[2].size == 0  # nothing to carry for raw arrays
    quantize(deltas, residual, method, 0.5)  # the returned residual is accepted as the next input


@pytest.mark.parametrize("method, threshold", [("1bit", None), ("threshold", 0.5)])
def test_a_payload_that_does_not_match_like_is_refused(method, threshold):
    deltas = [np.ones((4, 3), np.float32), np.array(7, np.int64)]
    payload, _ = quantize(deltas, None, method, threshold)
    with pytest.raises(InvariantError, match=r"must hold 3 arrays"):
        dequantize(payload, [*deltas, np.ones(2, np.float32)])  # count
    with pytest.raises(InvariantError, match=r"must hold 1 arrays"):
        dequantize(payload, deltas[:1])
    with pytest.raises(InvariantError, match=r"entry 0 .*must hold 120 values for shape \(40, 3\). Received: 12"):
        dequantize(payload, [np.ones((40, 3), np.float32), deltas[1]])  # sizes
    with pytest.raises(InvariantError, match=r"entry 1 .*must hold 2 values"):
        dequantize(payload, [deltas[0], np.ones(2, np.int64)])
    with pytest.raises(InvariantError, match=r"entry 1 .*raw array of shape \(1,\)"):
        dequantize(payload, [deltas[0], np.ones(1, np.int64)])  # same size, other shape
    with pytest.raises(InvariantError, match=r"entry 1"):
        dequantize(payload, [deltas[0], np.ones((), np.float32)])  # float where raw was sent
    with pytest.raises(InvariantError, match=r"entry 0 .*raw"):
        dequantize(payload, [np.ones((4, 3), np.int32), deltas[1]])
    if method == "1bit":
        with pytest.raises(InvariantError, match=r"entry 0 .*scales of shape \(2, 4\)"):
            dequantize(payload, [np.ones((3, 4), np.float32), deltas[1]])  # same size, other columns


def test_quantize_refuses_bad_inputs():
    delta = [np.ones(3, np.float32)]
    with pytest.raises(InvariantError, match=r"one array per update array"):
        quantize(delta, [], "1bit")
    with pytest.raises(InvariantError, match=r"residual array 0 .*\(3,\)"):
        quantize(delta, [np.zeros(4, np.float32)], "1bit")
    with pytest.raises(InvariantError, match=r"finite.*array 0"):
        quantize([np.array([1.0, np.nan], np.float32)], None, "threshold", 0.5)
    with pytest.raises(ConfigError, match=r"compressionThreshold.*None"):
        quantize(delta, None, "threshold")
    with pytest.raises(ConfigError, match=r"compressionThreshold.*-1"):
        quantize(delta, None, "threshold", -1)
    with pytest.raises(ConfigError, match=r"\['1bit', 'threshold'\].*'fp16'"):
        quantize(delta, None, "fp16")


def _ratio(payload, arrays):
    return sum(a.size * 4 for a in arrays) / len(payload)


def test_quantized_payloads_are_much_smaller_than_float32():
    rng = np.random.default_rng(1)
    arrays = [rng.normal(size=(3136, 128)).astype(np.float32), rng.normal(size=128).astype(np.float32)]
    n = sum(a.size for a in arrays)
    payload, _ = quantize(arrays, None, "1bit")
    assert len(payload) < math.ceil(3136 * 128 / 8) + math.ceil(128 / 8) + 8 * (128 + 1) + 4096  # bits + scales + framing
    assert _ratio(payload, arrays) >= 16
    t = float(np.quantile(np.abs(np.concatenate([a.reshape(-1) for a in arrays])), 0.98))  # about 2% pass
    payload, residual = quantize(arrays, None, "threshold", t)
    sent = sum(int(np.count_nonzero(g)) for g in dequantize(payload, arrays))
    assert 0.015 * n <= sent <= 0.025 * n
    assert _ratio(payload, arrays) >= 8


def test_check_compression_and_check_threshold():
    assert COMPRESSIONS == ("fp16", "1bit", "threshold", "int8", "int4") and QUANTIZED == ("1bit", "threshold")
    for name in (None, *COMPRESSIONS):
        BY_NAME["compression"].check(name)  # the Param's declared choices
    for bad in ("2bit", "topk", "FP16", 1):
        with pytest.raises(ConfigError, match=r"compression must be one of \[None, 'fp16', '1bit', 'threshold', 'int8', 'int4'\]"):
            BY_NAME["compression"].check(bad)
    assert check_threshold(0.5) == 0.5 and check_threshold(1) == 1.0 and check_threshold(np.float32(0.25)) == 0.25
    for bad in (0, -1, float("nan"), float("inf"), 1e300, None, "0.5", True):
        with pytest.raises(ConfigError, match=r"compressionThreshold") as info:
            check_threshold(bad)
        assert repr(bad) in str(info.value)


def test_the_module_imports_neither_spark_nor_tensorflow():
    code = (
        "import sys, sparkdl.core.compression\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'tensorflow', 'keras')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
