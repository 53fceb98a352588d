import numpy as np
import pytest

from sparkdl.core.aggregation import WeightedMean
from sparkdl.core.modes import get_policy
from sparkdl.core.modes.averaging import SyncAveraging, row_weighted_mean
from sparkdl.core.state import ModelState, RoundUpdates, WorkerUpdate
from sparkdl.errors import ConfigError
from tests.unit.modes_helpers import assert_states_equal, fit_of


def weighted_average(arrays_per_worker, weights):
    mean = WeightedMean()
    for arrays, weight in zip(arrays_per_worker, weights, strict=True):
        mean.add(arrays, weight)
    out = mean.result()
    if out is None:
        raise ValueError(f"at least one worker must have a positive weight. Received: {list(weights)}")
    return out


def test_weighted_average_matches_hand_computed_value():
    # (3*[1, 2] + 1*[5, 10]) / 4 = [2, 4]; (3*10 + 1*30) / 4 = 15
    a = [np.array([1.0, 2.0], np.float32), np.array(10.0, np.float32)]
    b = [np.array([5.0, 10.0], np.float32), np.array(30.0, np.float32)]
    out = weighted_average([a, b], [3, 1])
    np.testing.assert_array_equal(out[0], np.array([2.0, 4.0], np.float32))
    assert out[1].shape == () and float(out[1]) == 15.0
    assert [o.dtype for o in out] == [np.float32, np.float32]


def test_zero_d_arrays_accumulate_across_many_workers():
    # Regression: a 0-d running sum turned into a numpy scalar and lost later additions.
    out = weighted_average([[np.array(1.0)], [np.array(2.0)], [np.array(6.0)]], [1, 1, 1])
    assert float(out[0]) == 3.0


def test_integer_counters_are_rounded_and_keep_dtype():
    out = weighted_average([[np.array(10, np.int64)], [np.array(13, np.int64)]], [1, 1])
    assert out[0].dtype == np.int64 and int(out[0]) == 12  # rint(11.5) = 12 (round half to even)


def test_equal_workers_average_to_themselves_not_their_sum():
    w = [np.array([[0.25, -1.5]], np.float32)]
    out = weighted_average([w, w, w, w], [4, 4, 4, 4])
    np.testing.assert_array_equal(out[0], w[0])


def test_zero_weight_workers_are_skipped_and_all_zero_raises():
    out = weighted_average([[np.array([1.0])], [np.array([100.0])]], [2, 0])
    assert float(out[0][0]) == 1.0
    with pytest.raises(ValueError, match="positive weight"):
        weighted_average([[np.array([1.0])]], [0])


def test_mismatched_shapes_and_lengths_raise():
    acc = WeightedMean()
    acc.add([np.zeros((2, 2), np.float32)], 1)
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        acc.add([np.zeros((2, 3), np.float32)], 1)
    with pytest.raises(ValueError, match="same number of arrays"):
        acc.add([np.zeros((2, 2), np.float32)] * 2, 1)
    with pytest.raises(ValueError, match=">= 0"):
        acc.add([np.zeros((2, 2), np.float32)], -1)


def test_sync_policy_averages_weights_and_optimizer_state_by_rows():
    fit = fit_of(ModelState([np.array([0.0], np.float32)], [np.array(0, np.int64)]))
    updates = [
        WorkerUpdate(0, 300, 5, ModelState([np.array([1.0], np.float32)], [np.array(5, np.int64)])),
        WorkerUpdate(1, 100, 5, ModelState([np.array([5.0], np.float32)], [np.array(5, np.int64)])),
        WorkerUpdate(2, 0, 0, None),  # empty partition
    ]
    new = SyncAveraging().apply(fit, RoundUpdates(400, updates=updates)).master
    assert float(new.weights[0][0]) == pytest.approx(2.0)  # (300*1 + 100*5) / 400
    assert new.weights[0].dtype == np.float32
    assert int(new.optimizer[0]) == 5
    # the same from the round's mean, as a transport that reduces the updates hands it
    mean, rows = row_weighted_mean(updates)
    assert rows == 400
    assert_states_equal(SyncAveraging().apply(fit, RoundUpdates(rows, mean=mean)).master, new)


def test_row_weighted_mean_averages_the_optimizer_states_that_were_sent():
    updates = [
        WorkerUpdate(0, 1, 1, ModelState([np.array([1.0])], [np.array([4.0])])),
        WorkerUpdate(1, 3, 1, ModelState([np.array([5.0])], None)),
        WorkerUpdate(2, 0, 0, ModelState([np.array([100.0])], [np.array([100.0])])),  # no rows: no weight
    ]
    mean, rows = row_weighted_mean(updates)
    assert rows == 4 and mean.weights[0].tolist() == [4.0] and mean.optimizer[0].tolist() == [4.0]
    assert row_weighted_mean([WorkerUpdate(0, 0, 0, None)]) == (None, 0)
    mean, _ = row_weighted_mean([WorkerUpdate(0, 2, 1, ModelState([np.array([1.0])]))])
    assert mean.optimizer is None


def test_sync_policy_keeps_master_when_no_worker_trained():
    fit = fit_of(ModelState([np.array([3.0])], None), mode={"kept": [np.zeros(1)]})
    for empty in (RoundUpdates(0, updates=[WorkerUpdate(0, 0, 0, None)]), RoundUpdates(0)):
        transition = SyncAveraging().apply(fit, empty)
        assert transition.master is fit.master and transition.mode is fit.mode


def test_sync_policy_starts_every_worker_from_the_master():
    policy = get_policy("sync")
    fit = fit_of(ModelState([np.array([3.0])]))
    assert policy.starts(fit) is fit.master and policy.per_worker is False


def test_unknown_mode_is_a_config_error():
    assert get_policy("sync").name == "sync"
    with pytest.raises(ConfigError, match="Received: mode='nope'"):
        get_policy("nope")
