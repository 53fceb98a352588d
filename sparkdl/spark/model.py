"""``KerasModel``: the fitted Spark ML Model that wraps a trained Keras model."""

from __future__ import annotations

import numpy as np
from pyspark.ml import Model
from pyspark.ml.linalg import DenseVector, Vector
from pyspark.mllib.linalg import Vector as MLlibVector
from pyspark.sql import DataFrame

from sparkdl.errors import ConfigError, SchemaError
from sparkdl.spark.inference import OutputColumns, transform
from sparkdl.spark.params import COMPILE_PARAMS, KerasModelParams
from sparkdl.spark.persistence import KerasStageIO, read_keras_file


class KerasModel(Model, KerasModelParams, KerasStageIO):
    """A trained Keras model as a Spark ML Model (a Transformer).

    ``transform(df)`` runs batched inference on the executors and returns ``df`` with every
    input column kept, in the same rows and order, plus:

    - ``predictionCol`` (double): the class index for a classifier (argmax; ``p >= 0.5`` for a
      single sigmoid output; margin > 0 for hinge losses), the output value for a regressor
      (``array<double>`` when the regressor has several outputs; a multi-label classifier, binary
      cross-entropy with k > 1 outputs, writes ``array<double>`` of k 0/1 decisions);
    - ``rawPredictionCol`` (classifiers): the class scores, a ``pyspark.ml.linalg`` DenseVector
      (``[-z, z]`` for one logit or margin, ``[1 - p, p]`` for one sigmoid output, else the k outputs);
    - ``probabilityCol`` (classifiers whose outputs are probabilities, not hinge losses): class
      probabilities in [0, 1] as a DenseVector of k (``[1 - p, p]`` for one output; softmax or
      sigmoid of logits when the loss has ``from_logits=True``).

    A model with several outputs gets one column per output instead (``outputCols``), each classifier
    output followed by ``<column>_<probabilityCol>`` (:func:`sparkdl.spark.inference.transform`);
    with a loss per output (``loss={"progression": "mse", "high": "binary_crossentropy"}``) each
    output's own loss decides whether it is a classifier (``task="auto"``). :meth:`evaluate` computes
    the compiled loss and metrics over a DataFrame.

    The weights reach the executors as one Spark broadcast per model, kept on the driver while a
    ``KerasModel`` that scored with it (this one, a copy, a reload) is alive, or while it is among
    the 8 most recently scored models: run a DataFrame from ``transform`` while its model is kept, or before 8 other models
    are scored (:func:`sparkdl.spark.inference.weights_broadcast`).

    The loss family decides these rules (:mod:`sparkdl.keras.losses`); ``scoreColumnType="array"``
    writes ``array<double>`` instead of vectors, and an empty ``rawPredictionCol`` or
    ``probabilityCol`` leaves that column out. ``numClasses``, ``predict``, ``predictRaw`` and
    ``predictProbability`` score single rows on the driver, as Spark's classification models do.

    Features are read from ``featuresCol`` as in :class:`~sparkdl.spark.estimator.KerasEstimator`
    (numeric, ``array<numeric>`` or vector, ``prod(input_shape)`` values per row, cast to the
    model's input dtype) and predicted ``inferenceBatchSize`` rows at a time.

    Rows that cannot be scored (a null, NaN or ±inf feature value, or a wrongly sized row) follow
    ``handleInvalid``: ``"error"`` (default) raises :class:`~sparkdl.errors.SchemaError` naming the
    column and the counts of null, NaN, infinite and wrongly sized rows (before scoring with
    ``checkFeatures``, else in the task that meets the first one); ``"skip"`` leaves them out of
    the output; ``"keep"`` keeps them with NaN in every column ``transform`` adds (prediction,
    rawPrediction, probability, each output's columns). A NaN the model itself outputs stays NaN
    in every column too: no rule turns it into a class or a probability.

    Params: every Param of :class:`~sparkdl.spark.estimator.KerasEstimator`. The shared ones
    (columns, batch sizes, compile arguments, ``task``, ``scoreColumnType``, ``checkFeatures``,
    ``handleInvalid``) have getters and setters; the training ones (``numWorkers``, ``epochs``,
    ``mode``, ...) have getters only and hold the values the model was fitted with (copied at
    ``fit``, saved and loaded with it; a save of format 1, the format before them, did not
    record them: they read as their defaults), as Spark's models carry their estimator's Params.

    Attributes:
        history: per-epoch losses and metrics (``val_*`` with validation), as
            ``keras.callbacks.History.history``: ``{"loss": [0.41, 0.18], "accuracy": [0.87, 0.94]}``;
            nothing else (the parameter server's counts of each epoch are ``fitInfo["ps_epochs"]``).
        fitInfo: facts of the fit: ``fit_id`` (str, names its Spark jobs), ``rows`` (rows trained per
            epoch, equal to the input's row count), ``partition_rows`` (rows of each worker's partition),
            ``rounds``, ``rounds_per_epoch``, ``local_steps`` (τ), ``epoch_seconds`` (seconds per epoch),
            ``reduced_on_executors`` (whether each round's updates were combined on the executors),
            ``rounds_reading_data`` (rounds that read the cached training data: the first, and any whose
            partitions were in no worker's cache; the others ran over partition ids) and ``seconds``
            (``checks``, ``prepare_data``, ``first_step``, ``first_round``, ``other_rounds``, ``train``,
            ``total``: see :func:`sparkdl.spark.estimator.fit_seconds`), ``backend``, ``backend_reason``
            (why ``backend="auto"`` chose it) and ``mode``; backend ``ps`` adds the server's counts (``updates_applied``, ``duplicates_dropped``,
            ``staleness_mean``/``staleness_max``, ``bytes_pushed``/``bytes_pulled``, ``ps_epochs`` per epoch).
        optimizerState: the fit's final optimizer state, the values of the Keras model's
            ``optimizer.variables`` in order (iteration counter int64 ``()``, learning rate, e.g.
            Adam's moments shaped like the weights), or ``None``; saved as ``optimizer.arrow`` and
            the start of a continued fit (``KerasEstimator(initialModel=this_model)``).

    Persistence: ``save(path)`` / ``KerasModel.load(path)`` on any Hadoop filesystem: ``model.keras``,
    ``optimizer.arrow`` (the optimizer state) and JSON metadata written last
    (:mod:`sparkdl.spark.persistence`); ``model.write().overwrite().save(path)`` replaces a save.
    """

    _requires_model = True

    def __init__(self) -> None:
        super().__init__()
        self._spec = None
        self.history: dict[str, list[float]] = {}
        self.fitInfo: dict = {}

    @property
    def optimizerState(self) -> list | None:
        """The fit's final optimizer state (a new list of numpy arrays), or ``None``."""
        return None if self._optimizer_state is None else list(self._optimizer_state)

    @classmethod
    def _from_fit(cls, spec, history: dict, fit_info: dict, optimizer_state: list | None = None) -> KerasModel:
        model = cls()
        model._spec = spec
        model._optimizer_state = None if optimizer_state is None else list(optimizer_state)
        model.history = history
        model.fitInfo = fit_info
        return model

    @classmethod
    def fromKeras(cls, model, **params) -> KerasModel:
        """Wrap a trained ``keras.Model``, or a ``.keras`` file written by plain Keras, for scoring
        on Spark without training: ``KerasModel.fromKeras("cnn.keras", featuresCol="pixels").transform(df)``.

        A compiled model supplies its compile arguments (``loss`` decides the task and the
        classifier columns, see :mod:`sparkdl.keras.losses`; ``metrics`` are what :meth:`evaluate`
        reports); for an uncompiled one pass ``loss=`` (or ``task=``) to get classifier columns.
        The optimizer state is not kept (``optimizerState`` is None).

        Args:
            model: a built Functional or Sequential ``keras.Model``, or the path of a ``.keras``
                archive: a local path, or any Hadoop-filesystem URI (``hdfs://``, ``s3a://``,
                ``dbfs:/``) read through the active SparkSession.
            **params: Params of this model, e.g. ``featuresCol="pixels"``, ``inferenceBatchSize=1024``,
                ``loss="sparse_categorical_crossentropy"``, ``outputCols=[...]``; and ``customObjects``
                (a dict name -> class or function, as Keras' ``custom_objects``), registered here and
                shipped to the executors.

        Raises:
            ConfigError: not a Keras model nor a path, no ``.keras`` file at the path, a model that
                is not a built Functional/Sequential model, or custom objects that are not registered
                (the message names the object).
        """
        import os
        import warnings

        from sparkdl.keras.custom_objects import register_custom_objects
        from sparkdl.keras.runtime import keras_module
        from sparkdl.keras.spec import ModelSpec, compile_args_of

        keras = keras_module()
        register_custom_objects(params.pop("customObjects", None))
        unknown = sorted(name for name in params if not cls().hasParam(name))
        if unknown:
            raise ConfigError(f"fromKeras takes Params of KerasModel and customObjects. Received unknown names: {unknown}")
        if isinstance(model, (str, os.PathLike)):
            keras_model = read_keras_file(model, "fromKeras")
        elif isinstance(model, keras.Model):
            keras_model = model
        else:
            raise ConfigError(f"fromKeras takes a keras.Model or the path of a .keras file. Received: {type(model).__name__}")
        wrapped = cls()
        wrapped._spec = ModelSpec.from_model(keras_model)
        wrapped._optimizer_state = None
        wrapped._set(**params)
        adopted = []
        for keras_name, value in compile_args_of(keras_model).items():
            name = COMPILE_PARAMS[keras_name]
            if name in params:  # given explicitly: the caller's value wins
                continue
            try:
                wrapped._set(**{name: value})
                if keras_name != "optimizer":
                    adopted.append((keras_name, name))
            except (ConfigError, ValueError, TypeError) as exc:  # e.g. an unregistered custom loss: scoring needs none of them
                warnings.warn(f"fromKeras leaves the model's compile argument {keras_name!r} out ({exc}); pass {name}= "
                              "to set one, e.g. for evaluate or classifier columns", stacklevel=2)
        if adopted and wrapped.isDefined(wrapped.loss):
            try:  # per-output forms keyed as sparkdl names the outputs (a dict of outputs is keyed by its own keys in Keras)
                wrapped._compile_spec().check_outputs([name for name, _ in wrapped._spec.output_specs])
            except ConfigError as exc:
                for _, name in adopted:
                    wrapped.clear(wrapped.getParam(name))
                warnings.warn(f"fromKeras leaves the model's compile arguments {[k for k, _ in adopted]} out ({exc}); pass "
                              "loss= (and metrics=) by output name to set them, e.g. for evaluate or classifier columns",
                              stacklevel=2)
        return wrapped

    def getKerasModel(self):
        """A new ``keras.Model`` with the trained weights, compiled with the fit's compile arguments
        (optimizer, loss, metrics, weighted metrics, loss weights, jit_compile), its optimizer built
        and holding the fit's final state (``optimizer.iterations`` = the fit's steps) when there is one.

        Raises:
            ConfigError: when this KerasModel holds no model (built without fit or load).
        """
        if self._spec is None:
            raise ConfigError("KerasModel must come from fit() or load() to hold a Keras model. Received: an empty KerasModel")
        model = self._spec.build()
        if self.isDefined(self.loss):
            self._compile_spec().compile(model, self._optimizer_state, self._state_optimizer())
        return model

    def _require_model(self, action: str) -> None:
        if self._spec is None:
            raise ConfigError(f"KerasModel must come from fit() or load() before {action}. Received: an empty KerasModel")

    def _loss_and_task(self):
        """The loss family (:class:`~sparkdl.keras.losses.LossInfo`) and the inferred task; for a
        model with several outputs given a loss per output, the list of each output's (in output
        order) and the task as set (``"auto"``: each output's loss decides)."""
        from sparkdl.keras.losses import LossInfo

        if not self.isDefined(self.loss):
            info = LossInfo()
            return info, info.infer_task(self.getTask())
        compile_spec = self._compile_spec()
        if compile_spec.per_output_loss and len(self._spec.output_specs) > 1:
            return compile_spec.output_losses([name for name, _ in self._spec.output_specs]), self.getTask()
        info = compile_spec.loss_info
        return info, info.infer_task(self.getTask())

    def _transform(self, dataset: DataFrame) -> DataFrame:
        from sparkdl.spark.data import check_dataframe

        check_dataframe(dataset, "KerasModel.transform")  # a pandas DataFrame: say how to make a Spark one
        self._require_model("transform")
        info, task = self._loss_and_task()
        columns = OutputColumns(
            self.getPredictionCol(), self.getRawPredictionCol(), self.getProbabilityCol(), self.getScoreColumnType() == "vector"
        )
        from sparkdl.spark.session import check_inline

        check_inline(dataset.sparkSession, len(self._spec.weights), "the model's weights")  # Spark Connect: before any job
        return transform(dataset, self._spec, self.getFeaturesCol(), columns, self.getInferenceBatchSize(), task, info,
                         min_batch_size=self.getBatchSize(),
                         check_features=self.getCheckFeatures(), features_cols=self.getFeaturesCols(), decoders=self.getDecoders(),
                         output_cols=self.getOutputCols(), handle_invalid=self.getHandleInvalid(), pad_value=self.getPadValue())

    def evaluate(self, df: DataFrame, batchSize: int | None = None) -> dict[str, float]:
        """The compiled loss and metrics over every row of ``df``, as ``keras.Model.evaluate(x, y,
        return_dict=True)`` on the collected rows gives them (within float32 rounding), computed on the
        executors: each partition's Keras metric variables (sums and counts) are added up on the driver,
        never averaged per partition (:mod:`sparkdl.spark.evaluate`).

        Reads what ``fit`` reads: features from ``featuresCol``/``featuresCols`` (and ``decoders``),
        labels from ``labelCol`` or, for a multi-output model, ``labelCols`` (one column per output:
        a scalar class index or value, or an array/vector of ``prod(output_shape)`` values), and
        Keras' ``sample_weight`` from ``sampleWeightCol`` when set (``classWeight`` is never applied,
        as in Keras' ``evaluate``). ``fit`` copies these Params from the estimator; set them on a
        loaded or wrapped model. Runs two Spark jobs over the input's own partitions (no shuffle):
        the check job of ``fit`` (nulls, NaN, lengths, label ranges, rows) and the evaluation.

        Args:
            df: the DataFrame to evaluate (any partitioning; empty partitions are fine).
            batchSize: rows per ``test_on_batch`` call (> 0); None: the ``batchSize`` Param. The
                values do not depend on it (the loss is Σ w·l / rows over all rows).

        Returns:
            ``{name: float}`` sorted by name: ``"loss"`` (the mean over all rows of the per-row
            loss times its sample weight, plus regularization losses), each compiled metric under
            its Keras name (``"accuracy"``, ``"auc"``, ``"mae"``, ...), and for a model with several
            outputs each output's ``"<output>_loss"`` as Keras names it, e.g.
            ``{"accuracy": 0.75, "loss": 0.5423}``.

        Raises:
            ConfigError: ``df`` is not a Spark DataFrame; an empty KerasModel; a model without a loss (``fromKeras`` of an uncompiled
                model: pass ``loss=``); a ``batchSize`` that is not a positive integer; compile
                arguments that do not fit these labels. All before any Spark job.
            SchemaError: a missing or mistyped feature, label or weight column, or an output without a
                label column (before any job); nulls, NaN, wrong lengths, labels out of the loss's
                range, negative weights or no rows (the check job, before the evaluation job).
            WorkerError: the evaluation job failed on an executor.
        """
        from sparkdl.spark.data import check_dataframe
        from sparkdl.spark.evaluate import evaluate

        check_dataframe(df, "KerasModel.evaluate")
        self._require_model("evaluate")
        if not self.isDefined(self.loss):
            raise ConfigError(
                "evaluate needs the model's loss: compile the Keras model before KerasModel.fromKeras, or pass "
                "loss= to fromKeras (or call setLoss). Received: a KerasModel without a loss"
            )
        return evaluate(
            df, self._spec, self._compile_spec(), self.getFeaturesCol(), self.getFeaturesCols(), self.getLabelCol(),
            self.getLabelCols(), self.getSampleWeightCol(), self.getDecoders(),
            self.getBatchSize() if batchSize is None else batchSize, pad_value=self.getPadValue(),
        )

    def _outputs(self) -> int:
        return int(np.prod(self._spec.output_shape, dtype=np.int64))

    def _classifier(self, action: str):
        self._require_model(action)
        info, task = self._loss_and_task()
        if isinstance(info, list):
            raise ConfigError(
                f"{action} reads a single-output classifier; transform writes each output's columns of a multi-output "
                f"model. Received: outputs {[name for name, _ in self._spec.output_specs]} with a loss per output"
            )
        if task != "classification":
            raise ConfigError(
                f"{action} needs a classifier (a cross-entropy, hinge or KL-divergence loss, or task='classification'). "
                f"Received: task {task!r} with loss {info.name!r}"
            )
        return info, task

    @property
    def numClasses(self) -> int:
        """Classes of this classifier, as Spark's ``ClassificationModel.numClasses``: the output
        width k, 2 for a single output (a sigmoid or a hinge margin), k labels for multi-label.

        Raises:
            ConfigError: for a regressor, or an empty KerasModel.
        """
        info, _ = self._classifier("numClasses")
        return info.num_classes(self._outputs())

    def _score_one(self, features, action: str):
        """Model outputs of one row scored on the driver, through the loss family's transform."""
        self._require_model(action)
        from sparkdl.keras.predict import cached_model, predict_array

        if len(self._spec.input_specs) > 1 or len(self._spec.output_specs) > 1 or None in self._spec.input_shape:
            raise ConfigError(
                f"{action} scores one row of a model with one fixed-shape input and one output; use transform for this "
                f"model. Received: inputs {[(n, s) for n, s, _ in self._spec.input_specs]}, {len(self._spec.output_specs)} outputs"
            )
        size = int(np.prod(self._spec.input_shape, dtype=np.int64))
        values = features.toArray() if isinstance(features, (Vector, MLlibVector)) else features
        try:
            x = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"features must be a vector or a list of numbers. Received: {type(features).__name__} ({exc})") from exc
        if x.size != size:
            raise SchemaError(
                f"features must hold {size} numbers (the model input shape {tuple(self._spec.input_shape)}). "
                f"Received: {x.size} values of shape {x.shape}"
            )
        x = x.reshape((1, *self._spec.input_shape)).astype(self._spec.input_dtype)
        info, task = self._loss_and_task()
        return info.spark_outputs(predict_array(cached_model(self._spec), x, 1), task)

    def predict(self, features) -> float | list[float]:
        """The ``prediction`` of one row, computed on the driver as ``transform`` computes it.

        Args:
            features: a ``pyspark.ml.linalg`` (or mllib) Vector, or a list/array of
                ``prod(input_shape)`` numbers, e.g. 784 for an input of ``(28, 28, 1)``.

        Returns:
            A float (the class index of a classifier, the value of a one-output regressor), or a
            list of floats (multi-label 0/1 decisions, a multi-output regressor's values).

        Raises:
            SchemaError: features of the wrong length or not numeric.
            ConfigError: an empty KerasModel.
        """
        out = self._score_one(features, "predict")
        return float(out.prediction[0]) if out.prediction.ndim == 1 else out.prediction[0].tolist()

    def predictRaw(self, features) -> DenseVector:
        """The ``rawPrediction`` of one row (class scores; see :mod:`sparkdl.keras.losses`).

        Raises:
            ConfigError: for a regressor, or an empty KerasModel.
            SchemaError: features of the wrong length or not numeric.
        """
        self._classifier("predictRaw")
        return DenseVector(self._score_one(features, "predictRaw").raw[0])

    def predictProbability(self, features) -> DenseVector:
        """The ``probability`` of one row: k class probabilities in [0, 1] (``[1 - p, p]`` for one output).

        Raises:
            ConfigError: for a regressor, a hinge-loss classifier (margins are not probabilities),
                or an empty KerasModel.
            SchemaError: features of the wrong length or not numeric.
        """
        info, task = self._classifier("predictProbability")
        if not info.layout(task, self._outputs()).probability_width:
            raise ConfigError(
                "predictProbability needs a loss whose outputs are probabilities (cross-entropy, KL divergence, or a "
                f"regression loss with task='classification'); hinge losses give margins. Received: loss {info.name!r}"
            )
        return DenseVector(self._score_one(features, "predictProbability").probability[0])

    def copy(self, extra=None) -> KerasModel:
        that = super().copy(extra)
        that.history = {k: list(v) for k, v in self.history.items()}
        that._optimizer_state = self.optimizerState
        that.fitInfo = dict(self.fitInfo)
        return that

    def _state_optimizer(self):
        return self.getOptimizer()  # the fit's optimizer produced the state

    def _extra_metadata(self) -> dict:
        return {"history": self.history, "fitInfo": self.fitInfo}

    def _load_extra_metadata(self, metadata: dict) -> None:
        self.history = metadata.get("history", {})
        self.fitInfo = metadata.get("fitInfo", {})
