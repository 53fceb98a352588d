"""Helpers for the mode-policy tests: a fit's state and the driver loop's use of a policy, in numpy.

The driver loop (:mod:`sparkdl.spark.training.loop`) asks the policy for the round's start states,
runs the round, then commits the policy's :class:`~sparkdl.core.modes.Transition` into the fit's
state and counts the round; :func:`run_round` does the same, without Spark.
"""

from __future__ import annotations

import numpy as np

from sparkdl.core.state import FitState, ModelState, RoundUpdates, WorkerUpdate


def fit_of(master: ModelState, **kw) -> FitState:
    """A fresh fit's state holding ``master``."""
    return FitState(identity=kw.pop("identity", {}), master=master, **kw)


def round_of(updates: list[WorkerUpdate] | None = None, *, mean: ModelState | None = None, rows: int | None = None) -> RoundUpdates:
    """One round's updates: each worker's (``updates``) or their row-weighted ``mean`` over ``rows``."""
    if updates is not None:
        rows = sum(u.rows for u in updates if u.state is not None) if rows is None else rows
        return RoundUpdates(rows, updates=list(updates))
    return RoundUpdates(rows or 0, mean=mean)


def run_round(policy, fit: FitState, round_: RoundUpdates | list[WorkerUpdate]) -> FitState:
    """Apply one round to ``fit`` as the loop does (commit the transition, count the round); returns ``fit``."""
    if not isinstance(round_, RoundUpdates):
        round_ = round_of(round_)
    transition = policy.apply(fit, round_)
    fit.master, fit.mode = transition.master, transition.mode
    fit.rounds += 1
    return fit


def run_rounds(policy, fit: FitState, rounds) -> FitState:
    """Apply each round of ``rounds`` in turn (see :func:`run_round`)."""
    for round_ in rounds:
        run_round(policy, fit, round_)
    return fit


def assert_states_equal(a: ModelState | None, b: ModelState | None) -> None:
    """Bit-exact equality of two model states (every array: values, dtype and shape)."""
    assert (a is None) == (b is None)
    if a is None:
        return
    assert_arrays_equal(a.weights, b.weights)
    assert (a.optimizer is None) == (b.optimizer is None)
    if a.optimizer is not None:
        assert_arrays_equal(a.optimizer, b.optimizer)


def assert_arrays_equal(a, b) -> None:
    """Bit-exact equality of two lists of arrays (None equals None only)."""
    assert (a is None) == (b is None)
    if a is None:
        return
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, x.shape, y.dtype, y.shape)
        np.testing.assert_array_equal(x, y)
        if x.dtype.kind == "f":  # the same bits: -0.0 vs 0.0 and NaN payloads included
            assert x.tobytes() == y.tobytes()


def assert_modes_equal(a: dict, b: dict) -> None:
    """Bit-exact equality of two mode states (``FitState.mode``)."""
    assert sorted(a) == sorted(b)
    for key in a:
        assert_arrays_equal(a[key], b[key])
