"""Snapshots of a fit's whole state (:class:`~sparkdl.core.state.FitState`), and resuming from them.

Two kinds of folders hold them, written the same way (:class:`FitStateStore`):

- ``checkpointDir`` (any Hadoop path, or a local one): a snapshot at every epoch's end and, with
  ``checkpointEvery`` = n, after every n-th round (asynchronous modes: at epoch ends only). A new
  ``fit`` of the same estimator with the same folder (a job run again after its driver was killed)
  continues from the latest complete snapshot. The last ``keep`` snapshots are kept; the folder
  stays after the fit (a fit that finished resumes as finished: it returns at once).
- a ``keras.callbacks.BackupAndRestore``'s ``backup_dir``: each save of the callback (its epoch
  end, or every ``save_freq`` rounds) also writes the fit's state into ``<backup_dir>/sparkdl-fit-state``;
  the callback deletes the folder when the fit ends well, as in Keras.

Each snapshot is ``snapshot-<round>.arrow`` (the arrays, Arrow IPC), ``snapshot-<round>.json``
(everything else) and, written last, ``snapshot-<round>.done`` holding the SHA-256 of the first
two: a snapshot without its marker, or whose bytes do not match it, is ignored (a driver killed
mid-write). Such a driver also left the bytes in a driver-local temporary folder; a store removes
those of processes that are gone (:func:`~sparkdl.spark.persistence.remove_scratch_leftovers`). A snapshot of another model, mode, schedule or data is refused, naming the
difference (:func:`~sparkdl.core.state.check_identity`).

Workers' own state (1bit/threshold residuals, the optimizer states they keep) is collected into
the fit's state in the rounds a snapshot follows (:meth:`Snapshots.collects`).

Backend ``sharded``: the driver never holds the state, so each slice's owner writes its slice
(master and mode pieces) next to the snapshot, ``snapshot-<round>.slice-<j>-of-<N>.arrow``, and
the snapshot's JSON holds their manifest (layout, files, SHA-256 of each) instead of the arrays;
the marker, written last, covers the manifest. A sharded fit resumes with each owner reading its
own file (:class:`SlicedCheckpoint`); another backend reads and assembles them on the driver.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import warnings
from dataclasses import dataclass

from sparkdl.core.piece_codec import PIECEWISE
from sparkdl.core.state import FitState
from sparkdl.errors import ConfigError
from sparkdl.spark import persistence
from sparkdl.spark.training.contract import SlicedMaster

log = logging.getLogger("sparkdl")
BACKUP_FOLDER = "sparkdl-fit-state"


def fit_identity(job, policy) -> dict:
    """What a fit's snapshots must match to be resumed by it (JSON): the model's weights (shapes and
    dtypes, in order; not the names Keras numbers per model instance) and its optimizer's class, the
    mode and its settings (the mode class's :meth:`~sparkdl.core.modes.base.Mode.identity`), the
    schedule (batch size, τ, seed, shuffling, partitioning), the compression, the straggler setting
    and the data's rows per partition. Not the epochs (a resumed fit may train longer) nor the
    backend (a snapshot of one transport resumes on the other)."""
    from sparkdl.serialization.arrow_codec import decode_arrays

    config = job.config
    weights = decode_arrays(job.spec.weights, copy=False)
    return {
        "model": {"weights": [[list(a.shape), a.dtype.str] for a in weights.arrays], "optimizer": job.compile_spec.optimizer_kind()},
        "mode": policy.identity(),
        "schedule": {"batch_size": config.batch_size, "local_steps": config.local_steps, "seed": config.seed,
                     "shuffle": config.shuffle, "keep_partitioning": config.keep_partitioning},
        "compression": {"method": config.compression,
                        "threshold": config.compression_threshold if config.compression == "threshold" else None},
        "keep_local_optimizer": bool(config.keep_local_optimizer or policy.local_optimizer or config.compression in PIECEWISE),
        "overlap": bool(config.overlap),
        "min_workers_per_round": config.min_workers(job.workers),
        "data": {"partition_rows": [int(n) for n in job.plan.partition_rows]},
    }


class SlicedCheckpoint:
    """The master of a snapshot whose slices their owners wrote: the ``manifest``
    (``{"version", "layout", "uris", "sha256", "bytes"}``), and the arrays read from the files and
    assembled on the driver only when read (:attr:`weights`, :attr:`optimizer`, :meth:`mode`)."""

    def __init__(self, manifest: dict) -> None:
        self.manifest = manifest
        self._loaded = None

    def load(self):
        """``(master, mode)`` assembled from the slice files (one copy on the driver).

        Raises:
            CodecError: a file whose bytes do not match the manifest's SHA-256.
        """
        if self._loaded is None:
            self._loaded = load_sliced(self.manifest)
        return self._loaded

    @property
    def weights(self):
        return self.load()[0].weights

    @property
    def optimizer(self):
        return self.load()[0].optimizer


def load_sliced(manifest: dict):
    """``(master ModelState, mode state)`` from a sharded snapshot's slice files (pyarrow.fs)."""
    from sparkdl.core.slices import SliceLayout, assemble_mode
    from sparkdl.server.slices import read_slice

    layout = SliceLayout.from_json(manifest["layout"])
    parts = [read_slice(uri, digest) for uri, digest in zip(manifest["uris"], manifest["sha256"], strict=True)]
    master = layout.assemble([p.master for p in parts])
    return master, assemble_mode(layout, [p.mode for p in parts])


def _join(folder: str, name: str) -> str:
    return posixpath.join(folder.rstrip("/"), name) if "://" in folder or folder.startswith("/") else f"{folder.rstrip('/')}/{name}"


class FitStateStore:
    """Fit-state snapshots in one folder (see the module docstring).

    Args:
        spark: the session whose filesystem reaches ``folder`` (Hadoop through the driver's JVM,
            or pyarrow.fs on Spark Connect: :mod:`sparkdl.spark.persistence`).
        folder: a local path or any Hadoop URI.
        keep: complete snapshots kept (the older ones are deleted after each save).
    """

    def __init__(self, spark, folder: str, keep: int = 2, keep_sliced: bool = False) -> None:
        self.spark, self.folder, self.keep, self.keep_sliced = spark, folder, keep, keep_sliced
        # Snapshots go up through a driver-local temporary file: a driver killed mid-write left one
        # (the whole state's bytes) that nothing else removes. The run that resumes does.
        removed = persistence.remove_scratch_leftovers()
        if removed:
            log.info("removed %d temporary folders of killed drivers: %s", len(removed), ", ".join(removed))

    def _names(self) -> list[str]:
        """The snapshots with a marker, oldest first."""
        names = persistence.listing(self.folder, self.spark)
        return sorted(name[: -len(".done")] for name in names if name.startswith("snapshot-") and name.endswith(".done"))

    def save(self, fit: FitState) -> str:
        """Write ``fit`` as a new snapshot (data first, then its marker); returns its name."""
        name = f"snapshot-{fit.rounds:09d}-{fit.epochs:06d}"
        # a master that lives in its owners' slices: each owner writes its own
        sliced = fit.master.write_slices(persistence.qualify(self.folder, self.spark), name) if isinstance(fit.master, SlicedMaster) else None
        payload, meta = fit.snapshot(sliced=sliced)
        text = json.dumps(meta, sort_keys=True).encode()
        persistence.write_bytes(_join(self.folder, f"{name}.arrow"), payload, self.spark)
        persistence.write_bytes(_join(self.folder, f"{name}.json"), text, self.spark)
        digest = hashlib.sha256(payload + text).hexdigest()
        persistence.write_bytes(_join(self.folder, f"{name}.done"), digest.encode(), self.spark)
        old_names = self._names()[: -self.keep]
        if old_names:
            listed = persistence.listing(self.folder, self.spark)
            for old in old_names:
                for suffix in (".done", ".arrow", ".json"):
                    persistence.delete(_join(self.folder, old + suffix), self.spark)
                for entry in listed:
                    if entry.startswith(old + ".slice-"):
                        persistence.delete(_join(self.folder, entry), self.spark)
        return name

    def latest(self, identity: dict) -> FitState | None:
        """The newest complete snapshot, restored and checked against ``identity``; None when the
        folder holds none.

        Raises:
            ConfigError: the snapshot belongs to another fit (the difference named).
        """
        for name in reversed(self._names()):
            payload = persistence.read_bytes(_join(self.folder, f"{name}.arrow"), self.spark)
            text = persistence.read_bytes(_join(self.folder, f"{name}.json"), self.spark)
            marker = persistence.read_bytes(_join(self.folder, f"{name}.done"), self.spark)
            if payload is None or text is None or marker is None or hashlib.sha256(payload + text).hexdigest() != marker.decode():
                log.warning("fit state snapshot %s in %s is incomplete: skipped", name, self.folder)
                continue
            reader = (lambda manifest: (SlicedCheckpoint(manifest), {})) if self.keep_sliced else load_sliced
            try:
                return FitState.restore(payload, json.loads(text), identity, sliced=reader)
            except ConfigError as exc:
                raise ConfigError(f"{exc} [snapshot {name} in {self.folder}]") from None
        return None


@dataclass(frozen=True)
class SnapshotSchedule:
    """After which rounds ``checkpointDir`` gets a snapshot: every ``every`` rounds (None: only
    epoch ends), and at every epoch's end."""

    every: int | None = None

    def due(self, index: int, epoch_end: bool) -> bool:
        """Whether a snapshot follows round ``index`` (0-based, the fit's count)."""
        return epoch_end or (self.every is not None and (index + 1) % self.every == 0)


class Snapshots:
    """A fit's snapshots: ``checkpointDir`` and ``BackupAndRestore`` backups.

    Args:
        spark: the fit's session.
        identity: the fit's identity (what a snapshot must match).
        checkpoint_dir: ``checkpointDir`` (None: no checkpoints).
        checkpoint_every: ``checkpointEvery`` (rounds; None: epoch ends only).
        keep: snapshots kept in ``checkpointDir``.
        epochs_only: snapshots only at epoch ends (the asynchronous modes, where an epoch's end
            is the one point every worker is at the same place).
        warn_inexact: resuming from a Keras backup without the fit's state loses the mode's
            state (every mode but plain ``sync``): say so.
        keep_sliced: the fit runs on backend ``sharded``: a snapshot its slices' owners wrote
            resumes with each owner reading its own file (:class:`SlicedCheckpoint`), not assembled here.
    """

    def __init__(self, spark, identity: dict, checkpoint_dir: str | None = None, checkpoint_every: int | None = None,
                 keep: int = 2, epochs_only: bool = False, warn_inexact: bool = False, keep_sliced: bool = False) -> None:
        self.spark, self.identity = spark, identity
        self.keep_sliced = keep_sliced
        self.store = FitStateStore(spark, checkpoint_dir, keep, keep_sliced) if checkpoint_dir else None
        self.schedule = SnapshotSchedule(None if epochs_only else checkpoint_every)
        self.epochs_only, self.warn_inexact = epochs_only, warn_inexact
        self.callbacks = None
        self.saved = 0

    @property
    def any(self) -> bool:
        """Whether this fit writes snapshots at all (``checkpointDir`` or a ``BackupAndRestore``)."""
        return self.store is not None or bool(self.callbacks is not None and self.callbacks.backups)

    def collects(self, index: int, round_in_epoch: int, epoch_end: bool) -> bool:
        """Whether round ``index`` (``round_in_epoch`` of its epoch) must bring the workers' own
        state: a snapshot follows it."""
        if self.store is not None and self.schedule.due(index, epoch_end) and (epoch_end or not self.epochs_only):
            return True
        return self.callbacks is not None and self.callbacks.backup_due(round_in_epoch, epoch_end)

    def resume(self, fit: FitState, callbacks, rounds_per_epoch: int) -> FitState:
        """The state to train from: the newest snapshot of ``checkpointDir``, else of a
        ``BackupAndRestore``'s folder, else Keras' own backup (weights and epoch only), else
        ``fit`` itself (with weights a callback set in ``on_train_begin``).

        Raises:
            ConfigError: a snapshot of another fit.
        """
        self.callbacks = callbacks
        stores = ([self.store] if self.store is not None else []) + [
            FitStateStore(self.spark, _join(d, BACKUP_FOLDER), keep_sliced=self.keep_sliced) for d in callbacks.backup_dirs()]
        for store in stores:
            restored = store.latest(self.identity)
            if restored is not None:
                restored.info = {**restored.info, "resumed_from_epoch": restored.epochs, "resumed_from_round": restored.rounds,
                                 "resumed_from": store.folder}
                if callbacks.needs_weights:
                    callbacks.set_master(restored.master)
                log.info("resuming the fit from %s: epoch %d, round %d", store.folder, restored.epochs, restored.rounds)
                return restored
        epoch = callbacks.initial_epoch()
        if epoch:  # a Keras backup without the fit's state (weights, optimizer, epoch): the mode's own state is lost
            if self.warn_inexact:
                warnings.warn("BackupAndRestore restored the weights and the epoch without the fit's own state (a backup "
                              "written by Keras alone): the mode's state (block momentum, worker models, residuals) starts "
                              "afresh, so this resumed fit is not equal to an uninterrupted one", stacklevel=3)
            fit.master = callbacks.master_state()
            fit.epochs, fit.rounds = epoch, epoch * rounds_per_epoch
            fit.info["resumed_from_epoch"] = epoch
            callbacks.set_master(fit.master)
            return fit
        changed = callbacks.changed_state()
        if changed is not None:
            fit.master = changed
            fit.info["weights_from_callbacks"] = True
            callbacks.set_master(fit.master)
        return fit

    def attach(self, loop, callbacks, fit: FitState) -> None:
        """Write the fit's state into each ``BackupAndRestore``'s folder whenever it saves."""

        def save(backup_dir: str) -> None:
            FitStateStore(self.spark, _join(backup_dir, BACKUP_FOLDER), keep=1, keep_sliced=self.keep_sliced).save(loop.pending_state(fit))
            self.saved += 1

        callbacks.on_backup(save)

    def after_round(self, fit: FitState, epoch_end: bool) -> None:
        """A round ended (not the epoch's last: that one's snapshot follows the epoch's end)."""
        if self.store is not None and not epoch_end and not self.epochs_only and self.schedule.due(fit.rounds - 1, False):
            self._save(fit)

    def after_epoch(self, fit: FitState) -> None:
        if self.store is not None:
            self._save(fit)

    def _save(self, fit: FitState) -> None:
        name = self.store.save(fit)
        self.saved += 1
        log.debug("fit state snapshot %s written to %s", name, self.store.folder)

    def finish(self, fit: FitState) -> None:
        """The fit ended: a fit a callback stopped inside an epoch keeps that final state as its
        newest snapshot (a run again returns it at once; the last epoch's snapshot already is)."""
        if self.store is not None and "stopped" in fit.info:
            self._save(fit)
