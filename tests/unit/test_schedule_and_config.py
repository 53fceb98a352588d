import numpy as np
import pytest

from sparkdl.config import FitConfig
from sparkdl.core.schedule import RoundPlan, epoch_order
from sparkdl.errors import ConfigError


def test_default_tau_is_one_pass_so_one_round_per_epoch():
    plan = RoundPlan((4000, 3990), batch_size=64)
    assert plan.steps_per_epoch(0) == 63 and plan.steps_per_epoch(1) == 63
    assert plan.tau == 63 and plan.rounds_per_epoch == 1
    assert plan.row_range(0, 0) == (0, 4000)


def test_explicit_tau_cuts_epochs_into_rounds_and_exhausted_workers_idle():
    plan = RoundPlan((100, 40), batch_size=10, local_steps=3)
    assert plan.rounds_per_epoch == 4  # ceil(10 steps / 3)
    assert [plan.row_range(0, r) for r in range(4)] == [(0, 30), (30, 60), (60, 90), (90, 100)]
    assert [plan.row_range(1, r) for r in range(4)] == [(0, 30), (30, 40), (40, 40), (40, 40)]


def test_epoch_order_is_seeded_and_differs_by_epoch():
    a = epoch_order(50, seed=1, epoch=0, partition=0, shuffle=True)
    assert np.array_equal(a, epoch_order(50, seed=1, epoch=0, partition=0, shuffle=True))
    assert not np.array_equal(a, epoch_order(50, seed=1, epoch=1, partition=0, shuffle=True))
    assert sorted(a.tolist()) == list(range(50))
    assert epoch_order(5, 1, 0, 0, shuffle=False).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_workers": 0}, "numWorkers must be a positive integer. Received: numWorkers=0"),
        ({"epochs": 1.5}, "epochs must be a positive integer"),
        ({"local_steps": 0}, "localSteps must be None or a positive integer"),
        ({"mode": "elastic"}, "mode must be one of"),
        ({"round_timeout_s": 0}, "roundTimeout must be a positive number of seconds"),
    ],
)
def test_fit_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FitConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [  # Elephas' words, and typos: the choice closest to what was received
        ({"mode": "synchronous"}, "mode must be one of ['sync', 'bmuf', 'easgd', 'gossip', 'diloco', 'async', 'hogwild', "
                                  "'staleness_aware', 'ssp']. Did you mean 'sync'? Received: mode='synchronous'"),
        ({"mode": "asynchronous"}, "Did you mean 'async'? Received: mode='asynchronous'"),
        ({"mode": "Hogwild"}, "Did you mean 'hogwild'? Received: mode='Hogwild'"),
        ({"backend": "shard"}, "backend must be one of ['rounds', 'ps', 'sharded', 'auto']. Did you mean 'sharded'? "
                               "Received: backend='shard'"),
    ],
)
def test_a_choice_out_of_its_set_names_the_closest_one(kwargs, message):
    with pytest.raises(ConfigError) as info:
        FitConfig(**kwargs)
    assert str(info.value).endswith(message)
    with pytest.raises(ConfigError) as info:
        FitConfig(mode="elastic")
    assert "Did you mean" not in str(info.value)


def test_the_mode_and_backend_registries_name_the_closest_one():
    from sparkdl.core.modes import policy_class
    from sparkdl.spark.backends import backend

    with pytest.raises(ConfigError, match=r"mode must be one of \[.*\]\. Did you mean 'sync'\? Received: mode='synchronous'$"):
        policy_class("synchronous")
    with pytest.raises(ConfigError, match=r"backend must be one of \[.*\]\. Did you mean 'sharded'\? Received: 'shard'$"):
        backend("shard")


def test_did_you_mean_takes_other_libraries_words_only_for_a_valid_choice():
    from sparkdl.errors import did_you_mean

    assert did_you_mean("synchronous", ["sync", "async"]) == " Did you mean 'sync'?"
    assert did_you_mean("ASYNCHRONOUS", ["sync", "async"]) == " Did you mean 'async'?"
    assert did_you_mean("synchronous", ["label", "features"]) == ""  # the alias is no column here


def canonical_order(*arrays):
    from sparkdl.core.schedule import RowFingerprints

    fingerprints = RowFingerprints([(a.shape[1:], a.dtype) for a in arrays], exact=1)
    fingerprints.add(arrays, chunk_rows=64)
    return fingerprints.order()


def test_row_fingerprints_order_depends_on_row_contents_only():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 7)).astype(np.float32)
    y = rng.integers(0, 3, 300)
    x[10], y[10] = x[20], y[20]  # equal rows are interchangeable
    order = canonical_order(x, y)
    assert sorted(order.tolist()) == list(range(300))
    for seed in (1, 2):
        p = np.random.default_rng(seed).permutation(300)
        again = canonical_order(x[p], y[p])
        np.testing.assert_array_equal(x[p][again], x[order])
        np.testing.assert_array_equal(y[p][again], y[order])
