"""``KerasModel``: the fitted Spark ML Model that wraps a trained Keras model."""

from __future__ import annotations

from pyspark.ml import Model
from pyspark.sql import DataFrame

from sparkdl.errors import ConfigError
from sparkdl.spark.inference import transform
from sparkdl.spark.params import KerasSharedParams
from sparkdl.spark.persistence import KerasStageIO


class KerasModel(Model, KerasSharedParams, KerasStageIO):
    """A trained Keras model as a Spark ML Model (a Transformer).

    ``transform(df)`` runs batched inference on the executors and returns ``df`` with every
    input column kept, in the same rows and order, plus:

    - ``predictionCol`` (double): the class index for a classifier (argmax; ``p >= 0.5`` for a
      single sigmoid output), the output value for a regressor (``array<double>`` when the
      regressor has several outputs);
    - ``probabilityCol`` (``array<float>``, classifiers only): the class scores, shape
      ``(classes,)``; ``[1 - p, p]`` for a single sigmoid output.

    Features are read from ``featuresCol`` as in :class:`~sparkdl.spark.estimator.KerasEstimator`
    (numeric, ``array<numeric>`` or vector, ``prod(input_shape)`` values per row, cast to the
    model's input dtype) and predicted ``batchSize`` rows at a time.

    Attributes:
        history: per-epoch training metrics, as ``keras.callbacks.History.history``:
            ``{"loss": [0.41, 0.18], "accuracy": [0.87, 0.94]}``.
        fitInfo: ``{"rounds": int, "epoch_seconds": [...], "partition_rows": [...]}`` of the fit.

    Persistence: ``save(path)`` / ``KerasModel.load(path)``, JSON metadata plus ``model.keras``.
    """

    _requires_model = True

    def __init__(self) -> None:
        super().__init__()
        self._spec = None
        self.history: dict[str, list[float]] = {}
        self.fitInfo: dict = {}

    @classmethod
    def _from_fit(cls, spec, history: dict, fit_info: dict) -> KerasModel:
        model = cls()
        model._spec = spec
        model.history = history
        model.fitInfo = fit_info
        return model

    def getKerasModel(self):
        """A new ``keras.Model`` with the trained weights, compiled with the fit's optimizer, loss and metrics.

        Raises:
            ConfigError: when this KerasModel holds no model (built without fit or load).
        """
        if self._spec is None:
            raise ConfigError("KerasModel must come from fit() or load() to hold a Keras model. Received: an empty KerasModel")
        from sparkdl.keras.spec import CompileSpec

        model = self._spec.build()
        if self.isDefined(self.loss):
            CompileSpec(self.getOptimizer(), self.getLoss(), tuple(self.getMetrics())).compile(model)
        return model

    def _transform(self, dataset: DataFrame) -> DataFrame:
        if self._spec is None:
            raise ConfigError("KerasModel must come from fit() or load() before transform. Received: an empty KerasModel")
        from sparkdl.keras.spec import CompileSpec, infer_task

        compile_spec = CompileSpec(self.getOptimizer(), self.getLoss(), tuple(self.getMetrics())) if self.isDefined(self.loss) else None
        task = self.getTask()
        if task == "auto":
            task = infer_task(task, compile_spec) if compile_spec is not None else "regression"
        return transform(
            dataset, self._spec, self.getFeaturesCol(), self.getPredictionCol(), self.getProbabilityCol(), self.getBatchSize(),
            task, from_logits=compile_spec is not None and compile_spec.from_logits(),
        )

    def copy(self, extra=None) -> KerasModel:
        that = super().copy(extra)
        that.history = {k: list(v) for k, v in self.history.items()}
        that.fitInfo = dict(self.fitInfo)
        return that

    def _extra_metadata(self) -> dict:
        return {"history": self.history, "fitInfo": self.fitInfo}

    def _load_extra_metadata(self, metadata: dict) -> None:
        self.history = metadata.get("history", {})
        self.fitInfo = metadata.get("fitInfo", {})
