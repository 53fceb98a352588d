"""Per-worker modes on hand-computed arrays: EASGD (Zhang, Choromanska, LeCun, NIPS 2015) and
gossiping SGD (Jin, Yuan, Iandola, Keutzer, 2016). The worker models live in the fit's mode state."""

import numpy as np
import pytest

from sparkdl.core.modes import get_policy
from sparkdl.core.modes.worker_models import ElasticAveraging, GossipAveraging, mode_state, worker_models
from sparkdl.core.state import ModelState, RoundUpdates, WorkerUpdate
from sparkdl.errors import ConfigError, InvariantError
from tests.unit.modes_helpers import assert_modes_equal, assert_states_equal, fit_of, run_round


def _model(weights, moment=None, counter=None):
    optimizer = None if moment is None else [np.array(counter, np.int64), np.array(moment, np.float32)]
    return ModelState([np.array(weights, np.float32)], optimizer)


def _update(partition, state, rows=2):
    return WorkerUpdate(partition, rows, 1, state)


def _w(state):
    return state.weights[0].tolist()


# --- the mode state -----------------------------------------------------------------------------


def test_worker_models_round_trip_through_the_mode_state():
    models = [_model([1.0], [2.0], 3), _model([4.0])]
    state = mode_state(models)
    assert sorted(state) == ["models.0.o", "models.0.w", "models.1.w"]  # no optimizer: no models.1.o
    back = worker_models(state, 2)
    for a, b in zip(back, models, strict=True):
        assert_states_equal(a, b)
    assert worker_models({}, 2) is None  # before the first round


# --- gossip -------------------------------------------------------------------------------------


def test_gossip_two_workers_average_each_other():
    policy = get_policy("gossip", workers=2, seed=1)
    assert policy.per_worker and policy.pairs(0) in ([(0, 1)], [(1, 0)])
    fit = fit_of(_model([0.0, 0.0], [0.0], 0))
    assert [_w(s) for s in policy.starts(fit)] == [[0.0, 0.0]] * 2
    run_round(policy, fit, [_update(0, _model([1.0, 3.0], [2.0], 5)), _update(1, _model([3.0, 7.0], [4.0], 9))])
    new = fit.master
    assert _w(new) == [2.0, 5.0] and new.weights[0].dtype == np.float32
    assert sorted(fit.mode) == ["models.0.o", "models.0.w", "models.1.o", "models.1.w"]
    for start in policy.starts(fit):
        assert _w(start) == [2.0, 5.0]
        assert start.optimizer[0] == 9 and start.optimizer[0].dtype == np.int64  # counter: the max
        assert start.optimizer[1].tolist() == [3.0] and start.optimizer[1].dtype == np.float32
    assert new.optimizer[0] == 9 and new.optimizer[1].tolist() == [3.0]


def test_gossip_four_workers_mix_along_a_perfect_matching():
    policy = GossipAveraging(4, seed=3)
    pairs = policy.pairs(0)
    assert len(pairs) == 2 and sorted(i for pair in pairs for i in pair) == [0, 1, 2, 3]
    assert GossipAveraging(4, seed=3).pairs(0) == pairs  # same seed, same matching
    assert len({tuple(sorted(tuple(sorted(p)) for p in policy.pairs(k))) for k in range(10)}) > 1
    values = [1.0, 10.0, 100.0, 1000.0]
    fit = run_round(policy, fit_of(_model([0.0])), [_update(i, _model([v])) for i, v in enumerate(values)])
    starts = [_w(s)[0] for s in policy.starts(fit)]
    peer = {}
    for i, start in enumerate(starts):
        matches = [j for j in range(4) if j != i and start == (values[i] + values[j]) / 2]
        assert len(matches) == 1  # the mean of itself and exactly one peer
        peer[i] = matches[0]
    assert all(peer[peer[i]] == i for i in range(4))
    assert {tuple(sorted(p)) for p in pairs} == {tuple(sorted((i, peer[i]))) for i in range(4)}
    assert _w(fit.master) == [sum(values) / 4]
    assert fit.rounds == 1  # the next round draws pairs(1)


def test_gossip_matching_follows_the_fits_round_index():
    """Round k mixes along pairs(k), k = fit.rounds: a resumed fit draws the same matchings."""
    policy = GossipAveraging(4, seed=3)
    k = next(k for k in range(1, 20) if {tuple(sorted(p)) for p in policy.pairs(k)} != {tuple(sorted(p)) for p in policy.pairs(0)})
    values = [1.0, 10.0, 100.0, 1000.0]
    fit = fit_of(_model([0.0]), rounds=k)
    transition = policy.apply(fit, RoundUpdates(8, updates=[_update(i, _model([v])) for i, v in enumerate(values)]))
    assert fit.mode == {} and fit.rounds == k  # apply changes nothing in the fit
    mixed = worker_models(transition.mode, 4)
    for a, b in policy.pairs(k):
        assert _w(mixed[a]) == _w(mixed[b]) == [(values[a] + values[b]) / 2]


def test_gossip_odd_count_leaves_one_worker_unmatched():
    policy = GossipAveraging(3, seed=0)
    pairs = policy.pairs(0)
    assert len(pairs) == 1
    (a, b), = pairs
    (lone,) = {0, 1, 2} - {a, b}
    values = [2.0, 4.0, 12.0]
    fit = run_round(policy, fit_of(_model([0.0])), [_update(i, _model([v])) for i, v in enumerate(values)])
    starts = [_w(s)[0] for s in policy.starts(fit)]
    assert starts[lone] == values[lone]
    assert starts[a] == starts[b] == (values[a] + values[b]) / 2
    assert _w(fit.master)[0] == pytest.approx(sum(starts) / 3)


def test_gossip_idle_worker_mixes_its_unchanged_start():
    policy = GossipAveraging(2)
    fit = run_round(policy, fit_of(_model([4.0])), [_update(0, _model([8.0])), WorkerUpdate(1, 0, 0, None)])
    assert [_w(s) for s in policy.starts(fit)] == [[6.0], [6.0]]  # (8 + start 4) / 2
    fit = run_round(GossipAveraging(2), fit_of(_model([4.0])), [_update(1, _model([2.0]))])  # worker 0 missing: keeps its start
    assert _w(fit.master) == [3.0]


def test_gossip_non_float_weights_take_the_pair_first_value():
    policy = GossipAveraging(2, seed=5)
    (first, second), = policy.pairs(0)
    models = {first: ModelState([np.array([1.0]), np.array([7], np.int32)]),
              second: ModelState([np.array([3.0]), np.array([9], np.int32)])}
    fit = run_round(policy, fit_of(ModelState([np.array([0.0]), np.array([0], np.int32)])), [_update(i, models[i]) for i in (0, 1)])
    for start in policy.starts(fit):
        assert start.weights[0].tolist() == [2.0]
        assert start.weights[1].tolist() == [int(models[first].weights[1][0])]
        assert start.weights[1].dtype == np.int32


# --- easgd --------------------------------------------------------------------------------------


def test_easgd_fixed_point():
    policy = ElasticAveraging(3, 0.2)
    centre = _model([1.5, -2.0], [0.5], 4)
    fit = run_round(policy, fit_of(centre), [_update(i, centre) for i in range(3)])
    assert _w(fit.master) == [1.5, -2.0]
    assert all(_w(s) == [1.5, -2.0] for s in policy.starts(fit))
    run_round(policy, fit, RoundUpdates(0, updates=[]))
    assert _w(fit.master) == [1.5, -2.0] and all(_w(s) == [1.5, -2.0] for s in policy.starts(fit))


def test_easgd_by_hand():
    policy = get_policy("easgd", workers=2, elastic_force=0.25)
    assert policy.per_worker and policy.alpha == 0.25
    fit = fit_of(_model([0.0], [0.0], 0))
    assert all(s is fit.master for s in policy.starts(fit))  # before the first round: the master
    run_round(policy, fit, [_update(0, _model([4.0], [1.0], 3)), _update(1, _model([8.0], [3.0], 5))])
    starts, new = policy.starts(fit), fit.master
    assert _w(starts[0]) == [3.0] and _w(starts[1]) == [6.0]  # 4 − 0.25·4, 8 − 0.25·8
    assert _w(new) == [3.0] and new.weights[0].dtype == np.float32  # 0 + 0.25·(4 + 8)
    # optimizer states are not mixed: each worker keeps its own; the centre gets their mean
    assert starts[0].optimizer[1].tolist() == [1.0] and starts[0].optimizer[0] == 3
    assert starts[1].optimizer[1].tolist() == [3.0] and starts[1].optimizer[0] == 5
    assert new.optimizer[1].tolist() == [2.0]
    assert fit.mode["models.1.w"][0].tolist() == [6.0] and fit.mode["models.1.o"][0] == 5


def test_easgd_a_worker_that_did_not_train_neither_pulls_nor_is_pulled():
    """Absent updates carry no weight (as in sync, case C05): round 2 trains worker 0 only."""
    policy = ElasticAveraging(2, 0.25)
    fit = run_round(policy, fit_of(_model([0.0])), [_update(0, _model([4.0])), _update(1, _model([8.0]))])  # starts 3, 6; centre 3
    run_round(policy, fit, [_update(0, _model([5.0])), WorkerUpdate(1, 0, 0, None)])
    starts = policy.starts(fit)
    assert _w(fit.master) == [3.5] and _w(starts[0]) == [4.5] and _w(starts[1]) == [6.0]  # 3 + 0.25·(5 − 3); 5 − 0.25·2; kept
    assert fit.master.optimizer is None and "models.0.o" not in fit.mode


def test_easgd_default_and_refused_elastic_force():
    assert ElasticAveraging(2).alpha == pytest.approx(0.45)
    assert get_policy("easgd", workers=4).alpha == pytest.approx(0.225)
    with pytest.raises(ConfigError, match="elasticForce") as info:
        ElasticAveraging(2, 0.0)
    assert "0.0" in str(info.value)
    with pytest.raises(ConfigError, match="elasticForce") as info:
        get_policy("easgd", workers=2, elastic_force=0.6)
    assert "0.6" in str(info.value) and "0.5" in str(info.value)
    with pytest.raises(ConfigError, match="numWorkers"):
        ElasticAveraging(0)


def test_easgd_non_float_weights_are_kept():
    policy = ElasticAveraging(2, 0.25)
    fit = run_round(policy, fit_of(ModelState([np.array([0.0]), np.array([1], np.int64)])),
                    [_update(0, ModelState([np.array([4.0]), np.array([5], np.int64)])),
                     _update(1, ModelState([np.array([8.0]), np.array([7], np.int64)]))])
    assert fit.master.weights[1].tolist() == [1] and fit.master.weights[1].dtype == np.int64
    assert [s.weights[1].tolist() for s in policy.starts(fit)] == [[5], [7]]


# --- both ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [ElasticAveraging(2), GossipAveraging(2)], ids=["easgd", "gossip"])
def test_a_round_mean_is_refused(policy):
    with pytest.raises(ConfigError, match="per_worker"):
        policy.apply(fit_of(_model([0.0])), RoundUpdates(2, mean=_model([1.0])))


@pytest.mark.parametrize("policy", [ElasticAveraging(2), GossipAveraging(2)], ids=["easgd", "gossip"])
def test_updates_of_unknown_or_repeated_partitions_are_refused(policy):
    fit = fit_of(_model([0.0]))
    with pytest.raises(InvariantError, match=r"partition must be in \[0, 2\)"):
        policy.apply(fit, RoundUpdates(2, updates=[_update(2, _model([1.0]))]))
    with pytest.raises(InvariantError, match="partition 0 twice"):
        policy.apply(fit, RoundUpdates(4, updates=[_update(0, _model([1.0])), _update(0, _model([2.0]))]))


@pytest.mark.parametrize("policy", [ElasticAveraging(2, 0.25), GossipAveraging(2)], ids=["easgd", "gossip"])
def test_apply_leaves_the_fit_unchanged(policy):
    fit = run_round(policy, fit_of(_model([0.0], [0.0], 0)), [_update(0, _model([4.0], [1.0], 3)), _update(1, _model([8.0], [3.0], 5))])
    master, mode = fit.master, {k: [a.copy() for a in v] for k, v in fit.mode.items()}
    transition = policy.apply(fit, RoundUpdates(4, updates=[_update(0, _model([9.0], [2.0], 4))]))
    assert fit.master is master and fit.rounds == 1
    assert_modes_equal(fit.mode, mode)
    assert transition.mode is not fit.mode
