"""Rounds that never block training: the eager one-round overlap (``overlap=True``).

A blocking round g runs: every worker pulls round g's start s_g, trains τ steps to y_g and sends
its contribution; the round's policy (``sync``, ``bmuf``, ``diloco``) turns their mean into the
master of round g + 1. Each worker waits for the whole exchange before its next τ steps.

Overlapped, a worker hands round g's contribution to a background sender and trains round g + 1
at once. The start it lacks, s_{g+1} = s_g + (the mean progress of round g), is replaced by its own
progress in the mean's place (the eager update of Kale, Douillard and Donchev, "Eager Updates for
Overlapped Communication and Computation in DiLoCo", 2025: the local outer gradient as the proxy
for the averaged one, which arrives one round later)::

    y'_g = s_g + (y_g − x_g)        (round g's contribution, carried onto its start)
    x_{g+1} = y'_g                  (the start this worker trains round g + 1 from)

for the weights (trainable and not); the optimizer state's float arrays (Adam's moments, the
learning rate) are the worker's own after its steps, its integer arrays (the iteration counter)
carried like the weights, so they count every step once. The owners take the mean of the y' as in
a blocking round, so the master moves by the mean progress of each round; a worker's start differs
from the master by its own progress minus the mean one (Overlap Local-SGD, Wang, Liang and Joshi,
ICASSP 2020, and CO2, Sun et al., ICLR 2024, overlap the same exchange with local steps).

Sync points train from the round's own start s_g (the exchange before them drains): the stage's
first round, and, when the fit writes snapshots (``checkpointDir``, ``BackupAndRestore``), the round
after each (an epoch's first, and after every ``checkpointEvery`` rounds), so a resumed fit equals an
uninterrupted one. A worker's start x_{g+1} is y'_g, its contribution: kept on its executor's disk
(a retried task there trains from it again) and, without an encoding, in pieces by the owners that
counted them (``sparkdl.server.slices``), where a task retried on another executor assembles it;
with an encoding, ``keepLocalOptimizer`` or ``diloco``, or when a piece is found nowhere, such a
task trains from s_{g+1} (counted). Pure numpy:
no Spark, no Keras.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkdl.core.state import ModelState
from sparkdl.errors import InvariantError


@dataclass(frozen=True)
class EagerOverlap:
    """Which rounds are sync points, and the carry of a worker's progress (see the module docstring).

    Args:
        first: the fit's first round (0, or the round a resumed fit starts at).
        rounds_per_epoch: rounds in an epoch when snapshots are written at epoch ends (None: no snapshots).
        snapshot_every: ``checkpointEvery`` when snapshots are written every that many rounds (None: not).
    """

    first: int = 0
    rounds_per_epoch: int | None = None
    snapshot_every: int | None = None

    def synchronous(self, g: int) -> bool:
        """Whether round ``g`` (0-based, the fit's count) trains from its own start s_g: the stage's
        first, or the first after a snapshot."""
        return g == self.first or any(every is not None and g % every == 0 for every in (self.rounds_per_epoch, self.snapshot_every))

    @staticmethod
    def carry(state: ModelState, base: ModelState, start: ModelState) -> ModelState:
        """A worker's state after training from ``base`` moved onto ``start``: weights and integer
        optimizer arrays ``start + (state − base)`` (float64 arithmetic, in ``start``'s dtypes);
        float optimizer arrays as ``state`` has them.

        Args:
            state: the worker's state after its τ steps (``optimizer`` None: weights alone).
            base: the start it trained from (same arrays).
            start: the start its progress is applied to (same arrays).

        Raises:
            InvariantError: the three states' arrays differ in count or shape.
        """

        def moved(values, old, new, positions: bool) -> list[np.ndarray]:
            if not (len(values) == len(old) == len(new)):
                raise InvariantError(f"a carried state must hold as many arrays as its starts. Received: {len(values)}, "
                                     f"{len(old)} and {len(new)}")
            out = []
            for a, b, s in zip(values, old, new, strict=True):
                a, b, s = np.asarray(a), np.asarray(b), np.asarray(s)
                if not (a.shape == b.shape == s.shape):
                    raise InvariantError(f"a carried array must keep its shape. Received: {a.shape}, {b.shape} and {s.shape}")
                if positions or a.dtype.kind != "f":
                    if a.dtype.kind == "f":
                        out.append((s.astype(np.float64) + (a.astype(np.float64) - b)).astype(s.dtype))
                    else:
                        out.append(np.asarray(s + (a - b), dtype=s.dtype))
                else:
                    out.append(a)
            return out

        weights = moved(state.weights, base.weights, start.weights, True)
        if state.optimizer is None:
            return ModelState(weights, None)
        if base.optimizer is None or start.optimizer is None:  # a fresh optimizer at the start: nothing to carry onto
            return ModelState(weights, list(state.optimizer))
        return ModelState(weights, moved(state.optimizer, base.optimizer, start.optimizer, False))
