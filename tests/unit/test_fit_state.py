"""FitState snapshots: bit-exact round trips, refusal of another fit's snapshot, and, for every round
mode, "resume equals uninterrupted" on the pure-numpy core (a policy applied round after round)."""

import copy
import json

import numpy as np
import pytest

from sparkdl.core.modes import get_policy
from sparkdl.core.modes.averaging import row_weighted_mean
from sparkdl.core.state import EpochProgress, FitState, ModelState, RoundUpdates, WorkerLocal, WorkerUpdate
from sparkdl.errors import CodecError, ConfigError
from tests.unit.modes_helpers import assert_arrays_equal, assert_modes_equal, assert_states_equal, run_rounds

IDENTITY = {
    "model": {"weights": [["dense/kernel", [3, 2], "<f4"], ["seed", [], "<i8"], ["mask", [2], "|b1"]],
              "optimizer": [[[], "<i8"], [[3, 2], "<f4"], [[2], "|b1"]]},
    "mode": {"name": "bmuf", "blockMomentum": 0.5, "blockLearningRate": 1.0, "nesterov": True},
    "schedule": {"batch_size": 8, "local_steps": 2, "seed": 0, "shuffle": True, "keep_partitioning": False},
    "compression": {"method": None, "threshold": None},
    "min_workers_per_round": 2,
    "data": {"partition_rows": [10, 7]},
}


def _master():
    kernel = np.array([[0.1, -0.0], [np.inf, -np.inf], [np.nan, np.finfo(np.float32).tiny / 2]], np.float32)  # -0, ±inf, NaN, subnormal
    weights = [kernel, np.array(2**40 + 3, np.int64), np.array([True, False])]
    optimizer = [np.array(17, np.int64), np.arange(6, dtype=np.float32).reshape(3, 2) / 7, np.array([False, True])]
    return ModelState(weights, optimizer)


def _full_state() -> FitState:
    master = _master()
    mode = {
        "delta": [np.array([[1 / 3, -0.0], [5e-324, 1e308], [-2.5, 0.0]]), np.array(0.0), np.zeros(2)],  # float64, subnormal
        "models.0.w": [w.copy() for w in master.weights],
        "models.0.o": [o.copy() for o in master.optimizer],
        "models.1.w": [master.weights[0] * 2, np.array(5, np.int64), np.array([False, False])],  # no models.1.o
    }
    local = {
        0: WorkerLocal(3, None, [np.array(4, np.int64), np.full((3, 2), 0.25, np.float32)]),  # residual None
        1: WorkerLocal(2, [np.full((3, 2), -1e-8, np.float32), np.array(0, np.int64), np.zeros(2, bool)], None),  # optimizer None
        2: WorkerLocal(-1),  # neither
    }
    epoch = EpochProgress([np.array(12.5), np.array([3.0, 1 / 3]), np.array(7, np.int64)], rows=17, dropped=3, nbytes=123456, expected=20)
    return FitState(
        identity=copy.deepcopy(IDENTITY), master=master, mode=mode, local=local, rounds=7, epochs=2, epoch=epoch,
        history={"loss": [0.5, 1 / 3], "val_loss": [0.75, 0.1 + 0.2]},
        info={"learning_rates": [[0, 0.1, None]], "stopped": {"epoch": 2, "round": 7}, "local_state_resets": 0},
    )


def _through_json(meta: dict) -> dict:
    """The metadata as a checkpoint reads it back (JSON on a filesystem)."""
    return json.loads(json.dumps(meta, sort_keys=True))


def _assert_fit_states_equal(a: FitState, b: FitState) -> None:
    assert a.identity == b.identity
    assert_states_equal(a.master, b.master)
    assert_modes_equal(a.mode, b.mode)
    assert sorted(a.local) == sorted(b.local)
    for p in a.local:
        assert a.local[p].version == b.local[p].version
        assert_arrays_equal(a.local[p].residual, b.local[p].residual)
        assert_arrays_equal(a.local[p].optimizer, b.local[p].optimizer)
    assert (a.rounds, a.epochs) == (b.rounds, b.epochs)
    assert_arrays_equal(a.epoch.sums, b.epoch.sums)
    assert (a.epoch.rows, a.epoch.dropped, a.epoch.nbytes, a.epoch.expected) == (b.epoch.rows, b.epoch.dropped, b.epoch.nbytes, b.epoch.expected)
    assert a.history == b.history and a.info == b.info


# ---- round trip ----------------------------------------------------------------------------------


def test_snapshot_and_restore_round_trip_bit_for_bit():
    state = _full_state()
    payload, meta = state.snapshot()
    assert isinstance(payload, bytes) and b"pickle" not in payload
    restored = FitState.restore(payload, _through_json(meta), copy.deepcopy(IDENTITY))
    _assert_fit_states_equal(restored, state)
    assert "models.1.o" not in restored.mode and restored.local[0].residual is None and restored.local[1].optimizer is None
    assert restored.local[2].residual is None and restored.local[2].optimizer is None and restored.local[2].version == -1
    assert restored.master.weights[1].shape == () and restored.master.weights[1].dtype == np.int64
    assert restored.mode["delta"][0][1, 0] == 5e-324 and np.signbit(restored.mode["delta"][0][0, 1])
    assert isinstance(restored.history["loss"][1], float) and restored.history["val_loss"][1] == 0.1 + 0.2
    # what restore returns is the restoring fit's own: changing it changes neither the meta nor a second restore
    restored.info["stopped"]["epoch"] = 99
    restored.info["learning_rates"][0][1] = 99
    again = FitState.restore(payload, meta)
    assert again.info == state.info and meta["info"]["stopped"]["epoch"] == 2 and meta["info"]["learning_rates"][0][1] == 0.1
    # a snapshot of the restored state is the same snapshot
    payload_2, meta_2 = FitState.restore(payload, meta).snapshot()
    assert payload_2 == payload and meta_2 == meta


def test_an_empty_fit_state_round_trips():
    state = FitState(identity={"model": {}}, master=ModelState([np.zeros(0, np.float32)]))
    payload, meta = state.snapshot()
    restored = FitState.restore(payload, _through_json(meta), {"model": {}})
    _assert_fit_states_equal(restored, state)
    assert restored.master.optimizer is None and restored.epoch.sums is None and restored.mode == {} and restored.local == {}


def test_a_snapshot_refuses_what_json_cannot_hold():
    state = FitState(identity={}, master=ModelState([np.zeros(1)]), info={"bad": np.float32(1.0)})
    with pytest.raises(TypeError):
        state.snapshot()


# ---- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, named", [
    (lambda i: i["mode"].update(name="sync"), "mode.name"),
    (lambda i: i["model"]["weights"][0].__setitem__(1, [2, 3]), "model.weights"),
    (lambda i: i["data"].update(partition_rows=[10, 8]), "data.partition_rows"),
    (lambda i: i["schedule"].update(local_steps=None), "schedule.local_steps"),
    (lambda i: i.pop("compression"), "compression"),
])
def test_restore_refuses_another_fits_snapshot_naming_the_difference(change, named):
    payload, meta = _full_state().snapshot()
    other = copy.deepcopy(IDENTITY)
    change(other)
    with pytest.raises(ConfigError, match="checkpoint") as info:
        FitState.restore(payload, _through_json(meta), other)
    assert repr(named) in str(info.value) or f"its {named} must equal" in str(info.value)
    FitState.restore(payload, _through_json(meta), copy.deepcopy(IDENTITY))  # its own identity restores


def test_restore_names_both_values_of_the_differing_key():
    payload, meta = _full_state().snapshot()
    other = copy.deepcopy(IDENTITY)
    other["mode"]["name"] = "sync"
    with pytest.raises(ConfigError, match=r'its mode.name must equal this fit\'s. Received: "bmuf" in the checkpoint, "sync" in this fit'):
        FitState.restore(payload, meta, other)


def test_restore_refuses_another_snapshot_format():
    payload, meta = _full_state().snapshot()
    with pytest.raises(ConfigError, match="format 1"):
        FitState.restore(payload, {**meta, "format": "0"})
    with pytest.raises(ConfigError, match="format 1"):
        FitState.restore(payload, [meta])


def test_restore_refuses_a_payload_that_does_not_match_its_metadata():
    state = _full_state()
    _, meta = state.snapshot()
    extra = copy.copy(state)
    extra.mode = {**state.mode, "zz": [np.ones(1)]}  # one array more than the metadata lists
    with pytest.raises(CodecError, match="only the arrays its metadata lists.*mode.zz/0"):
        FitState.restore(extra.snapshot()[0], meta, IDENTITY)
    longer = copy.copy(state)
    longer.history = {}
    longer.master = ModelState([*state.master.weights, np.zeros(1)], state.master.optimizer)
    with pytest.raises(CodecError, match="only the arrays"):
        FitState.restore(longer.snapshot()[0], meta, IDENTITY)
    missing = copy.copy(state)
    missing.mode = {k: v for k, v in state.mode.items() if k != "delta"}  # the metadata lists mode.delta/0..2
    with pytest.raises(CodecError, match="every array its metadata lists.*mode.delta/0"):
        FitState.restore(missing.snapshot()[0], meta, IDENTITY)
    with pytest.raises(CodecError):
        FitState.restore(b"not an arrow stream", meta, IDENTITY)


# ---- resume equals uninterrupted -----------------------------------------------------------------


def _random_state(rng, optimizer=True):
    weights = [rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(2).astype(np.float32),
               np.array(rng.integers(0, 100), np.int64)]
    opt = [np.array(rng.integers(0, 1000), np.int64), rng.standard_normal((3, 2)).astype(np.float32)] if optimizer else None
    return ModelState(weights, opt)


def _rounds(mode: str, workers: int, seed: int = 7) -> list[RoundUpdates]:
    """4 rounds of random worker states; a worker now and then trains no rows (an exhausted partition)."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(4):
        updates = []
        for p in range(workers):
            rows = int(rng.integers(1, 50)) if (g + p) % 3 else 0
            updates.append(WorkerUpdate(p, rows, 2, _random_state(rng) if rows else None))
        if mode in ("sync", "bmuf"):  # the round's row-weighted mean, as the transports bring it
            mean, rows = row_weighted_mean(updates)
            out.append(RoundUpdates(rows, mean=mean))
        else:
            out.append(RoundUpdates(sum(u.rows for u in updates), updates=updates))
    return out


MODES = [("sync", {}, 2), ("bmuf", {"block_momentum": 0.5, "nesterov": True}, 2), ("easgd", {"workers": 2}, 2),
         ("gossip", {"workers": 3, "seed": 11}, 3)]


@pytest.mark.parametrize("mode, settings, workers", MODES, ids=[m[0] for m in MODES])
def test_resume_from_a_snapshot_equals_the_uninterrupted_run(mode, settings, workers):
    identity = {"mode": {"name": mode}, "data": {"partition_rows": [50] * workers}}
    start = _random_state(np.random.default_rng(1))

    whole = run_rounds(get_policy(mode, **settings), FitState(identity=identity, master=start), _rounds(mode, workers))

    first = run_rounds(get_policy(mode, **settings), FitState(identity=identity, master=start), _rounds(mode, workers)[:2])
    assert first.rounds == 2
    payload, meta = first.snapshot()
    resumed = FitState.restore(payload, _through_json(meta), identity)
    resumed = run_rounds(get_policy(mode, **settings), resumed, _rounds(mode, workers)[2:])  # a new policy: it keeps no state

    assert resumed.rounds == whole.rounds == 4
    assert_states_equal(resumed.master, whole.master)
    assert_modes_equal(resumed.mode, whole.mode)
    if mode == "sync":
        assert whole.mode == {}
    elif mode == "bmuf":
        assert sorted(whole.mode) == ["delta"]
    else:
        assert sorted(whole.mode) == sorted(f"models.{i}.{k}" for i in range(workers) for k in "wo")
    # the rounds changed the master: the comparison is not of two untouched starts
    assert not np.array_equal(whole.master.weights[0], start.weights[0])
