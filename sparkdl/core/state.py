"""The state of a fit, as plain numpy data: the master model, each round's updates, and
:class:`FitState`, everything a fit needs to continue exactly where it stopped.

Nothing here imports Spark, TensorFlow or Keras. A snapshot of a :class:`FitState` is Arrow IPC
bytes (:func:`~sparkdl.serialization.arrow_codec.encode_arrays`, never pickle) plus one JSON
object; :meth:`FitState.restore` takes both back, bit for bit, and refuses the snapshot of
another model, mode, schedule or data, naming the first difference.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

import numpy as np

from sparkdl.errors import CodecError, ConfigError

SNAPSHOT_FORMAT = "1"


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
    """

    partition: int
    rows: int
    steps: int
    state: ModelState | None


@dataclass
class RoundUpdates:
    """What a mode's policy receives from one round (see :mod:`sparkdl.core.modes`).

    Attributes:
        rows: rows trained in the round by the workers whose updates arrived.
        mean: the row-weighted mean of those workers' states (None when none trained, or when
            the round brings ``updates`` instead).
        updates: each trained worker's own state (the per-worker modes ``easgd`` and ``gossip``).
        master: the asynchronous modes: the parameter server's master after the epoch's pushes.
    """

    rows: int
    mean: ModelState | None = None
    updates: list[WorkerUpdate] | None = None
    master: ModelState | None = None


@dataclass
class WorkerLocal:
    """What one worker keeps of its own between rounds, as of the round it follows.

    Attributes:
        version: the fit's round index after which this state holds (-1: before any round).
        residual: 1bit/threshold's error-feedback residual, one array per weight (None: zero).
        optimizer: the optimizer state the worker keeps itself (1bit/threshold, and the
            asynchronous modes), or None for the master's.
    """

    version: int
    residual: list[np.ndarray] | None = None
    optimizer: list[np.ndarray] | None = None


@dataclass
class EpochProgress:
    """The epoch in progress: metric variable sums and counts of its rounds so far.

    Attributes:
        sums: element-wise sums of the workers' Keras metric variables (float64 / int64), or None.
        rows: rows trained; dropped: rows of late updates dropped (straggler-tolerant rounds);
        nbytes: bytes of updates the workers sent; expected: rows of the epoch's rounds run.
    """

    sums: list[np.ndarray] | None = None
    rows: int = 0
    dropped: int = 0
    nbytes: int = 0
    expected: int = 0

    def add_sums(self, variables) -> None:
        """Add one worker's metric variables (see :class:`~sparkdl.core.metrics.MetricSums`)."""
        from sparkdl.core.metrics import MetricSums

        sums = MetricSums(self.sums)
        sums.add(variables)
        self.sums = sums.total()


@dataclass
class FitState:
    """Everything a fit needs to continue exactly: one object, snapshotted whole.

    Attributes:
        identity: what the state belongs to (JSON): the model's weight and optimizer signature,
            the mode and its settings, the schedule and the data's partition rows. A snapshot is
            restored only into a fit of the same identity.
        master: the master weights and optimizer state.
        mode: the mode's own state, named lists of arrays (BMUF's block momentum ``delta``,
            the worker models of ``easgd`` and ``gossip``: ``models.<i>.w`` / ``models.<i>.o``).
        local: per partition, what its worker keeps between rounds (:class:`WorkerLocal`).
        rounds: driver rounds completed (the index of the next round); ``epochs``: epochs
            completed; ``epoch``: the epoch in progress (:class:`EpochProgress`).
        history: per-epoch metrics, ``{"loss": [...], "val_loss": [...]}``.
        info: facts for ``fitInfo`` that accumulate over the fit (JSON-able).

    The asynchronous modes snapshot at epoch ends only, where every worker stands at the same place,
    so no parameter server bookkeeping (applied slots, SSP clocks) needs to be kept: a resumed fit
    starts a new stage, and a new server, at the epoch's boundary.
    """

    identity: dict
    master: ModelState
    mode: dict[str, list[np.ndarray]] = field(default_factory=dict)
    local: dict[int, WorkerLocal] = field(default_factory=dict)
    rounds: int = 0
    epochs: int = 0
    epoch: EpochProgress = field(default_factory=EpochProgress)
    history: dict[str, list[float]] = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    # ---- snapshot ------------------------------------------------------------------------------

    def snapshot(self, sliced: dict | None = None) -> tuple[bytes, dict]:
        """The whole state as ``(Arrow IPC bytes, JSON-able metadata)``; see :meth:`restore`.

        The bytes hold every array (named ``group/.../index``), the metadata the identity, the
        position, the history and the counters, and how the arrays regroup. Nothing is pickled.
        ``sliced``: the master and the mode's state were written by the slices' owners (backend
        ``sharded``): this manifest of their files goes into the metadata instead of their arrays.
        """
        from sparkdl.serialization.arrow_codec import encode_arrays

        names: list[str] = []
        arrays: list[np.ndarray] = []
        layout: dict[str, int | None] = {}

        def put(group: str, values) -> None:
            layout[group] = None if values is None else len(values)
            for i, value in enumerate(values or []):
                names.append(f"{group}/{i}")
                arrays.append(np.asarray(value))

        if sliced is None:
            put("master.w", self.master.weights)
            put("master.o", self.master.optimizer)
            for key in sorted(self.mode):
                put(f"mode.{key}", self.mode[key])
        for partition in sorted(self.local):
            local = self.local[partition]
            put(f"local.{partition}.r", local.residual)
            put(f"local.{partition}.o", local.optimizer)
        put("epoch.sums", self.epoch.sums)
        meta = {
            "format": SNAPSHOT_FORMAT,
            "identity": self.identity,
            "layout": layout,
            "mode_keys": [] if sliced is not None else sorted(self.mode),
            **({"sliced": sliced} if sliced is not None else {}),
            "local_versions": {str(p): self.local[p].version for p in sorted(self.local)},
            "rounds": self.rounds,
            "epochs": self.epochs,
            "epoch": {"rows": self.epoch.rows, "dropped": self.epoch.dropped, "nbytes": self.epoch.nbytes, "expected": self.epoch.expected},
            "history": self.history,
            "info": self.info,
        }
        json.dumps(meta)  # fails here, not in a writer, when something is not JSON
        return encode_arrays(arrays, names), copy.deepcopy(meta)

    @classmethod
    def restore(cls, payload: bytes, meta: dict, expected_identity: dict | None = None, sliced=None) -> FitState:
        """The state :meth:`snapshot` wrote, bit for bit.

        Args:
            payload: the snapshot's Arrow IPC bytes.
            meta: its metadata (a dict, as :meth:`snapshot` returned it or read back from JSON).
            expected_identity: the identity of the fit that restores it; the snapshot's must equal it.
            sliced: for a snapshot whose master the slices' owners wrote (``meta["sliced"]``):
                ``sliced(manifest) -> (master, mode)``, the master and mode state to restore.

        Raises:
            ConfigError: the snapshot belongs to another model, mode, schedule or data (the first
                difference is named), or is of another snapshot format.
            CodecError: the bytes are not a snapshot's arrays, or do not match its metadata.
        """
        from sparkdl.serialization.arrow_codec import decode_arrays

        if not isinstance(meta, dict) or meta.get("format") != SNAPSHOT_FORMAT:
            raise ConfigError(f"a fit state snapshot must be of format {SNAPSHOT_FORMAT}. Received: "
                              f"{meta.get('format') if isinstance(meta, dict) else type(meta).__name__!r}")
        if expected_identity is not None:
            check_identity(meta["identity"], expected_identity)
        decoded = decode_arrays(payload)
        by_name = dict(zip(decoded.names, decoded.arrays, strict=True))

        def take(group: str):
            count = meta["layout"].get(group, None)
            if count is None:
                return None
            try:
                return [by_name.pop(f"{group}/{i}") for i in range(count)]
            except KeyError as exc:
                raise CodecError(f"a fit state snapshot must hold every array its metadata lists. Received: no {exc}") from None

        if "sliced" in meta:
            if sliced is None:
                raise ConfigError("a snapshot whose slices its owners wrote needs a reader of those slices. Received: none")
            master, mode = sliced(meta["sliced"])
        else:
            master, mode = ModelState(take("master.w"), take("master.o")), {key: take(f"mode.{key}") for key in meta["mode_keys"]}
        state = cls(
            identity=meta["identity"],
            master=master,
            mode=mode,
            local={int(p): WorkerLocal(int(v), take(f"local.{p}.r"), take(f"local.{p}.o")) for p, v in meta["local_versions"].items()},
            rounds=int(meta["rounds"]),
            epochs=int(meta["epochs"]),
            epoch=EpochProgress(take("epoch.sums"), **{k: int(v) for k, v in meta["epoch"].items()}),
            history={k: [float(x) for x in v] for k, v in meta["history"].items()},
            info=copy.deepcopy(meta["info"]),
        )
        if by_name:
            raise CodecError(f"a fit state snapshot must hold only the arrays its metadata lists. Received: also {sorted(by_name)[:5]}")
        return state


def check_identity(found: dict, expected: dict, path: str = "") -> None:
    """Raise :class:`ConfigError` naming the first key where a snapshot's identity ``found``
    differs from the fit's ``expected`` (nested dicts are compared key by key)."""
    for key in sorted(set(found) | set(expected)):
        where = f"{path}.{key}" if path else key
        if key not in found or key not in expected:
            raise ConfigError(f"a checkpoint must belong to this fit. Received: a checkpoint "
                              f"{'without' if key not in found else 'with'} {where!r}, which this fit "
                              f"{'has' if key in expected else 'has not'}")
        a, b = found[key], expected[key]
        if isinstance(a, dict) and isinstance(b, dict):
            check_identity(a, b, where)
        elif _jsonable(a) != _jsonable(b):
            raise ConfigError(f"a checkpoint must belong to this fit: its {where} must equal this fit's. "
                              f"Received: {_short(a)} in the checkpoint, {_short(b)} in this fit "
                              "(delete the checkpoint, or fit the model, mode and data it was written for)")


def _jsonable(value):
    return json.loads(json.dumps(value))


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 160 else text[:157] + "..."
