"""The backends' registry (``sparkdl.spark.backends``): what each backend declares it runs, read
against every mode's own declarations (``sparkdl.core.modes``), and the refusals it words before
any job. The fits themselves: test_auto_backend.py, test_sharded.py, test_ps_*.py."""

import pytest

from sparkdl.param_specs import BACKENDS as BACKEND_CHOICES
from sparkdl.config import FitConfig
from sparkdl.core.modes import MODE_NAMES, build_policy, policy_class
from sparkdl.errors import ConfigError
from sparkdl.spark.backends import BACKENDS, backend, check, running

# every (backend, mode) pair, as the project documents it (docs/user-guide/training-modes.md)
RUNS = {
    "rounds": {"sync", "bmuf", "easgd", "gossip"},
    "ps": {"sync", "bmuf", "easgd", "gossip", "async", "hogwild", "staleness_aware", "ssp"},
    "sharded": {"sync", "bmuf", "diloco"},
}


@pytest.mark.parametrize("name", list(RUNS))
def test_each_backend_runs_exactly_the_modes_it_documents(name):
    assert set(backend(name).modes) == RUNS[name]
    assert {m for m in MODE_NAMES if name in running(m)} == RUNS[name]


def test_the_backend_params_choices_are_the_registrys_names_and_auto():
    assert BACKEND_CHOICES == (*BACKENDS, "auto")
    handed = [b.hands_over_to for b in BACKENDS.values() if b.hands_over_to is not None]
    assert handed and all(h in BACKENDS and not backend(h).long_lived for h in handed)  # the successor needs no slot per worker


@pytest.mark.parametrize(("settings", "words"), [
    (dict(mode="ssp", backend="rounds"), r"mode 'ssp' is asynchronous and runs on backend 'ps'.*Use backend 'ps' or 'auto'"),
    (dict(mode="diloco", backend="ps"), r"mode 'diloco' keeps each worker's optimizer.*Use backend 'sharded' or 'auto'"),
    (dict(mode="gossip", backend="sharded"), r"mode 'gossip' cannot be sliced.*Use backends 'ps' and 'rounds' or 'auto'"),
    (dict(keep_local_optimizer=True, backend="ps"), r"keepLocalOptimizer is a setting of backend 'sharded'\. Received"),
    (dict(compression="int8", backend="ps"), r"compression='int8' runs on backend 'sharded'"),
    (dict(min_workers_per_round=1, backend="sharded"), r"minWorkersPerRound \(straggler-tolerant rounds\) runs on backends 'ps' and"),
])
def test_a_fit_its_backend_cannot_run_is_refused_naming_the_rule_and_the_backends_that_can(settings, words):
    with pytest.raises(ConfigError, match=words):
        check(FitConfig(**settings))


def test_validation_is_refused_only_where_declared_and_auto_is_never_refused_here():
    assert backend("sharded").refusal(FitConfig(backend="sharded"), validation=True).startswith(
        "backend 'sharded' keeps the state in its workers' tasks")
    assert backend("ps").refusal(FitConfig(backend="ps"), validation=True) is None
    check(FitConfig(mode="ssp"))  # auto: resolved against the session, nothing refused here


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_each_mode_builds_itself_from_its_params_and_rebuilds_from_its_settings(mode):
    """A mode is one class: it reads the Params it declares, gives the settings a slice owner
    rebuilds it from, and the identity a snapshot must match (the user's values, not the defaults)."""
    cls = policy_class(mode)
    params = {"blockMomentum": None, "blockLearningRate": 1.0, "nesterov": True, "elasticForce": None,
              "outerLearningRate": 0.7, "outerMomentum": 0.9, "seed": 3}
    policy = build_policy(mode, params, trainable=[True, False], workers=4)
    assert policy.name == mode and set(cls.PARAMS) <= set(params)
    identity = policy.identity()
    assert identity["name"] == mode and set(identity) - {"name"} <= set(cls.PARAMS)
    again = type(policy)(mode, **policy.settings()) if cls.asynchronous else type(policy)(**policy.settings())
    assert again.settings() == policy.settings()
    if mode == "bmuf":
        assert policy.eta == pytest.approx(0.75) and identity["blockMomentum"] is None  # 1 - 1/4; the user set none
