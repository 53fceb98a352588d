"""Server-side rules of the ``ps`` backend, in pure numpy: synchronous rounds on a parameter
server, and the per-epoch bookkeeping wrapped around any update rule.

:class:`SyncRoundRule` makes mode ``sync`` run on a :class:`sparkdl.server.ParameterServer`:
each worker pushes its whole state (weights and optimizer state) and its rows at the end of a
round; the rule keeps the master unchanged until the round's ``workers``-th push arrives, then
applies the row-weighted mean (:class:`~sparkdl.core.modes.SyncAveraging`), exactly as the
``rounds`` backend does. The server's version rises by one per push, so round ``g`` (0-based,
counted over the whole fit) is closed at version ``workers × (g + 1)``.

:class:`EpochRecorder` wraps a rule and records, per epoch, what the pushes it applied carried in
``meta["extra"]``: the metric variable sums (for an exact Keras-style history), rows trained,
updates applied, their staleness and bytes pushed and pulled. It also keeps the row-weighted
mean of the workers' final optimizer states (asynchronous modes keep optimizer state per worker;
the fitted model gets their mean). Nothing here imports Spark, TensorFlow or Keras.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from sparkdl.core.aggregation import WeightedMean
from sparkdl.core.metrics import MetricSums
from sparkdl.core.modes import SyncAveraging
from sparkdl.core.state import ModelState


def encode_metric_sums(sums: list[np.ndarray] | None) -> list | None:
    """Metric variable sums as JSON: ``[[shape, [values...]], ...]`` (float64 values round-trip exactly)."""
    if sums is None:
        return None
    return [[list(np.shape(a)), np.asarray(a, np.float64).reshape(-1).tolist()] for a in sums]


def decode_metric_sums(encoded: list) -> list[np.ndarray]:
    """The inverse of :func:`encode_metric_sums`.

    Raises:
        ValueError: on a malformed list.
    """
    out = []
    for shape, values in encoded:
        out.append(np.asarray(values, np.float64).reshape([int(d) for d in shape]))
    return out


def _arrays(values: list | None) -> list[np.ndarray] | None:
    """numpy arrays (a 0-d mean comes back from numpy as a scalar)."""
    return None if values is None else [np.asarray(v) for v in values]


class SyncRoundRule:
    """Synchronous model averaging on a parameter server; see the module docstring.

    Args:
        workers: pushes that close a round (one per worker, workers with no rows included: they
            push ``rows == 0`` and carry no weight).

    A round in which no worker trained keeps the master. Updates hold the workers' new states
    (not differences); an update with ``rows > 0`` must hold the optimizer arrays too when the
    master has them.
    """

    name = "sync"
    lock = True

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1. Received: {workers}")
        self.workers = workers
        self._reset()

    def _reset(self) -> None:
        self._weights, self._optimizer, self._pushes, self._has_optimizer = WeightedMean(), WeightedMean(), 0, False
        self._seen: set = set()

    def __call__(self, master: ModelState, update: ModelState, meta: Mapping) -> ModelState:
        worker = meta.get("worker")
        if worker is not None and worker in self._seen:  # raising leaves this round's sums untouched (checked before any change)
            raise ValueError(f"each worker pushes once per sync round. Received: a second push from worker {worker!r}")
        self._seen.add(worker)
        rows = int(meta.get("rows", 0))
        if rows > 0:
            self._weights.add(update.weights, rows)
            if update.optimizer is not None:
                self._optimizer.add(update.optimizer, rows)
                self._has_optimizer = True
        self._pushes += 1
        if self._pushes < self.workers:
            return master
        weights = _arrays(self._weights.result())
        optimizer = _arrays(self._optimizer.result()) if self._has_optimizer else None
        total = int(self._weights.total_weight)
        self._reset()
        mean = None if weights is None else ModelState(weights, optimizer)
        return SyncAveraging().apply_mean(master, mean, total)

    @property
    def pending(self) -> int:
        """Pushes received in the round not yet closed."""
        return self._pushes


class EpochStats:
    """What the pushes of one epoch carried (see :class:`EpochRecorder`)."""

    def __init__(self) -> None:
        self.sums = MetricSums()
        self.rows = 0
        self.updates = 0
        self.staleness: list[int] = []
        self.bytes_pushed = 0
        self.bytes_pulled = 0

    def summary(self) -> dict:
        return {
            "updates_applied": self.updates,
            "staleness_mean": float(np.mean(self.staleness)) if self.staleness else 0.0,
            "staleness_max": int(max(self.staleness, default=0)),
            "bytes_pushed": int(self.bytes_pushed),
            "bytes_pulled": int(self.bytes_pulled),
        }


class EpochRecorder:
    """Wraps an update rule ``inner`` and records each applied push in its epoch.

    Reads ``meta["extra"]``: ``epoch`` (0-based), ``metrics`` (:func:`encode_metric_sums`),
    ``pulled`` (bytes the worker pulled since its last push), ``final`` (the worker's last push:
    ``update.optimizer``, when sent, joins the final optimizer mean, weighted by
    ``extra["worker_rows"]``). ``rows`` and ``nbytes`` and ``staleness`` come from the server's meta.
    A push is recorded only once ``inner`` returned (the server drops duplicates before the rule).

    ``lock`` is ``inner``'s, so a Hogwild rule still runs outside the server's lock; the
    bookkeeping takes its own short lock.

    With ``snapshot_rows`` (the rows of one epoch), a copy of the master weights is kept in
    ``snapshots[epoch]`` when the push that completes the epoch's rows has been applied: the
    weights a validation of that epoch evaluates (in the asynchronous modes a faster worker's
    pushes of the next epoch may already be in them).
    """

    def __init__(self, inner, epochs: int, snapshot_rows: int | None = None) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self.lock = getattr(inner, "lock", True)
        self.epochs = [EpochStats() for _ in range(epochs)]
        self.final_optimizer = WeightedMean()
        self.final_workers: set[str] = set()
        self.snapshot_rows = snapshot_rows
        self.snapshots: dict[int, list] = {}
        self._mutex = threading.Lock()

    def __call__(self, master: ModelState, update: ModelState, meta: Mapping) -> ModelState:
        # Read and check everything the bookkeeping needs before ``inner`` changes any state: a
        # push refused here leaves ``inner`` (e.g. a sync round's sums) untouched.
        extra = meta.get("extra") or {}
        epoch = int(extra.get("epoch", 0))
        pulled = int(extra.get("pulled", 0))
        worker_rows = max(1, int(extra.get("worker_rows", 1)))
        metrics = extra.get("metrics")
        sums = decode_metric_sums(metrics) if metrics is not None else None
        new = self.inner(master, update, meta)
        with self._mutex:
            stats = self.epochs[min(max(epoch, 0), len(self.epochs) - 1)]
            stats.rows += int(meta.get("rows", 0))
            stats.updates += 1
            stats.staleness.append(int(meta.get("staleness", 0)))
            stats.bytes_pushed += int(meta.get("nbytes", 0))
            stats.bytes_pulled += pulled
            if sums is not None:
                stats.sums.add(sums)
            if extra.get("final"):
                self.final_workers.add(str(meta.get("worker")))
                if update.optimizer is not None:
                    self.final_optimizer.add(update.optimizer, worker_rows)
            index = min(max(epoch, 0), len(self.epochs) - 1)
            if self.snapshot_rows is not None and index not in self.snapshots and stats.rows >= self.snapshot_rows:
                self.snapshots[index] = [np.array(w, copy=True) for w in new.weights]
        return new

    def rows(self, epoch: int) -> int:
        with self._mutex:
            return self.epochs[epoch].rows

    def summaries(self) -> list[dict]:
        with self._mutex:
            return [e.summary() for e in self.epochs]
