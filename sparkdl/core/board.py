"""What the parameter server keeps for the driver loop, in pure numpy: the open round of a round
mode (:class:`RoundBoard`) and the per-epoch record of an asynchronous fit (:class:`EpochLedger`).

Round modes (``sync``, ``bmuf``, ``easgd``, ``gossip``) on backend ``ps``: the driver opens round g
with the state each worker starts from (:meth:`RoundBoard.open`); a worker waits until its round
is open (:meth:`RoundBoard.wait_open`), pulls its start (:meth:`RoundBoard.served`), trains τ
steps and pushes its state, or its compressed update relative to that start, with its rows and
metric sums (:meth:`RoundBoard.__call__`, the server's update rule). The driver waits until the
round's workers pushed (:meth:`RoundBoard.wait_pushed`), closes it (:meth:`RoundBoard.close`),
applies the mode's policy and runs its callbacks, then opens the next round: so no worker starts
round g + 1 before the driver's callbacks of round g returned, and every worker stops in the
same round. A push for a round already closed (a straggler) is dropped as late.

Asynchronous modes: the server applies each push with the mode's rule as it arrives;
:class:`EpochLedger` wraps the rule and records, per epoch, what the applied pushes carried in
``meta["extra"]`` (metric sums, rows, staleness, bytes) and each worker's latest optimizer state,
and wakes the driver when an epoch's rows are all in.

Nothing here imports Spark, TensorFlow or Keras, and nothing starts threads.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sparkdl.core.aggregation import WeightedMean
from sparkdl.core.compression import decode_mean
from sparkdl.core.metrics import MetricSums
from sparkdl.core.state import ModelState, WorkerLocal, WorkerUpdate


def encode_metric_sums(sums: Sequence[np.ndarray] | None) -> list | None:
    """Metric variable sums as JSON: ``[[shape, [values...]], ...]`` (float64 values round-trip exactly)."""
    if sums is None:
        return None
    return [[list(np.shape(a)), np.asarray(a, np.float64).reshape(-1).tolist()] for a in sums]


def decode_metric_sums(encoded: list) -> list[np.ndarray]:
    """The inverse of :func:`encode_metric_sums`.

    Raises:
        ValueError: on a malformed list.
    """
    return [np.asarray(values, np.float64).reshape([int(d) for d in shape]) for shape, values in encoded]


class LatePush(Exception):
    """A push for a round that is not open (it closed first): the server answers it ``dropped: late``."""


@dataclass
class RoundCollection:
    """What one closed round brought to the driver.

    Attributes:
        index: the round's index in the fit.
        workers: ``(partition, rows)`` of each push applied, sorted.
        rows: rows those pushes trained.
        mean: their row-weighted mean state (not per-worker rounds; None when none trained).
        updates: each trained worker's state (per-worker rounds).
        metrics: each push's metric variable sums.
        nbytes: bytes of the applied pushes.
        missing: expected workers whose push had not arrived when the round closed.
        local: what workers sent of their own state with the round (collected rounds).
    """

    index: int
    workers: list[tuple[int, int]] = field(default_factory=list)
    rows: int = 0
    mean: ModelState | None = None
    updates: list[WorkerUpdate] | None = None
    metrics: list[list[np.ndarray]] = field(default_factory=list)
    nbytes: int = 0
    missing: list[int] = field(default_factory=list)
    local: dict[int, WorkerLocal] = field(default_factory=dict)


class RoundBoard:
    """The rounds of a round mode on a parameter server (see the module docstring).

    Args:
        workers: the fit's workers (partitions 0..workers−1).
        per_worker: keep each worker's state apart (``easgd``, ``gossip``) instead of their
            running row-weighted mean (held as one float64 sum, not N copies).

    The round of a push is its ``seq`` − 1 (a worker's slot index). Thread-safe: the server's
    handlers and the driver call it from different threads.
    """

    name = "rounds"
    lock = True

    def __init__(self, workers: int, per_worker: bool = False) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1. Received: {workers}")
        self.workers, self.per_worker = workers, per_worker
        self._cond = threading.Condition()
        self.opened = -1  # the index of the round opened last
        self.closed = True  # whether that round is closed
        self.stopped = False
        self.late = 0
        self.learning_rate: float | None = None
        self._rates: dict[int, float | None] = {}  # round -> the learning rate it was opened with (the last three)
        self.collect = False
        self._starts: ModelState | list[ModelState] | None = None
        self._expected: set[int] = set()
        self._reset()
        # validation inside the workers' tasks: the epoch posted last, its weights, who evaluates it, what they reported
        self.val_epoch, self.val_closed = -1, -1
        self._val_weights: list[np.ndarray] | None = None
        self._val_expected: set[int] = set()
        self._val_reports: dict[int, tuple[int, list[np.ndarray] | None]] = {}

    def _reset(self) -> None:
        self._weights, self._optimizer, self._all_optimizer = WeightedMean(), WeightedMean(), True
        self._states: dict[int, tuple[int, ModelState]] = {}
        self._pushed: dict[int, int] = {}
        self._metrics: list[list[np.ndarray]] = []
        self._nbytes = 0
        self._local: dict[int, WorkerLocal] = {}

    # ---- the driver's side ---------------------------------------------------------------------

    def open(self, index: int, starts: ModelState | Sequence[ModelState], expected: set[int],
             learning_rate: float | None = None, collect: bool = False) -> None:
        """Open round ``index``: ``starts`` (one state, or one per worker; None when the workers pull
        it elsewhere: backend ``sharded``) are what workers pull,
        ``expected`` the partitions with rows in it, ``learning_rate`` what replicas train it with
        (None: their own), ``collect`` whether workers send their own state with their push."""
        with self._cond:
            if not self.closed or index <= self.opened:
                raise ValueError(f"rounds open one after the other, each once closed. Received: round {index} after "
                                 f"round {self.opened} ({'closed' if self.closed else 'open'})")
            self._reset()
            self._starts = starts if isinstance(starts, ModelState) or starts is None else list(starts)
            self._expected = set(expected)
            self.learning_rate, self.collect = learning_rate, collect
            self._rates[index] = learning_rate  # what wait_open answers for this round later too (overlap trains behind)
            for old in [r for r in self._rates if r < index - 2]:
                del self._rates[old]
            self.opened, self.closed = index, False
            self._cond.notify_all()

    def pushed(self) -> set[int]:
        """The partitions whose push for the open round arrived."""
        with self._cond:
            return set(self._pushed)

    def wait_pushed(self, need: int, timeout_s: float) -> bool:
        """Wait until every expected worker pushed, or at least ``need`` of them did (straggler
        rounds), for at most ``timeout_s`` seconds; returns whether that many arrived."""
        with self._cond:
            return self._cond.wait_for(lambda: self._complete() or len(set(self._pushed) & self._expected) >= need,
                                       timeout=max(0.0, timeout_s))

    def wait_change(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds for the next push (or close, stop)."""
        with self._cond:
            self._cond.wait(timeout=max(0.0, timeout_s))

    def _complete(self) -> bool:
        return self._expected <= set(self._pushed)

    def close(self) -> RoundCollection:
        """Close the open round (later pushes for it are dropped as late) and return what arrived."""
        with self._cond:
            if self.closed:
                raise ValueError(f"round {self.opened} is closed already")
            self.closed = True
            out = RoundCollection(self.opened, workers=sorted(self._pushed.items()), nbytes=self._nbytes,
                                  metrics=self._metrics, missing=sorted(self._expected - set(self._pushed)), local=self._local)
            out.rows = sum(rows for _, rows in out.workers)
            if self.per_worker:
                out.updates = [WorkerUpdate(p, rows, 0, state) for p, (rows, state) in sorted(self._states.items())]
            else:
                weights = self._weights.result()
                optimizer = self._optimizer.result() if self._all_optimizer and self._optimizer.total_weight else None
                out.mean = None if weights is None else ModelState(weights, optimizer)
            self._reset()
            self._cond.notify_all()
            return out

    def stop(self) -> None:
        """No more rounds: workers waiting for one return."""
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    # ---- the workers' side (server handlers) ---------------------------------------------------

    def wait_open(self, index: int, timeout_s: float, worker: int | None = None) -> dict:
        """Wait up to ``timeout_s`` seconds until round ``index`` is open, a later one was opened,
        the fit stopped, or (``worker`` given) a validation ``worker`` has to run was posted.
        Returns ``{"round": opened, "open": bool (this round is open now), "late": bool (it closed,
        or a later one opened, without this worker), "stop": bool, "learning_rate", "collect",
        "validate": the epoch whose validation ``worker`` has to run now, or None}``."""
        with self._cond:
            def ready():
                return self.stopped or self.opened > index or (self.opened == index and not self.closed) \
                    or (self.opened == index and self.closed) or self._val_pending(worker) is not None

            self._cond.wait_for(ready, timeout=max(0.0, timeout_s))
            is_open = self.opened == index and not self.closed
            late = self.opened > index or (self.opened == index and self.closed)
            return {"round": self.opened, "open": is_open and not self.stopped, "late": late and not self.stopped,
                    "stop": self.stopped, "learning_rate": self._rates.get(index, self.learning_rate), "collect": self.collect,
                    "validate": self._val_pending(worker)}

    # ---- validation inside the workers' tasks ----------------------------------------------------

    def post_validation(self, epoch: int, weights: Sequence[np.ndarray], expected: set[int]) -> None:
        """(The driver) Ask the ``expected`` workers (those with validation rows) to evaluate
        ``weights`` (the master after ``epoch``) on their validation rows; workers waiting for a
        round are woken (``"validate"`` in :meth:`wait_open`'s reply).

        Raises:
            ValueError: an epoch not after the last posted one, or one posted while another is open.
        """
        with self._cond:
            if epoch <= self.val_epoch or self.val_closed < self.val_epoch:
                raise ValueError(f"validations are posted one after the other, each once closed. Received: epoch {epoch} after "
                                 f"epoch {self.val_epoch} ({'closed' if self.val_closed == self.val_epoch else 'open'})")
            self._val_weights = [np.asarray(w) for w in weights]
            self._val_expected, self._val_reports = set(expected), {}
            self.val_epoch = epoch
            self._cond.notify_all()

    def _val_pending(self, worker) -> int | None:
        """The open validation's epoch when ``worker`` is expected and has not reported, else None."""
        if worker is None or self.val_closed == self.val_epoch:
            return None
        worker = int(worker)
        return self.val_epoch if worker in self._val_expected and worker not in self._val_reports else None

    def validation_weights(self, epoch: int) -> list[np.ndarray] | None:
        """The weights posted for ``epoch`` while its validation is open, else None."""
        with self._cond:
            return self._val_weights if epoch == self.val_epoch and self.val_closed < epoch else None

    def report_validation(self, worker: int, epoch: int, rows: int, sums: list[np.ndarray] | None) -> bool:
        """(A worker) Its validation rows and summed metric variables for ``epoch``. Returns whether
        they were recorded: not for another epoch than the open one, nor twice (a retried
        task's second report of the same weights on the same rows is the same)."""
        with self._cond:
            if epoch != self.val_epoch or self.val_closed == epoch or worker not in self._val_expected or worker in self._val_reports:
                return False
            self._val_reports[worker] = (int(rows), sums)
            self._cond.notify_all()
            return True

    def validation_complete(self) -> bool:
        """Whether every expected worker reported the open validation."""
        with self._cond:
            return self._val_expected <= set(self._val_reports)

    def validation_done(self, worker: int, epoch: int) -> bool:
        """Whether ``worker`` has nothing left to do for the validation of ``epoch`` (closed, reported, or not its)."""
        with self._cond:
            return self.val_closed >= epoch or (self.val_epoch == epoch and (int(worker) in self._val_reports
                                                                             or int(worker) not in self._val_expected))

    def close_validation(self) -> dict[int, tuple[int, list[np.ndarray] | None]]:
        """(The driver) Close the open validation; returns per worker ``(rows, metric sums)``.

        Raises:
            ValueError: none is open.
        """
        with self._cond:
            if self.val_closed == self.val_epoch:
                raise ValueError(f"no validation is open (epoch {self.val_epoch} is closed)")
            self.val_closed = self.val_epoch
            self._val_weights = None
            self._cond.notify_all()
            return dict(self._val_reports)

    def wait_validation(self, worker: int, epoch: int, timeout_s: float) -> dict:
        """(A worker, after its last slot) Wait up to ``timeout_s`` seconds until the validation of
        ``epoch`` is posted for it or done, or the fit stopped. Returns ``{"validate": epoch to run now or
        None, "done": bool (nothing left for it of ``epoch``), "stop": bool}``."""
        with self._cond:
            ready = lambda: self.stopped or self._val_pending(worker) is not None or self.validation_done(worker, epoch)  # noqa: E731
            self._cond.wait_for(ready, timeout=max(0.0, timeout_s))
            return {"validate": self._val_pending(worker), "done": self.validation_done(worker, epoch), "stop": self.stopped}

    def served(self, worker, master: ModelState) -> ModelState:
        """The state ``worker`` starts the open round from (the master before any round opened)."""
        with self._cond:
            starts = self._starts
        if starts is None:
            return master
        return starts[int(worker)] if isinstance(starts, list) else starts

    def is_late(self, meta: Mapping) -> bool:
        """Whether a push is not for the open round (``seq`` − 1 != the open round's index)."""
        seq = meta.get("seq")
        with self._cond:  # a re-entrant lock: also called from __call__
            return not (isinstance(seq, int) and seq - 1 == self.opened and not self.closed)

    def __call__(self, master: ModelState, update: ModelState, meta: Mapping) -> ModelState:
        """A push for the open round (the server's update rule): kept for the driver; the master
        does not change until the driver closes the round. ``meta["encoding"]`` (fp16, 1bit,
        threshold) says ``update`` is relative to the worker's start; ``meta["extra"]`` carries
        ``metrics`` (:func:`encode_metric_sums`)."""
        self.record(meta, update, master)
        return master

    def record(self, meta: Mapping, update: ModelState | None = None, master: ModelState | None = None) -> None:
        """Record one worker's push (``update``: its state or its encoded update) or, with
        ``update`` None, its report alone (rows, metric sums, bytes) for the open round.

        Raises:
            LatePush: the push's round (``meta["seq"]`` − 1) is not open.
            ValueError: a second push of the same worker in the round.
        """
        worker = int(meta["worker"])
        rows = int(meta.get("rows", 0))
        extra = meta.get("extra") or {}
        sums = decode_metric_sums(extra["metrics"]) if extra.get("metrics") is not None else None
        with self._cond:
            if self.is_late(meta):  # the round closed between the server's check and this call
                self.late += 1
                raise LatePush(f"round {meta.get('seq', 0) - 1} is not open")
            if worker in self._pushed:
                raise ValueError(f"each worker pushes once per round. Received: a second push from worker {worker} for round {self.opened}")
            start = self._starts if isinstance(self._starts, ModelState) or self._starts is None else self._starts[worker]
            if rows > 0 and update is not None:
                encoding = meta.get("encoding")
                state = update if encoding is None else decode_mean(update, start if start is not None else master)
                if self.per_worker:
                    self._states[worker] = (rows, state)
                else:
                    self._weights.add(state.weights, rows)
                    if state.optimizer is not None:
                        self._optimizer.add(state.optimizer, rows)
                    else:
                        self._all_optimizer = False
            if sums is not None:
                self._metrics.append(sums)
            self._pushed[worker] = rows
            self._nbytes += int(meta.get("nbytes", 0))
            self._cond.notify_all()

    def add_local(self, worker: int, local: WorkerLocal) -> None:
        """A worker's own state after the open round (a collected round), sent before its push."""
        with self._cond:
            self._local[int(worker)] = local


class EpochStats:
    """What the pushes of one epoch carried (see :class:`EpochLedger`)."""

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


class EpochLedger:
    """Wraps an asynchronous update rule ``inner`` and records each applied push in its epoch.

    Reads ``meta["extra"]``: ``epoch`` (0-based), ``metrics`` (:func:`encode_metric_sums`),
    ``pulled`` (bytes the worker pulled since its last push), ``final`` (the worker's last push).
    A push that carries ``update.optimizer`` (a worker's last push of an epoch, and its final one)
    becomes that worker's latest optimizer state (:attr:`optimizers`, for snapshots and retries);
    a final one joins :attr:`final_optimizer`, weighted by ``extra["worker_rows"]``. ``rows``,
    ``nbytes`` and ``staleness`` come from the server's meta. A push is recorded only once
    ``inner`` returned (the server drops duplicates before the rule).

    ``lock`` is ``inner``'s, so a Hogwild rule still runs outside the server's lock; the
    bookkeeping takes its own short lock. :meth:`wait_epoch` wakes when an epoch's rows are in.
    """

    def __init__(self, inner, epochs: int, first_epoch: int = 0) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self.lock = getattr(inner, "lock", True)
        self.epochs = [EpochStats() for _ in range(epochs)]
        self.first_epoch = first_epoch
        self.final_optimizer = WeightedMean()
        self.optimizers: dict[int, list[np.ndarray]] = {}
        self._cond = threading.Condition()

    def __call__(self, master: ModelState, update: ModelState, meta: Mapping) -> ModelState:
        extra = meta.get("extra") or {}
        epoch = min(max(int(extra.get("epoch", 0)), 0), len(self.epochs) - 1)
        pulled = int(extra.get("pulled", 0))
        worker_rows = max(1, int(extra.get("worker_rows", 1)))
        metrics = extra.get("metrics")
        sums = decode_metric_sums(metrics) if metrics is not None else None
        weights_only = ModelState(update.weights, None)
        new = self.inner(master, weights_only, meta)
        with self._cond:
            stats = self.epochs[epoch]
            stats.rows += int(meta.get("rows", 0))
            stats.updates += 1
            stats.staleness.append(int(meta.get("staleness", 0)))
            stats.bytes_pushed += int(meta.get("nbytes", 0))
            stats.bytes_pulled += pulled
            if sums is not None:
                stats.sums.add(sums)
            if update.optimizer is not None:
                self.optimizers[int(meta["worker"])] = [np.array(a, copy=True) for a in update.optimizer]
                if extra.get("final"):
                    self.final_optimizer.add(update.optimizer, worker_rows)
            self._cond.notify_all()
        if new.optimizer is None and master.optimizer is not None:
            new = ModelState(new.weights, master.optimizer)
        return new

    def rows(self, epoch: int) -> int:
        with self._cond:
            return self.epochs[epoch].rows

    def wait_change(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds for the next recorded push."""
        with self._cond:
            self._cond.wait(timeout=max(0.0, timeout_s))

    def wait_epoch(self, epoch: int, rows: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds until ``rows`` rows of ``epoch`` were applied."""
        with self._cond:
            return self._cond.wait_for(lambda: self.epochs[epoch].rows >= rows, timeout=max(0.0, timeout_s))

    def summaries(self) -> list[dict]:
        with self._cond:
            return [e.summary() for e in self.epochs]



class SliceBoard(RoundBoard):
    """The rounds of backend ``sharded`` as the driver's coordinator keeps them: the open round, each
    worker's report of it (rows, metric sums, bytes; no state: the state lives in the slices), and
    the slices' owners: where each serves its slice (the slice map), and the newest version each
    reported ready.

    Args:
        workers: the fit's workers (partitions 0..workers−1).
        owners: the slices (one per worker).

    Thread-safe (the coordinator's handlers and the driver call it from different threads).
    """

    def __init__(self, workers: int, owners: int) -> None:
        super().__init__(workers)
        self.owners = owners
        self.map_version = 0
        self._slices: dict[int, dict] = {}  # owner -> {"location", "cert", "fingerprint", "attempt"}
        self._history: dict[int, int] = {}  # owner -> registrations so far
        self._ready: dict[int, int] = {}  # owner -> newest version reported ready (by its registered attempt)
        self.problems: list[str] = []  # slices that reported a non-finite candidate
        self.lost: list[str] = []  # slices found nowhere by their owners (SliceLost): the fit fails at once

    def register(self, owner: int, attempt: int, info: dict) -> dict | None:
        """Owner ``owner`` (task attempt ``attempt``) serves its slice at ``info``; returns the
        registration it replaces (None for the first), or raises ValueError for a superseded attempt."""
        with self._cond:
            previous = self._slices.get(owner)
            if previous is not None and previous["attempt"] > attempt:
                raise ValueError(f"slice {owner}: attempt {attempt} is superseded by attempt {previous['attempt']}")
            self._slices[owner] = {**info, "attempt": int(attempt)}
            self._history[owner] = self._history.get(owner, 0) + 1
            self._ready.pop(owner, None)
            self.map_version += 1
            self._cond.notify_all()
            return previous

    def position(self) -> tuple[int, bool]:
        """``(the round opened last, whether it is closed)``, read together."""
        with self._cond:
            return self.opened, self.closed

    def registrations(self, owner: int) -> int:
        with self._cond:
            return self._history.get(owner, 0)

    def slice_map(self) -> dict:
        """``{"version": map version, "owners": [registration or None per owner]}``."""
        with self._cond:
            return {"version": self.map_version, "owners": [self._slices.get(j) for j in range(self.owners)]}

    def mark_ready(self, owner: int, attempt: int, version: int, problem: str | None = None) -> bool:
        """Owner ``owner`` holds ``version`` (the start of round ``version``); ``problem``: its
        candidate was not finite. Returns False for an attempt that is not the registered one."""
        with self._cond:
            registered = self._slices.get(owner)
            if registered is None or registered["attempt"] != attempt:
                return False
            if problem is not None:
                self.problems.append(f"slice {owner}: {problem}")
            else:
                self._ready[owner] = max(version, self._ready.get(owner, -1))
            self._cond.notify_all()
            return True

    def mark_lost(self, owner: int, attempt: int, message: str) -> None:
        """Owner ``owner``'s task attempt ``attempt`` found its slice nowhere (``message``)."""
        with self._cond:
            self.lost.append(f"slice {owner} (task attempt {attempt}): {message}")
            self._cond.notify_all()

    def describe(self) -> str:
        """Where the open round stands, in words, for a round that waits too long: the workers
        whose pieces it still waits for, and each slice's registered task attempt and newest ready
        version (``none`` while its owner reported none)."""
        with self._cond:
            missing = sorted(self._expected - set(self._pushed))
            slices = []
            for j in range(self.owners):
                attempt = self._slices[j]["attempt"] if j in self._slices else "none"
                ready = f"v{self._ready[j]}" if j in self._ready else "none"
                slices.append(f"{j}: attempt {attempt}, ready {ready}")
            return (f"round {self.opened + 1} of the fit {'closed' if self.closed else 'open'}, waiting for the pieces of "
                    f"workers {missing or 'none'}; slices {'; '.join(slices)}; slice map version {self.map_version}")

    def ready_version(self) -> int:
        """The newest version every slice holds (-1 while a slice holds none)."""
        with self._cond:
            if len(self._ready) < self.owners:
                return -1
            return min(self._ready.values())

    def wait_open_or_map(self, index: int, known_map: int, timeout_s: float) -> dict:
        """:meth:`wait_open`, also returning early when the slice map changes from ``known_map``;
        the answer carries ``map_version``."""
        with self._cond:
            self._cond.wait_for(lambda: self.stopped or self.opened >= index or self.map_version != known_map,
                                timeout=max(0.0, timeout_s))
        answer = self.wait_open(index, 0.0)
        answer["map_version"] = self.map_version
        return answer
