"""Mode policies: how the driver turns one round's worker updates into new master weights.

A policy is pure numpy and knows nothing of Spark or Keras. The ``rounds`` backend combines a
round's updates where they are (on the executors for large rounds, see
:mod:`sparkdl.core.pieces`) and hands the policy the master :class:`~sparkdl.core.state.ModelState`
with the row-weighted mean of the workers' states and the rows behind it (:meth:`apply_mean`);
a backend that holds the per-worker list (:class:`~sparkdl.core.state.WorkerUpdate`, workers that
saw no rows included with ``rows == 0``) calls :meth:`apply`. Both return the new master.

Per-worker policies (``per_worker = True``: :class:`ElasticAveraging` ``easgd``,
:class:`GossipAveraging` ``gossip``) keep one model per worker between rounds. They expose
``starts(master) -> list[ModelState]``, the state each worker (index = partition) starts the next
round from, and need each worker's own state: only :meth:`apply` with the per-worker list works,
:meth:`apply_mean` (the round's mean) raises :class:`~sparkdl.errors.ConfigError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from sparkdl.core.aggregation import WeightedMean
from sparkdl.core.state import ModelState, WorkerUpdate
from sparkdl.errors import ConfigError, InvariantError


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
        mean, rows = row_weighted_mean(updates)
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
        weights = [np.asarray((w + self.eta * d).astype(w.dtype)) if self._filtered(i, w) else w
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
            weights.append(np.asarray((w + step).astype(w.dtype)))  # 0-d arithmetic gives numpy scalars
        return ModelState(weights, mean.optimizer if mean.optimizer is not None else master.optimizer)


def row_weighted_mean(updates: Sequence[WorkerUpdate]) -> tuple[ModelState | None, int]:
    """The row-weighted mean of the trained workers' states (optimizer arrays over the workers that
    sent them; None when none did) and the rows behind it; ``(None, 0)`` when no worker trained."""
    weights, optimizer = WeightedMean(), WeightedMean()
    for update in updates:
        if update.rows == 0 or update.state is None:
            continue
        weights.add(update.state.weights, update.rows)
        if update.state.optimizer is not None:
            optimizer.add(update.state.optimizer, update.rows)
    result = weights.result()
    return (None if result is None else ModelState(result, optimizer.result())), int(weights.total_weight)


def _is_float(array: np.ndarray) -> bool:
    return np.asarray(array).dtype.kind == "f"


def _check_shapes(arrays: Sequence[np.ndarray]) -> None:
    shapes = {np.shape(a) for a in arrays}
    if len(shapes) > 1:
        raise InvariantError(f"the workers' arrays must agree in shape. Received: shapes {sorted(shapes)}")


def _mean_arrays(arrays: Sequence[np.ndarray], integers: str) -> np.ndarray:
    """Equal-weight mean of one array over models: float arrays in float64, cast back to the first
    array's dtype; other dtypes take the first model's value (``integers="first"``) or the
    elementwise maximum (``integers="max"``)."""
    _check_shapes(arrays)
    first = np.asarray(arrays[0])
    if _is_float(first):
        total = np.zeros(first.shape, np.float64)
        for a in arrays:
            total += np.asarray(a, np.float64)
        return np.asarray((total / len(arrays)).astype(first.dtype))
    if integers == "max":
        return np.asarray(np.maximum.reduce([np.asarray(a) for a in arrays]).astype(first.dtype))
    return first


def _mean_weights(models: Sequence[ModelState]) -> list[np.ndarray]:
    """Equal-weight mean of the models' weights (non-float arrays: the first model's)."""
    return [_mean_arrays(list(arrays), "first") for arrays in zip(*(m.weights for m in models), strict=True)]


def _mean_optimizer(models: Sequence[ModelState]) -> list[np.ndarray] | None:
    """Equal-weight mean of the optimizer states that exist (non-float arrays, e.g. the iteration
    counter: the maximum); ``None`` when no model has one."""
    states = [m.optimizer for m in models if m.optimizer is not None]
    if not states:
        return None
    return [_mean_arrays(list(arrays), "max") for arrays in zip(*states, strict=True)]


class _WorkerModelsPolicy:
    """Base of the policies that keep one model per worker between rounds (``per_worker``).

    The driver sends worker i (its partition index, 0..workers−1) ``starts(master)[i]`` each round
    and hands :meth:`apply` every reporting worker's :class:`~sparkdl.core.state.WorkerUpdate`. A
    worker that did not train (``rows == 0``, ``state`` None, or missing from the round) keeps its
    start state. Each worker's model carries its own optimizer state.

    Args:
        workers: the number of workers (partitions), ≥ 1.
    """

    per_worker = True
    name = ""

    def __init__(self, workers: int) -> None:
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
            raise ConfigError(f"numWorkers must be an integer >= 1 for mode {self.name!r}. Received: {workers!r}")
        self.workers = int(workers)
        self._models: list[ModelState] | None = None

    def starts(self, master: ModelState) -> list[ModelState]:
        """The state each worker (index 0..workers−1) starts the next round from; before the first
        :meth:`apply`, ``master`` for every worker."""
        if self._models is None:
            return [master] * self.workers
        return list(self._models)

    def _round_models(self, master: ModelState, updates: Sequence[WorkerUpdate]) -> list[ModelState]:
        """x_i: each worker's model after this round's local steps, its start where it did not train."""
        models = self.starts(master)
        seen: set[int] = set()
        for update in updates:
            partition = update.partition
            if isinstance(partition, bool) or not isinstance(partition, (int, np.integer)) \
                    or not 0 <= partition < self.workers:
                raise InvariantError(f"a worker update's partition must be in [0, {self.workers}). "
                                     f"Received: partition={partition!r}")
            if partition in seen:
                raise InvariantError(f"one update per worker and round. Received: partition {partition} twice")
            seen.add(int(partition))
            if update.rows == 0 or update.state is None:
                continue
            models[int(partition)] = update.state
        return models

    def apply(self, master: ModelState, updates: Sequence[WorkerUpdate]) -> ModelState:  # pragma: no cover
        raise NotImplementedError

    def apply_mean(self, master: ModelState, mean: ModelState | None, rows: int) -> ModelState:
        raise ConfigError(f"mode {self.name!r} needs each worker's model (per_worker), not the round's mean: "
                          f"call apply with every worker's update. Received: a round mean ({rows} rows)")


class ElasticAveraging(_WorkerModelsPolicy):
    """Synchronous elastic averaging SGD (EASGD), communication every τ local steps.

    The master is the centre variable x̃; every worker keeps its own model x_i between rounds. With
    x_i the worker's model after the round's local steps and elastic force α, every worker i that
    trained in the round and the centre move towards each other, both from the values before the
    update:

        x_i ← x_i − α·(x_i − x̃)          (each worker that trained)
        x̃  ← x̃ + α·Σᵢ (x_i − x̃)          (the centre, i over the workers that trained)

    A worker that did not train (no rows left in the round, an empty partition, an update dropped
    as late) neither pulls nor is pulled: its model stays as it was, as an absent update carries
    no weight in ``sync``. With every worker training each round this is the paper's rule.

    Float arrays are mixed in float64 and stored back in each array's dtype and shape; non-float
    weight arrays (e.g. integer counters) are not mixed: each worker and the centre keep their own.
    Optimizer states are not mixed: each worker keeps its own; the returned centre's optimizer is
    the equal-weight mean of the workers' optimizer states that exist (float arrays; non-float: the
    maximum), else ``master.optimizer``. If every x_i equals x̃, nothing changes.

    Args:
        workers: p, the number of workers (partitions), ≥ 1.
        elastic_force: α, with 0 < α and β = p·α < 1 (default 0.9 / p: the paper's advice β = 0.9).

    References:
        Zhang, Choromanska, LeCun. "Deep learning with Elastic Averaging SGD", NIPS 2015
        (Algorithm 1, synchronous EASGD).
    """

    name = "easgd"

    def __init__(self, workers: int, elastic_force: float | None = None) -> None:
        super().__init__(workers)
        alpha = 0.9 / self.workers if elastic_force is None else elastic_force
        try:
            alpha = float(alpha)
        except (TypeError, ValueError):
            raise ConfigError(f"elasticForce must be a number. Received: {elastic_force!r}") from None
        if not (alpha > 0 and self.workers * alpha < 1):
            raise ConfigError(f"elasticForce must be > 0 and numWorkers * elasticForce < 1 (β = p·α, advised 0.9), "
                              f"i.e. in (0, {1 / self.workers!r}) with {self.workers} workers. "
                              f"Received: elasticForce={elastic_force!r} (numWorkers * elasticForce = "
                              f"{self.workers * alpha!r})")
        self.alpha = alpha

    def apply(self, master: ModelState, updates: Sequence[WorkerUpdate]) -> ModelState:
        """One round: the elastic moves of every worker and the centre; returns the new centre."""
        models = self._round_models(master, updates)
        trained = {u.partition for u in updates if u.rows > 0 and u.state is not None}
        for m in models:
            if len(m.weights) != len(master.weights):
                raise InvariantError(f"a worker's model must have as many weight arrays as the centre "
                                     f"({len(master.weights)}). Received: {len(m.weights)}")
        alpha = self.alpha
        moved: list[list[np.ndarray]] = [[] for _ in models]
        centre: list[np.ndarray] = []
        for j, c in enumerate(master.weights):
            c = np.asarray(c)
            arrays = [np.asarray(m.weights[j]) for m in models]
            if not _is_float(c):
                centre.append(c)
                for i, x in enumerate(arrays):
                    moved[i].append(x)
                continue
            _check_shapes([c, *arrays])
            c64 = c.astype(np.float64)
            pull = np.zeros(c.shape, np.float64)
            for i, x in enumerate(arrays):
                if i not in trained:
                    moved[i].append(x)
                    continue
                diff = np.asarray(x, np.float64) - c64
                pull += diff
                moved[i].append(np.asarray((np.asarray(x, np.float64) - alpha * diff).astype(x.dtype)) if _is_float(x) else x)
            centre.append(np.asarray((c64 + alpha * pull).astype(c.dtype)))
        self._models = [ModelState(w, m.optimizer) for w, m in zip(moved, models, strict=True)]
        optimizer = _mean_optimizer(models)
        return ModelState(centre, optimizer if optimizer is not None else master.optimizer)


class GossipAveraging(_WorkerModelsPolicy):
    """Gossiping SGD: each round every worker averages its model with one random peer.

    Round k (counted by the policy from 0) draws a random perfect matching of the workers,
    ``perm = np.random.default_rng([seed, k]).permutation(workers)``, pairs (perm[0], perm[1]),
    (perm[2], perm[3]), … (:meth:`pairs`); with an odd count the last worker is unmatched and keeps
    its model. With x_a, x_b the pair's models after the round's local steps (a worker's start when
    it did not train):

        x_a, x_b ← (x_a + x_b) / 2

    for weights and optimizer state alike. Float arrays are averaged in float64 and stored back in
    the pair's first worker's dtype, in the same shape; non-float weight arrays take the pair's
    first worker's value, non-float optimizer arrays (e.g. the iteration counter) the maximum of the
    two; a missing optimizer state (``None``) takes the peer's. The returned master is the
    equal-weight average of all the workers' models after mixing (weights: floats averaged, others
    worker 0's; optimizer: floats averaged, others the maximum; ``master.optimizer`` when no worker
    has one), the model the fit returns.

    Args:
        workers: the number of workers (partitions), ≥ 1.
        seed: a non-negative integer seeding the matchings.

    References:
        Jin, Yuan, Iandola, Keutzer. "How to scale distributed deep learning?", NIPS ML Systems
        Workshop 2016 (gossiping SGD).
    """

    name = "gossip"

    def __init__(self, workers: int, seed: int = 0) -> None:
        super().__init__(workers)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"seed must be a non-negative integer. Received: {seed!r}")
        self.seed = int(seed)
        self.round = 0

    def pairs(self, k: int) -> list[tuple[int, int]]:
        """The matching of round k: a pure function of ``seed`` and ``k``."""
        perm = np.random.default_rng([self.seed, int(k)]).permutation(self.workers)
        return [(int(perm[i]), int(perm[i + 1])) for i in range(0, self.workers - 1, 2)]

    @staticmethod
    def _pair_average(a: ModelState, b: ModelState) -> ModelState:
        if len(a.weights) != len(b.weights):
            raise InvariantError(f"paired models must have as many weight arrays. Received: "
                                 f"{len(a.weights)} and {len(b.weights)}")
        weights = [_mean_arrays([x, y], "first") for x, y in zip(a.weights, b.weights, strict=True)]
        if a.optimizer is None or b.optimizer is None:
            optimizer = b.optimizer if a.optimizer is None else a.optimizer
        else:
            if len(a.optimizer) != len(b.optimizer):
                raise InvariantError(f"paired optimizer states must have as many arrays. Received: "
                                     f"{len(a.optimizer)} and {len(b.optimizer)}")
            optimizer = [_mean_arrays([x, y], "max") for x, y in zip(a.optimizer, b.optimizer, strict=True)]
        return ModelState(weights, optimizer)

    def apply(self, master: ModelState, updates: Sequence[WorkerUpdate]) -> ModelState:
        """One round: average each matched pair; returns the mean of all the workers' models."""
        models = self._round_models(master, updates)
        mixed = list(models)
        for a, b in self.pairs(self.round):
            mixed[a] = mixed[b] = self._pair_average(models[a], models[b])
        self.round += 1
        self._models = mixed
        optimizer = _mean_optimizer(mixed)
        return ModelState(_mean_weights(mixed), optimizer if optimizer is not None else master.optimizer)


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


_POLICIES = {"sync": SyncAveraging, "bmuf": BlockMomentum, "easgd": ElasticAveraging, "gossip": GossipAveraging, **{m: _async(m) for m in ("async", "hogwild", "staleness_aware", "ssp")}}


def get_policy(mode: str, **settings) -> ModePolicy:
    """A new policy object of a mode name; ``settings`` go to its constructor:

    - ``sync``: none.
    - ``bmuf``: ``block_momentum``, ``block_learning_rate``, ``nesterov``, ``trainable``.
    - ``easgd`` (per-worker): ``workers`` (required), ``elastic_force`` (default 0.9 / workers).
    - ``gossip`` (per-worker): ``workers`` (required), ``seed`` (default 0).
    - ``async``, ``hogwild``, ``staleness_aware``, ``ssp`` (backend ``ps``): none.

    Raises:
        ConfigError: for an unknown mode or a setting out of range.
    """
    if mode not in _POLICIES:
        raise ConfigError(f"mode must be one of {sorted(_POLICIES)}. Received: mode={mode!r}")
    return _POLICIES[mode](**settings)
