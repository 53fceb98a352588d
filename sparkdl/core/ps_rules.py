"""Server-side rules of the ``ps`` backend, in pure numpy: synchronous rounds on a parameter
server, and the per-epoch bookkeeping wrapped around any update rule.

:class:`SyncRoundRule` makes the round modes (``sync``, ``bmuf``, ``easgd``, ``gossip``) run on a
:class:`sparkdl.server.ParameterServer`: each worker pulls its start state, pushes its whole
state (or its compressed update) and its rows at the end of a round; the rule keeps the master
unchanged until the round closes (every worker pushed, or the minimum and the deadline of a
straggler-tolerant round), then applies the mode's policy, exactly as the ``rounds`` backend
does. Workers wait for :attr:`SyncRoundRule.round` (rounds closed) through the server.

:class:`EpochRecorder` wraps a rule and records, per epoch, what the pushes it applied carried in
``meta["extra"]``: the metric variable sums (for an exact Keras-style history), rows trained,
updates applied, their staleness and bytes pushed and pulled. It also keeps the row-weighted
mean of the workers' final optimizer states (asynchronous modes keep optimizer state per worker;
the fitted model gets their mean). Nothing here imports Spark, TensorFlow or Keras.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import numpy as np

from sparkdl.core.aggregation import WeightedMean
from sparkdl.core.compression import decode_mean
from sparkdl.core.metrics import MetricSums
from sparkdl.core.modes import SyncAveraging
from sparkdl.core.state import ModelState, WorkerUpdate


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


class SyncRoundRule:
    """Synchronous rounds of a round mode (``sync``, ``bmuf``, ``easgd``, ``gossip``) on a parameter server.

    Each worker pulls its start state for the round (:meth:`served`: the master, BMUF's W + η·Δ,
    or its own model in a per-worker mode), trains and pushes its state (or, with ``encoding``,
    its update relative to that start: fp16, or 1bit/threshold weights decoded by the server),
    its rows and its metric sums. The round closes when every worker pushed, or, with
    ``min_workers`` < ``workers``, once ``min_workers`` pushes arrived and ``deadline_s`` seconds
    passed since the round opened (:meth:`close_if_due`, called by the server while workers wait);
    the mode's policy then gives the new master, exactly as on backend ``rounds``. A push for a
    round already closed is late: dropped and counted (:attr:`late`), and :meth:`is_late` tells
    the bookkeeping to skip it. The round of a push is its ``seq`` − 1 (the slot index).

    Args:
        workers: workers of the fit (pushes that close a round; workers with no rows push ``rows == 0``).
        policy: the mode's policy (default :class:`~sparkdl.core.modes.SyncAveraging`).
        min_workers: pushes that may close a round once ``deadline_s`` passed (default ``workers``).
        deadline_s: seconds from a round's opening before it may close with ``min_workers`` pushes.
        rounds_per_epoch: with it, the master weights after each epoch's last round are kept in
            :attr:`snapshots` (for validation after the barrier stage).
        clock: monotonic seconds (tests pass their own).

    Attributes:
        round: rounds closed so far.
        dropped: per closed round, the workers (ints) whose push had not arrived.
        late: pushes that arrived after their round closed.
    """

    name = "sync"
    lock = True

    def __init__(self, workers: int, policy=None, min_workers: int | None = None, deadline_s: float = 0.0,
                 rounds_per_epoch: int | None = None, clock=time.monotonic) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1. Received: {workers}")
        self.workers = workers
        self.policy = policy if policy is not None else SyncAveraging()
        self.per_worker = bool(getattr(self.policy, "per_worker", False))
        self.min_workers = workers if min_workers is None else max(1, min(workers, int(min_workers)))
        self.deadline_s = float(deadline_s)
        self.rounds_per_epoch = rounds_per_epoch
        self.round, self.late = 0, 0
        self.dropped: list[list[int]] = []
        self.snapshots: dict[int, list[np.ndarray]] = {}
        self._clock = clock
        self._opened: float | None = None  # the first round opens at its first pull or push (not while the stage starts)
        self._starts = None  # None: the master; a ModelState shared by all; a list: one per worker
        self._reset()

    def _reset(self) -> None:
        self._weights, self._optimizer, self._pushes, self._all_optimizer = WeightedMean(), WeightedMean(), 0, True
        self._trained, self._idle = 0, 0  # pushes with rows, and with none (workers with nothing to train in this round)
        self._states: dict[int, tuple[int, ModelState]] = {}
        self._seen: set = set()

    def served(self, worker, master: ModelState) -> ModelState:
        """The state ``worker`` starts the open round from."""
        if self._opened is None:
            self._opened = self._clock()
        starts = self._starts
        if starts is None:
            return master
        start = starts[int(worker)] if isinstance(starts, list) else starts
        if start.optimizer is None and master.optimizer is not None:  # 1bit/threshold: the workers keep their optimizer state
            start = ModelState(start.weights, master.optimizer)
        return start

    def is_late(self, meta: Mapping) -> bool:
        """Whether a push is for a round already closed (``seq`` − 1 < :attr:`round`)."""
        seq = meta.get("seq")
        return isinstance(seq, int) and 1 <= seq and seq - 1 < self.round

    def __call__(self, master: ModelState, update: ModelState, meta: Mapping) -> ModelState:
        if self.is_late(meta):
            self.late += 1
            return master
        worker = meta.get("worker")
        if worker is not None and worker in self._seen:  # raising leaves this round's sums untouched (checked before any change)
            raise ValueError(f"each worker pushes once per sync round. Received: a second push from worker {worker!r}")
        if self._opened is None:
            self._opened = self._clock()
        rows = int(meta.get("rows", 0))
        if rows > 0:
            encoding = meta.get("encoding")
            state = update if encoding is None else decode_mean(update, self.served(worker, master))
            if self.per_worker:
                self._states[int(worker)] = (rows, state)
            else:
                self._weights.add(state.weights, rows)
                if state.optimizer is not None:
                    self._optimizer.add(state.optimizer, rows)
                else:
                    self._all_optimizer = False
        self._seen.add(worker)
        self._pushes += 1
        if rows > 0:
            self._trained += 1
        else:
            self._idle += 1
        if self._pushes >= self.workers or self._due():
            return self._close(master)
        return master

    def _due(self) -> bool:
        """Whether the open round may close before every push came: ``min_workers`` of the workers
        with rows in it pushed their update (a push of no rows is no update and does not count;
        fewer than the minimum suffice when the others said they have none) and the deadline passed."""
        need = min(self.min_workers, self.workers - self._idle)
        return need > 0 and self._trained >= need and self._opened is not None and self._clock() - self._opened >= self.deadline_s

    def close_if_due(self, master: ModelState) -> ModelState | None:
        """The new master when the open round may close now (:meth:`_due`), else None."""
        return self._close(master) if self._due() else None

    def _close(self, master: ModelState) -> ModelState:
        if self.per_worker:
            updates = [WorkerUpdate(p, rows, 0, state) for p, (rows, state) in sorted(self._states.items())]
            new = self.policy.apply(master, updates)
        else:
            weights = self._weights.result()
            optimizer = self._optimizer.result() if self._all_optimizer and self._optimizer.total_weight else None
            mean = None if weights is None else ModelState(weights, optimizer)
            new = self.policy.apply_mean(master, mean, int(self._weights.total_weight))
        arrived = {int(w) for w in self._seen if w is not None and str(w).isdigit()}
        self.dropped.append([w for w in range(self.workers) if w not in arrived] if self._seen != {None} else [])
        self.round += 1
        self._reset()
        self._opened = self._clock()
        if self.per_worker:
            self._starts = self.policy.starts(new)
        elif hasattr(self.policy, "start"):
            self._starts = self.policy.start(new)
        if self.rounds_per_epoch and self.round % self.rounds_per_epoch == 0:
            self.snapshots[self.round // self.rounds_per_epoch - 1] = [np.array(w, copy=True) for w in new.weights]
        return new

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
        late = getattr(self.inner, "is_late", None)
        if late is not None and late(meta):  # a straggler's push for a closed round: dropped by the rule, not recorded
            return self.inner(master, update, meta)
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

    def __getattr__(self, name: str):
        # A round rule's interface (per-worker pulls, rounds closed by the deadline) seen through the recorder.
        if name in ("served", "close_if_due", "round", "is_late", "dropped", "late"):
            return getattr(self.__dict__["inner"], name)
        raise AttributeError(name)

    def rows(self, epoch: int) -> int:
        with self._mutex:
            return self.epochs[epoch].rows

    def summaries(self) -> list[dict]:
        with self._mutex:
            return [e.summary() for e in self.epochs]
