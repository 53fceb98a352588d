"""A model per worker: ``easgd`` (elastic averaging) and ``gossip`` (pairwise averaging).

Each worker keeps its own model between rounds; the fit's mode state holds them
(``models.<i>.w``: worker i's weights, ``models.<i>.o``: its optimizer state, absent when it has
none), so a snapshot of the fit carries every worker's model. Before the first round every
worker starts from the master. A worker that did not train in a round (no rows left, an empty
partition, an update dropped as late) keeps its start state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sparkdl.core.modes import Transition
from sparkdl.core.modes.base import Mode, check_param
from sparkdl.core.state import FitState, ModelState, RoundUpdates, WorkerUpdate
from sparkdl.errors import ConfigError, InvariantError


def worker_models(mode: dict, workers: int) -> list[ModelState] | None:
    """The worker models held in a fit's mode state, or None before the first round."""
    if "models.0.w" not in mode:
        return None
    return [ModelState(mode[f"models.{i}.w"], mode.get(f"models.{i}.o")) for i in range(workers)]


def mode_state(models: Sequence[ModelState]) -> dict[str, list[np.ndarray]]:
    """The mode state holding ``models`` (see :func:`worker_models`)."""
    out: dict[str, list[np.ndarray]] = {}
    for i, model in enumerate(models):
        out[f"models.{i}.w"] = list(model.weights)
        if model.optimizer is not None:
            out[f"models.{i}.o"] = list(model.optimizer)
    return out


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


class _WorkerModels(Mode):
    """Base of the policies that keep one model per worker between rounds (``per_worker``).

    The driver sends worker i (its partition index, 0..workers−1) ``starts(fit)[i]`` each round
    and hands :meth:`apply` every trained worker's :class:`~sparkdl.core.state.WorkerUpdate`.
    Each worker's model carries its own optimizer state.

    Args:
        workers: the number of workers (partitions), ≥ 1.
    """

    per_worker = True
    name = ""

    def __init__(self, workers: int) -> None:
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
            raise ConfigError(f"numWorkers must be an integer >= 1 for mode {self.name!r}. Received: {workers!r}")
        self.workers = int(workers)

    def starts(self, fit: FitState) -> list[ModelState]:
        """The state each worker (index 0..workers−1) starts the next round from; before the first
        round, the master for every worker."""
        models = worker_models(fit.mode, self.workers)
        return [fit.master] * self.workers if models is None else models

    def _round_models(self, fit: FitState, updates: Sequence[WorkerUpdate]) -> list[ModelState]:
        """x_i: each worker's model after this round's local steps, its start where it did not train."""
        models = self.starts(fit)
        seen: set[int] = set()
        for update in updates:
            partition = update.partition
            if isinstance(partition, bool) or not isinstance(partition, (int, np.integer)) or not 0 <= partition < self.workers:
                raise InvariantError(f"a worker update's partition must be in [0, {self.workers}). Received: partition={partition!r}")
            if partition in seen:
                raise InvariantError(f"one update per worker and round. Received: partition {partition} twice")
            seen.add(int(partition))
            if update.rows == 0 or update.state is None:
                continue
            models[int(partition)] = update.state
        return models

    def _updates(self, round_: RoundUpdates) -> list[WorkerUpdate]:
        if round_.updates is None:
            raise ConfigError(f"mode {self.name!r} needs each worker's model (per_worker), not the round's mean. "
                              f"Received: a round mean ({round_.rows} rows)")
        return round_.updates


class ElasticAveraging(_WorkerModels):
    """Synchronous elastic averaging SGD (EASGD), communication every τ local steps.

    The master is the centre variable x̃; every worker keeps its own model x_i between rounds. With
    x_i the worker's model after the round's local steps and elastic force α, every worker i that
    trained in the round and the centre move towards each other, both from the values before the
    update:

        x_i ← x_i − α·(x_i − x̃)          (each worker that trained)
        x̃  ← x̃ + α·Σᵢ (x_i − x̃)          (the centre, i over the workers that trained)

    A worker that did not train neither pulls nor is pulled: its model stays as it was, as an
    absent update carries no weight in ``sync``. With every worker training each round this is
    the paper's rule.

    Float arrays are mixed in float64 and stored back in each array's dtype and shape; non-float
    weight arrays (e.g. integer counters) are not mixed: each worker and the centre keep their own.
    Optimizer states are not mixed: each worker keeps its own; the returned centre's optimizer is
    the equal-weight mean of the workers' optimizer states that exist (float arrays; non-float: the
    maximum), else the master's. If every x_i equals x̃, nothing changes.

    Args:
        workers: p, the number of workers (partitions), ≥ 1.
        elastic_force: α, with 0 < α and β = p·α < 1 (default 0.9 / p: the paper's advice β = 0.9).

    References:
        Zhang, Choromanska, LeCun. "Deep learning with Elastic Averaging SGD", NIPS 2015
        (Algorithm 1, synchronous EASGD).
    """

    name = "easgd"
    PARAMS = ("elasticForce",)

    @classmethod
    def _from_params(cls, name, params, trainable, workers):
        """α = ``elasticForce`` (default 0.9 / workers)."""
        return cls(workers, params.get("elasticForce"))

    def settings(self) -> dict:
        return {"workers": self.workers, "elastic_force": self.alpha}

    def __init__(self, workers: int, elastic_force: float | None = None) -> None:
        super().__init__(workers)
        check_param("elasticForce", elastic_force)
        alpha = 0.9 / self.workers if elastic_force is None else float(elastic_force)
        if not self.workers * alpha < 1:  # the relation to numWorkers; the range is the Param's
            raise ConfigError(f"elasticForce must be > 0 and numWorkers * elasticForce < 1 (β = p·α, advised 0.9), "
                              f"i.e. in (0, {1 / self.workers!r}) with {self.workers} workers. "
                              f"Received: elasticForce={elastic_force!r} (numWorkers * elasticForce = "
                              f"{self.workers * alpha!r})")
        self.alpha = alpha

    def apply(self, fit: FitState, round_: RoundUpdates) -> Transition:
        """One round: the elastic moves of every worker and the centre."""
        updates = self._updates(round_)
        master = fit.master
        models = self._round_models(fit, updates)
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
        new_models = [ModelState(w, m.optimizer) for w, m in zip(moved, models, strict=True)]
        optimizer = _mean_optimizer(models)
        return Transition(ModelState(centre, optimizer if optimizer is not None else master.optimizer), mode_state(new_models))


class GossipAveraging(_WorkerModels):
    """Gossiping SGD: each round every worker averages its model with one random peer.

    Round k (the fit's round index, so a resumed fit draws the same matchings) draws a random
    perfect matching of the workers, ``perm = np.random.default_rng([seed, k]).permutation(workers)``,
    pairs (perm[0], perm[1]), (perm[2], perm[3]), … (:meth:`pairs`); with an odd count the last
    worker is unmatched and keeps its model. With x_a, x_b the pair's models after the round's
    local steps (a worker's start when it did not train):

        x_a, x_b ← (x_a + x_b) / 2

    for weights and optimizer state alike. Float arrays are averaged in float64 and stored back in
    the pair's first worker's dtype, in the same shape; non-float weight arrays take the pair's
    first worker's value, non-float optimizer arrays (e.g. the iteration counter) the maximum of the
    two; a missing optimizer state (``None``) takes the peer's. The master is the equal-weight
    average of all the workers' models after mixing (weights: floats averaged, others worker 0's;
    optimizer: floats averaged, others the maximum; the master's when no worker has one), the
    model the fit returns.

    Args:
        workers: the number of workers (partitions), ≥ 1.
        seed: a non-negative integer seeding the matchings.

    References:
        Jin, Yuan, Iandola, Keutzer. "How to scale distributed deep learning?", NIPS ML Systems
        Workshop 2016 (gossiping SGD).
    """

    name = "gossip"
    PARAMS = ("seed",)
    IDENTITY = ()  # the seed is the schedule's, which a snapshot matches already

    @classmethod
    def _from_params(cls, name, params, trainable, workers):
        return cls(workers, params["seed"])

    def settings(self) -> dict:
        return {"workers": self.workers, "seed": self.seed}

    def __init__(self, workers: int, seed: int = 0) -> None:
        super().__init__(workers)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"seed must be a non-negative integer. Received: {seed!r}")
        self.seed = int(seed)

    def pairs(self, k: int) -> list[tuple[int, int]]:
        """The matching of round k: a pure function of ``seed`` and ``k``."""
        perm = np.random.default_rng([self.seed, int(k)]).permutation(self.workers)
        return [(int(perm[i]), int(perm[i + 1])) for i in range(0, self.workers - 1, 2)]

    @staticmethod
    def _pair_average(a: ModelState, b: ModelState) -> ModelState:
        if len(a.weights) != len(b.weights):
            raise InvariantError(f"paired models must have as many weight arrays. Received: {len(a.weights)} and {len(b.weights)}")
        weights = [_mean_arrays([x, y], "first") for x, y in zip(a.weights, b.weights, strict=True)]
        if a.optimizer is None or b.optimizer is None:
            optimizer = b.optimizer if a.optimizer is None else a.optimizer
        else:
            if len(a.optimizer) != len(b.optimizer):
                raise InvariantError(f"paired optimizer states must have as many arrays. Received: {len(a.optimizer)} and {len(b.optimizer)}")
            optimizer = [_mean_arrays([x, y], "max") for x, y in zip(a.optimizer, b.optimizer, strict=True)]
        return ModelState(weights, optimizer)

    def apply(self, fit: FitState, round_: RoundUpdates) -> Transition:
        """Round ``fit.rounds``: average each matched pair; the master is the mean of all the workers' models."""
        models = self._round_models(fit, self._updates(round_))
        mixed = list(models)
        for a, b in self.pairs(fit.rounds):
            mixed[a] = mixed[b] = self._pair_average(models[a], models[b])
        optimizer = _mean_optimizer(mixed)
        master = ModelState(_mean_weights(mixed), optimizer if optimizer is not None else fit.master.optimizer)
        return Transition(master, mode_state(mixed))
