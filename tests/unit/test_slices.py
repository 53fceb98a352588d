"""The slice layout of backend ``sharded``: every element in exactly one owner's slice, slices that
round-trip to the same arrays, and the mode policies run on slices as on the whole state."""

import numpy as np
import pytest

from sparkdl.core.modes import get_policy
from sparkdl.core.slices import SliceLayout, assemble_mode, mode_slice
from sparkdl.core.state import FitState, ModelState, RoundUpdates
from sparkdl.errors import InvariantError


def _state(rng):
    weights = [rng.normal(size=(7, 5)).astype(np.float32), rng.normal(size=(5,)).astype(np.float32),
               np.zeros((0,), np.float32), rng.normal(size=(3, 2, 2)).astype(np.float32)]
    optimizer = [np.array(12, np.int64), rng.normal(size=(7, 5)).astype(np.float32), rng.normal(size=(5,)).astype(np.float32)]
    return ModelState(weights, optimizer)


@pytest.mark.parametrize("owners", [1, 2, 3, 4, 7, 60])
def test_every_element_lies_in_exactly_one_slice_and_slices_round_trip(owners):
    state = _state(np.random.default_rng(0))
    layout = SliceLayout.of(state, owners)
    seen = {}
    for j in range(owners):
        for p in layout.pieces(j):
            for e in range(p.start, p.stop):
                key = (p.group, p.array, e)
                assert key not in seen, key
                seen[key] = j
    total = sum(a.size for a in state.weights) + sum(np.asarray(a).size for a in state.optimizer)
    assert len(seen) == total
    sizes = [sum(p.size for p in layout.pieces(j) if p.group == 0) for j in range(owners)]
    assert max(sizes) - min(sizes) <= 1  # balanced to one element
    whole = layout.assemble(layout.split(state))
    for a, b in zip([*state.weights, *state.optimizer], [*whole.weights, *whole.optimizer], strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
    assert layout.nbytes() == sum(np.asarray(a).nbytes for a in [*state.weights, *state.optimizer])
    assert SliceLayout.from_json(layout.to_json()).pieces(owners - 1) == layout.pieces(owners - 1)


def test_a_slice_of_another_shape_is_refused():
    state = _state(np.random.default_rng(1))
    layout = SliceLayout.of(state, 3)
    part = layout.take(state, 1)
    with pytest.raises(InvariantError, match="slice 0 must hold"):
        layout.put(layout.empty(), 0, part)
    with pytest.raises(InvariantError, match="must match its slice layout"):
        layout.take(ModelState(state.weights[:2], state.optimizer), 0)


def test_weights_only_layout_holds_no_optimizer():
    state = _state(np.random.default_rng(2))
    layout = SliceLayout.of(ModelState(state.weights), 2)
    assert not layout.has_optimizer and layout.take(state, 1).optimizer is None


@pytest.mark.parametrize("mode", ["sync", "bmuf", "diloco"])
def test_a_policy_applied_slice_by_slice_equals_it_applied_whole(mode):
    """The policies are elementwise: owners applying them to their slices give the whole state's result."""
    rng = np.random.default_rng(3)
    master = _state(rng)
    mean = ModelState([w + rng.normal(size=w.shape).astype(np.float32) * 0.1 for w in master.weights],
                      [np.array(15, np.int64)] + [o + 0.5 for o in master.optimizer[1:]])
    trainable = [True, True, True, False]
    settings = {"bmuf": dict(block_momentum=0.5, trainable=trainable), "diloco": dict(trainable=trainable)}.get(mode, {})
    fit = FitState(identity={}, master=master)
    for _ in range(2):  # twice: the second round reads the mode state the first wrote
        whole = get_policy(mode, **settings).apply(fit, RoundUpdates(10, mean=mean))
        layout = SliceLayout.of(master, 3)
        parts, modes = [], []
        for j in range(3):
            piece_settings = dict(settings)
            if "trainable" in piece_settings:
                piece_settings["trainable"] = layout.per_piece(trainable, j)
            sliced = FitState(identity={}, master=layout.take(fit.master, j), mode=mode_slice(layout, fit.mode, j))
            t = get_policy(mode, **piece_settings).apply(sliced, RoundUpdates(10, mean=layout.take(mean, j)))
            parts.append(t.master)
            modes.append(t.mode)
        assembled = layout.assemble(parts)
        for a, b in zip([*whole.master.weights, *whole.master.optimizer], [*assembled.weights, *assembled.optimizer], strict=True):
            assert np.array_equal(np.asarray(a), b)
        assembled_mode = assemble_mode(layout, modes)
        assert sorted(assembled_mode) == sorted(whole.mode)
        for key in whole.mode:
            for a, b in zip(whole.mode[key], assembled_mode[key], strict=True):
                assert np.array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64))
        fit = FitState(identity={}, master=whole.master, mode=whole.mode)
