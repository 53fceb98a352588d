"""Mode policies: how the driver turns one round's updates into the next master state.

A policy is pure numpy and knows nothing of Spark, Keras or the transport that ran the round. It
reads the fit's state (:class:`~sparkdl.core.state.FitState`) and writes nothing: the driver loop
asks it for the state each worker starts a round from (:meth:`RoundPolicy.starts`) and, once the
round's updates arrived (:class:`~sparkdl.core.state.RoundUpdates`), for a :class:`Transition`:
the new master and the mode's new state, which the loop commits only when the master is finite.
So everything a mode carries from round to round (BMUF's block momentum, the worker models of
EASGD and gossip) lives in the fit's state and is snapshotted with it.

One module per family:

- :mod:`~sparkdl.core.modes.averaging`: ``sync`` (model averaging), ``bmuf`` (block momentum) and
  ``diloco`` (an outer Nesterov step on the averaged delta of workers that keep their optimizer);
- :mod:`~sparkdl.core.modes.worker_models`: ``easgd`` and ``gossip`` (a model per worker);
- :mod:`~sparkdl.core.modes.asynchronous`: ``async``, ``hogwild``, ``staleness_aware``, ``ssp``:
  update rules the parameter server applies to each push as it arrives, and SSP's clocks.

A new mode is a class with ``name``, ``per_worker``, ``starts`` and ``apply`` added to
:data:`POLICIES`; no transport changes.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from sparkdl.core.state import FitState, ModelState, RoundUpdates
from sparkdl.errors import ConfigError


ROUND_MODES = ("sync", "bmuf", "easgd", "gossip", "diloco")  # the driver loop (or the slice owners) apply them round by round
SLICED_MODES = ("sync", "bmuf", "diloco")  # elementwise policies: backend 'sharded' applies them slice by slice
LOCAL_OPTIMIZER_MODES = ("diloco",)  # modes whose workers always keep their own optimizer state
ASYNC_MODES = ("async", "hogwild", "staleness_aware", "ssp")  # the parameter server applies them push by push
MODES = ROUND_MODES + ASYNC_MODES


class Transition(NamedTuple):
    """A policy's answer to one round: the new master and the mode's new state (``FitState.mode``)."""

    master: ModelState
    mode: dict[str, list[np.ndarray]]


class RoundPolicy(Protocol):
    """Interface of a training mode's update rule.

    Attributes:
        name: the mode's name.
        per_worker: whether the policy needs each worker's own state (``RoundUpdates.updates``)
            rather than the round's row-weighted mean, and starts each worker from its own state.
    """

    name: str
    per_worker: bool

    def starts(self, fit: FitState) -> ModelState | list[ModelState]:
        """The state the workers start the next round from: one for all, or one per worker
        (index = partition) when ``per_worker``."""

    def apply(self, fit: FitState, round_: RoundUpdates) -> Transition:
        """The new master and mode state after one round; ``fit`` is not changed."""


def policy_class(mode: str) -> type:
    """The policy class of mode ``mode`` (its ``per_worker`` and other class facts, without settings).

    Raises:
        ConfigError: for an unknown mode.
    """
    from sparkdl.core.modes import asynchronous, averaging, worker_models

    classes = {"sync": averaging.SyncAveraging, "bmuf": averaging.BlockMomentum, "diloco": averaging.DiLoCo,
               "easgd": worker_models.ElasticAveraging, "gossip": worker_models.GossipAveraging,
               **{name: asynchronous.AsyncPolicy for name in ASYNC_MODES}}
    if mode not in classes:
        raise ConfigError(f"mode must be one of {sorted(classes)}. Received: mode={mode!r}")
    return classes[mode]


def get_policy(mode: str, **settings) -> RoundPolicy:
    """A new policy object of a mode name; ``settings`` go to its constructor:

    - ``sync``: none.
    - ``bmuf``: ``block_momentum``, ``block_learning_rate``, ``nesterov``, ``trainable``.
    - ``diloco``: ``outer_learning_rate``, ``outer_momentum``, ``trainable``.
    - ``easgd`` (per-worker): ``workers`` (required), ``elastic_force`` (default 0.9 / workers).
    - ``gossip`` (per-worker): ``workers`` (required), ``seed`` (default 0).
    - ``async``, ``hogwild``, ``staleness_aware``, ``ssp`` (backend ``ps``): ``trainable``, ``workers``.

    Raises:
        ConfigError: for an unknown mode or a setting out of range.
    """
    cls = policy_class(mode)
    return cls(mode, **settings) if mode in ASYNC_MODES else cls(**settings)


__all__ = ["ASYNC_MODES", "LOCAL_OPTIMIZER_MODES", "MODES", "ROUND_MODES", "SLICED_MODES", "RoundPolicy", "Transition", "get_policy",
           "policy_class"]
