"""Invariants the driver asserts between rounds, so that a fit fails loudly instead of returning a
silently wrong model. Pure numpy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sparkdl.core.state import ModelState
from sparkdl.errors import InvariantError


def check_finite(state: ModelState, names: Sequence[str], description: str) -> None:
    """Raise :class:`InvariantError` naming the first weight array of ``state`` holding NaN or ±inf.

    Args:
        state: the master state to check (its optimizer state is not checked).
        names: one name per weight array.
        description: what produced ``state``, for the message (e.g. ``"round 3/8"``).
    """
    for name, array in zip(names, state.weights, strict=True):
        if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
            raise InvariantError(
                f"the master weights must stay finite. Received: non-finite values in {name!r} after {description} "
                "(the loss diverged: lower the learning rate, or check the inputs' scale)"
            )


def check_epoch_rows(epoch: int, trained: int, dropped: int, expected: int, total: int, stopped: bool) -> None:
    """Each epoch trains every counted row once: ``trained`` + ``dropped`` (late updates of
    straggler-tolerant rounds) must equal ``expected`` (the rows of the rounds run), and, unless a
    callback stopped the fit inside the epoch, ``expected`` must equal ``total`` (the rows counted
    in the input).

    Raises:
        InvariantError: naming the counts and the epoch (1-based in the message).
    """
    if trained + dropped != expected or (not stopped and expected != total):
        raise InvariantError(
            f"each epoch must train on every row once. Received: {trained} rows trained and {dropped} dropped "
            f"(late workers) in epoch {epoch + 1}, {expected} rows in its rounds, {total} rows counted in the input"
        )
