"""The one-round-delayed rule of ``overlap`` (``sparkdl.core.modes.overlap``): which start each
round trains from, and how a worker's progress is carried onto the start it is applied to."""

import numpy as np
import pytest

from sparkdl.core.modes.overlap import DelayedRound
from sparkdl.core.state import ModelState
from sparkdl.errors import InvariantError


def test_rounds_train_from_the_start_before_their_own_except_at_sync_points():
    assert [DelayedRound().base(g) for g in range(5)] == [0, 0, 1, 2, 3]  # no snapshots: the fit's first round alone
    assert [DelayedRound(first=4).base(g) for g in range(4, 7)] == [4, 4, 5]  # a resumed fit's first round
    delay = DelayedRound(rounds_per_epoch=4)  # snapshots at epoch ends: epochs start at 0, 4, 8
    assert [delay.base(g) for g in range(9)] == [0, 0, 1, 2, 4, 4, 5, 6, 8]
    snapshots = DelayedRound(rounds_per_epoch=4, snapshot_every=3)  # and after every 3 rounds (3, 6)
    assert [snapshots.base(g) for g in range(9)] == [0, 0, 1, 3, 4, 4, 6, 6, 8]
    assert all(DelayedRound(rounds_per_epoch=1).base(g) == g for g in range(5))  # a snapshot after every round: blocking


def test_the_carry_moves_weights_and_counters_by_the_progress_and_keeps_the_worker_s_moments():
    base = ModelState([np.array([1.0, 2.0], np.float32)], [np.array(10, np.int64), np.array([0.5], np.float32)])
    state = ModelState([np.array([1.5, 1.0], np.float32)], [np.array(13, np.int64), np.array([0.25], np.float32)])
    start = ModelState([np.array([3.0, -1.0], np.float32)], [np.array(13, np.int64), np.array([0.75], np.float32)])
    carried = DelayedRound.carry(state, base, start)
    np.testing.assert_array_equal(carried.weights[0], [3.5, -2.0])  # start + (state - base)
    assert carried.weights[0].dtype == np.float32
    assert int(carried.optimizer[0]) == 16 and carried.optimizer[0].dtype == np.int64  # 13 + 3 steps: each step counted once
    np.testing.assert_array_equal(carried.optimizer[1], [0.25])  # the worker's own moment
    alone = DelayedRound.carry(ModelState(state.weights, None), ModelState(base.weights, None), ModelState(start.weights, None))
    assert alone.optimizer is None and np.array_equal(alone.weights[0], [3.5, -2.0])
    fresh = DelayedRound.carry(state, ModelState(base.weights, None), ModelState(start.weights, None))
    assert fresh.optimizer[0] == 13  # no optimizer state at the starts: the worker's, as it is


def test_the_carry_of_a_state_whose_arrays_do_not_match_its_starts_fails_loudly():
    one = ModelState([np.zeros(2, np.float32)])
    with pytest.raises(InvariantError, match="keep its shape"):
        DelayedRound.carry(one, one, ModelState([np.zeros(3, np.float32)]))
    with pytest.raises(InvariantError, match="as many arrays"):
        DelayedRound.carry(one, ModelState([np.zeros(2, np.float32)] * 2), one)
