"""The driver's progress display of a fit, as a Keras callback (run by :class:`~sparkdl.keras.callbacks.DriverCallbacks`).

``verbose`` as Keras has it: 0 silent; 1 a live bar (rich) with the epoch, round, running loss
and metrics, samples per second and the time left, when stdout is a terminal or a notebook, and
one plain line per epoch otherwise (a log file, spark-submit's redirected stdout); 2 one plain
line per epoch. Every epoch line also goes to the ``sparkdl`` logger at DEBUG level.
"""

from __future__ import annotations

import logging
import sys
import time

import keras

log = logging.getLogger("sparkdl")


def epoch_line(epoch: int, epochs: int, seconds: float, rows: int, logs: dict) -> str:
    """``Epoch 3/5 - 4.2s - 1,905 samples/s - loss: 0.1234 - accuracy: 0.9650 - val_loss: ...``:
    ``loss`` first, then the other keys in History's (sorted) order; ``rows`` (rows trained in the
    epoch) over ``seconds`` (wall clock) is the samples/s."""
    names = sorted(logs, key=lambda name: (name != "loss", name))
    shown = " - ".join(f"{name}: {logs[name]:.4g}" if name == "learning_rate" else f"{name}: {logs[name]:.4f}" for name in names)
    rate = f" - {rows / seconds:,.0f} samples/s" if rows and seconds > 0 else ""
    return f"Epoch {epoch + 1}/{epochs} - {seconds:.1f}s{rate}" + (f" - {shown}" if shown else "")


class FitProgress(keras.callbacks.Callback):
    """Progress of one fit on the driver (see the module docstring).

    Args:
        verbose: 0, 1 or 2.
        rows_per_epoch: rows each epoch trains on (for samples/s and the round's rows).
        name: shown in front of the bar, e.g. ``"sparkdl fit 1a2b3c4d"``.
        file: where lines go (default ``sys.stdout`` at the time of the fit).
    """

    needs_weights = False  # reads the logs alone: the master need not be put into the model at epoch ends

    def __init__(self, verbose: int, rows_per_epoch: int, name: str = "sparkdl fit", file=None) -> None:
        super().__init__()
        self.verbose, self.rows_per_epoch, self.name = verbose, rows_per_epoch, name
        self._file = file
        self._progress = self._task = None
        self._epoch_started = self._started = 0.0
        self.lines: list[str] = []

    @property
    def wants_rounds(self) -> bool:
        """Only the live bar (verbose 1) shows rounds."""
        return self.verbose == 1

    def _console(self):
        from rich.console import Console

        return Console(file=self._file or sys.stdout, soft_wrap=True, highlight=False)

    def on_train_begin(self, logs=None):
        self._started = self._epoch_started = time.perf_counter()
        self.epochs, self.steps = self.params.get("epochs", 1), max(1, self.params.get("steps") or 1)
        if self.verbose != 1:
            return
        console = self._console()
        if not (console.is_terminal or console.is_jupyter):
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        # Narrow enough for 80 columns: "Epoch 2/8 ━━━━━━━━━━━━ 5/8 3,266 samples/s 0:00:04 loss: 0.1151 accuracy: 0.9653"
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=12), MofNCompleteColumn(), TextColumn("{task.fields[speed]}"),
            TimeRemainingColumn(), TextColumn("{task.fields[metrics]}"), console=console, transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task(f"Epoch 1/{self.epochs}", total=self.epochs * self.steps, speed="", metrics="")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_started = time.perf_counter()
        if self._progress is not None:
            self._progress.update(self._task, description=f"Epoch {epoch + 1}/{self.epochs}")

    def on_train_batch_end(self, batch, logs=None):
        if self._progress is None:
            return
        seconds = time.perf_counter() - self._epoch_started
        rows = self.rows_per_epoch * (batch + 1) / self.steps
        logs = {k: v for k, v in (logs or {}).items() if k != "learning_rate"}
        metrics = " ".join(f"{k}: {v:.4f}" for k, v in sorted(logs.items(), key=lambda kv: (kv[0] != "loss", kv[0]))[:3])
        self._progress.update(self._task, advance=1, speed=f"{rows / seconds:,.0f} samples/s" if seconds > 0 else "", metrics=metrics)

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._epoch_started if self._epoch_started else 0.0
        line = epoch_line(epoch, self.epochs, seconds, self.rows_per_epoch, logs or {})
        self._epoch_started = time.perf_counter()  # backend ps: epochs are reported as they complete, without begin hooks
        self.lines.append(line)
        log.debug(line)
        if self.verbose == 0:
            return
        if self._progress is not None:
            self._progress.update(self._task, completed=(epoch + 1) * self.steps)
            self._progress.console.print(line, markup=False)
        else:
            self._console().print(line, markup=False)

    def on_train_end(self, logs=None):
        self.abort()

    def abort(self) -> None:
        """Stop the live display (the fit ended, or failed)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
