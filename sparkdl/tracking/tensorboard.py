"""TensorBoard event files for a fit, written on the Spark driver.

Layout (as Keras' own ``keras.callbacks.TensorBoard`` writes it, so ``tensorboard --logdir
<logDir>`` shows the two runs ``train`` and ``validation`` side by side)::

    <logDir>/train/events.out.tfevents.*       epoch_<metric>  one point per epoch, step = epoch index (0-based)
                                               round_<metric>  one point per training round, step = round index in the fit
                                               model_summary   text: the Keras model summary, step 0
    <logDir>/validation/events.out.tfevents.*  epoch_<metric>  the epoch's ``val_<metric>`` logs, without the ``val_`` prefix

Values are the floats the estimator hands to the callback hooks, in their own units (the loss
and metrics as Keras computes them; ``learning_rate`` as the optimizer's learning rate).
``round_<metric>`` are the epoch's running training metrics after that round (the average over
the rounds of the epoch so far, as Keras' per-batch logs are), plus ``round_learning_rate``.
An epoch whose logs carry no ``learning_rate`` gets ``epoch_learning_rate`` from the last
round's logs, as Keras' callback adds the optimizer's learning rate to each epoch.

The scalars are written with ``tf.summary.write`` and the TensorBoard scalar plugin's metadata
(what ``tf.summary.scalar`` writes), so the ``tensorboard`` package itself is not needed to
write them, only to view them. TensorFlow is imported when the logger is built; with
``KERAS_BACKEND=jax`` or ``torch`` it must be installed all the same.
"""

from __future__ import annotations

import logging
import os

import keras

from sparkdl.errors import ConfigError

_log = logging.getLogger(__name__)


def _import_tensorflow():
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise ConfigError(
            "logDir needs the tensorflow package to write TensorBoard event files: install it with "
            "`pip install tensorflow-cpu` (or sparkdl-keras[cpu]). Received: no importable tensorflow "
            f"({exc})"
        ) from exc
    return tf


def _as_float(value) -> float | None:
    """``value`` as a Python float, or None when it is not a real number (a string, an array)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class TensorBoardLogger(keras.callbacks.Callback):
    """Writes a fit's metrics as TensorBoard event files under ``log_dir`` (see the module doc).

    The estimator appends one to the fit's driver-side callbacks when ``logDir`` is set. Hooks:

    - ``on_train_begin``: opens the ``train`` writer and writes the model summary as text (step 0).
    - ``on_train_batch_end(round, logs)``: ``round_<metric>`` in ``train/`` at step ``epoch ·
      steps + round`` (``round`` counts the epoch's rounds, as Keras counts batches; the step is the
      round index in the fit), for every real-number value of ``logs``.
    - ``on_epoch_end(epoch, logs)``: ``epoch_<metric>`` at step ``epoch``: training keys in
      ``train/``, ``val_*`` keys in ``validation/`` without the prefix; then flushes both files.
    - ``on_train_end``: flushes and closes the writers (a later fit with the same logger opens
      new event files in the same folders).

    Values that are not real numbers are skipped; NaN and infinities are written as they are
    (TensorBoard shows them), so a diverging fit stays visible.

    Args:
        log_dir: the folder to write into: a local path, or a URI of a filesystem TensorFlow's
            ``tf.io.gfile`` writes (``gs://``; ``s3://`` and ``hdfs://`` with ``tensorflow-io``).
            Created if missing; existing event files are kept (TensorBoard merges them).
        write_rounds: write the per-round ``round_<metric>`` scalars (default True).
        write_model_summary: write the Keras model summary as a text summary (default True).

    Raises:
        ConfigError: when TensorFlow is not installed (``pip install tensorflow-cpu``), when
            ``log_dir`` is not a non-empty path, or (at ``on_train_begin``) when TensorFlow
            cannot create the folder or its event file.
    """

    needs_weights = False  # reads the logs alone: the master need not be put into the model at epoch ends

    def __init__(self, log_dir, write_rounds: bool = True, write_model_summary: bool = True) -> None:
        super().__init__()
        self._tf = _import_tensorflow()
        if not isinstance(log_dir, (str, os.PathLike)) or not os.fspath(log_dir):
            raise ConfigError(f"logDir must be a non-empty folder path or URI. Received: {log_dir!r}")
        self.log_dir = os.fspath(log_dir)
        self.train_dir = os.path.join(self.log_dir, "train")
        self.validation_dir = os.path.join(self.log_dir, "validation")
        self.write_rounds = bool(write_rounds)
        self.write_model_summary = bool(write_model_summary)
        self.needs_model = self.write_model_summary  # the model's summary (not its weights)
        self._writers: dict = {}
        self._last_learning_rate: float | None = None
        from tensorflow.core.framework import summary_pb2

        def plugin(name, data_class):
            return summary_pb2.SummaryMetadata(
                plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=name, content=b""), data_class=data_class
            ).SerializeToString()

        # What tensorboard.summary.v2.scalar and .text attach (plugin data version 0 serializes to b"").
        self._scalar_metadata = plugin("scalars", summary_pb2.DATA_CLASS_SCALAR)
        self._text_metadata = plugin("text", summary_pb2.DATA_CLASS_TENSOR)

    # -- writers ------------------------------------------------------------------------------

    def _writer(self, folder: str):
        writer = self._writers.get(folder)
        if writer is None:
            try:
                writer = self._tf.summary.create_file_writer(folder)
            except Exception as exc:  # tf.errors.* for unsupported schemes, permissions, a file in the way
                raise ConfigError(
                    "logDir must be a folder TensorFlow can create and write (a local path, or a URI tf.io.gfile "
                    f"supports). Received: {self.log_dir!r} ({type(exc).__name__}: {exc})"
                ) from exc
            self._writers[folder] = writer
        return writer

    def _write_scalars(self, folder: str, prefix: str, values: dict, step: int) -> None:
        if not values:
            return
        tf = self._tf
        with self._writer(folder).as_default():
            for name, value in values.items():
                tf.summary.write(
                    f"{prefix}{name}", tf.constant(value, tf.float32), step=int(step), metadata=self._scalar_metadata
                )

    @staticmethod
    def _split(logs) -> tuple[dict, dict]:
        """(training values, validation values without ``val_``), real numbers only, in key order."""
        train, val = {}, {}
        for key, value in (logs or {}).items():
            number = _as_float(value)
            if number is None:
                continue
            if key.startswith("val_"):
                val[key[4:]] = number
            else:
                train[key] = number
        return train, val

    def _close(self) -> None:
        for writer in self._writers.values():
            writer.flush()
            writer.close()
        self._writers = {}

    # -- hooks --------------------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._close()
        self._last_learning_rate = None
        writer = self._writer(self.train_dir)
        if self.write_model_summary and self.model is not None:
            lines: list[str] = []
            try:
                self.model.summary(print_fn=lambda text, line_break=True: lines.append(str(text)))
            except Exception as exc:  # an unbuilt or exotic model: the summary is optional
                _log.warning("TensorBoardLogger: no model summary written (%s: %s)", type(exc).__name__, exc)
                lines = []
            if lines:
                # Indented by four spaces: a Markdown code block, so TensorBoard keeps the table's columns.
                text = "\n".join("    " + line for line in "\n".join(lines).splitlines())
                tf = self._tf
                with writer.as_default():
                    tf.summary.write("model_summary", tf.constant(text), step=0, metadata=self._text_metadata)
                writer.flush()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        batch = getattr(self, "_epoch", 0) * max(1, int(self.params.get("steps") or 1)) + batch  # the round index in the fit
        train, val = self._split(logs)
        if "learning_rate" in train:
            self._last_learning_rate = train["learning_rate"]
        if self.write_rounds:
            self._write_scalars(self.train_dir, "round_", train, batch)
            self._write_scalars(self.validation_dir, "round_", val, batch)

    def on_epoch_end(self, epoch, logs=None):
        train, val = self._split(logs)
        if "learning_rate" not in train and self._last_learning_rate is not None:
            train["learning_rate"] = self._last_learning_rate
        self._write_scalars(self.train_dir, "epoch_", train, epoch)
        self._write_scalars(self.validation_dir, "epoch_", val, epoch)
        for writer in self._writers.values():
            writer.flush()

    def abort(self) -> None:
        """The fit failed: flush and close the event files."""
        self._close()

    def on_train_end(self, logs=None):
        self._close()
