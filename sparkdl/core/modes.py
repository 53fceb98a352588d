"""Mode policies: how the driver turns one round's worker updates into new master weights.

A policy is pure numpy and knows nothing of Spark or Keras; the backend hands it the master
:class:`~sparkdl.core.state.ModelState` and the round's :class:`~sparkdl.core.state.WorkerUpdate`
list (workers that saw no rows included, with ``rows == 0``), and gets the new master back.
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
        """Return the new master state after one round."""


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
        if new_weights is None:
            return master
        new_optimizer = optimizer.result()
        return ModelState(new_weights, new_optimizer if new_optimizer is not None else master.optimizer)


_POLICIES = {"sync": SyncAveraging}


def get_policy(mode: str) -> ModePolicy:
    """The policy object of a mode name.

    Raises:
        ConfigError: for an unknown mode.
    """
    try:
        return _POLICIES[mode]()
    except KeyError:
        raise ConfigError(f"mode must be one of {sorted(_POLICIES)}. Received: mode={mode!r}") from None
