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

A new mode is one class (:class:`~sparkdl.core.modes.base.Mode`: its Params, settings, checkpoint
identity and declared facts, with ``starts`` and ``apply``) and one entry in :func:`policy_class`
and :data:`MODE_NAMES`; the families below are read from the classes, and no backend changes
unless the mode needs what no backend declares.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from sparkdl.core.state import FitState, ModelState, RoundUpdates
from sparkdl.errors import ConfigError, did_you_mean


MODE_NAMES = ("sync", "bmuf", "easgd", "gossip", "diloco", "async", "hogwild", "staleness_aware", "ssp")


def _declared(fact: str) -> tuple[str, ...]:
    return tuple(name for name in MODE_NAMES if getattr(policy_class(name), fact))


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
    """The class of mode ``mode``: its rule and its declarations (:class:`~sparkdl.core.modes.base.Mode`).

    Raises:
        ConfigError: for an unknown mode.
    """
    from sparkdl.core.modes import asynchronous, averaging, worker_models

    classes = {"sync": averaging.SyncAveraging, "bmuf": averaging.BlockMomentum, "diloco": averaging.DiLoCo,
               "easgd": worker_models.ElasticAveraging, "gossip": worker_models.GossipAveraging,
               **{name: asynchronous.AsyncPolicy for name in asynchronous.RULES}}
    if mode not in classes:
        raise ConfigError(f"mode must be one of {sorted(classes)}.{did_you_mean(mode, classes)} Received: mode={mode!r}")
    return classes[mode]


def get_policy(mode: str, **settings) -> RoundPolicy:
    """A new policy object of a mode name; ``settings`` go to its constructor (what
    :meth:`~sparkdl.core.modes.base.Mode.settings` gave, and ``trainable`` where the class
    :attr:`~sparkdl.core.modes.base.Mode.uses_trainable`):

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
    return cls(mode, **settings) if cls.asynchronous else cls(**settings)


def build_policy(mode: str, params, *, trainable, workers: int) -> RoundPolicy:
    """Mode ``mode`` built from the estimator's Param values (``params``: name -> value, at least
    the class's :attr:`~sparkdl.core.modes.base.Mode.PARAMS`) for a fit of ``workers`` workers
    whose weight arrays are ``trainable`` (:meth:`~sparkdl.core.modes.base.Mode.build`).

    Raises:
        ConfigError: for an unknown mode or a setting out of range.
    """
    return policy_class(mode).build(mode, params, trainable=trainable, workers=workers)


# The mode families, as the classes declare them (the order of MODE_NAMES)
ROUND_MODES = tuple(name for name in MODE_NAMES if not policy_class(name).asynchronous)  # applied round by round
ASYNC_MODES = _declared("asynchronous")  # the parameter server applies them push by push
SLICED_MODES = _declared("elementwise")  # backend 'sharded' applies them slice by slice
LOCAL_OPTIMIZER_MODES = _declared("local_optimizer")  # the workers always keep their own optimizer state
MODES = MODE_NAMES

__all__ = ["ASYNC_MODES", "LOCAL_OPTIMIZER_MODES", "MODES", "MODE_NAMES", "ROUND_MODES", "SLICED_MODES", "RoundPolicy", "Transition",
           "build_policy", "get_policy", "policy_class"]
