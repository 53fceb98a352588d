"""``KerasEstimator``: fit a Keras model on a Spark DataFrame with distributed training rounds."""

from __future__ import annotations

import uuid
import warnings

from pyspark import keyword_only
from pyspark.ml import Estimator
from pyspark.sql import DataFrame

from sparkdl.config import FitConfig
from sparkdl.core.modes import get_policy
from sparkdl.core.schedule import RoundPlan
from sparkdl.core.state import ModelState
from sparkdl.errors import ConfigError
from sparkdl.spark.backends import TrainJob, get_backend
from sparkdl.spark.data import prepare_training_data
from sparkdl.spark.model import KerasModel
from sparkdl.spark.params import KerasEstimatorParams
from sparkdl.spark.persistence import KerasStageIO


def _print_epoch(epochs: int):
    def report(epoch: int, metrics: dict, seconds: float) -> None:
        names = sorted(metrics, key=lambda name: (name != "loss", name))
        shown = " - ".join(f"{name}: {metrics[name]:.4f}" for name in names)
        print(f"Epoch {epoch + 1}/{epochs} - {seconds:.1f}s - {shown}", flush=True)

    return report


class KerasEstimator(Estimator, KerasEstimatorParams, KerasStageIO):
    """Spark ML Estimator that trains a Keras 3 model on a DataFrame across Spark executors.

    ``fit(df)`` runs ``numWorkers`` model replicas, one Spark task each, on ``numWorkers``
    partitions of ``df``. In mode ``sync`` (SparkNet model averaging; Moritz et al., ICLR 2016)
    every replica runs τ = ``localSteps`` local steps from the master weights, then the driver
    averages weights and optimizer state weighted by the rows each replica trained on. With
    ``localSteps=None`` a round is one pass over each partition, i.e. one round per epoch.
    ``numWorkers=1`` is exactly ``keras.Model.fit`` on the same batches.

    Args:
        model: a built ``keras.Model`` with one input and one output. It is kept as
            architecture JSON plus weights (Arrow IPC), never pickled. If it is compiled and
            ``optimizer``/``loss``/``metrics`` are not given, its compile arguments are used.
        optimizer: Keras optimizer as a name (``"adam"``), an object (``Adam(1e-3)``) or a config dict.
        loss: Keras loss as a name, an object, a function or a config dict.
        metrics: list of Keras metrics (names, objects or configs).
        featuresCol: input column: numeric, ``array<numeric>`` or an ml/mllib vector with
            ``prod(input_shape)`` values per row, e.g. 784 for an input of shape ``(28, 28, 1)``;
            cast to the model input's dtype (float32 by default).
        labelCol: label column: numeric (class index or value) or ``array<numeric>``/vector (one-hot).
        predictionCol: output column of the fitted model (double).
        probabilityCol: output column of class scores (``array<float>``, classifiers).
        numWorkers: replicas and partitions (default 2).
        epochs: passes over the data (default 1).
        batchSize: rows per local step and per inference batch (default 32).
        localSteps: τ, local steps between averaging rounds (default None: one pass per round).
        mode: ``"sync"``.
        shuffle: reshuffle each partition every epoch with a seeded permutation (default True).
        seed: seed of the shuffles and of random layers (default 0).
        verbose: 1 prints ``Epoch e/E - seconds - loss: ... - metric: ...`` per epoch; 0 is silent.
        roundTimeout: seconds a round may run before its jobs are cancelled (default 3600).
        task: ``"auto"``, ``"classification"`` or ``"regression"``, how ``transform`` reads outputs.

    Raises (from ``fit``, before any training job):
        ConfigError: a missing model or loss, or a Param out of range.
        SchemaError: a missing or mistyped column, nulls, a feature length that does not match
            the model input, or an empty DataFrame.

    Example:
        >>> est = KerasEstimator(model=model, optimizer="adam", loss="sparse_categorical_crossentropy",
        ...                      metrics=["accuracy"], featuresCol="pixels", labelCol="label",
        ...                      numWorkers=2, epochs=5, batchSize=64)
        >>> fitted = est.fit(train_df)
        >>> fitted.transform(test_df).select("label", "prediction").show()
    """

    @keyword_only
    def __init__(
        self,
        *,
        model=None,
        optimizer=None,
        loss=None,
        metrics=None,
        featuresCol="features",
        labelCol="label",
        predictionCol="prediction",
        probabilityCol="probability",
        numWorkers=2,
        epochs=1,
        batchSize=32,
        localSteps=None,
        mode="sync",
        shuffle=True,
        seed=0,
        verbose=1,
        roundTimeout=3600.0,
        task="auto",
    ) -> None:
        super().__init__()
        self._spec = None
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(
        self,
        *,
        model=None,
        optimizer=None,
        loss=None,
        metrics=None,
        featuresCol="features",
        labelCol="label",
        predictionCol="prediction",
        probabilityCol="probability",
        numWorkers=2,
        epochs=1,
        batchSize=32,
        localSteps=None,
        mode="sync",
        shuffle=True,
        seed=0,
        verbose=1,
        roundTimeout=3600.0,
        task="auto",
    ) -> KerasEstimator:
        """Set Params by keyword; ``model`` as in :meth:`setModel`. Returns ``self``."""
        kwargs = dict(self._input_kwargs)
        model = kwargs.pop("model", None)
        if model is not None:
            self.setModel(model)
            from sparkdl.keras.spec import compile_args_of

            for key, value in compile_args_of(model).items():
                if kwargs.get(key) is None and not self.isSet(getattr(self, key)):
                    kwargs[key] = value
        kwargs = {k: v for k, v in kwargs.items() if not (k in ("optimizer", "loss", "metrics") and v is None)}
        return self._set(**kwargs)

    def setModel(self, model) -> KerasEstimator:
        """Use ``model`` (a built ``keras.Model``): its architecture and current weights are the start point.

        Raises:
            ConfigError: when ``model`` is not a built single-input, single-output ``keras.Model``.
        """
        from sparkdl.keras.spec import ModelSpec

        self._spec = ModelSpec.from_model(model)
        return self

    def getKerasModel(self):
        """A new ``keras.Model`` with the estimator's initial weights (``None`` when no model was given)."""
        return None if self._spec is None else self._spec.build()

    def _fit_config(self) -> FitConfig:
        return FitConfig(
            num_workers=self.getNumWorkers(),
            epochs=self.getEpochs(),
            batch_size=self.getBatchSize(),
            local_steps=self.getLocalSteps(),
            mode=self.getMode(),
            seed=self.getSeed(),
            shuffle=self.getShuffle(),
            verbose=self.getVerbose(),
            round_timeout_s=self.getRoundTimeout(),
        )

    def _fit(self, dataset: DataFrame) -> KerasModel:
        from sparkdl.keras.spec import CompileSpec, infer_task

        config = self._fit_config()
        if self._spec is None:
            raise ConfigError("KerasEstimator needs a model: pass model=keras_model or call setModel(). Received: no model")
        if not self.isDefined(self.loss):
            raise ConfigError("KerasEstimator needs a loss (a name, a keras.losses.Loss or a config). Received: no loss")
        compile_spec = CompileSpec(self.getOptimizer(), self.getLoss(), tuple(self.getMetrics()))
        policy = get_policy(config.mode)
        backend = get_backend(config.backend)
        spark = dataset.sparkSession
        if spark.conf.get("spark.python.worker.reuse", "true").lower() != "true":
            warnings.warn("spark.python.worker.reuse is false: every task re-imports TensorFlow and rebuilds its replica", stacklevel=2)
        spec = self._spec
        task = infer_task(self.getTask(), compile_spec)
        if task == "classification" and len(spec.output_shape) != 1:
            raise ConfigError(
                f"a classifier must output shape (classes,) per row. Received: {spec.output_shape}; "
                "pass task='regression' to get the raw outputs"
            )
        data = prepare_training_data(
            dataset, self.getFeaturesCol(), self.getLabelCol(), spec.input_shape, spec.input_dtype, spec.output_shape,
            compile_spec.loss_name(), config.num_workers,
        )
        try:
            plan = RoundPlan(data.partition_rows, config.batch_size, config.local_steps)
            job = TrainJob(uuid.uuid4().hex, spec, compile_spec, data, plan, config)
            report = _print_epoch(config.epochs) if config.verbose else None
            result = backend.run(job, policy, ModelState(spec.weight_arrays(), None), on_epoch_end=report)
        finally:
            data.df.unpersist()
        fit_info = {
            "rounds": result.rounds,
            "rounds_per_epoch": plan.rounds_per_epoch,
            "local_steps": plan.tau,
            "epoch_seconds": result.epoch_seconds,
            "partition_rows": list(data.partition_rows),
        }
        model = KerasModel._from_fit(spec.with_weights(result.state.weights), result.history, fit_info)
        self._copyValues(model)
        model._set(task=task)
        return model
