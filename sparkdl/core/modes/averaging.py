"""Model averaging: ``sync`` (SparkNet) and ``bmuf`` (blockwise model-update filtering).

Both act on the round's row-weighted mean of the workers' states
(:attr:`~sparkdl.core.state.RoundUpdates.mean`); every worker starts a round from one state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sparkdl.core.aggregation import WeightedMean
from sparkdl.core.modes import Transition
from sparkdl.core.modes.base import Mode, check_param
from sparkdl.core.state import FitState, ModelState, RoundUpdates, WorkerUpdate


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


def _mean_of(round_: RoundUpdates) -> tuple[ModelState | None, int]:
    if round_.updates is not None:
        return row_weighted_mean(round_.updates)
    return round_.mean, round_.rows


class SyncAveraging(Mode):
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
    elementwise = True

    def starts(self, fit: FitState) -> ModelState:
        """Every worker starts from the master."""
        return fit.master

    def apply(self, fit: FitState, round_: RoundUpdates) -> Transition:
        """W ← the mean itself; the master is kept when no worker trained (mean None or 0 rows)."""
        mean, rows = _mean_of(round_)
        if mean is None or rows == 0:
            return Transition(fit.master, fit.mode)
        return Transition(ModelState(mean.weights, mean.optimizer if mean.optimizer is not None else fit.master.optimizer), fit.mode)


class BlockMomentum(Mode):
    """Blockwise model-update filtering (BMUF): model averaging with momentum across blocks.

    Each round (a block of τ local steps) starts every worker from W_g; with W̄ the row-weighted
    average of the worker models after the block:

        G = W̄ − W_g                 (the block's aggregated update)
        Δ ← η·Δ + ζ·G                (block momentum η, block learning rate ζ)
        W ← W + Δ
        W_g = W + η·Δ  with Nesterov, else W   (where the next block starts)

    η = 0, ζ = 1 is plain model averaging (``sync``). Only the entries of ``trainable`` are
    filtered; the others (BatchNorm moving statistics, integer variables) and the optimizer state
    take the average as in ``sync``. Δ (float64, one array per weight) is the fit's mode state
    ``delta``, absent before the first block.

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
    elementwise = True
    uses_trainable = True
    PARAMS = ("blockMomentum", "blockLearningRate", "nesterov")

    @classmethod
    def _from_params(cls, name, params, trainable, workers):
        """η = ``blockMomentum`` (default 1 − 1/workers), ζ = ``blockLearningRate``, filtering the trainable weights only."""
        eta = params.get("blockMomentum")
        return cls(eta if eta is not None else 1.0 - 1.0 / max(1, workers), params["blockLearningRate"], params["nesterov"],
                   trainable=trainable)

    def settings(self) -> dict:
        return {"block_momentum": self.eta, "block_learning_rate": self.zeta, "nesterov": self.nesterov}

    def __init__(self, block_momentum: float, block_learning_rate: float = 1.0, nesterov: bool = True,
                 trainable: Sequence[bool] | None = None) -> None:
        check_param("blockMomentum", block_momentum)
        check_param("blockLearningRate", block_learning_rate)
        self.eta, self.zeta, self.nesterov = float(block_momentum), float(block_learning_rate), bool(nesterov)
        self.trainable = None if trainable is None else list(trainable)

    def _filtered(self, i: int, array: np.ndarray) -> bool:
        return array.dtype.kind == "f" and (self.trainable is None or self.trainable[i])

    def _start(self, master: ModelState, delta: list[np.ndarray] | None) -> ModelState:
        if not self.nesterov or delta is None or self.eta == 0.0:
            return master
        weights = [np.asarray((w + self.eta * d).astype(w.dtype)) if self._filtered(i, w) else w
                   for i, (w, d) in enumerate(zip(master.weights, delta, strict=True))]
        return ModelState(weights, master.optimizer)

    def starts(self, fit: FitState) -> ModelState:
        """W_g: the state the workers start the next block from (W + η·Δ with Nesterov)."""
        return self._start(fit.master, fit.mode.get("delta"))

    def apply(self, fit: FitState, round_: RoundUpdates) -> Transition:
        mean, rows = _mean_of(round_)
        if mean is None or rows == 0:
            return Transition(fit.master, fit.mode)
        master = fit.master
        previous = fit.mode.get("delta")
        start = self._start(master, previous)
        delta = previous if previous is not None else [np.zeros(w.shape, np.float64) for w in master.weights]
        weights, new_delta = [], []
        for i, (w, w_g, average, d) in enumerate(zip(master.weights, start.weights, mean.weights, delta, strict=True)):
            if not self._filtered(i, w):
                weights.append(np.asarray(average, dtype=w.dtype))
                new_delta.append(d)
                continue
            step = self.eta * d + self.zeta * (np.asarray(average, np.float64) - w_g)
            new_delta.append(step)
            weights.append(np.asarray((w + step).astype(w.dtype)))  # 0-d arithmetic gives numpy scalars
        optimizer = mean.optimizer if mean.optimizer is not None else master.optimizer
        return Transition(ModelState(weights, optimizer), {**fit.mode, "delta": new_delta})


class DiLoCo(Mode):
    """DiLoCo: local inner optimization, an outer Nesterov-momentum step on the averaged delta.

    Each worker trains τ inner steps with its own optimizer, whose state it keeps between rounds
    (``keepLocalOptimizer``: the paper's inner AdamW; only weights travel); with W the master
    (the outer parameters) and W̄ the row-weighted mean of the workers' weights after the round:

        G = W − W̄                   (the outer gradient: minus the averaged delta)
        M ← μ·M + G                  (outer momentum μ)
        W ← W − η·(G + μ·M)          (Nesterov, outer learning rate η)

    η = 1, μ = 0 is plain model averaging. Only the entries of ``trainable`` take the outer step;
    the others (BatchNorm moving statistics, integer variables) take the average. M (float64, one
    array per weight) is the fit's mode state ``momentum``, absent before the first round. The
    master holds no optimizer state (the workers keep theirs): ``apply`` keeps ``fit.master.optimizer``.

    Args:
        outer_learning_rate: η > 0 (the paper's 0.7).
        outer_momentum: μ in [0, 1) (the paper's 0.9).
        trainable: per weight array, whether it takes the outer step (default: every float array).

    References:
        Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam, Shen. "DiLoCo:
        Distributed Low-Communication Training of Language Models", arXiv:2311.08105, 2023
        (Algorithm 1: inner AdamW for H steps, outer Nesterov momentum on the averaged delta).
    """

    name = "diloco"
    elementwise = True
    local_optimizer = True
    uses_trainable = True
    PARAMS = ("outerLearningRate", "outerMomentum")

    @classmethod
    def _from_params(cls, name, params, trainable, workers):
        return cls(params["outerLearningRate"], params["outerMomentum"], trainable=trainable)

    def settings(self) -> dict:
        return {"outer_learning_rate": self.lr, "outer_momentum": self.mu}

    def __init__(self, outer_learning_rate: float = 0.7, outer_momentum: float = 0.9, trainable: Sequence[bool] | None = None) -> None:
        check_param("outerLearningRate", outer_learning_rate)
        check_param("outerMomentum", outer_momentum)
        self.lr, self.mu = float(outer_learning_rate), float(outer_momentum)
        self.trainable = None if trainable is None else list(trainable)

    def starts(self, fit: FitState) -> ModelState:
        """Every worker starts from the master (its own optimizer state stays its own)."""
        return fit.master

    def apply(self, fit: FitState, round_: RoundUpdates) -> Transition:
        mean, rows = _mean_of(round_)
        if mean is None or rows == 0:
            return Transition(fit.master, fit.mode)
        master = fit.master
        momentum = fit.mode.get("momentum") or [np.zeros(np.shape(w), np.float64) for w in master.weights]
        weights, new_momentum = [], []
        for i, (w, average, m) in enumerate(zip(master.weights, mean.weights, momentum, strict=True)):
            w = np.asarray(w)
            if w.dtype.kind != "f" or (self.trainable is not None and not self.trainable[i]):
                weights.append(np.asarray(average, dtype=w.dtype))
                new_momentum.append(m)
                continue
            g = w.astype(np.float64) - np.asarray(average, np.float64)
            m = self.mu * m + g
            new_momentum.append(m)
            weights.append(np.asarray((w - self.lr * (g + self.mu * m)).astype(w.dtype)))
        return Transition(ModelState(weights, master.optimizer), {**fit.mode, "momentum": new_momentum})
