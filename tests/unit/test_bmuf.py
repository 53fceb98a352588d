"""BMUF block momentum (Chen & Huo, ICASSP 2016) on hand-computed arrays (issue 9)."""

import numpy as np
import pytest

from sparkdl.core.modes import BlockMomentum, SyncAveraging, get_policy
from sparkdl.core.state import ModelState, WorkerUpdate
from sparkdl.errors import ConfigError


def _state(*weights):
    return ModelState([np.array(w, np.float32) for w in weights], [np.array([3.0], np.float32)])


def _updates():
    return [WorkerUpdate(0, 3, 1, _state([1.0, 2.0], [10.0])), WorkerUpdate(1, 1, 1, _state([5.0, 6.0], [20.0]))]


def test_zero_momentum_and_unit_learning_rate_is_sync_averaging():
    master = _state([0.0, 0.0], [0.0])
    sync = SyncAveraging().apply(master, _updates())
    bmuf = BlockMomentum(0.0, 1.0).apply(master, _updates())
    for a, b in zip(sync.weights, bmuf.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(bmuf.weights[0], [2.0, 3.0])  # (3·[1, 2] + 1·[5, 6]) / 4


def test_two_blocks_by_hand_with_and_without_nesterov():
    # One weight, W = 0. Block 1: mean 2 → G = 2, Δ = 1·2 = 2 (ζ = 1), W = 2.
    # Classical: block 2 starts at W = 2; mean 3 → G = 1, Δ = 0.5·2 + 1 = 2, W = 4.
    # Nesterov: block 2 starts at W + ηΔ = 3; mean 3 → G = 0, Δ = 0.5·2 + 0 = 1, W = 3.
    for nesterov, start_2, final in ((False, 2.0, 4.0), (True, 3.0, 3.0)):
        policy = BlockMomentum(0.5, 1.0, nesterov=nesterov)
        master = ModelState([np.array([0.0], np.float32)])
        assert policy.start(master).weights[0][0] == 0.0
        master = policy.apply_mean(master, ModelState([np.array([2.0])]), rows=4)
        assert master.weights[0][0] == 2.0
        assert policy.start(master).weights[0][0] == start_2
        master = policy.apply_mean(master, ModelState([np.array([3.0])]), rows=4)
        assert master.weights[0][0] == pytest.approx(final)
        assert master.weights[0].dtype == np.float32


def test_block_learning_rate_scales_the_block_update():
    policy = BlockMomentum(0.0, 0.5, nesterov=False)
    master = policy.apply_mean(ModelState([np.array([1.0], np.float32)]), ModelState([np.array([3.0])]), rows=2)
    assert master.weights[0][0] == 2.0  # 1 + 0.5·(3 − 1)


def test_untrainable_and_integer_arrays_take_the_average():
    policy = BlockMomentum(0.9, 1.0, nesterov=False, trainable=[True, False, True])
    master = ModelState([np.array([0.0], np.float32), np.array([1.0], np.float32), np.array([7], np.int64)])
    mean = ModelState([np.array([1.0]), np.array([4.0]), np.array([9])])
    for _ in range(2):
        master = policy.apply_mean(master, mean, rows=2)
    assert master.weights[1][0] == 4.0 and master.weights[2][0] == 9  # moving statistics, counters: the average
    assert master.weights[0][0] == pytest.approx(1.9)  # filtered: 1 + (0.9·1 + 0), momentum overshoots the average


def test_no_rows_keeps_the_master_and_settings_are_checked():
    master = _state([1.0, 1.0], [1.0])
    assert BlockMomentum(0.5).apply_mean(master, None, 0) is master
    with pytest.raises(ConfigError, match=r"blockMomentum must be in \[0, 1\)"):
        get_policy("bmuf", block_momentum=1.0)
    with pytest.raises(ConfigError, match="blockLearningRate must be > 0"):
        get_policy("bmuf", block_momentum=0.5, block_learning_rate=0.0)
