"""Asynchronous update rules on hand-computed values (no server, no Spark)."""

import numpy as np
import pytest

from sparkdl.core.async_rules import DownpourRule, HogwildRule, SSPClock, SSPRule, StalenessAwareRule
from sparkdl.core.state import ModelState


def _state(*arrays, optimizer=None):
    return ModelState([np.array(a) for a in arrays], optimizer)


def test_downpour_adds_the_delta_and_leaves_master_untouched():
    master = _state(np.array([1.0, 2.0], np.float32))
    out = DownpourRule().apply(master, _state(np.array([0.5, -1.0], np.float32)), None, staleness=5, rows=10)
    np.testing.assert_array_equal(out.weights[0], [1.5, 1.0])
    assert out.weights[0].dtype == np.float32
    np.testing.assert_array_equal(master.weights[0], [1.0, 2.0])


def test_staleness_aware_divides_by_staleness():
    master = _state(np.array([1.0, 2.0]))
    update = _state(np.array([0.5, -1.0]))
    rule = StalenessAwareRule()
    np.testing.assert_allclose(rule.apply(master, update, None, 2, 1).weights[0], [1.25, 1.5])
    np.testing.assert_allclose(rule.apply(master, update, None, 0, 1).weights[0], [1.5, 1.0])  # max(1, 0)
    np.testing.assert_allclose(rule.apply(master, update, None, 4, 1).weights[0], [1.125, 1.75])
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        rule.apply(master, update, None, -1, 1)


def test_base_given_means_update_holds_worker_weights():
    master = _state(np.array([1.0, 2.0], np.float32))
    base = _state(np.array([0.0, 0.0], np.float32))
    worker = _state(np.array([0.5, -1.0], np.float32))
    np.testing.assert_allclose(StalenessAwareRule().apply(master, worker, base, 2, 1).weights[0], [1.25, 1.5])
    np.testing.assert_allclose(DownpourRule().apply(master, worker, base, 2, 1).weights[0], [1.5, 1.0])


def test_non_float_arrays_take_the_worker_value_and_optimizer_is_kept():
    opt = [np.array([7.0])]
    master = _state(np.array([1.0]), np.array([3], np.int64), np.array([False]), optimizer=opt)
    update = _state(np.array([1.0]), np.array([9], np.int64), np.array([True]))
    out = StalenessAwareRule().apply(master, update, None, 3, 1)
    np.testing.assert_allclose(out.weights[0], [1 + 1 / 3])
    assert out.weights[1].tolist() == [9] and out.weights[1].dtype == np.int64
    assert out.weights[2].tolist() == [True]
    assert out.optimizer is opt


def test_hogwild_is_lock_free_and_in_place():
    assert HogwildRule.lock is False and DownpourRule.lock is True
    master = _state(np.array([1.0, 2.0]))
    arr = master.weights[0]
    out = HogwildRule().apply(master, _state(np.array([0.5, -1.0])), None, 1, 1)
    assert out.weights[0] is arr
    np.testing.assert_array_equal(arr, [1.5, 1.0])
    pure = HogwildRule(in_place=False).apply(master, _state(np.array([1.0, 1.0])), None, 1, 1)
    np.testing.assert_array_equal(pure.weights[0], [2.5, 2.0])
    np.testing.assert_array_equal(arr, [1.5, 1.0])


def test_server_call_form_reads_staleness_from_meta():
    master = _state(np.array([1.0, 2.0]))
    out = StalenessAwareRule()(master, _state(np.array([0.5, -1.0])), {"staleness": 2, "rows": 3})
    np.testing.assert_allclose(out.weights[0], [1.25, 1.5])


def test_layout_mismatch_is_rejected_with_rule_and_received():
    master = _state(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"shape \(3, 2\) float32. Received: shape \(2, 2\) float32"):
        DownpourRule().apply(master, _state(np.zeros((2, 2), np.float32)), None, 0, 1)
    with pytest.raises(ValueError, match="must hold 1 arrays"):
        DownpourRule().apply(master, _state(np.zeros((3, 2), np.float32), np.zeros(1)), None, 0, 1)


def test_ssp_clock_bounds_the_lead_over_the_slowest_worker():
    clock = SSPClock(["a", "b"])
    assert clock.can_advance("a", 0)
    clock.tick("a")
    assert not clock.can_advance("a", 0) and clock.can_advance("a", 1)
    clock.tick("a")
    assert not clock.can_advance("a", 1) and clock.can_advance("a", 2)
    assert clock.can_advance("b", 0)
    clock.tick("b")
    assert clock.can_advance("a", 1) and clock.min_clock() == 1
    clock.register("c")  # joins at the slowest clock
    assert clock.clock("c") == 1
    clock.unregister("b")
    clock.unregister("c")
    assert clock.can_advance("a", 0)
    with pytest.raises(ValueError, match="s must be >= 0"):
        clock.can_advance("a", -1)
    np.testing.assert_array_equal(SSPRule().apply(_state([1.0]), _state([2.0]), None, 3, 1).weights[0], [3.0])
