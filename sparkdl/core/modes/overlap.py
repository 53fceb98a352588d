"""Rounds that never block training: the one-round-delayed rule (``overlap=True``).

A blocking round g runs: every worker pulls round g's start s_g, trains τ steps to y_g and sends
its contribution; the round's policy (``sync``, ``bmuf``, ``diloco``) turns their mean into the
master of round g + 1. Each worker waits for the whole exchange before its next τ steps.

Overlapped, a worker hands round g's contribution to a background sender and trains round g + 1
at once, from the newest start it holds: s_g, whose exchange (round g − 1's) ran during round g's
steps. So round g + 1 trains from s_g instead of s_{g+1}, and its progress is carried onto the
start it is applied to:

    y'_{g+1} = s_{g+1} + (y_{g+1} − s_g)

for the weights (trainable and not); the optimizer state's float arrays (Adam's moments, the
learning rate) are the worker's own after its steps, statistics of its recent gradients rather
than positions; its integer arrays (the iteration counter) are carried like the weights, so they
count every step once. The round's policy then applies to the mean of the y' as in a blocking
round: for ``sync`` the master moves by the mean progress; for ``bmuf`` and ``diloco`` the outer
step takes the outer gradient computed one round earlier, applied at the current master. This is
the one-outer-step-delayed update of overlapped DiLoCo (Kale, Douillard and Donchev, "Eager
Updates for Overlapped Communication and Computation in DiLoCo", 2025: their delayed baseline),
and the asynchronous model averaging of CO2 (Sun et al., ICLR 2024) and Overlap Local-SGD (Wang,
Liang and Joshi, ICASSP 2020) without their extra correction terms.

Sync points train from their own start (the exchange before them drains): the fit's first round,
and, when the fit writes snapshots (``checkpointDir``, ``BackupAndRestore``), the round after each
one (an epoch's first, and after every ``checkpointEvery`` rounds): so a snapshot holds everything
trained before it and a resumed fit equals an uninterrupted one. The callbacks at an epoch's end
see the master after its every round either way; a learning rate set at an epoch's start applies
from its second round (its first trains with the rate of the round before it). Pure numpy: no
Spark, no Keras.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkdl.core.state import ModelState
from sparkdl.errors import InvariantError


@dataclass(frozen=True)
class DelayedRound:
    """Which start each round trains from, and the carry of its progress (see the module docstring).

    Args:
        first: the fit's first round (0, or the round a resumed fit starts at).
        rounds_per_epoch: rounds in an epoch when snapshots are written at epoch ends (None: no snapshots).
        snapshot_every: ``checkpointEvery`` when snapshots are written every that many rounds (None: not).
    """

    first: int = 0
    rounds_per_epoch: int | None = None
    snapshot_every: int | None = None

    def synchronous(self, g: int) -> bool:
        """Whether round ``g`` (0-based, the fit's count) trains from its own start: the fit's first,
        or the first after a snapshot."""
        return g == self.first or any(every is not None and g % every == 0 for every in (self.rounds_per_epoch, self.snapshot_every))

    def base(self, g: int) -> int:
        """The round whose start round ``g`` trains from: ``g`` at a sync point, else ``g − 1``."""
        return g if self.synchronous(g) else g - 1

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
