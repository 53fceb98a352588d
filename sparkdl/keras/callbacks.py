"""Keras callbacks run on the Spark driver during a distributed fit.

The driver holds the master weights; the workers hold replicas. Callbacks given to
``KerasEstimator(callbacks=[...])`` run once, on the driver, against a compiled ``keras.Model``
whose weights (and optimizer state, when the fit has one) are the master's, with the global
metrics of the fit (summed over every worker, ``val_*`` included), in Keras' order of hooks:

- ``on_train_begin``; per epoch ``on_epoch_begin(epoch)``;
- ``on_train_batch_begin``/``on_train_batch_end(round, logs)`` once per *round* (``round`` counts
  the epoch's rounds from 0, as Keras counts batches; ``logs``: the epoch's running training
  metrics over the rounds so far, and ``learning_rate``);
- ``on_epoch_end(epoch, logs)`` with the epoch's training metrics and ``val_*``; the master weights
  are in ``self.model`` before it runs;
- ``on_train_end(logs)``.

Decisions are made once, so every worker follows them (the failure of per-rank callbacks in
Horovod, case C17): ``self.model.stop_training = True`` ends the fit after the current round (the
same round for every worker; from ``on_epoch_end``, after the epoch); a learning rate a callback
sets on ``self.model.optimizer`` (``ReduceLROnPlateau``, ``LearningRateScheduler``) reaches every
replica from the next round; weights or optimizer variables a callback sets become the master
from the next round, as in Keras (``EarlyStopping(restore_best_weights=True)`` at
``on_train_end``: the fitted model's). ``keras.callbacks.BackupAndRestore`` keeps working as in
Keras, and each of its saves also writes the fit's whole state next to its own files, so a
resumed fit continues exactly (see :mod:`sparkdl.spark.training.checkpoint`). The callbacks are
never pickled: they stay on the driver and out of saved Params. Pure Keras: no Spark here.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from contextlib import contextmanager

import keras
import numpy as np

from sparkdl.core.state import ModelState
from sparkdl.errors import ConfigError


def check_callbacks(callbacks) -> list:
    """The callbacks as a list of ``keras.callbacks.Callback`` (``None`` -> ``[]``).

    Raises:
        ConfigError: when ``callbacks`` is not a list or tuple of ``keras.callbacks.Callback`` objects,
            naming the position and type of the first one that is not.
    """
    if callbacks is None:
        return []
    if isinstance(callbacks, keras.callbacks.Callback):
        callbacks = [callbacks]
    if not isinstance(callbacks, (list, tuple)):
        raise ConfigError(f"callbacks must be a list of keras.callbacks.Callback objects. Received: {type(callbacks).__name__}")
    for i, callback in enumerate(callbacks):
        if not isinstance(callback, keras.callbacks.Callback):
            raise ConfigError(
                f"callbacks must be keras.callbacks.Callback objects. Received: {type(callback).__name__} at position {i}"
            )
    return list(callbacks)


_IN_USE: set[int] = set()  # ids of the callback objects of the fits running in this driver
_IN_USE_LOCK = threading.Lock()


@contextmanager
def exclusive(callbacks):
    """Hold ``callbacks`` for one fit: a callback object keeps per-fit state (its model, the best
    value, open files), so two fits running at once cannot share it.

    Raises:
        ConfigError: when another fit running now holds one of them (``CrossValidator`` or
            ``TrainValidationSplit`` with ``parallelism`` > 1, or two threads), naming it.
    """
    ids = {id(c): type(c).__name__ for c in callbacks or []}
    with _IN_USE_LOCK:
        busy = sorted(name for key, name in ids.items() if key in _IN_USE)
        if busy:
            raise ConfigError(
                "a Keras callback object can serve one fit at a time: it keeps that fit's state (its model, the best "
                f"value, open files). Received: {busy} already in a fit running now (CrossValidator or TrainValidationSplit "
                "with parallelism > 1, or another thread); use parallelism=1 or give each fit its own callbacks"
            )
        _IN_USE.update(ids)
    try:
        yield
    finally:
        with _IN_USE_LOCK:
            _IN_USE.difference_update(ids)


def _learning_rate_variable(optimizer):
    """The optimizer's ``learning_rate`` variable, or None when it follows a schedule."""
    if isinstance(getattr(optimizer, "_learning_rate", None), keras.optimizers.schedules.LearningRateSchedule):
        return None
    for variable in optimizer.variables:
        if variable.path.rsplit("/", 1)[-1] == "learning_rate":
            return variable
    return None


_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


def _overrides_batch_hooks(callback) -> bool:
    return any(getattr(type(callback), name) is not getattr(keras.callbacks.Callback, name) for name in _BATCH_HOOKS)


class DriverCallbacks:
    """The fit's Keras callbacks on the driver (see the module docstring).

    Args:
        callbacks: ``keras.callbacks.Callback`` objects, run in order.
        model: the driver's compiled ``keras.Model`` of the fit's architecture (its optimizer is
            built here); the callbacks' ``self.model``.
        epochs: the fit's epochs.
        rounds_per_epoch: rounds in one epoch (Keras' ``steps``).
    """

    def __init__(self, callbacks: Sequence, model, epochs: int, rounds_per_epoch: int) -> None:
        self.model = model
        # Whether any callback uses the round hooks: the running metrics are read for them only.
        self.wants_rounds = any(getattr(c, "wants_rounds", True) and _overrides_batch_hooks(c) for c in callbacks)
        # Whether any callback may read or set the model's weights (the progress display and the trackers do not):
        # the master is put into the model at each epoch's end for them only (on backend sharded, read from the slices).
        self.needs_weights = any(getattr(c, "needs_weights", True) for c in callbacks)
        if self.needs_weights and not model.optimizer.built:  # its variables take the master's optimizer state
            model.optimizer.build(model.trainable_variables)
        model.stop_training = False
        self._callbacks = keras.callbacks.CallbackList(
            list(callbacks), add_history=False, add_progbar=False, model=model, epochs=epochs, steps=rounds_per_epoch, verbose=0,
        )
        self._optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
        self._lr = _learning_rate_variable(self._optimizer)
        variables = list(self._optimizer.variables)
        self._lr_index = next((i for i, v in enumerate(variables) if v is self._lr), None)
        self._sent_lr = self.current_learning_rate()
        self.learning_rate: float | None = None  # set once a callback changes it: every later round gets it
        self._set_weights: list | None = None
        self._set_optimizer: list | None = None
        self.backups = [c for c in callbacks if isinstance(c, keras.callbacks.BackupAndRestore)]

    # ---- the master state in the driver model ------------------------------------------------

    def set_master(self, state: ModelState) -> None:
        """Put the master weights (and optimizer state, when it has one of this optimizer's
        variables) into the callbacks' model; the learning rate a callback set is kept."""
        self.model.set_weights(state.weights)
        variables = list(self._optimizer.variables)
        if state.optimizer is not None and len(state.optimizer) == len(variables):
            for i, (variable, array) in enumerate(zip(variables, state.optimizer, strict=True)):
                if i != self._lr_index:
                    variable.assign(np.asarray(array).astype(variable.dtype))
        self._set_weights = [np.array(w) for w in self.model.get_weights()]
        self._set_optimizer = self._optimizer_arrays()

    def _optimizer_arrays(self) -> list[np.ndarray]:
        return [np.array(v.numpy()) for i, v in enumerate(self._optimizer.variables) if i != self._lr_index]

    def master_state(self) -> ModelState:
        """The driver model's weights and optimizer state, as a master state (after a resume)."""
        return ModelState([np.asarray(w) for w in self.model.get_weights()],
                          [np.asarray(v.numpy()) for v in self._optimizer.variables])

    def initial_epoch(self) -> int:
        """The epoch a ``BackupAndRestore`` callback restored the model at (0: none)."""
        return int(getattr(self.model, "_initial_epoch", 0) or 0)

    def changed_state(self) -> ModelState | None:
        """The driver model's weights and optimizer state when a callback changed either since
        :meth:`set_master` (``EarlyStopping(restore_best_weights=True)``, a callback that sets
        weights or an optimizer variable), else None. A learning rate a callback set is followed
        apart (:attr:`learning_rate`) and does not count as a change here."""
        if self._set_weights is None:
            return None
        # variable by variable: the driver holds one variable's value at a time, not a copy of the whole state
        weights = self.model.weights
        same = len(weights) == len(self._set_weights) and all(
            np.array_equal(np.asarray(v.numpy()), b) for v, b in zip(weights, self._set_weights, strict=True))
        optimizer = (v for i, v in enumerate(self._optimizer.variables) if i != self._lr_index)
        same = same and all(np.array_equal(np.asarray(v.numpy()), b) for v, b in zip(optimizer, self._set_optimizer, strict=True))
        return None if same else self.master_state()

    def backup_dirs(self) -> list[str]:
        """The folders of the ``BackupAndRestore`` callbacks."""
        return [str(c.backup_dir) for c in self.backups]

    def backup_due(self, round_in_epoch: int, epoch_end: bool) -> bool:
        """Whether a ``BackupAndRestore`` saves at the end of this round (``round_in_epoch``, and
        whether it ends the epoch), by Keras' own rule for its ``save_freq``."""
        for callback in self.backups:
            if callback.save_freq == "epoch":
                if epoch_end:
                    return True
                continue
            last = callback._last_batch_seen
            seen = callback._batches_seen_since_last_saving + (round_in_epoch + 1 if round_in_epoch <= last else round_in_epoch - last)
            if seen >= callback.save_freq:
                return True
        return False

    def on_backup(self, save) -> None:
        """Call ``save(backup_dir)`` right after each save of every ``BackupAndRestore`` callback
        (at its epoch end or every ``save_freq`` rounds), in its place among the callbacks."""
        for callback in self.backups:
            original = callback._save_model

            def saved(*args, _original=original, _dir=callback.backup_dir, **kwargs):
                _original(*args, **kwargs)
                save(_dir)

            callback._save_model = saved

    # ---- learning rate -----------------------------------------------------------------------

    def current_learning_rate(self) -> float | None:
        """The driver optimizer's learning rate (None with a schedule)."""
        return None if self._lr is None else float(np.asarray(self._lr.numpy()))

    def _follow_learning_rate(self) -> None:
        now = self.current_learning_rate()
        if now is None or now == self._sent_lr:
            return
        if not math.isfinite(now) or now < 0:
            raise ConfigError(f"a callback set the learning rate to {now!r}; it must be a finite number >= 0")
        self.learning_rate = self._sent_lr = now

    def master_learning_rate(self, state: ModelState) -> float | None:
        """The learning rate held in ``state``'s optimizer state (the replicas' own, averaged), or None."""
        if state.optimizer is None or self._lr_index is None or self._lr_index >= len(state.optimizer):
            return None
        return float(np.asarray(state.optimizer[self._lr_index]))

    # ---- hooks -------------------------------------------------------------------------------

    @property
    def stop_training(self) -> bool:
        return bool(getattr(self.model, "stop_training", False))

    def train_begin(self, state: ModelState) -> None:
        if self.needs_weights:  # no callback reads the model's weights: the driver keeps no copy of them
            self.set_master(state)
        self._callbacks.on_train_begin({})
        self._follow_learning_rate()

    def epoch_begin(self, epoch: int) -> None:
        self._callbacks.on_epoch_begin(epoch, {})
        self._follow_learning_rate()

    def round_begin(self, round_in_epoch: int) -> None:
        self._callbacks.on_train_batch_begin(round_in_epoch, {})
        self._follow_learning_rate()

    def round_end(self, round_in_epoch: int, logs: dict) -> None:
        logs = dict(logs)
        lr = self.current_learning_rate()
        if lr is not None:
            logs.setdefault("learning_rate", lr)
        self._callbacks.on_train_batch_end(round_in_epoch, logs)
        flush = getattr(self._callbacks, "_flush_futures", None)  # async-safe callbacks: their decisions are in before the next round
        if flush is not None:
            flush()
        self._follow_learning_rate()

    def epoch_end(self, epoch: int, logs: dict, state: ModelState) -> dict:
        """Run ``on_epoch_end`` with the master state in the model; returns the logs, with the keys
        callbacks added (``ReduceLROnPlateau`` adds ``learning_rate``)."""
        if self.needs_weights:
            self.set_master(state)
        logs = dict(logs)
        flush = getattr(self._callbacks, "_flush_futures", None)
        if flush is not None and getattr(self._callbacks, "_async_train", False):
            flush()
        for callback in self._callbacks.callbacks:  # one dict, as keras.Model.fit hands it on: History sees what callbacks add
            callback.on_epoch_end(epoch, logs)
        self._follow_learning_rate()
        return logs

    def train_end(self, logs: dict) -> None:
        self._callbacks.on_train_end(dict(logs))


def abort_all(callbacks) -> None:
    """The fit failed: let each callback that can (``abort``: the progress display, TensorBoard,
    MLflow) stop its display, close its files, end its run; an error there is not raised over the fit's."""
    for callback in callbacks:
        hook = getattr(callback, "abort", None)
        if hook is not None:
            try:
                hook()
            except Exception:  # noqa: BLE001 - the fit's own error is the one to see
                pass


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """``keras.callbacks.ModelCheckpoint`` that also writes to any URI ``pyarrow.fs`` writes
    (``hdfs://``, ``s3://``, ``gs://``, ``abfs://``, ``file://``): each checkpoint is saved to a
    local staging folder, copied with ``pyarrow.fs.copy_files`` to the URI's folder and removed.
    A plain local path behaves exactly as Keras'. The file name keeps Keras' template
    (``"hdfs://nn/ckpt/model-{epoch:02d}.keras"``); every other argument is Keras'. Used as a
    driver callback (``KerasEstimator(callbacks=[...])``), it saves the master model.

    Raises:
        ConfigError: a URI whose scheme ``pyarrow.fs`` cannot open (naming it).
        OSError: a copy that fails (from pyarrow).
    """

    def __init__(self, filepath, **kwargs) -> None:
        import os
        import tempfile
        import uuid

        self.uri = os.fspath(filepath)
        self._fs = self._folder = self._staging = None
        local = self.uri
        if "://" in self.uri:
            import pyarrow.fs

            folder, name = self.uri.rsplit("/", 1)
            try:
                self._fs, self._folder = pyarrow.fs.FileSystem.from_uri(folder)
            except (ValueError, OSError) as exc:  # ArrowInvalid is a ValueError
                raise ConfigError(f"ModelCheckpoint needs a local path or a URI pyarrow.fs can open. Received: {self.uri!r} ({exc})") from exc
            self._staging = os.path.join(tempfile.gettempdir(), f"sparkdl-checkpoint-{uuid.uuid4().hex}")
            local = os.path.join(self._staging, name)
        super().__init__(local, **kwargs)

    def _save_model(self, epoch, batch, logs):
        import os

        import pyarrow.fs

        import shutil

        super()._save_model(epoch, batch, logs)
        if self._fs is None or not os.path.isdir(self._staging):
            return
        try:
            for name in sorted(os.listdir(self._staging)):
                self._fs.create_dir(self._folder, recursive=True)
                pyarrow.fs.copy_files(os.path.join(self._staging, name), f"{self._folder}/{name}", destination_filesystem=self._fs)
        finally:
            shutil.rmtree(self._staging, ignore_errors=True)  # Keras makes the folder again for the next save
