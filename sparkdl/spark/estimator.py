"""``KerasEstimator``: fit a Keras model on a Spark DataFrame with distributed training rounds."""

from __future__ import annotations

import logging
import time
import uuid
import warnings

import numpy as np
from pyspark import keyword_only
from pyspark.ml import Estimator
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from dataclasses import dataclass

from sparkdl.config import ASYNC_DEFAULT_LOCAL_STEPS, ASYNC_MODES, FitConfig
from sparkdl.core.modes import get_policy
from sparkdl.core.schedule import RoundPlan
from sparkdl.core.state import FitState, ModelState
from sparkdl.errors import ConfigError
from sparkdl.keras.custom_objects import register_custom_objects
from sparkdl.keras.replica import check_state_dtypes, initial_optimizer, trainable_mask
from sparkdl.serialization.arrow_codec import decode_arrays
from sparkdl.spark.data import col, prepare_training_data, request_columns, validation_split
from sparkdl.spark.jobs import run_job
from sparkdl.spark.model import KerasModel
from sparkdl.spark.params import COMPILE_PARAMS, KerasEstimatorParams
from sparkdl.spark.partitions import row_bytes, task_budget
from sparkdl.spark.persistence import KerasStageIO
from sparkdl.spark.session import check_inline
from sparkdl.spark.training.checkpoint import fit_identity
from sparkdl.spark.training.job import TrainJob

log = logging.getLogger("sparkdl")


@dataclass
class _FitRequest:
    """What a fit resolved and checked before any job (driver-side; never travels to a task)."""

    fit_id: str
    config: FitConfig
    backend: str
    spec: object
    compile_spec: object
    start: ModelState
    task: str
    request: object
    loss: object
    reader: object
    trainable: tuple
    train_df: DataFrame
    validation_df: DataFrame | None
    callbacks: list
    trackers: list
    budget: int
    spark: object

class KerasEstimator(Estimator, KerasEstimatorParams, KerasStageIO):
    """Spark ML Estimator that trains a Keras 3 model on a DataFrame across Spark executors.

    ``fit(df)`` runs ``numWorkers`` model replicas, one Spark task each, on ``numWorkers``
    partitions of ``df``. In mode ``sync`` (SparkNet model averaging; Moritz et al., ICLR 2016)
    every replica runs τ = ``localSteps`` local steps from the master weights, then the driver
    averages weights and optimizer state weighted by the rows each replica trained on. With
    ``localSteps=None`` a round is one pass over each partition, i.e. one round per epoch.
    ``numWorkers=1`` with ``keepPartitioning=True`` is exactly ``keras.Model.fit`` on the same batches.

    Args:
        model: a built Functional or Sequential ``keras.Model`` (one or several inputs and outputs). It is kept as
            architecture JSON plus weights (Arrow IPC), never pickled. If it is compiled and
            ``optimizer``/``loss``/``metrics`` are not given, its compile arguments are used.
        optimizer: Keras optimizer as a name (``"adam"``), an object (``Adam(1e-3)``) or a config dict.
        loss: Keras loss as a name, an object, a function or a config dict.
        metrics: list of Keras metrics (names, objects or configs).
        weightedMetrics, lossWeights, jitCompile: ``keras.Model.compile``'s ``weighted_metrics``,
            ``loss_weights`` (a float, a list or a dict of floats) and ``jit_compile`` (True, False,
            ``"auto"``), kept as Params and used on the executors.
        initialModel: a fitted or loaded ``KerasModel`` to continue from (weights and optimizer
            state), see :meth:`setInitialModel`.
        featuresCol: input column: numeric, ``array<numeric>`` or an ml/mllib vector with
            ``prod(input_shape)`` values per row, e.g. 784 for an input of shape ``(28, 28, 1)``;
            cast to the model input's dtype (float32 by default).
        labelCol: label column: numeric (class index or value) or ``array<numeric>``/vector (one-hot).
        featuresCols: instead of ``featuresCol``: a list of columns (scalars, arrays, vectors) whose
            values are concatenated per row, in order, into the one model input; or a dict model input
            name -> column (or list of columns) for multi-input models. Each input is cast to its
            Keras input's dtype (int32/int64 ids stay integers). A sequence input ``(None, k)`` takes
            one ``array<array<numeric>>`` column, padded with 0.0 to the longest row (``Masking``).
        decoders: dict binary column -> ``"module:function"`` run on the executors on each row's bytes,
            returning an array of the input's shape (a binary column without one is refused).
        labelCols: labels of a multi-output model: a list in output order or a dict output name -> column.
        sampleWeightCol: per-row loss weights (numeric, finite, >= 0), Keras ``sample_weight``, in
            training and validation (loss Σ w·l / rows per batch, as Keras).
        classWeight: Keras ``class_weight``, dict class index -> weight (not with ``sampleWeightCol``).
        validationCol, validationSplit: validate after each epoch on the rows where the boolean
            ``validationCol`` is true, or on a seeded ``validationSplit`` fraction of the rows (a hash
            of each row: the same rows every run); or pass ``fit(df, validationData=val_df)``. The
            history gets ``val_*`` keys, exact over all validation rows. On backend ``ps`` each
            epoch's master weights are kept when its last update is applied and validated after
            the barrier stage (it holds every slot).
        compression: ``None`` (default: workers send their full state), ``"fp16"``: each worker sends
            its update relative to the round's start as float16 (half the bytes), summed in float64
            and averaged in float32; ``"1bit"``: one bit per value plus two float32 reconstruction
            values per column, the quantization error kept by the worker and added to its next
            update (error feedback; Seide et al., Interspeech 2014); ``"threshold"``: only the
            entries whose accumulated update reaches ``compressionThreshold`` t, as ±t at sparse
            uint32 indices (Strom, Interspeech 2015). With ``1bit``/``threshold`` the optimizer state
            stays on each worker (it is not averaged; the fitted model keeps the initial one). Any
            mode, either backend (asynchronous modes: every push but each worker's last);
            ``fitInfo["update_bytes"]`` counts the bytes of the updates the driver received.
        compressionThreshold: ``"threshold"``'s t (> 0, in weight units; default 0.01, which sends
            about 1/20 of a full update's bytes on the mnist10k CNN with Adam(0.002) and τ = 16;
            see ``benchmarks/compare_modes.py``).
        minWorkersPerRound: straggler-tolerant rounds of the round modes: a round closes with
            the updates that arrived once this many workers (int) or this fraction of them (float)
            have sent theirs and ``roundDeadline`` seconds have passed since the round started
            (workers with no rows in a round do not count); the late workers' updates are dropped
            and counted (``fitInfo["updates_dropped"]``, ``["rows_dropped"]``,
            ``["dropped_per_round"]``). On backend ``rounds`` each worker then runs its own Spark
            job per round; a late job goes on in the background (cancelled when the fit ends) and
            its partition sits out the rounds that start before it ends. On ``ps`` the server
            closes the round and a late worker skips to the open round. None (default) waits for
            every worker.
        roundDeadline: seconds a straggler-tolerant round waits for every worker (default 0: it
            closes as soon as ``minWorkersPerRound`` updates arrived).
        mixedPrecision: None (default: the model's own dtypes), ``"mixed_float16"`` or ``"mixed_bfloat16"``:
            the Keras dtype policy of the replicas' layers (float32 variables, 16-bit compute; the output
            layers stay float32; ``mixed_float16`` adds Keras' dynamic loss scaling). The master weights,
            their averaging and the Arrow wire stay float32 (checked); the fitted model is float32.
            Validated before any job. See docs/gpu.md.
        handleInvalid: ``"error"`` (default: rows with a null, NaN or ±inf in any model column fail
            before training, naming the column and the count) or ``"skip"`` (dropped, counted in a
            warning and ``fitInfo["rows_skipped"]``).
        maxTaskMemoryMB: a task's budget for its partition (MB; None: the executor's memory divided
            by its task slots); a larger partition is written once to local ``.npy`` files and
            read a batch at a time (never memory-mapped).
        predictionCol: output column of the fitted model (double).
        probabilityCol: class probabilities (a ``pyspark.ml.linalg`` DenseVector; ``array<double>`` with
            ``scoreColumnType="array"``).
        rawPredictionCol: raw class scores (DenseVector), as Spark's classifiers write them.
        scoreColumnType: ``"vector"`` (default) or ``"array"``, the type of the two score columns.
        checkFeatures: whether the fitted model's ``transform`` counts bad feature rows over the whole
            input when called (one Spark-SQL pass, default True) or stays fully lazy (False).
        numWorkers: replicas and partitions (default 2).
        epochs: passes over the data (default 1).
        batchSize: rows per local step and per inference batch (default 32).
        localSteps: τ, local steps between averaging rounds (sync) or between a worker's push and
            its next pull (asynchronous modes). Default None: one pass per round in ``sync``; in the
            asynchronous modes None means the mode's default τ (4 steps, see
            ``sparkdl.config.ASYNC_DEFAULT_LOCAL_STEPS``).
        mode: ``"sync"`` (model averaging, SparkNet), ``"bmuf"`` (blockwise model-update filtering:
            model averaging with block momentum, Chen & Huo ICASSP 2016; Params ``blockMomentum`` η,
            default 1 − 1/numWorkers, ``blockLearningRate`` ζ, default 1, ``nesterov``, default True;
            ), ``"easgd"`` (elastic averaging SGD: each worker keeps its own model,
            pulled towards the centre with force α = ``elasticForce``, default 0.9/numWorkers;
            the fitted model is the centre; Zhang, Choromanska, LeCun NIPS 2015),
            ``"gossip"`` (each round every worker averages with one peer of a seeded random perfect
            matching, routed by the driver; the fitted model is the workers' average; Jin, Yuan,
            Iandola, Keutzer 2016) — these four round modes run on either backend, the same result
            on the same seed — or an asynchronous mode on backend ``ps``:
            ``"async"`` (Downpour SGD: each worker pushes Δ every τ steps, then pulls; Dean et al.
            NIPS 2012), ``"hogwild"`` (the server adds updates without a lock; Recht et al. NIPS
            2011), ``"staleness_aware"`` (each Δ scaled by 1/staleness; Zhang, Gupta, Lian, Liu
            IJCAI 2016), ``"ssp"`` (bounded staleness, see ``staleness``; Ho et al. NIPS 2013).
        backend: ``"auto"`` (default: ``rounds`` for ``sync``, ``ps`` for the asynchronous modes),
            ``"rounds"`` (one Spark job per round; works with dynamic allocation; the round modes) or
            ``"ps"`` (a parameter server on the driver and one long-lived barrier stage; a round
            mode on it equals ``rounds`` on the same seed). ``ps`` needs a task slot per worker and
            dynamic allocation off, both checked before any job.
        staleness: ``ssp``'s bound s in clocks (one clock = one push), default 2.
        serverPort: the parameter server's port on the driver (default 0: a free port).
        workerTimeout: seconds a ``ps`` worker may go without contacting the server (a push, a
            wait or a heartbeat; a waiting worker re-asks every 5 s) before the fit fails with
            ``WorkerError`` naming its partition (default 600; must exceed τ steps and the first
            replica build).
        shuffle: reshuffle each partition every epoch with a seeded permutation (default True).
        seed: seed of the shuffles and of random layers (default 0).
        verbose: as Keras: 0 silent; 1 (default) a live progress bar on the driver (rich: epoch, round,
            running loss and metrics, samples/s, time left) when stdout is a terminal or a notebook,
            else one line ``Epoch e/E - seconds - samples/s - loss: ... - metric: ...`` per epoch;
            2 one such line per epoch. Each line also goes to the ``sparkdl`` logger (DEBUG).
        callbacks: Keras callbacks run on the driver, see :meth:`setCallbacks` (backend ``rounds``).
        logDir: a folder for TensorBoard event files (``train/``, ``validation/``): ``epoch_*``
            scalars per epoch and ``round_*`` per round; needs TensorFlow on the driver.
        mlflow: True logs the Params, per-epoch metrics and the fitted model (an artifact folder
            ``model`` that :meth:`KerasModel.load` reads) to MLflow (the ``mlflow`` extra); None
            (default) does so when mlflow is installed and a run is active; False never.
        roundTimeout: seconds a round may run before its jobs are cancelled (default 3600).
        task: ``"auto"``, ``"classification"`` or ``"regression"``, how ``transform`` reads outputs.
        keepPartitioning: train on the input's own partitions, one worker each, instead of spreading
            the rows round-robin over ``numWorkers`` partitions (default False: every worker gets rows
            from every input partition, so label-sorted files do not give workers label-sorted shards).

    Raises (from ``fit``, before any training job):
        ConfigError: a missing model or loss, a Param out of range, ``classWeight`` with
            ``sampleWeightCol``, two validation sources.
        SchemaError: a missing or mistyped column, an input or output without a column, nulls or
            NaN (``handleInvalid="error"``), a feature length that does not match the model input,
            labels that do not fit the output or the loss, negative weights, a decoder's wrong
            output, or an empty DataFrame.

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
        initialModel=None,
        customObjects=None,
        optimizer=None,
        loss=None,
        metrics=None,
        weightedMetrics=None,
        lossWeights=None,
        jitCompile=None,
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
        keepPartitioning=False,
        rawPredictionCol="rawPrediction",
        scoreColumnType="vector",
        checkFeatures=True,
        backend="auto",
        staleness=2,
        serverPort=0,
        workerTimeout=600.0,
        featuresCols=None,
        labelCols=None,
        sampleWeightCol=None,
        classWeight=None,
        validationCol=None,
        validationSplit=0.0,
        handleInvalid="error",
        maxTaskMemoryMB=None,
        decoders=None,
        blockMomentum=None,
        blockLearningRate=1.0,
        nesterov=True,
        elasticForce=None,
        compression=None,
        compressionThreshold=0.01,
        minWorkersPerRound=None,
        roundDeadline=0.0,
        outputCols=None,
        mixedPrecision=None,
        callbacks=None,
        logDir=None,
        mlflow=None,
    ) -> None:
        super().__init__()
        self._spec = None
        self._validation_data = None
        self._callbacks = []
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(
        self,
        *,
        model=None,
        initialModel=None,
        customObjects=None,
        optimizer=None,
        loss=None,
        metrics=None,
        weightedMetrics=None,
        lossWeights=None,
        jitCompile=None,
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
        keepPartitioning=False,
        rawPredictionCol="rawPrediction",
        scoreColumnType="vector",
        checkFeatures=True,
        backend="auto",
        staleness=2,
        serverPort=0,
        workerTimeout=600.0,
        featuresCols=None,
        labelCols=None,
        sampleWeightCol=None,
        classWeight=None,
        validationCol=None,
        validationSplit=0.0,
        handleInvalid="error",
        maxTaskMemoryMB=None,
        decoders=None,
        blockMomentum=None,
        blockLearningRate=1.0,
        nesterov=True,
        elasticForce=None,
        compression=None,
        compressionThreshold=0.01,
        minWorkersPerRound=None,
        roundDeadline=0.0,
        outputCols=None,
        mixedPrecision=None,
        callbacks=None,
        logDir=None,
        mlflow=None,
    ) -> KerasEstimator:
        """Set Params by keyword; ``model`` as in :meth:`setModel`, ``initialModel`` as in
        :meth:`setInitialModel` (applied after ``model``), ``customObjects`` (a dict name -> class or
        function, as Keras' ``custom_objects``) registered with Keras here and on the executors
        (:func:`sparkdl.keras.custom_objects.register_custom_objects`). Compile keywords given as ``None`` are
        ignored. Returns ``self``."""
        kwargs = {k: v for k, v in self._input_kwargs.items() if not (k in COMPILE_PARAMS.values() and v is None)}
        model, initial_model = kwargs.pop("model", None), kwargs.pop("initialModel", None)
        if "callbacks" in kwargs:
            self.setCallbacks(kwargs.pop("callbacks"))
        register_custom_objects(kwargs.pop("customObjects", None))  # before the model is captured
        self._set(**kwargs)
        if model is not None:
            self.setModel(model)
        if initial_model is not None:
            self.setInitialModel(initial_model)
        return self

    def setCallbacks(self, callbacks) -> KerasEstimator:
        """Keras callbacks (``keras.callbacks.Callback`` objects, a list; None for none) run on the
        driver during ``fit``, against a model holding the master weights, with the fit's global
        metrics: see :mod:`sparkdl.keras.callbacks` (``EarlyStopping`` with ``restore_best_weights``,
        ``ModelCheckpoint``, ``ReduceLROnPlateau``, ``LearningRateScheduler``, ``CSVLogger``,
        ``TerminateOnNaN``, ``BackupAndRestore``, your own). ``self.model.stop_training = True`` stops
        every worker after the same round. Backend ``rounds`` only (``ps`` workers run on their own).
        Not a Param: the objects stay on the driver (tasks carry plain values only, never the
        estimator) and are not saved. A copy of the estimator shares them, and a callback object serves
        one fit at a time: a fit started while another fit holds it (``CrossValidator`` with
        ``parallelism`` > 1) fails with ``ConfigError``. Also the ``callbacks=`` keyword of the constructor.

        Raises:
            ConfigError: when an element is not a ``keras.callbacks.Callback``.
        """
        from sparkdl.keras.callbacks import check_callbacks

        self._callbacks = check_callbacks(callbacks)
        return self

    def getCallbacks(self) -> list:
        """The Keras callbacks set by :meth:`setCallbacks` (a list, maybe empty)."""
        return list(self._callbacks)

    def setModel(self, model) -> KerasEstimator:
        """Use ``model`` (a built ``keras.Model``): its architecture and current weights are the start
        point, with fresh optimizer state (an earlier :meth:`setInitialModel`'s state is dropped).

        A compiled ``model`` supplies each compile Param not set yet (``optimizer``, ``loss``,
        ``metrics``, ``weightedMetrics``, ``lossWeights``, ``jitCompile``), as the constructor does;
        ``jitCompile`` is the value Keras resolved at compile time.

        Raises:
            ConfigError: when ``model`` is not a built Functional or Sequential ``keras.Model``.
        """
        from sparkdl.keras.spec import ModelSpec, compile_args_of

        self._spec = ModelSpec.from_model(model)
        self._optimizer_state, self._optimizer_state_source = None, None
        for keras_name, value in compile_args_of(model).items():
            if not self.isSet(getattr(self, COMPILE_PARAMS[keras_name])):
                self._set(**{COMPILE_PARAMS[keras_name]: value})
        return self

    def setInitialModel(self, model: KerasModel) -> KerasEstimator:
        """Continue training from a fitted (or loaded) ``KerasModel``: its weights and its optimizer
        state (e.g. Adam's moments and iteration counter) are the start point of the next ``fit``.

        Without a ``model`` set, the estimator takes ``model``'s architecture too; with one, the two
        must have the same weights (count, shapes and dtypes, in order), and the estimator's
        architecture is kept with ``model``'s weights. Compile Params not set yet are taken from
        ``model``. The optimizer must be of the class that produced the state (checked now and again
        at ``fit``, before any job); its learning rate is the estimator's own. Fitting one epoch and
        continuing one more with ``numWorkers=1``, ``shuffle=False`` equals fitting two epochs.
        Also the ``initialModel=`` keyword of the constructor.

        Raises:
            ConfigError: when ``model`` is not a KerasModel holding a model, its weights do not
                match the estimator's model, or its optimizer state does not fit the optimizer.
        """
        if not isinstance(model, KerasModel) or model._spec is None:
            raise ConfigError(
                f"initialModel must be a KerasModel from fit() or KerasModel.load(). Received: {type(model).__name__}"
                + (" without a model" if isinstance(model, KerasModel) else "")
            )
        spec = model._spec
        if self._spec is not None:
            mine = [(a.shape, a.dtype) for a in self._spec.weight_arrays()]
            theirs = [(a.shape, a.dtype) for a in spec.weight_arrays()]
            if mine != theirs or (self._spec.input_shape, self._spec.output_shape) != (spec.input_shape, spec.output_shape):
                raise ConfigError(
                    "initialModel must have the architecture of the estimator's model (the same weight shapes and "
                    f"dtypes, in order). Received: weights {[(tuple(s), str(d)) for s, d in theirs]} where the model has "
                    f"{[(tuple(s), str(d)) for s, d in mine]}"
                )
            spec = self._spec.with_weights(spec.weight_arrays())
        for name in COMPILE_PARAMS.values():
            param = getattr(self, name)
            if not self.isSet(param) and model.isSet(name):
                self._set(**{name: model.getOrDefault(name)})
        self._spec = spec
        state = model._optimizer_state
        self._optimizer_state = None if state is None else list(state)
        self._optimizer_state_source = None if state is None else model._state_optimizer()
        if state is not None and self.isDefined(self.loss):
            self._initial_state(spec, self._compile_spec())
        return self

    def _initial_state(self, spec, compile_spec) -> ModelState:
        """The weights and optimizer state a fit starts from: ``spec``'s weights, and the initial
        model's optimizer state (``None``, a fresh optimizer, without one) checked against
        ``compile_spec`` on the driver, with ``compile_spec``'s learning rate.

        Raises:
            ConfigError: when the optimizer state does not fit ``compile_spec``'s optimizer.
        """
        if self._optimizer_state is None:
            return ModelState(spec.weight_arrays(), None)
        model = compile_spec.compile(spec.build(), self._optimizer_state, self._optimizer_state_source)
        return ModelState(spec.weight_arrays(), [variable.numpy() for variable in model.optimizer.variables])

    def getKerasModel(self):
        """A new ``keras.Model`` with the estimator's initial weights (``None`` when no model was given)."""
        return None if self._spec is None else self._spec.build()

    def _fit_config(self) -> FitConfig:
        local_steps = self.getLocalSteps()
        if local_steps is None:
            local_steps = ASYNC_DEFAULT_LOCAL_STEPS.get(self.getMode())  # None for sync: one round per epoch
        return FitConfig(
            num_workers=self.getNumWorkers(),
            epochs=self.getEpochs(),
            batch_size=self.getBatchSize(),
            local_steps=local_steps,
            mode=self.getMode(),
            seed=self.getSeed(),
            shuffle=self.getShuffle(),
            verbose=self.getVerbose(),
            round_timeout_s=self.getRoundTimeout(),
            keep_partitioning=self.getKeepPartitioning(),
            backend=self.getBackend(),
            staleness=self.getStaleness(),
            server_port=self.getServerPort(),
            worker_timeout_s=self.getWorkerTimeout(),
            compression=self.getCompression(),
            compression_threshold=self.getCompressionThreshold(),
            min_workers_per_round=self.getMinWorkersPerRound(),
            round_deadline_s=self.getRoundDeadline(),
            mixed_precision=self.getMixedPrecision(),
        )

    def setValidationData(self, df: DataFrame | None) -> KerasEstimator:
        """Validate on ``df`` (the model's columns, as the training DataFrame) after each epoch; None
        to stop. Not a Param: a DataFrame is not saved with the estimator. Also ``fit(df, validationData=...)``."""
        self._validation_data = df
        return self

    def fit(self, dataset: DataFrame, params=None, validationData: DataFrame | None = None):
        """``Estimator.fit``; ``validationData`` is a DataFrame validated on after each epoch (see
        :meth:`setValidationData`): the history gets ``val_*`` keys."""
        if validationData is None:
            return super().fit(dataset, params)
        # A copy (same uid, Params, model and optimizer state) holds it, so this estimator is never
        # changed, not even for a moment: a concurrent fit of it (CrossValidator) never sees it.
        estimator = self.copy()
        estimator._validation_data = validationData
        return Estimator.fit(estimator, dataset, params)

    def _split_validation(self, dataset: DataFrame, request, seed: int) -> tuple[DataFrame, DataFrame | None]:
        """The training and validation DataFrames: ``validationData``, else the rows where
        ``validationCol`` is true, else a seeded ``validationSplit`` of the rows, else no validation.

        Raises:
            ConfigError: more than one of them given.
            SchemaError: ``validationCol`` missing or not boolean.
        """
        from pyspark.sql import types as T

        from sparkdl.errors import SchemaError

        given = getattr(self, "_validation_data", None)
        column, fraction = self.getValidationCol(), self.getValidationSplit()
        chosen = [name for name, on in (("validationData", given is not None), ("validationCol", column is not None),
                                        ("validationSplit", fraction > 0)) if on]
        if len(chosen) > 1:
            raise ConfigError(f"give one of validationData, validationCol and validationSplit. Received: {chosen}")
        if given is not None:
            return dataset, given
        if column is not None:
            if column not in dataset.columns:
                raise SchemaError(f"validationCol {column!r} must exist in the DataFrame. Received columns: {dataset.columns}")
            data_type = dataset.schema[column].dataType
            if not isinstance(data_type, T.BooleanType):
                raise SchemaError(f"validationCol {column!r} must be boolean (true: a validation row). Received: {data_type.simpleString()}")
            flag = F.coalesce(col(column), F.lit(False))
            return dataset.filter(~flag), dataset.filter(flag)
        if fraction > 0:
            flag = validation_split(dataset, request, fraction, seed)
            return dataset.filter(~flag), dataset.filter(flag)
        return dataset, None

    def _check_validation_data(self, df: DataFrame, spec, loss) -> None:
        """Check, without a job, that a validation DataFrame has the training data's columns (inputs,
        labels, sample weights) with usable types, as :func:`request_columns` checks the training data.

        Raises:
            SchemaError: naming ``validationData`` and the column.
        """
        from sparkdl.errors import SchemaError

        try:
            request = request_columns(
                df, spec, loss, self.getFeaturesCol(), self.getFeaturesCols(), self.getLabelCol(), self.getLabelCols(),
                self.getSampleWeightCol(), self.getClassWeight(), self.getDecoders(), self.getHandleInvalid(),
            )
            for (_, output_shape, label_col), (label_shape, _) in zip(request.outputs, request.label_specs(df, loss), strict=True):
                if label_shape == ():
                    loss.check_label_shape(label_col, (), output_shape)
        except SchemaError as exc:
            raise SchemaError(f"validationData: {exc}") from exc

    def _policy(self, mode: str, trainable: list[bool], workers: int):
        """The mode's policy for ``workers`` workers: bmuf with η = ``blockMomentum`` (default 1 −
        1/workers) filtering the trainable weights only; easgd with α = ``elasticForce`` (default
        0.9/workers); gossip seeded by ``seed``; the asynchronous modes averaging the
        non-trainable arrays (BatchNorm statistics) over the workers.

        Raises:
            ConfigError: a setting out of its range (η outside [0, 1), ζ <= 0, α·workers >= 1).
        """
        if mode == "easgd":
            return get_policy("easgd", workers=workers, elastic_force=self.getElasticForce())
        if mode == "gossip":
            return get_policy("gossip", workers=workers, seed=self.getSeed())
        if mode in ASYNC_MODES:
            return get_policy(mode, trainable=list(trainable), workers=workers)
        if mode != "bmuf":
            return get_policy(mode)
        eta = self.getBlockMomentum()
        return get_policy(
            "bmuf", block_momentum=eta if eta is not None else 1.0 - 1.0 / max(1, workers),
            block_learning_rate=self.getBlockLearningRate(), nesterov=self.getNesterov(), trainable=list(trainable),
        )

    def _fit(self, dataset: DataFrame) -> KerasModel:
        from sparkdl.keras.callbacks import abort_all, exclusive

        observers: list = []  # this fit's progress display and trackers: stopped, closed, ended as failed if it fails
        with exclusive(self._callbacks):  # a callback object serves one fit at a time
            try:
                return self._fit_exclusive(dataset, observers)
            except BaseException:
                abort_all(observers)
                raise

    def _fit_exclusive(self, dataset: DataFrame, observers: list) -> KerasModel:
        """The fit as named steps: check everything that can be checked without a job, prepare the
        data (the check and caching jobs), train (the driver loop over a transport), and make the
        fitted model."""
        seconds = {"started": time.perf_counter()}
        request = self._check(dataset, observers)
        seconds["checked"] = time.perf_counter()
        data, validation = self._prepare(request)
        try:
            seconds["prepared"] = time.perf_counter()
            job, fit, loop = self._train(request, data, validation, observers)
        finally:
            data.df.unpersist()
            if validation is not None:
                validation.df.unpersist()
        return self._fitted_model(request, job, fit, loop, seconds)

    # ---- step 1: everything checked before any job -------------------------------------------

    def _check(self, dataset: DataFrame, observers: list) -> _FitRequest:
        """Resolve and check the fit's settings, model, columns, compile arguments, callbacks and
        transport before any Spark job; start the trackers (an MLflow run).

        Raises:
            ConfigError, SchemaError: see the class docstring.
        """
        from sparkdl.core.gpu import gpu_conf_warnings
        from sparkdl.keras.callbacks import check_callbacks
        from sparkdl.keras.metrics import MetricReader
        from sparkdl.keras.spec import infer_task
        from sparkdl.spark.transports import preflight

        config = self._fit_config()
        if self._spec is None:
            raise ConfigError("KerasEstimator needs a model: pass model=keras_model or call setModel(). Received: no model")
        if not self.isDefined(self.loss):
            raise ConfigError("KerasEstimator needs a loss (a name, a keras.losses.Loss or a config). Received: no loss")
        compile_spec = self._compile_spec()
        start = self._initial_state(self._spec, compile_spec)  # before any job; raises ConfigError
        spec = self._spec
        if len(spec.output_specs) > 1 and self.getOutputCols() is not None:  # transform's columns, checked now
            from sparkdl.spark.inference import output_columns

            output_columns(spec, self.getOutputCols())
        spark = dataset.sparkSession
        if spark.conf.get("spark.python.worker.reuse", "true").lower() != "true":
            warnings.warn("spark.python.worker.reuse is false: every task re-imports TensorFlow and rebuilds its replica", stacklevel=3)
        for problem in gpu_conf_warnings(lambda key: spark.conf.get(key, None)):  # GPUs shared or switched by tasks
            warnings.warn(problem, stacklevel=3)
        user_callbacks = check_callbacks(self._callbacks)
        trackers = self._trackers(observers)  # TensorBoard and MLflow, checked (and the MLflow run started) before any job
        task = infer_task(self.getTask(), compile_spec)
        if task == "classification" and len(spec.output_shape) != 1:
            raise ConfigError(
                f"a classifier must output shape (classes,) per row. Received: {spec.output_shape}; "
                "pass task='regression' to get the raw outputs"
            )
        loss = compile_spec.loss_info
        if self.getFeaturesCols() is not None and self.isSet(self.featuresCol):
            warnings.warn(f"featuresCols is set: it replaces featuresCol={self.getFeaturesCol()!r}", stacklevel=3)
        request = request_columns(
            dataset, spec, loss, self.getFeaturesCol(), self.getFeaturesCols(), self.getLabelCol(), self.getLabelCols(),
            self.getSampleWeightCol(), self.getClassWeight(), self.getDecoders(), self.getHandleInvalid(),
        )
        label_specs = request.label_specs(dataset, loss)
        for (_, output_shape, label_col), (label_shape, _) in zip(request.outputs, label_specs, strict=True):
            if label_shape == ():  # a scalar column's per-row shape is known from the schema: check it now
                loss.check_label_shape(label_col, (), output_shape)
        train_df, validation_df = self._split_validation(dataset, request, config.seed)
        if validation_df is not None and getattr(self, "_validation_data", None) is not None:
            self._check_validation_data(validation_df, spec, loss)
        # Compile arguments that cannot work (loss_weights for missing outputs, a metric that cannot
        # read these labels) fail here on one dummy row, before any Spark job; the loop reuses it.
        reader = MetricReader(
            spec, compile_spec, [s for _, s, _, _ in request.inputs], [d for _, _, d, _ in request.inputs],
            [s for s, _ in label_specs], [d for _, d in label_specs], weighted=bool(request.weight or request.class_weight),
        )
        trainable = trainable_mask(reader.model)
        self._policy(config.mode, trainable, config.num_workers)  # its settings checked now; built again with the workers counted
        backend = preflight(spark, config, reader.model, validation=validation_df is not None)  # ps: slots, reachability; rounds: result sizes
        if validation_df is not None:
            check_inline(spark, len(spec.weights), "the master weights to validate")
        if start.optimizer is None:  # the fit's master always holds an optimizer state: a fresh optimizer's to begin with
            start = ModelState(start.weights, initial_optimizer(reader.model))
        return _FitRequest(
            fit_id=uuid.uuid4().hex, config=config, backend=backend, spec=spec, compile_spec=compile_spec, start=start,
            task=task, request=request, loss=loss, reader=reader, trainable=tuple(trainable), train_df=train_df,
            validation_df=validation_df, callbacks=user_callbacks, trackers=trackers,
            budget=task_budget(spark, self.getMaxTaskMemoryMB()), spark=spark,
        )

    # ---- step 2: the data -------------------------------------------------------------------

    def _prepare(self, request: _FitRequest):
        """The check and caching jobs of the training (and validation) data; warnings about what
        they found. The data jobs read the whole input: they are bounded by ``dataTimeout``, not
        by ``roundTimeout``.

        Raises:
            SchemaError: what the check job found (nulls, NaN, lengths, labels, weights, no rows).
        """
        config, spark = request.config, request.spark

        def check_job(action, description):
            return run_job(spark, action, description, f"sparkdl-{request.fit_id}-check", config.data_timeout_s)

        data = prepare_training_data(request.train_df, request.request, request.loss, config.num_workers,
                                     keep_partitioning=config.keep_partitioning, run_job=check_job)
        validation = None
        try:
            if data.skipped:
                warnings.warn(f"handleInvalid='skip': {data.skipped} rows with a null, NaN or infinite value were dropped, "
                              f"{data.total_rows} rows are trained on", stacklevel=4)
            if request.validation_df is not None:
                validation = prepare_training_data(request.validation_df, request.request, request.loss, config.num_workers,
                                                   run_job=check_job, role="validation")
                if validation.skipped:
                    warnings.warn(f"handleInvalid='skip': {validation.skipped} validation rows with a null, NaN or infinite value "
                                  "were dropped", stacklevel=4)
                if validation.total_rows == 0:
                    warnings.warn("the validation set is empty: the history has no val_* values", stacklevel=4)
        except BaseException:
            data.df.unpersist()
            raise
        workers = len(data.partition_rows)
        if config.keep_partitioning and workers != config.num_workers:
            warnings.warn(
                f"keepPartitioning=True: training with {workers} workers, one per partition of the cached input, "
                f"not numWorkers={config.num_workers} (after a shuffle a cached plan keeps spark.sql.shuffle.partitions "
                "partitions: AQE does not coalesce it)",
                stacklevel=4,
            )
        if data.total_rows < workers:
            warnings.warn(
                f"numWorkers={workers} is larger than the {data.total_rows} rows of the input: "
                f"{workers - data.total_rows} workers will have no rows to train on",
                stacklevel=4,
            )
        if config.min_workers_per_round is not None and config.min_workers(workers) >= workers:
            warnings.warn(f"minWorkersPerRound={config.min_workers_per_round!r} asks for all {workers} workers: every round "
                          "waits for every worker (no straggler is dropped)", stacklevel=4)
        if validation is not None and validation.total_rows == 0:
            validation.df.unpersist()
            validation = None
        return data, validation

    # ---- step 3: the driver loop -------------------------------------------------------------

    def _train(self, request: _FitRequest, data, validation, observers: list):
        """Build the fit's job, policy, transport, callbacks, validator and snapshots, and run the
        driver loop. Returns ``(job, final fit state, loop)``."""
        from sparkdl.keras.callbacks import DriverCallbacks
        from sparkdl.keras.custom_objects import registered
        from sparkdl.keras.progress import FitProgress
        from sparkdl.spark.training import faults
        from sparkdl.spark.training.checkpoint import Snapshots
        from sparkdl.spark.training.loop import TrainingLoop
        from sparkdl.spark.training.validation import Validator
        from sparkdl.spark.transports import TransportOptions, get_transport

        config, fit_id = request.config, request.fit_id
        workers = len(data.partition_rows)
        policy = self._policy(config.mode, list(request.trainable), workers)
        plan = RoundPlan(data.partition_rows, config.batch_size, config.local_steps)
        job = TrainJob(fit_id, request.spec, request.compile_spec, data, plan, config, request.reader,
                       names=tuple(decode_arrays(request.spec.weights).names), trainable=request.trainable,
                       validation=validation, budget_bytes=request.budget, custom_objects=registered(), hooks=faults.active())
        asynchronous = config.mode in ASYNC_MODES
        snapshots = Snapshots(request.spark, fit_identity(job, self._mode_settings(), request.start.optimizer), config.checkpoint_dir, config.checkpoint_every,
                              epochs_only=asynchronous, warn_inexact=config.mode != "sync" or config.compression is not None)
        validator = Validator(request.spark, validation, job.task_spec(), request.reader, config.data_timeout_s) if validation else None
        backups = any(type(c).__name__ == "BackupAndRestore" for c in request.callbacks)
        snapshot = config.checkpoint_dir is not None or backups
        pause_at_epochs = validation is not None or (asynchronous and snapshot)
        transport = get_transport(request.backend, job, policy, TransportOptions(pause_at_epochs=pause_at_epochs, snapshots=snapshot))
        progress = [FitProgress(config.verbose, data.total_rows, f"sparkdl fit {fit_id[:8]}")]  # verbose=0: the DEBUG log only
        observers.extend(progress)
        callbacks = DriverCallbacks([*request.callbacks, *request.trackers, *progress], request.reader.model, config.epochs,
                                    transport.rounds_per_epoch)
        log.info("fit %s: %d rows on %d workers, mode %s on backend %s, %d epochs x %d rounds", fit_id[:8], data.total_rows,
                 workers, config.mode, transport.name, config.epochs, transport.rounds_per_epoch)
        loop = TrainingLoop(job, policy, transport, callbacks, validator, snapshots)
        fit = loop.run(FitState(identity=snapshots.identity, master=request.start))
        changed = callbacks.changed_state()  # EarlyStopping(restore_best_weights=True) and the like, at on_train_end
        if changed is not None:
            fit.master = ModelState([np.asarray(w) for w in changed.weights], fit.master.optimizer)
            fit.info["weights_from_callbacks"] = True
        check_state_dtypes(request.start.weights, fit.master.weights, "the fitted master weights")  # float32 in, float32 out
        loop.transport_info = transport.info()
        return job, fit, loop

    def _mode_settings(self) -> dict:
        """The mode's own settings, for the fit's identity (a snapshot resumes only with them)."""
        return {"blockMomentum": self.getBlockMomentum(), "blockLearningRate": self.getBlockLearningRate(),
                "nesterov": self.getNesterov(), "elasticForce": self.getElasticForce()}

    # ---- step 4: the fitted model -----------------------------------------------------------

    def _fitted_model(self, request: _FitRequest, job, fit: FitState, loop, seconds: dict) -> KerasModel:
        config, data = request.config, job.data
        per_row = row_bytes(data.columns)
        validation = job.validation
        info = {**fit.info, **loop.transport_info}
        first_round = info.pop("first_round_s", loop.first_round_s or 0.0)
        fit_info = {
            "fit_id": request.fit_id,
            "rounds": fit.rounds,
            "rounds_per_epoch": job.plan.rounds_per_epoch,
            "local_steps": job.plan.tau,
            "epoch_seconds": loop.epoch_seconds,
            "epochs_run": len(loop.epoch_seconds),
            "partition_rows": list(data.partition_rows),
            "rows": data.total_rows,
            "backend": request.backend,
            "mode": config.mode,
            "compression": config.compression,
            "rows_skipped": data.skipped,
            "validation_rows": validation.total_rows if validation is not None else 0,
            "validation_rows_skipped": validation.skipped if validation is not None else 0,
            "task_budget_bytes": request.budget,
            "partitions_on_disk": sum(1 for n in data.partition_rows if n * per_row > request.budget),
            **info,
        }
        if config.compression == "threshold":
            fit_info["compression_threshold"] = config.compression_threshold
        if config.min_workers(job.workers) < job.workers:
            fit_info["min_workers_per_round"] = config.min_workers(job.workers)
        # Where the fit's time went (seconds): checks and the compile dry run on the driver, the data
        # preparation jobs, the first round (replicas built, partitions converted), the other rounds.
        fit_info["seconds"] = {
            "checks": round(seconds["checked"] - seconds["started"], 3),
            "prepare_data": round(seconds["prepared"] - seconds["checked"], 3),
            "first_round": round(first_round, 3),
            "other_rounds": round(max(0.0, sum(loop.epoch_seconds) - first_round), 3),
            "total": round(time.perf_counter() - seconds["started"], 3),
        }
        spec = request.spec
        model = KerasModel._from_fit(spec.with_weights(fit.master.weights), fit.history, fit_info, optimizer_state=fit.master.optimizer)
        self._copyValues(model)
        model._set(task=request.task)
        for tracker in request.trackers:
            if hasattr(tracker, "log_model"):  # MLflow: the fitted model as an artifact folder KerasModel.load reads
                model.fitInfo["mlflow_run_id"] = tracker.run_id
                model.fitInfo["mlflow_model_uri"] = tracker.log_model(model)
        log.info("fit %s: done in %.1f s, %d rounds%s", request.fit_id[:8], fit_info["seconds"]["total"], fit.rounds,
                 f", stopped by a callback after epoch {fit.info['stopped']['epoch']}" if fit.info.get("stopped") else "")
        return model

    def _trackers(self, observers: list) -> list:
        """The driver-side loggers the Params ask for: TensorBoard event files (``logDir``) and MLflow
        (``mlflow``), built now so that a missing package fails before any job; the MLflow run is
        started (or joined) and the Params logged now too, so that a tracking store that cannot
        start a run fails before any job. Each is added to ``observers`` as it is made.

        Raises:
            ConfigError: ``logDir`` without TensorFlow, ``mlflow=True`` without mlflow, an MLflow
                tracking store that cannot start a run.
        """
        trackers = []
        if self.getLogDir() is not None:
            from sparkdl.tracking.tensorboard import TensorBoardLogger

            trackers.append(TensorBoardLogger(self.getLogDir()))
            observers.append(trackers[-1])
        from sparkdl.tracking.mlflow_run import MlflowLogger, mlflow_requested

        if mlflow_requested(self.getMlflow()):
            params = {param.name: value for param, value in self.extractParamMap().items()}
            trackers.append(MlflowLogger(params=params))
            observers.append(trackers[-1])
            trackers[-1].on_train_begin()
        return trackers
