"""Plain-data records exchanged between the driver's round loop and the mode policies."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ModelState:
    """The master copy of a model, as numpy arrays in Keras order.

    Attributes:
        weights: ``model.weights`` values (trainable and non-trainable, e.g. BatchNorm moving
            statistics), in model order.
        optimizer: ``optimizer.variables`` values (iteration counter, learning rate, moments),
            or ``None`` before the optimizer has been built, meaning "fresh optimizer state".
    """

    weights: list[np.ndarray]
    optimizer: list[np.ndarray] | None = None


@dataclass(frozen=True)
class WorkerUpdate:
    """What one worker returns at the end of a round.

    Attributes:
        partition: Spark partition index of the worker's data.
        rows: rows trained on in this round (0 when the worker had no batch left).
        steps: local steps (batches) run in this round.
        state: the replica's weights and optimizer state after the round, ``None`` when rows == 0.
        metrics: Keras metric means over the round's steps, e.g. ``{"loss": 0.3, "accuracy": 0.9}``.
    """

    partition: int
    rows: int
    steps: int
    state: ModelState | None
    metrics: dict[str, float] = field(default_factory=dict)
