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


class SyncAveraging:
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

    def apply(self, master: ModelState, updates: Sequence[WorkerUpdate]) -> ModelState:
        weights, optimizer = WeightedMean(), WeightedMean()
        for update in updates:
            if update.rows == 0 or update.state is None:
                continue
            weights.add(update.state.weights, update.rows)
            if update.state.optimizer is not None:
                optimizer.add(update.state.optimizer, update.rows)
        new_weights = weights.result()
        return self.apply_mean(master, None if new_weights is None else ModelState(new_weights, optimizer.result()), int(weights.total_weight))

    def apply_mean(self, master: ModelState, mean: ModelState | None, rows: int) -> ModelState:
        """W ← the mean itself; the master is kept when no worker trained (``mean`` None or 0 rows)."""
        if mean is None or rows == 0:
            return master
        return ModelState(mean.weights, mean.optimizer if mean.optimizer is not None else master.optimizer)


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


_POLICIES = {"sync": SyncAveraging, **{m: _async(m) for m in ("async", "hogwild", "staleness_aware", "ssp")}}


def get_policy(mode: str) -> ModePolicy:
    """The policy object of a mode name.

    Raises:
        ConfigError: for an unknown mode.
    """
    try:
        return _POLICIES[mode]()
    except KeyError:
        raise ConfigError(f"mode must be one of {sorted(_POLICIES)}. Received: mode={mode!r}") from None
