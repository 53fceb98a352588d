"""Asynchronous modes on hand-computed values (no server, no Spark): the update rules, SSP's clocks
and the policy the driver loop sees."""

import numpy as np
import pytest

from sparkdl.core.modes import get_policy
from sparkdl.core.modes.asynchronous import RULES, AsyncPolicy, DownpourRule, HogwildRule, SSPClock, SSPRule, StalenessAwareRule
from sparkdl.core.state import ModelState, RoundUpdates
from tests.unit.modes_helpers import assert_states_equal, fit_of


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


# --- non-trainable statistics -------------------------------------------------------------------


def _rule(name, **kw):
    return HogwildRule(in_place=False, **kw) if name == "hogwild" else RULES[name](**kw)


@pytest.mark.parametrize("name", sorted(RULES))
def test_statistics_of_two_pushes_from_one_base_average_instead_of_adding(name):
    """A kernel (trainable) and a BatchNorm moving variance (not): both workers pulled variance 1.0
    and moved it down by most of its value (to 0.25 and 0.5). Each push adds Δ / workers of the
    variance, so the master holds their mean 0.375; adding whole deltas would give 1 − 0.75 − 0.5 < 0.
    The kernel takes each push's whole Δ (staleness 0, then 1: not scaled by staleness_aware)."""
    rule = _rule(name, trainable=[True, False], workers=2)
    base = _state(np.array([1.0, 2.0], np.float32), np.array([1.0, 1.0], np.float32))
    workers = [_state(np.array([1.5, 2.0], np.float32), np.array([0.25, 0.5], np.float32)),
               _state(np.array([1.0, 3.0], np.float32), np.array([0.5, 0.25], np.float32))]
    master = base
    for staleness, worker in enumerate(workers):
        delta = ModelState([w - b for w, b in zip(worker.weights, base.weights, strict=True)])
        master = rule(master, delta, {"staleness": staleness, "rows": 4})
    np.testing.assert_array_equal(master.weights[0], [1.5, 3.0])  # 1 + 0.5 + 0, 2 + 0 + 1
    np.testing.assert_array_equal(master.weights[1], [0.375, 0.375])  # the workers' mean
    assert master.weights[1].dtype == np.float32 and np.all(master.weights[1] >= 0)
    whole = _rule(name)  # every array trainable (the default): whole deltas, a negative variance
    master = base
    for staleness, worker in enumerate(workers):
        delta = ModelState([w - b for w, b in zip(worker.weights, base.weights, strict=True)])
        master = whole(master, delta, {"staleness": staleness, "rows": 4})
    assert np.all(master.weights[1] < 0)


def test_the_policy_builds_rules_with_its_trainable_flags_and_workers():
    policy = get_policy("async", trainable=[True, False], workers=2)
    rule = policy.rule()
    assert isinstance(rule, DownpourRule) and rule.workers == 2 and rule.statistics == [False, True]
    master = _state(np.array([0.0], np.float32), np.array([1.0], np.float32))
    out = rule(master, _state(np.array([1.0], np.float32), np.array([-0.5], np.float32)), {"staleness": 0})
    assert out.weights[0].tolist() == [1.0] and out.weights[1].tolist() == [0.75]
    assert get_policy("staleness_aware").rule().name == "staleness_aware"
    assert isinstance(get_policy("hogwild").rule(), HogwildRule) and isinstance(get_policy("ssp").rule(), SSPRule)
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="workers must be an integer >= 1"):
            DownpourRule(workers=bad)


def test_the_policy_starts_from_the_master_and_adopts_the_servers():
    policy = AsyncPolicy("async")
    assert policy.per_worker is False and policy.name == "async"
    fit = fit_of(_state(np.array([1.0])), mode={"x": [np.zeros(1)]})
    assert policy.starts(fit) is fit.master
    server = _state(np.array([5.0]))
    transition = policy.apply(fit, RoundUpdates(10, master=server))
    assert transition.master is server and transition.mode is fit.mode
    assert_states_equal(policy.apply(fit, RoundUpdates(0)).master, fit.master)  # no master from the server: kept


# --- SSP ----------------------------------------------------------------------------------------


def test_ssp_clock_bounds_the_lead_over_the_slowest_worker():
    clock = SSPClock({"a": 0, "b": 0})
    assert clock.can_advance("a", 0)
    clock.advance("a", 1)
    assert not clock.can_advance("a", 0) and clock.can_advance("a", 1)
    clock.advance("a", 2)
    assert not clock.can_advance("a", 1) and clock.can_advance("a", 2)
    assert clock.can_advance("b", 0)
    clock.advance("b", 1)
    assert clock.can_advance("a", 1) and clock.min_clock() == 1
    clock.advance("b", 0)  # clocks never go back
    assert clock.clocks() == {"a": 2, "b": 1}
    clock.register("c", 1)  # joins at the clock it is given
    assert clock.clocks()["c"] == 1 and clock.min_clock() == 1
    clock.register("a", 0)  # registered already at a higher clock: kept
    assert clock.clocks()["a"] == 2
    clock.register("d")  # at 0 by default: the others wait for it
    assert clock.min_clock() == 0 and not clock.can_advance("a", 1)
    clock.unregister("d")
    clock.unregister("b")
    clock.unregister("c")
    clock.unregister("nobody")  # no error
    assert clock.can_advance("a", 0) and clock.clocks() == {"a": 2}
    clock.advance("e", 5)  # an unregistered worker is not registered by advancing
    assert "e" not in clock.clocks() and clock.can_advance("e", 0)
    assert SSPClock().min_clock() == 0
    with pytest.raises(ValueError, match="s must be >= 0"):
        clock.can_advance("a", -1)
    np.testing.assert_array_equal(SSPRule().apply(_state([1.0]), _state([2.0]), None, 3, 1).weights[0], [3.0])
