"""Mode policies: how the driver turns one round's worker updates into new master weights.

A policy is pure numpy and knows nothing of Spark or Keras. The ``rounds`` backend combines a
round's updates where they are (on the executors for large rounds, see
:mod:`sparkdl.core.pieces`) and hands the policy the master :class:`~sparkdl.core.state.ModelState`
with the row-weighted mean of the workers' states and the rows behind it (:meth:`apply_mean`);
a backend that holds the per-worker list (:class:`~sparkdl.core.state.WorkerUpdate`, workers that
saw no rows included with ``rows == 0``) calls :meth:`apply`. Both return the new master.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from sparkdl.core.aggregation import WeightedMean
from sparkdl.core.state import ModelState, WorkerUpdate
from sparkdl.errors import ConfigError


class ModePolicy(Protocol):
    """Interface of a training mode's update rule."""

    name: str

    def apply(self, master: ModelState, updates: Sequence[WorkerUpdate]) -> ModelState:
        """Return the new master state after one round, from every worker's update."""

    def apply_mean(self, master: ModelState, mean: ModelState | None, rows: int) -> ModelState:
        """Return the new master state after one round, from the row-weighted mean of the workers'
        states (``None`` when no worker trained) and the rows trained."""

    # Optional: ``start(master) -> ModelState``, the state the workers start a round from when it
    # is not the master itself (BMUF's Nesterov look-ahead W + η·Δ).


class _RoundPolicy:
    """A policy that acts on the round's row-weighted mean: :meth:`apply` reduces the per-worker
    list to that mean and calls :meth:`apply_mean`."""

    def apply(self, master: ModelState, updates: Sequence[WorkerUpdate]) -> ModelState:
        mean, rows = _row_weighted_mean(updates)
        return self.apply_mean(master, mean, rows)


class SyncAveraging(_RoundPolicy):
    """Synchronous model averaging every τ local steps, weighted by rows.

    W ← Σᵢ nᵢ·Wᵢ / Σᵢ nᵢ over the workers that trained in the round, for model weights
    (trainable and non-trainable) and optimizer state alike, so that Adam moments and the
    iteration counter survive from round to round. With one worker this is exactly local
    training. Workers with nᵢ = 0 (an empty or exhausted partition) carry no weight; a round
    in which no worker trained leaves the master unchanged.

    References:
        Moritz, Nishihara, Stoica, Jordan. "SparkNet: Training Deep Networks in Spark", ICLR 2016.
        Su, Chen. "Experiments on Parallel Training of Deep Neural Network using Model Averaging", 2015.
    """

    name = "sync"

    def apply_mean(self, master: ModelState, mean: ModelState | None, rows: int) -> ModelState:
        """W ← the mean itself; the master is kept when no worker trained (``mean`` None or 0 rows)."""
        if mean is None or rows == 0:
            return master
        return ModelState(mean.weights, mean.optimizer if mean.optimizer is not None else master.optimizer)


class BlockMomentum(_RoundPolicy):
    """Blockwise model-update filtering (BMUF): model averaging with momentum across blocks.

    Each round (a block of τ local steps) starts every worker from W_g; with W̄ the row-weighted
    average of the worker models after the block:

        G = W̄ − W_g                 (the block's aggregated update)
        Δ ← η·Δ + ζ·G                (block momentum η, block learning rate ζ)
        W ← W + Δ
        W_g = W + η·Δ  with Nesterov, else W   (where the next block starts)

    η = 0, ζ = 1 is plain model averaging (``sync``). Only the entries of ``trainable`` are
    filtered; the others (BatchNorm moving statistics, integer variables) and the optimizer state
    take the average as in ``sync``. Δ is kept here, as the fit's state (:attr:`delta`).

    Args:
        block_momentum: η in [0, 1), e.g. 1 − 1/numWorkers (the paper's advice).
        block_learning_rate: ζ > 0 (default 1).
        nesterov: start each block from W + η·Δ (default True).
        trainable: per weight array, whether it is filtered (default: every float array).

    References:
        Chen, Huo. "Scalable training of deep learning machines by incremental block training with
        intra-block parallel optimization and blockwise model-update filtering", ICASSP 2016.
    """

    name = "bmuf"

    def __init__(self, block_momentum: float, block_learning_rate: float = 1.0, nesterov: bool = True,
                 trainable: Sequence[bool] | None = None) -> None:
        if not 0.0 <= block_momentum < 1.0:
            raise ConfigError(f"blockMomentum must be in [0, 1). Received: {block_momentum!r}")
        if not block_learning_rate > 0:
            raise ConfigError(f"blockLearningRate must be > 0. Received: {block_learning_rate!r}")
        self.eta, self.zeta, self.nesterov = float(block_momentum), float(block_learning_rate), bool(nesterov)
        self.trainable = None if trainable is None else list(trainable)
        self.delta: list[np.ndarray] | None = None

    def _filtered(self, i: int, array: np.ndarray) -> bool:
        return array.dtype.kind == "f" and (self.trainable is None or self.trainable[i])

    def start(self, master: ModelState) -> ModelState:
        """W_g: the state the workers start the next block from (W + η·Δ with Nesterov)."""
        if not self.nesterov or self.delta is None or self.eta == 0.0:
            return master
        weights = [(w + self.eta * d).astype(w.dtype) if self._filtered(i, w) else w
                   for i, (w, d) in enumerate(zip(master.weights, self.delta, strict=True))]
        return ModelState(weights, master.optimizer)

    def apply_mean(self, master: ModelState, mean: ModelState | None, rows: int) -> ModelState:
        if mean is None or rows == 0:
            return master
        start = self.start(master)
        if self.delta is None:
            self.delta = [np.zeros(w.shape, np.float64) for w in master.weights]
        weights = []
        for i, (w, w_g, average) in enumerate(zip(master.weights, start.weights, mean.weights, strict=True)):
            if not self._filtered(i, w):
                weights.append(np.asarray(average, dtype=w.dtype))
                continue
            step = self.eta * self.delta[i] + self.zeta * (np.asarray(average, np.float64) - w_g)
            self.delta[i] = step
            weights.append((w + step).astype(w.dtype))
        return ModelState(weights, mean.optimizer if mean.optimizer is not None else master.optimizer)


def _row_weighted_mean(updates: Sequence[WorkerUpdate]) -> tuple[ModelState | None, int]:
    weights, optimizer = WeightedMean(), WeightedMean()
    for update in updates:
        if update.rows == 0 or update.state is None:
            continue
        weights.add(update.state.weights, update.rows)
        if update.state.optimizer is not None:
            optimizer.add(update.state.optimizer, update.rows)
    result = weights.result()
    return (None if result is None else ModelState(result, optimizer.result())), int(weights.total_weight)


class AsyncPolicy:
    """An asynchronous mode: no rounds on the driver; the parameter server applies each worker's
    push with :attr:`rule` (a rule of :mod:`sparkdl.core.async_rules`) as it arrives.

    :meth:`apply` and :meth:`apply_mean` refuse: these modes run on backend ``ps`` only.
    """

    def __init__(self, name: str, rule_factory) -> None:
        self.name = name
        self._rule_factory = rule_factory

    def rule(self):
        """A new server update rule for this mode."""
        return self._rule_factory()

    def apply(self, master, updates):
        raise ConfigError(f"mode {self.name!r} runs on backend 'ps' only. Received: a round of updates")

    def apply_mean(self, master, mean, rows):
        raise ConfigError(f"mode {self.name!r} runs on backend 'ps' only. Received: a round mean")


def _async(name: str):
    def make():
        from sparkdl.core import async_rules

        rules = {"async": async_rules.DownpourRule, "hogwild": async_rules.HogwildRule,
                 "staleness_aware": async_rules.StalenessAwareRule, "ssp": async_rules.SSPRule}
        return AsyncPolicy(name, rules[name])

    return make


_POLICIES = {"sync": SyncAveraging, "bmuf": BlockMomentum, **{m: _async(m) for m in ("async", "hogwild", "staleness_aware", "ssp")}}


def get_policy(mode: str, **settings) -> ModePolicy:
    """A new policy object of a mode name; ``settings`` go to its constructor (``bmuf``:
    ``block_momentum``, ``block_learning_rate``, ``nesterov``, ``trainable``).

    Raises:
        ConfigError: for an unknown mode or a setting out of range.
    """
    if mode not in _POLICIES:
        raise ConfigError(f"mode must be one of {sorted(_POLICIES)}. Received: mode={mode!r}")
    return _POLICIES[mode](**settings)
