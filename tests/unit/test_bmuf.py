"""BMUF block momentum (Chen & Huo, ICASSP 2016) on hand-computed arrays (issue 9). The block
momentum Δ is the fit's mode state ``delta``."""

import numpy as np
import pytest

from sparkdl.core.modes import get_policy
from sparkdl.core.modes.averaging import BlockMomentum, SyncAveraging
from sparkdl.core.state import ModelState, RoundUpdates, WorkerUpdate
from sparkdl.errors import ConfigError
from tests.unit.modes_helpers import fit_of, run_round


def _state(*weights):
    return ModelState([np.array(w, np.float32) for w in weights], [np.array([3.0], np.float32)])


def _updates():
    return [WorkerUpdate(0, 3, 1, _state([1.0, 2.0], [10.0])), WorkerUpdate(1, 1, 1, _state([5.0, 6.0], [20.0]))]


def _mean(value, rows=4):
    return RoundUpdates(rows, mean=ModelState([np.array(value)]))


def test_zero_momentum_and_unit_learning_rate_is_sync_averaging():
    fit = fit_of(_state([0.0, 0.0], [0.0]))
    sync = SyncAveraging().apply(fit, RoundUpdates(4, updates=_updates())).master
    bmuf = BlockMomentum(0.0, 1.0).apply(fit, RoundUpdates(4, updates=_updates())).master
    for a, b in zip(sync.weights, bmuf.weights, strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(bmuf.weights[0], [2.0, 3.0])  # (3·[1, 2] + 1·[5, 6]) / 4


def test_two_blocks_by_hand_with_and_without_nesterov():
    # One weight, W = 0. Block 1: mean 2 → G = 2, Δ = 1·2 = 2 (ζ = 1), W = 2.
    # Classical: block 2 starts at W = 2; mean 3 → G = 1, Δ = 0.5·2 + 1 = 2, W = 4.
    # Nesterov: block 2 starts at W + ηΔ = 3; mean 3 → G = 0, Δ = 0.5·2 + 0 = 1, W = 3.
    for nesterov, start_2, delta_2, final in ((False, 2.0, 2.0, 4.0), (True, 3.0, 1.0, 3.0)):
        policy = BlockMomentum(0.5, 1.0, nesterov=nesterov)
        fit = fit_of(ModelState([np.array([0.0], np.float32)]))
        assert policy.starts(fit).weights[0][0] == 0.0 and "delta" not in fit.mode
        run_round(policy, fit, _mean([2.0]))
        assert fit.master.weights[0][0] == 2.0
        assert fit.mode["delta"][0].tolist() == [2.0] and fit.mode["delta"][0].dtype == np.float64
        assert policy.starts(fit).weights[0][0] == start_2 and policy.starts(fit).weights[0].dtype == np.float32
        run_round(policy, fit, _mean([3.0]))
        assert fit.mode["delta"][0].tolist() == [delta_2]
        assert fit.master.weights[0][0] == pytest.approx(final)
        assert fit.master.weights[0].dtype == np.float32


def test_block_learning_rate_scales_the_block_update():
    policy = BlockMomentum(0.0, 0.5, nesterov=False)
    fit = run_round(policy, fit_of(ModelState([np.array([1.0], np.float32)])), _mean([3.0], rows=2))
    assert fit.master.weights[0][0] == 2.0  # 1 + 0.5·(3 − 1)


def test_untrainable_and_integer_arrays_take_the_average():
    policy = BlockMomentum(0.9, 1.0, nesterov=False, trainable=[True, False, True])
    fit = fit_of(ModelState([np.array([0.0], np.float32), np.array([1.0], np.float32), np.array([7], np.int64)]))
    mean = ModelState([np.array([1.0]), np.array([4.0]), np.array([9])])
    for _ in range(2):
        run_round(policy, fit, RoundUpdates(2, mean=mean))
    master = fit.master
    assert master.weights[1][0] == 4.0 and master.weights[2][0] == 9  # moving statistics, counters: the average
    assert master.weights[2].dtype == np.int64
    assert master.weights[0][0] == pytest.approx(1.9)  # filtered: 1 + (0.9·1 + 0), momentum overshoots the average
    assert [d.tolist() for d in fit.mode["delta"]] == [[pytest.approx(0.9)], [0.0], [0.0]]  # Δ of the filtered entry only


def test_the_optimizer_state_takes_the_average_or_stays():
    policy = BlockMomentum(0.5)
    fit = run_round(policy, fit_of(_state([0.0, 0.0], [0.0])), RoundUpdates(4, updates=_updates()))
    assert fit.master.optimizer[0].tolist() == [3.0]
    master = fit.master
    run_round(policy, fit, RoundUpdates(4, mean=ModelState([np.ones(2), np.ones(1)])))  # a mean without optimizer state: the master's
    assert fit.master.optimizer is master.optimizer


def test_apply_reads_delta_from_the_fit_and_changes_nothing_in_it():
    policy = BlockMomentum(0.5, 1.0, nesterov=False)
    fit = fit_of(ModelState([np.array([2.0], np.float32)]), mode={"delta": [np.array([2.0])]})
    assert policy.starts(fit).weights[0][0] == 2.0  # classical: W
    transition = policy.apply(fit, _mean([3.0]))
    assert transition.mode["delta"][0].tolist() == [2.0] and transition.master.weights[0][0] == 4.0  # as block 2 above
    assert fit.mode["delta"][0].tolist() == [2.0] and fit.master.weights[0][0] == 2.0 and fit.rounds == 0
    nesterov = BlockMomentum(0.5, 1.0, nesterov=True)
    assert nesterov.starts(fit).weights[0][0] == 3.0  # W + ηΔ from the fit's Δ


def test_no_rows_keeps_the_master_and_settings_are_checked():
    fit = fit_of(_state([1.0, 1.0], [1.0]), mode={"delta": [np.zeros(2), np.zeros(1)]})
    for empty in (RoundUpdates(0), RoundUpdates(0, updates=[WorkerUpdate(0, 0, 0, None)])):
        transition = BlockMomentum(0.5).apply(fit, empty)
        assert transition.master is fit.master and transition.mode is fit.mode
    with pytest.raises(ConfigError, match=r"blockMomentum must be None or a number in \[0, 1\)"):
        get_policy("bmuf", block_momentum=1.0)
    with pytest.raises(ConfigError, match="blockLearningRate must be a number > 0"):
        get_policy("bmuf", block_momentum=0.5, block_learning_rate=0.0)
