"""The asynchronous modes: update rules a parameter server applies to each push, in pure numpy.

A worker pulls the master weights ``B`` (at server version ``v_base``), trains for τ local
steps and pushes its change ``Δ = W_worker − B`` (same names, shapes and dtypes as the
weights). The server applies the push at version ``v``; the push's *staleness* is
``v − v_base``, the number of other updates applied since the worker pulled.

Conventions shared by every rule here:

* Only weights are combined. The optimizer state (moments, iteration counter) stays with
  each worker, because averaging or adding Adam moments of different workers has no
  meaning in these papers; the master optimizer arrays, when present, are returned
  unchanged.
* Floating-point arrays are combined by the rule. Non-float arrays (int, uint, bool: seed
  generator state, step counters) cannot carry a fractional change: the update holds the
  worker's *value* for them (not a difference) and the master takes it.
* Non-trainable float arrays (BatchNorm's moving mean and variance, given by ``trainable``) are
  statistics, not parameters: each push adds Δ / ``workers`` of them, whatever the rule, so the
  pushes of all workers from one base give the *mean* of their statistics, as ``sync`` does.
  Adding each worker's whole Δ would count every worker's estimate as the population's, and a
  low BatchNorm momentum could drive a moving variance below zero (finite, so no invariant
  fires, yet inference gives NaN).
* ``base`` is ``None`` when the update already holds Δ (what :class:`ParameterServerClient`
  pushes). When ``base`` is given, the update holds the worker's new weights and Δ is
  computed as ``update − base``.
* Each rule is also a server rule: ``rule(master, update, meta)`` reads ``meta["staleness"]``
  and ``meta["rows"]``, as passed by :class:`sparkdl.server.ParameterServer`.

Nothing here imports Spark, TensorFlow or Keras, and nothing starts threads.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import numpy as np

from sparkdl.core.modes.base import Mode
from sparkdl.core.state import FitState, ModelState, RoundUpdates


def _check_same_layout(master: list[np.ndarray], other: list[np.ndarray], what: str) -> None:
    if len(other) != len(master):
        raise ValueError(f"{what} must hold {len(master)} arrays, one per master weight. Received: {len(other)} arrays")
    for i, (m, o) in enumerate(zip(master, other, strict=True)):
        o = np.asarray(o)
        if o.shape != m.shape or o.dtype != m.dtype:
            raise ValueError(
                f"{what} array {i} must have shape {m.shape} {m.dtype}. Received: shape {o.shape} {o.dtype}"
            )


def _deltas(master: ModelState, update: ModelState, base: ModelState | None) -> list[np.ndarray]:
    """Δ per weight (float arrays) or the worker's value (non-float arrays)."""
    _check_same_layout(master.weights, update.weights, "update")
    if base is None:
        return [np.asarray(u) for u in update.weights]
    _check_same_layout(master.weights, base.weights, "base")
    return [
        np.subtract(u, b, dtype=m.dtype) if m.dtype.kind == "f" else np.asarray(u)
        for m, u, b in zip(master.weights, update.weights, base.weights, strict=True)
    ]


def _additive(master: ModelState, deltas: list[np.ndarray], scale: float, out: bool, statistics: list[bool] | None = None,
              workers: int = 1) -> ModelState:
    weights = []
    for i, (m, d) in enumerate(zip(master.weights, deltas, strict=True)):
        if m.dtype.kind != "f":
            value = np.array(d, dtype=m.dtype)
            if out:
                m[...] = value
                value = m
            weights.append(value)
            continue
        factor = 1.0 / workers if statistics is not None and statistics[i] else scale
        step = d if factor == 1.0 else np.multiply(d, factor, dtype=m.dtype)
        if out:
            np.add(m, step, out=m, casting="same_kind")
            weights.append(m)
        else:
            weights.append(np.add(m, step, dtype=m.dtype))
    return ModelState(weights, master.optimizer)


class _Rule:
    """Base of the rules. ``trainable`` (per weight array; default all) marks the parameters;
    the other float arrays are statistics, averaged over ``workers`` (see the module docstring)."""

    name = "rule"
    lock = True

    def __init__(self, trainable: list[bool] | None = None, workers: int = 1) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1. Received: {workers!r}")
        self.statistics = None if trainable is None else [not t for t in trainable]
        self.workers = workers

    def _add(self, master: ModelState, deltas: list[np.ndarray], scale: float, out: bool = False) -> ModelState:
        return _additive(master, deltas, scale, out, self.statistics, self.workers)

    def apply(self, master: ModelState, update: ModelState, base: ModelState | None, staleness: int, rows: int) -> ModelState:
        raise NotImplementedError

    def __call__(self, master: ModelState, update: ModelState, meta: Mapping) -> ModelState:
        return self.apply(master, update, None, int(meta.get("staleness", 0)), int(meta.get("rows", 0)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class DownpourRule(_Rule):
    """Downpour SGD's parameter-server update: ``W ← W + Δ``.

    Each worker pushes its accumulated change every τ local steps (n_push), then pulls
    (n_fetch); the server adds it to the master as it arrives, whatever its staleness.

    Paper: Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012.

    Args of :meth:`apply`:
        master: master weights (any shapes; float arrays are combined).
        update: Δ per weight (``base is None``) or the worker's new weights.
        base: the weights the worker pulled, or ``None``.
        staleness: ignored by this rule (int, updates).
        rows: ignored by this rule.

    Returns:
        A new :class:`ModelState` (new arrays; the master's are not modified) with the
        master's optimizer state unchanged.

    Raises:
        ValueError: when the update (or base) differs from the master in count, shape or dtype.
    """

    name = "downpour"

    def apply(self, master, update, base, staleness, rows):
        return self._add(master, _deltas(master, update, base), 1.0)


class HogwildRule(_Rule):
    """Hogwild!: the additive rule ``W ← W + Δ`` applied without any lock.

    ``lock = False`` tells :class:`sparkdl.server.ParameterServer` to run this rule outside
    its lock. With ``in_place=True`` (the default) the rule adds into the master arrays
    themselves (``np.add(W, Δ, out=W)``, which releases the GIL), so concurrent updates race
    element by element as in the paper rather than overwriting each other whole; readers
    may see a partially applied update. Use ``in_place=False`` for a pure function (new
    arrays), e.g. in tests.

    Paper: Recht, Ré, Wright, Niu, "Hogwild!: A Lock-Free Approach to Parallelizing
    Stochastic Gradient Descent", NIPS 2011.

    Raises:
        ValueError: when the update (or base) differs from the master in count, shape or dtype.
    """

    name = "hogwild"
    lock = False

    def __init__(self, in_place: bool = True, trainable: list[bool] | None = None, workers: int = 1) -> None:
        super().__init__(trainable, workers)
        self.in_place = bool(in_place)

    def apply(self, master, update, base, staleness, rows):
        return self._add(master, _deltas(master, update, base), 1.0, out=self.in_place)

    def __repr__(self) -> str:
        return f"HogwildRule(in_place={self.in_place})"


class StalenessAwareRule(_Rule):
    """Staleness-aware async SGD: ``W ← W + Δ / max(1, staleness)``.

    The learning rate of each push is divided by its staleness (updates applied since the
    worker pulled), so stale changes move the master less.

    Paper: Zhang, Gupta, Lian, Liu, "Staleness-aware Async-SGD for Distributed Deep
    Learning", IJCAI 2016.

    Example: master ``[1, 2]``, Δ ``[0.5, -1]``, staleness 2 → ``[1.25, 1.5]``.

    Raises:
        ValueError: on a negative staleness, or an update (or base) that differs from the
            master in count, shape or dtype.
    """

    name = "staleness_aware"

    def apply(self, master, update, base, staleness, rows):
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0 updates. Received: {staleness}")
        return self._add(master, _deltas(master, update, base), 1.0 / max(1, staleness))


class SSPRule(DownpourRule):
    """The update of a Stale Synchronous Parallel server: additive, ``W ← W + Δ``; the
    bound on staleness is enforced by :class:`SSPClock`, not by the rule.

    Paper: Ho et al., "More Effective Distributed ML via a Stale Synchronous Parallel
    Parameter Server", NIPS 2013.
    """

    name = "ssp"


class SSPClock:
    """Per-worker clocks for Stale Synchronous Parallel (bounded staleness).

    A worker's clock is the number of its slots (pushes) applied. A worker at clock ``c`` may
    start its next slot only while ``c − min_w c_w <= s``: no worker runs more than ``s`` clocks
    ahead of the slowest registered worker. ``s = 0`` is bulk synchronous; ``s = ∞`` is fully
    asynchronous. A worker stays registered while it is being retried (a failed task keeps its
    clock, so the others wait for it within the bound); only a worker that finished its slots is
    unregistered. The class is pure (no threads, no waiting); the parameter server wraps it in a
    condition variable and re-checks :meth:`can_advance` after each :meth:`advance`.

    Paper: Ho et al., "More Effective Distributed ML via a Stale Synchronous Parallel
    Parameter Server", NIPS 2013.

    Raises:
        ValueError: on a negative bound ``s``.
    """

    def __init__(self, clocks: Mapping[Hashable, int] | None = None) -> None:
        self._clocks: dict[Hashable, int] = {w: int(c) for w, c in (clocks or {}).items()}

    def register(self, worker: Hashable, clock: int = 0) -> None:
        """Adds ``worker`` at ``clock`` (kept when it is registered already at a higher clock)."""
        self._clocks[worker] = max(int(clock), self._clocks.get(worker, 0))

    def unregister(self, worker: Hashable) -> None:
        """Removes a worker that finished, so it no longer holds the others back."""
        self._clocks.pop(worker, None)

    def advance(self, worker: Hashable, clock: int) -> None:
        """Records that ``worker`` completed its slots up to ``clock`` (a registered worker only)."""
        if worker in self._clocks:
            self._clocks[worker] = max(self._clocks[worker], int(clock))

    def clocks(self) -> dict[Hashable, int]:
        return dict(self._clocks)

    def min_clock(self) -> int:
        return min(self._clocks.values(), default=0)

    def can_advance(self, worker: Hashable, s: int) -> bool:
        """True unless ``worker`` is more than ``s`` clocks ahead of the slowest registered worker."""
        if s < 0:
            raise ValueError(f"staleness bound s must be >= 0 clocks. Received: {s}")
        if worker not in self._clocks:
            return True
        return self._clocks[worker] - self.min_clock() <= s

    def __repr__(self) -> str:
        return f"SSPClock({self._clocks!r})"


RULES = {"async": DownpourRule, "hogwild": HogwildRule, "staleness_aware": StalenessAwareRule, "ssp": SSPRule}


class AsyncPolicy(Mode):
    """An asynchronous mode as the driver loop sees it: the parameter server applies each push with
    :meth:`rule` as it arrives; at each epoch's end the loop adopts the server's master
    (:attr:`~sparkdl.core.state.RoundUpdates.master`).

    Args:
        name: ``async``, ``hogwild``, ``staleness_aware`` or ``ssp``.
        trainable: per weight array, whether it is a parameter (the others are statistics, averaged).
        workers: the workers of the fit.
    """

    asynchronous = True
    uses_trainable = True

    @classmethod
    def _from_params(cls, name, params, trainable, workers):
        """The non-trainable arrays (BatchNorm statistics) averaged over the workers."""
        return cls(name, trainable=trainable, workers=workers)

    def settings(self) -> dict:
        return {"workers": self.workers}

    def __init__(self, name: str, trainable: list[bool] | None = None, workers: int = 1) -> None:
        self.name, self.trainable, self.workers = name, trainable, workers

    def rule(self) -> _Rule:
        """A new server update rule for this mode."""
        return RULES[self.name](trainable=self.trainable, workers=self.workers)

    def starts(self, fit: FitState) -> ModelState:
        return fit.master

    def apply(self, fit: FitState, round_: RoundUpdates):
        """The server's master after the epoch (``round_.master``); its optimizer state the workers'
        latest ones (``round_.updates``: each worker's ``state.optimizer``, weighted by its
        ``rows``), since the server applies weight deltas only and each worker keeps its own."""
        from sparkdl.core.aggregation import WeightedMean
        from sparkdl.core.modes import Transition

        master = round_.master if round_.master is not None else fit.master
        kept = [u for u in round_.updates or [] if u.state is not None and u.state.optimizer is not None]
        if kept:
            mean = WeightedMean()
            for update in kept:
                mean.add(update.state.optimizer, max(1, update.rows))
            master = ModelState(master.weights, [np.asarray(a) for a in mean.result()])
        return Transition(master, fit.mode)
