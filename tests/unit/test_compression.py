"""Compressed updates (issue 9, item 2): fp16 updates decoded to the mean of the states; case C37."""

import numpy as np
import pytest

from sparkdl.core.compression import decode_mean, encode_update
from sparkdl.param_specs import BY_NAME
from sparkdl.core.pieces import PieceMean, assemble, split_state
from sparkdl.core.state import ModelState
from sparkdl.errors import ConfigError, InvariantError


def _combine(states, rows):
    mean = PieceMean()
    for state, n in zip(states, rows, strict=True):
        for piece in split_state(state, max_piece_bytes=4):  # pieces of two float16 values
            mean.add(piece, n)
    return assemble(piece for piece, _ in mean.results())


def test_c37_fp16_updates_of_many_workers_average_without_overflow():
    update = np.array([40000.0, -40000.0, 1e-3, 3e-8], np.float32)
    start = ModelState([np.zeros(4, np.float32)])
    encoded = [encode_update(ModelState([update.copy()]), start, "fp16") for _ in range(4)]
    assert encoded[0].weights[0].dtype == np.float16  # what travels: 8 bytes, not 16
    mean = _combine(encoded, [1, 1, 1, 1])
    assert mean.weights[0].dtype == np.float32  # averaged from float64 sums, kept in float32
    got = decode_mean(mean, start).weights[0]
    assert got.dtype == np.float32 and np.all(np.isfinite(got))  # 4 × 40000 in float16 would be inf
    np.testing.assert_allclose(got[:3], [40000.0, -40000.0, 1e-3], rtol=1e-3)
    assert abs(got[3] - 3e-8) <= 6e-8
    exact = _combine([ModelState([update.copy()]) for _ in range(4)], [1, 1, 1, 1]).weights[0]
    np.testing.assert_array_equal(exact, update)  # without compression the mean is exact


def test_updates_are_relative_to_the_start_and_integers_travel_as_they_are():
    start = ModelState([np.array([1.0, 2.0], np.float32)], [np.array(3, np.int64), np.array([0.5], np.float32)])
    workers = [ModelState([np.array([2.0, 2.0], np.float32)], [np.array(5, np.int64), np.array([0.75], np.float32)]),
               ModelState([np.array([0.0, 4.0], np.float32)], [np.array(5, np.int64), np.array([0.25], np.float32)])]
    encoded = [encode_update(w, start, "fp16") for w in workers]
    assert encoded[0].optimizer[0].dtype == np.int64 and encoded[0].weights[0].tolist() == [1.0, 0.0]
    got = decode_mean(_combine(encoded, [3, 1]), start)
    np.testing.assert_allclose(got.weights[0], [1.5, 2.5])  # (3·[2, 2] + 1·[0, 4]) / 4
    assert got.optimizer[0] == 5 and got.optimizer[1][0] == pytest.approx(0.625)
    fresh = encode_update(workers[0], ModelState(start.weights, None), "fp16")
    assert fresh.optimizer[1].dtype == np.float32  # a round that started from a fresh optimizer sends its state as is


def test_changes_beyond_float16_and_unknown_methods_are_refused():
    start = ModelState([np.zeros(2, np.float32)])
    with pytest.raises(InvariantError, match=r"fp16 update must stay within ±65504.*weight array 0"):
        encode_update(ModelState([np.array([0.0, 1e5], np.float32)]), start, "fp16")
    with pytest.raises(ConfigError, match=r"compression must be one of \[None, 'fp16', '1bit', 'threshold', 'int8', 'int4'\]"):
        BY_NAME["compression"].check("2bit")
