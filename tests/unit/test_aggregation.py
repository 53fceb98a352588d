import numpy as np
import pytest

from sparkdl.core.aggregation import WeightedMean, weighted_average
from sparkdl.core.modes import SyncAveraging, get_policy
from sparkdl.core.state import ModelState, WorkerUpdate
from sparkdl.errors import ConfigError


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
    master = ModelState([np.array([0.0], np.float32)], [np.array(0, np.int64)])
    updates = [
        WorkerUpdate(0, 300, 5, ModelState([np.array([1.0], np.float32)], [np.array(5, np.int64)])),
        WorkerUpdate(1, 100, 5, ModelState([np.array([5.0], np.float32)], [np.array(5, np.int64)])),
        WorkerUpdate(2, 0, 0, None),  # empty partition
    ]
    new = SyncAveraging().apply(master, updates)
    assert float(new.weights[0][0]) == pytest.approx(2.0)  # (300*1 + 100*5) / 400
    assert int(new.optimizer[0]) == 5


def test_sync_policy_keeps_master_when_no_worker_trained():
    master = ModelState([np.array([3.0])], None)
    assert SyncAveraging().apply(master, [WorkerUpdate(0, 0, 0, None)]) is master


def test_unknown_mode_is_a_config_error():
    assert get_policy("sync").name == "sync"
    with pytest.raises(ConfigError, match="Received: mode='nope'"):
        get_policy("nope")
