"""The eager one-round overlap of ``overlap`` (``sparkdl.core.modes.overlap``): its sync points,
and how a worker's progress is carried onto the start it is applied to."""

import numpy as np
import pytest

from sparkdl.core.modes.overlap import EagerOverlap
from sparkdl.core.state import ModelState
from sparkdl.errors import InvariantError


def test_sync_points_are_the_first_round_and_the_rounds_after_a_snapshot():
    def points(delay, n=9):
        return [g for g in range(n) if delay.synchronous(g)]

    assert points(EagerOverlap()) == [0]  # no snapshots: the stage's first round alone
    assert points(EagerOverlap(first=4)) == [4]  # a resumed fit's first round
    assert points(EagerOverlap(rounds_per_epoch=4)) == [0, 4, 8]  # snapshots at epoch ends
    assert points(EagerOverlap(rounds_per_epoch=4, snapshot_every=3)) == [0, 3, 4, 6, 8]  # and every 3 rounds
    assert points(EagerOverlap(rounds_per_epoch=1), 5) == [0, 1, 2, 3, 4]  # a snapshot after every round: blocking


def test_the_carry_moves_weights_and_counters_by_the_progress_and_keeps_the_worker_s_moments():
    base = ModelState([np.array([1.0, 2.0], np.float32)], [np.array(10, np.int64), np.array([0.5], np.float32)])
    state = ModelState([np.array([1.5, 1.0], np.float32)], [np.array(13, np.int64), np.array([0.25], np.float32)])
    start = ModelState([np.array([3.0, -1.0], np.float32)], [np.array(13, np.int64), np.array([0.75], np.float32)])
    carried = EagerOverlap.carry(state, base, start)
    np.testing.assert_array_equal(carried.weights[0], [3.5, -2.0])  # start + (state - base)
    assert carried.weights[0].dtype == np.float32
    assert int(carried.optimizer[0]) == 16 and carried.optimizer[0].dtype == np.int64  # 13 + 3 steps: each step counted once
    np.testing.assert_array_equal(carried.optimizer[1], [0.25])  # the worker's own moment
    alone = EagerOverlap.carry(ModelState(state.weights, None), ModelState(base.weights, None), ModelState(start.weights, None))
    assert alone.optimizer is None and np.array_equal(alone.weights[0], [3.5, -2.0])
    fresh = EagerOverlap.carry(state, ModelState(base.weights, None), ModelState(start.weights, None))
    assert fresh.optimizer[0] == 13  # no optimizer state at the starts: the worker's, as it is


def test_the_carry_of_a_state_whose_arrays_do_not_match_its_starts_fails_loudly():
    one = ModelState([np.zeros(2, np.float32)])
    with pytest.raises(InvariantError, match="keep its shape"):
        EagerOverlap.carry(one, one, ModelState([np.zeros(3, np.float32)]))
    with pytest.raises(InvariantError, match="as many arrays"):
        EagerOverlap.carry(one, ModelState([np.zeros(2, np.float32)] * 2), one)
