"""MLflow tracking for a fit, on the Spark driver (named ``mlflow_run`` so it does not shadow ``mlflow``).

A fit logs to MLflow when :func:`mlflow_requested` says so (the estimator's ``mlflow`` Param:
True, False, or None = "when an MLflow run is active"). It then runs an :class:`MlflowLogger`
among its driver-side callbacks and hands it the fitted stage afterwards:

- Params: the fit's Params (``log_params``), as strings, keys sorted, values cut to MLflow's
  length limit (6000 characters in MLflow >= 2; 500 before).
- Metrics: the epoch's global metrics (training keys and ``val_*``), step = epoch index (0-based).
- Artifacts: the fitted ``KerasModel`` saved as a Spark ML stage under the run's ``model``
  artifact folder; ``sparkdl.KerasModel.load(<that folder, downloaded>)`` reloads it.

The run is the active one (``mlflow.active_run()``) when there is one; otherwise the logger starts
a run at the start of the fit and ends it after :meth:`MlflowLogger.log_model` (or
:meth:`MlflowLogger.end_run`). The tracking server is MLflow's own setting
(``MLFLOW_TRACKING_URI`` or ``mlflow.set_tracking_uri``). With ``mlflow-skinny`` (the ``mlflow``
extra) set one: its default ``sqlite:///mlflow.db`` store needs ``sqlalchemy`` and ``alembic``
(the full ``mlflow`` package), and a ``file:`` store needs ``MLFLOW_ALLOW_FILE_STORE=true`` in MLflow >= 3.7.
"""

from __future__ import annotations

import math
import pathlib
import shutil
import sys
import tempfile
import time
import warnings

import keras

from sparkdl.errors import ConfigError

_EXTRA_HINT = "install it with `pip install sparkdl-keras[mlflow]` (or `pip install mlflow-skinny`)"


def _import_mlflow():
    try:
        import mlflow
    except ImportError as exc:
        raise ConfigError(f"mlflow=True needs the mlflow package: {_EXTRA_HINT}. Received: no importable mlflow ({exc})") from exc
    return mlflow


def _max_param_length() -> int:
    try:
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
    except ImportError:  # pragma: no cover - moved in some MLflow release
        return 500
    return int(MAX_PARAM_VAL_LENGTH)


def mlflow_requested(flag: bool | None) -> bool:
    """Whether a fit logs to MLflow, from the estimator's ``mlflow`` Param.

    - ``True``: yes; raises :class:`~sparkdl.errors.ConfigError` naming the ``mlflow`` extra
      when mlflow is not installed.
    - ``False``: no.
    - ``None``: yes only when mlflow is importable and an MLflow run is active
      (``mlflow.active_run()`` is not None). When this process has not imported mlflow yet no run
      can be active, so the answer is False without importing it. Never starts a run.

    Raises:
        ConfigError: ``flag`` is True and mlflow is missing, or ``flag`` is not True/False/None.
    """
    if flag is True:
        _import_mlflow()
        return True
    if flag is False:
        return False
    if flag is not None:
        raise ConfigError(f"mlflow must be True, False or None (log when an MLflow run is active). Received: {flag!r}")
    if "mlflow" not in sys.modules:
        return False
    try:
        import mlflow
    except ImportError:  # pragma: no cover - a broken install: treat as absent
        return False
    return mlflow.active_run() is not None


class MlflowLogger(keras.callbacks.Callback):
    """Logs a fit's Params, per-epoch metrics and fitted model to an MLflow run.

    Hooks, as the estimator calls them on the driver:

    - ``on_train_begin``: takes the active MLflow run, or starts one (``run_name``) and remembers
      to end it; logs ``params`` (see the module doc). A param the active run already holds with
      another value (MLflow params cannot change, e.g. a second fit in the same run) is not
      logged again: a ``UserWarning`` names it.
    - ``on_epoch_end(epoch, logs)``: logs the finite real-number values of ``logs`` as metrics
      at step ``epoch``.
    - ``on_train_end``: nothing (the run stays open for :meth:`log_model`).
    - :meth:`log_model` (called by the estimator after the fit): the fitted stage as the
      ``model`` artifact folder; ends the run if this logger started it.
    - :meth:`end_run`: ends the run if this logger started it (``status="FAILED"`` when a fit
      stops with an error before :meth:`log_model`); idempotent.

    Every call names the run explicitly (``run_id``), so logging does not depend on which run
    is active in the calling thread. ``run_id`` is set from ``on_train_begin`` on.

    Args:
        params: the fit's Params, name -> value (any value; logged as ``str(value)``).
        run_name: the name of the run this logger starts when no run is active (None: MLflow's).

    Raises:
        ConfigError: mlflow is not installed (built), or the tracking store cannot start a run
            (``on_train_begin``; the message names the tracking URI).
    """

    needs_weights = False  # reads the logs alone: the master need not be put into the model at epoch ends

    def __init__(self, params: dict, run_name: str | None = None) -> None:
        super().__init__()
        self._mlflow = _import_mlflow()
        self.run_params = dict(params or {})
        self.run_name = run_name
        self.run_id: str | None = None
        self._started = False
        self._ended = False

    def _client(self):
        return self._mlflow.tracking.MlflowClient()

    # -- hooks --------------------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        """Start (or join) the run and log the params; a second call for the same fit does nothing
        (the estimator calls it before any Spark job, so that a bad tracking store fails first)."""
        if self.run_id is not None and not self._ended:
            return
        mlflow = self._mlflow
        active = mlflow.active_run()
        if active is None:
            try:
                active = mlflow.start_run(run_name=self.run_name)
            except mlflow.exceptions.MlflowException as exc:
                raise ConfigError(
                    "mlflow: could not start an MLflow run at the tracking URI; set one with MLFLOW_TRACKING_URI or "
                    "mlflow.set_tracking_uri (mlflow-skinny's default sqlite store needs sqlalchemy and alembic, a file: "
                    f"store MLFLOW_ALLOW_FILE_STORE=true). Received: {mlflow.get_tracking_uri()!r} ({exc})"
                ) from exc
            self._started, self._ended = True, False
        self.run_id = active.info.run_id
        self._log_params()

    def _log_params(self) -> None:
        from mlflow.entities import Param

        limit = _max_param_length()
        wanted = {str(key): str(value)[:limit] for key, value in self.run_params.items()}
        client = self._client()
        held = client.get_run(self.run_id).data.params
        clashes = sorted(key for key, value in wanted.items() if key in held and held[key] != value)
        if clashes:
            warnings.warn(
                f"MLflow run {self.run_id} already holds these params with other values, which MLflow cannot change; "
                f"they keep their old values (start a new or nested run per fit to log each): {clashes}",
                stacklevel=2,
            )
        todo = [Param(key, wanted[key]) for key in sorted(wanted) if key not in held]
        for start in range(0, len(todo), 100):  # MLflow's limit of params per batch
            client.log_batch(self.run_id, params=todo[start : start + 100])

    def on_epoch_end(self, epoch, logs=None):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = []
        for key in sorted(logs or {}):
            try:
                value = float(logs[key])
            except (TypeError, ValueError):
                continue
            if math.isfinite(value):
                metrics.append(Metric(str(key), value, now, int(epoch)))
        if metrics:
            self._client().log_batch(self.run_id, metrics=metrics)

    # -- after the fit ------------------------------------------------------------------------

    def log_model(self, stage) -> str:
        """Save ``stage`` (a fitted ``sparkdl.KerasModel``) as the run's ``model`` artifact folder.

        The stage is saved with ``stage.write().overwrite().save(...)`` into a local temporary
        folder (needs the active SparkSession; a ``file:`` URI, so the cluster's default
        filesystem is not involved), uploaded with ``log_artifacts(..., artifact_path="model")``
        and the folder deleted. Hadoop's ``.crc`` checksum files are left out. Ends the run when
        this logger started it.

        Returns:
            The artifact URI of the model folder (``<run artifact URI>/model``).

        Raises:
            ConfigError: called before ``on_train_begin`` (no run).
        """
        if self.run_id is None:
            raise ConfigError("MlflowLogger.log_model needs a run: call it after the fit. Received: no on_train_begin yet")
        client = self._client()
        folder = tempfile.mkdtemp(prefix="sparkdl-mlflow-")
        try:
            local = pathlib.Path(folder, "model")
            stage.write().overwrite().save(local.as_uri())
            for crc in local.rglob("*.crc"):
                crc.unlink()
            client.log_artifacts(self.run_id, str(local), artifact_path="model")
        except BaseException:
            self.end_run("FAILED")  # a run this logger started never stays active
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        uri = client.get_run(self.run_id).info.artifact_uri.rstrip("/") + "/model"
        self.end_run()
        return uri

    def abort(self) -> None:
        """The fit failed: end a run this logger started as ``FAILED``."""
        self.end_run("FAILED")

    def end_run(self, status: str = "FINISHED") -> None:
        """End the run if this logger started it and has not ended it yet (``status``: MLflow's
        ``FINISHED``, ``FAILED`` or ``KILLED``). A run that was active before the fit is left open."""
        if not self._started or self._ended or self.run_id is None:
            return
        mlflow = self._mlflow
        active = mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            mlflow.end_run(status=status)
        else:  # started in another thread, or a run was started on top of it: end it by id
            self._client().set_terminated(self.run_id, status=status)
        self._ended = True


__all__ = ["MlflowLogger", "mlflow_requested"]
