"""Driver-side tracking of fits: TensorBoard event files and MLflow runs.

Both loggers are ``keras.callbacks.Callback`` objects that the estimator runs on the Spark
driver against a driver-side ``keras.Model`` holding the master weights:

- :class:`TensorBoardLogger` (``logDir``): event files under ``<logDir>/train`` and
  ``<logDir>/validation``, as Keras' own ``TensorBoard`` callback lays them out.
- :class:`MlflowLogger` (``mlflow``): the fit's Params, its per-epoch metrics and the fitted
  ``KerasModel`` as artifacts of an MLflow run; :func:`mlflow_requested` decides whether a fit logs.

TensorFlow and MLflow are imported only when a logger is built (or, for MLflow, when
:func:`mlflow_requested` must look for an active run), so importing this package is cheap.
"""

__all__ = ["MlflowLogger", "TensorBoardLogger", "mlflow_requested"]


def __getattr__(name):
    if name == "TensorBoardLogger":
        from sparkdl.tracking.tensorboard import TensorBoardLogger

        return TensorBoardLogger
    if name in ("MlflowLogger", "mlflow_requested"):
        from sparkdl.tracking import mlflow_run

        return getattr(mlflow_run, name)
    raise AttributeError(f"module 'sparkdl.tracking' has no attribute {name!r}")
