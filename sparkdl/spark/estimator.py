"""``KerasEstimator``: fit a Keras model on a Spark DataFrame with distributed training rounds."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import uuid
import warnings

import numpy as np
from pyspark.ml import Estimator
from pyspark.sql import DataFrame

from dataclasses import dataclass

from sparkdl.config import ASYNC_DEFAULT_LOCAL_STEPS, FitConfig
from sparkdl.core.modes import build_policy, policy_class
from sparkdl.spark.backends import check as check_backend
from sparkdl.core.schedule import RoundPlan
from sparkdl.core.state import FitState, ModelState
from sparkdl.errors import ConfigError, FitCancelledError, KeywordArgumentsError
from sparkdl.keras.custom_objects import register_custom_objects
from sparkdl.keras.replica import check_state_dtypes, initial_optimizer, trainable_mask
from sparkdl.serialization.arrow_codec import decode_arrays
from sparkdl.spark.daemon import prepare_workers
from sparkdl.spark.data import check_dataframe, prepare, request_columns, training_and_validation
from sparkdl.spark.jobs import check_workers_python, interrupted_fit, run_job
from sparkdl.spark.model import KerasModel
from sparkdl.param_specs import PARAMS, args_docstring, check_keywords, keyword_signature
from sparkdl.spark.params import COMPILE_PARAMS, KerasEstimatorParams
from sparkdl.spark.partitions import row_bytes
from sparkdl.spark.persistence import KerasStageIO
from sparkdl.spark.plan import FitPlan
from sparkdl.spark.session import check_inline_bytes
from sparkdl.spark.training.checkpoint import fit_identity
from sparkdl.spark.training.job import TrainJob

log = logging.getLogger("sparkdl")


@dataclass(frozen=True)
class _FitSettings:
    """What a fit resolved from the estimator alone, before any job: its id, settings, model, compile
    arguments, start state (its optimizer state may be None: :class:`_FitRequest` has the one trained
    from), task, losses (one :class:`~sparkdl.keras.losses.LossInfo` per output), callbacks and
    trackers. Neither the DataFrame nor its session: those, and what they decide, are in :class:`_FitRequest`."""

    fit_id: str
    config: FitConfig
    spec: object
    compile_spec: object
    start: ModelState
    task: str
    loss: list
    callbacks: list
    trackers: list


@dataclass
class _FitRequest:
    """What the DataFrame and its session added to the settings before any job (driver-side; never
    travels to a task): the fit's :class:`~sparkdl.spark.plan.FitPlan` (its session's facts, read
    once), the columns, the metric reader, the backend and the start state; ``cluster`` is the plan's
    cluster facts as the backend's checks left them (their task slots counted again while executors
    registered)."""

    backend: str
    backend_reason: str
    start: ModelState
    request: object
    reader: object
    trainable: tuple
    train_df: DataFrame
    validation_df: DataFrame | None
    budget: int
    plan: FitPlan
    cluster: object
    state_bytes: int

def fit_seconds(marks: dict, first_round: float, rounds_total: float, first_round_end: float | None,
                round_seconds: list[float]) -> dict:
    """Where a fit's time went, in seconds (floats, 3 decimals), for ``fitInfo["seconds"]``.

    ``checks`` (settings, model, compile dry run, transport preflight: no job), ``prepare_data``
    (the check and caching jobs), ``first_round`` (the first round: replicas built, partitions
    converted, τ steps), ``other_rounds``, ``train`` (the driver loop with its transport's start
    and end, validation, callbacks), ``first_step`` (from ``fit()`` to the workers' first step:
    the end of the first round less a steady round's time, the median of the others; with one
    round, to its end), ``total``.

    Args:
        marks: ``time.perf_counter()`` at ``started``, ``checked``, ``prepared`` and ``trained``.
        first_round: the first round's seconds; ``rounds_total``: the epochs' seconds summed.
        first_round_end: ``time.perf_counter()`` when the first round came back (None: no round ran).
        round_seconds: every round's seconds, in order.
    """
    started = marks["started"]
    steady = float(np.median(round_seconds[1:])) if len(round_seconds) > 1 else 0.0
    first_step = max(0.0, first_round_end - started - steady) if first_round_end is not None else marks["trained"] - started
    return {
        "checks": round(marks["checked"] - started, 3),
        "prepare_data": round(marks["prepared"] - marks["checked"], 3),
        "first_step": round(first_step, 3),
        "first_round": round(first_round, 3),
        "other_rounds": round(max(0.0, rounds_total - first_round), 3),
        "train": round(marks["trained"] - marks["prepared"], 3),
        "total": round(time.perf_counter() - started, 3),
    }


def keyword_only(func):
    """pyspark's ``keyword_only`` (the keywords kept in ``self._input_kwargs``) with a message that
    names the keyword form: positional arguments raise :class:`~sparkdl.errors.KeywordArgumentsError`
    (a ``TypeError`` too, as pyspark's bare "forces keyword arguments" was)."""

    @functools.wraps(func)
    def wrapper(self, *args, **kwargs):
        if args:
            owner = type(self).__name__
            call = owner if func.__name__ == "__init__" else f"{owner}.{func.__name__}"
            example = (f"{owner}(model=model, loss='mse', featuresCol='features', labelCol='label', epochs=5)"
                       if func.__name__ == "__init__" else f"est.{func.__name__}(epochs=5, batchSize=64)")
            shown = ", ".join(type(a).__name__ if hasattr(a, "get_config") else repr(a)[:40] for a in args)
            raise KeywordArgumentsError(
                f"{call} takes keyword arguments only, each Param by its name: {example} (every keyword: the class "
                f"docstring, docs/reference/params.md). Received: {len(args)} positional argument{'s' if len(args) > 1 else ''} "
                f"({shown})"
            )
        self._input_kwargs = kwargs
        return func(self, **kwargs)

    return wrapper


class KerasEstimator(Estimator, KerasEstimatorParams, KerasStageIO):
    """Spark ML Estimator that trains a Keras 3 model on a DataFrame across Spark executors.

    ``fit(df)`` runs ``numWorkers`` model replicas, one Spark task each, on ``numWorkers``
    partitions of ``df``. In mode ``sync`` (SparkNet model averaging; Moritz et al., ICLR 2016)
    every replica runs τ = ``localSteps`` local steps from the master weights, then the driver
    averages weights and optimizer state weighted by the rows each replica trained on. With
    ``localSteps=None`` a round is one pass over each partition, i.e. one round per epoch.
    ``numWorkers=1`` with ``keepPartitioning=True`` is exactly ``keras.Model.fit`` on the same batches.

    Every Param is a keyword of the constructor and of :meth:`setParams`, with a ``getX`` and a
    ``setX`` method; the fitted :class:`KerasModel` carries every Param with the value it was fitted
    with. The Params are declared once in :mod:`sparkdl.param_specs`, and the entries below are
    generated from the declarations (the docs' Params table and the job config's keys too).

    Args:
        <generated from sparkdl.param_specs>

    Raises (from ``fit``, before any training job):
        ConfigError: a streaming DataFrame, a missing model or loss, a Param out of range,
            ``handleInvalid="keep"``, ``classWeight`` with ``sampleWeightCol``, two validation sources.
        SchemaError: a missing or mistyped column, an input or output without a column, nulls or
            NaN (``handleInvalid="error"``), a feature length that does not match the model input,
            labels that do not fit the output or the loss, negative weights, a decoder's wrong
            output, or an empty DataFrame.

    Raises (from the constructor and :meth:`setParams`):
        ConfigError: an unknown keyword (named with the closest valid one), or a Param value of the
            wrong type (named with its rule and the value received).
        KeywordArgumentsError: positional arguments (a ``ConfigError`` and a ``TypeError``),
            naming the keyword form.

    Example:
        >>> est = KerasEstimator(model=model, optimizer="adam", loss="sparse_categorical_crossentropy",
        ...                      metrics=["accuracy"], featuresCol="pixels", labelCol="label",
        ...                      numWorkers=2, epochs=5, batchSize=64)
        >>> fitted = est.fit(train_df)
        >>> fitted.transform(test_df).select("label", "prediction").show()
    """

    @keyword_only
    def __init__(self, **kwargs) -> None:
        super().__init__()
        self._spec = None
        self._validation_data = None
        self._callbacks = []
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs) -> KerasEstimator:
        """Set Params by keyword (any declared Param, see the class docstring); ``model`` as in
        :meth:`setModel`, ``initialModel`` as in :meth:`setInitialModel` (applied after ``model``),
        ``customObjects`` (a dict name -> class or function, as Keras' ``custom_objects``) registered
        with Keras here and on the executors (:func:`sparkdl.keras.custom_objects.register_custom_objects`),
        ``callbacks`` as in :meth:`setCallbacks`. Compile keywords given as ``None`` are ignored.
        Returns ``self``.

        Raises:
            ConfigError: an unknown keyword (the message names it and the closest valid keyword), or
                a value of the wrong type (naming the Param, its rule and the value).
        """
        check_keywords(type(self).__name__, self._input_kwargs)
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
        ``TerminateOnNaN``, ``BackupAndRestore``, your own), on backend ``rounds`` and ``ps``. In the
        round modes ``self.model.stop_training = True`` stops every worker after the same round; in
        the asynchronous modes (``ps``) the callbacks see each epoch's end and a stop reaches every
        worker at its next slot. Not a Param: the objects stay on the driver (tasks carry plain values only, never the
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
        """Use ``model`` (a built ``keras.Model``, or the path of a ``.keras`` file written by
        ``keras.Model.save``): its architecture and current weights are the start point, with fresh
        optimizer state (an earlier :meth:`setInitialModel`'s state is dropped). A path is read once,
        here, as :meth:`KerasModel.fromKeras` reads one: a local path, or any Hadoop-filesystem URI
        (``hdfs://``, ``s3a://``, ``dbfs:/``) through the active SparkSession; the estimator keeps the
        model itself, not the path (a saved estimator holds the model).

        A compiled ``model`` supplies each compile Param not set yet (``optimizer``, ``loss``,
        ``metrics``, ``weightedMetrics``, ``lossWeights``, ``jitCompile``), as the constructor does;
        ``jitCompile`` is the value Keras resolved at compile time.

        Raises:
            ConfigError: when ``model`` is not a built Functional or Sequential ``keras.Model``, or a
                path holds no ``.keras`` file (or one naming unregistered custom objects).
        """
        import os

        from sparkdl.keras.spec import ModelSpec, compile_args_of
        from sparkdl.spark.persistence import read_keras_file

        if isinstance(model, (str, os.PathLike)):
            model = read_keras_file(model, "KerasEstimator model")
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
        """The weights and optimizer state a fit starts from: ``spec``'s weights (read-only views of
        its payload: no copy), and the initial model's optimizer state (``None``, a fresh optimizer,
        without one) checked against ``compile_spec`` on the driver, with ``compile_spec``'s learning rate.

        Raises:
            ConfigError: when the optimizer state does not fit ``compile_spec``'s optimizer.
        """
        weights = decode_arrays(spec.weights, copy=False).arrays
        if self._optimizer_state is None:
            return ModelState(weights, None)
        model = compile_spec.compile(spec.build(), self._optimizer_state, self._optimizer_state_source)
        return ModelState(weights, [variable.numpy() for variable in model.optimizer.variables])

    def getKerasModel(self):
        """A new ``keras.Model`` with the estimator's initial weights (``None`` when no model was given)."""
        return None if self._spec is None else self._spec.build()

    def _fit_config(self) -> FitConfig:
        """The validated settings of a fit (:class:`~sparkdl.config.FitConfig`), checked before any job.

        Raises:
            ConfigError: a Param out of its range, or a value that is only for the fitted model
                (``handleInvalid="keep"``: set it on the ``KerasModel``).
        """
        for spec in PARAMS:
            value = self.getOrDefault(spec.name) if self.isDefined(spec.name) else None
            if spec.fit_choices is not None and value not in spec.fit_choices:
                raise ConfigError(
                    f"{spec.name} must be one of {list(spec.fit_choices)} to fit; {value!r} is for the fitted model's "
                    f"transform: fit with one of those, then call set{spec.suffix}({value!r}) on the KerasModel. "
                    f"Received: {spec.name}={value!r}"
                )
        local_steps = self.getLocalSteps()
        if local_steps is None:
            local_steps = ASYNC_DEFAULT_LOCAL_STEPS.get(self.getMode())  # None for sync: one round per epoch
        config = FitConfig(
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
            data_timeout_s=self.getDataTimeout(),
            checkpoint_dir=self.getCheckpointDir(),
            checkpoint_every=self.getCheckpointEvery(),
            server_tls=self.getServerTls(),
            server_cert_file=self.getServerCertFile(),
            server_key_file=self.getServerKeyFile(),
            keep_local_optimizer=self.getKeepLocalOptimizer(),
            overlap=self.getOverlap(),
        )
        check_backend(config)  # what the named backend runs (the registry), before any job
        return config

    def setValidationData(self, df: DataFrame | None) -> KerasEstimator:
        """Validate on ``df`` (the model's columns, as the training DataFrame) after each epoch; None
        to stop. Not a Param: a DataFrame is not saved with the estimator. Also ``fit(df, validationData=...)``."""
        self._validation_data = df
        return self

    def fit(self, dataset: DataFrame, params=None, validationData: DataFrame | None = None):
        """``Estimator.fit``; ``validationData`` is a DataFrame validated on after each epoch (see
        :meth:`setValidationData`): the history gets ``val_*`` keys.

        Raises:
            ConfigError: ``dataset`` is not a Spark DataFrame (a pandas one: the message says
                ``spark.createDataFrame(pandas_df)``) or is a streaming one (both checked first,
                before any job), and the errors listed in the class docstring.
        """
        check_dataframe(dataset, "KerasEstimator.fit")  # a pandas DataFrame, a path: before anything else
        if dataset.isStreaming:
            raise ConfigError(
                "KerasEstimator.fit needs a batch DataFrame: training makes several passes (epochs) over a fixed set of "
                "rows, which a stream does not have. To train on a stream, fit each micro-batch in "
                "writeStream.foreachBatch(lambda batch_df, batch_id: ...), continuing from the previous model with "
                "initialModel. Received: a streaming DataFrame (isStreaming=True)"
            )
        if validationData is None:
            return super().fit(dataset, params)
        # A copy (same uid, Params, model and optimizer state) holds it, so this estimator is never
        # changed, not even for a moment: a concurrent fit of it (CrossValidator) never sees it.
        estimator = self.copy()
        estimator._validation_data = validationData
        return Estimator.fit(estimator, dataset, params)

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
                self.getSampleWeightCol(), self.getClassWeight(), self.getDecoders(), self.getHandleInvalid(), self.getPadValue(),
            )
            for (_, output_shape, label_col), (label_shape, _), info in zip(
                    request.outputs, request.label_specs(df, loss), request.output_losses(loss), strict=True):
                if label_shape == ():
                    info.check_label_shape(label_col, (), output_shape)
        except SchemaError as exc:
            raise SchemaError(f"validationData: {exc}") from exc

    def _policy(self, mode: str, trainable: list[bool], workers: int):
        """The mode's policy for ``workers`` workers, built by its class from the Params it declares
        (:meth:`~sparkdl.core.modes.base.Mode.build`).

        Raises:
            ConfigError: a setting out of its range (η outside [0, 1), ζ <= 0, α·workers >= 1).
        """
        params = {name: self.getOrDefault(self.getParam(name)) for name in policy_class(mode).PARAMS}
        return build_policy(mode, params, trainable=list(trainable), workers=workers)

    def _fit(self, dataset: DataFrame) -> KerasModel:
        from sparkdl.keras.callbacks import abort_all, exclusive
        from sparkdl.spark.console import progress_bar_hidden

        observers: list = []  # this fit's progress display and trackers: stopped, closed, ended as failed if it fails
        # a callback object serves one fit at a time; Spark's stage bars stay off the fit's own progress lines
        fit_ids: list[str] = []  # the fit's id once its checks made one: an interrupt cancels its jobs by tag
        with exclusive(self._callbacks), progress_bar_hidden(dataset.sparkSession, hide=self.getVerbose() > 0):
            try:
                return self._fit_exclusive(dataset, observers, fit_ids)
            except KeyboardInterrupt as exc:  # Ctrl-C, a notebook's stop: no job left running, said in words
                error = exc if isinstance(exc, FitCancelledError) else interrupted_fit(dataset.sparkSession, fit_ids[0] if fit_ids else None)
                abort_all(observers)
                if error is exc:
                    raise
                raise error from exc
            except BaseException:
                abort_all(observers)
                raise

    def _fit_exclusive(self, dataset: DataFrame, observers: list, fit_ids: list | None = None) -> KerasModel:
        """The fit as named steps: check everything that can be checked without a job, prepare the
        data (the check and caching jobs), train (the driver loop over a transport), and make the
        fitted model. The fit's id is appended to ``fit_ids`` once made."""
        seconds = {"started": time.perf_counter()}
        settings = self._settings(observers)
        request = self._check(dataset, settings)
        if fit_ids is not None:
            fit_ids.append(settings.fit_id)
        seconds["checked"] = time.perf_counter()
        data, validation = self._prepare(settings, request)
        try:
            seconds["prepared"] = time.perf_counter()
            job, fit, loop = self._train(settings, request, data, validation, observers)
            seconds["trained"] = time.perf_counter()
        finally:
            data.df.unpersist()
            if validation is not None:
                validation.df.unpersist()
        return self._fitted_model(settings, request, job, fit, loop, seconds)

    # ---- step 1: everything checked before any job -------------------------------------------

    def _settings(self, observers: list) -> _FitSettings:
        """Resolve and check what the estimator alone decides, before the session is read and any
        job: the settings, model, compile arguments, task, losses and callbacks; start the trackers
        (an MLflow run).

        Raises:
            ConfigError: see the class docstring.
        """
        from sparkdl.keras.callbacks import check_callbacks
        from sparkdl.keras.spec import infer_task

        config = self._fit_config()
        if self._spec is None:
            raise ConfigError("KerasEstimator needs a model: pass model=keras_model or call setModel(). Received: no model")
        if not self.isDefined(self.loss):
            raise ConfigError("KerasEstimator needs a loss (a name, a keras.losses.Loss or a config). Received: no loss")
        compile_spec = self._compile_spec()
        spec = self._spec
        output_names = [name for name, _ in spec.output_specs]
        compile_spec.check_outputs(output_names)  # per-output losses, weights and metrics against the outputs, before any job
        start = self._initial_state(spec, compile_spec)  # before any job; raises ConfigError
        if len(spec.output_specs) > 1 and self.getOutputCols() is not None:  # transform's columns, checked now
            from sparkdl.spark.inference import output_columns

            output_columns(spec, self.getOutputCols())
        user_callbacks = check_callbacks(self._callbacks)
        trackers = self._trackers(observers)  # TensorBoard and MLflow, checked (and the MLflow run started) before any job
        task = infer_task(self.getTask(), compile_spec)
        loss = compile_spec.output_losses(output_names)  # one LossInfo per output, in output order
        for (name, shape), info in zip(spec.output_specs, loss, strict=True):
            if info.infer_task(task) == "classification" and len(shape) != 1:
                raise ConfigError(
                    f"a classifier must output shape (classes,) per row. Received: {tuple(shape)}"
                    + (f" for output {name!r}" if len(output_names) > 1 else "") + "; pass task='regression' to get the raw outputs"
                )
        if self.getFeaturesCols() is not None and self.isSet(self.featuresCol):
            warnings.warn(f"featuresCols is set: it replaces featuresCol={self.getFeaturesCol()!r}", stacklevel=3)
        return _FitSettings(fit_id=uuid.uuid4().hex, config=config, spec=spec, compile_spec=compile_spec, start=start, task=task,
                            loss=loss, callbacks=user_callbacks, trackers=trackers)

    def _check(self, dataset: DataFrame, settings: _FitSettings) -> _FitRequest:
        """Read the session once (:class:`~sparkdl.spark.plan.FitPlan`) and check what the DataFrame
        and its cluster decide before any Spark job: the executors' Python, the session's settings,
        the columns, the validation rows, the compile arguments on one dummy row, the backend.

        Raises:
            ConfigError, SchemaError: see the class docstring.
        """
        from sparkdl.keras.metrics import MetricReader
        from sparkdl.spark.backends import backend, preflight

        config, spec, compile_spec, loss, start = settings.config, settings.spec, settings.compile_spec, settings.loss, settings.start
        if config.overlap:  # its sync points are the rounds after a snapshot at an epoch's end or every checkpointEvery rounds
            for callback in settings.callbacks:
                if type(callback).__name__ == "BackupAndRestore" and getattr(callback, "save_freq", "epoch") != "epoch":
                    raise ConfigError(f"overlap waits for the exchange after snapshots at epoch ends (or every checkpointEvery "
                                      f"rounds), so a resumed fit equals an uninterrupted one: use BackupAndRestore(save_freq='epoch') "
                                      f"or checkpointDir with checkpointEvery. Received: BackupAndRestore(save_freq="
                                      f"{callback.save_freq!r}) with overlap=True")
        plan = FitPlan.read(dataset.sparkSession, self.getMaxTaskMemoryMB())  # the session's facts, once
        check_workers_python(plan.python_exec, plan.master, plan.ships_files)  # a local master's workers without sparkdl: said now
        prepare_workers(plan)  # a plain local session's later workers fork from sparkdl's daemon (TensorFlow imported)
        for problem in plan.warnings:  # Python workers not reused; GPUs shared or switched by tasks
            warnings.warn(problem, stacklevel=3)
        request = request_columns(
            dataset, spec, loss, self.getFeaturesCol(), self.getFeaturesCols(), self.getLabelCol(), self.getLabelCols(),
            self.getSampleWeightCol(), self.getClassWeight(), self.getDecoders(), self.getHandleInvalid(), self.getPadValue(),
        )
        label_specs = request.label_specs(dataset, loss)
        for (_, output_shape, label_col), (label_shape, _), info in zip(request.outputs, label_specs, loss, strict=True):
            if label_shape == ():  # a scalar column's per-row shape is known from the schema: check it now
                info.check_label_shape(label_col, (), output_shape)
        train_df, validation_df = training_and_validation(dataset, request, config.seed, getattr(self, "_validation_data", None),
                                                          self.getValidationCol(), self.getValidationSplit())
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
        if validation_df is not None and plan.connect:
            check_inline_bytes(len(spec.weights), plan.inline_limit, "the master weights to validate")
        choice, cluster, state_bytes = preflight(plan, config, reader.model, validation_df is not None)  # auto's choice; ps, sharded: slots, reachability; rounds: result sizes
        if not backend(choice.backend).sliced:  # the driver's master: arrays of its own, and a fresh optimizer's state to begin with
            start = ModelState([np.array(w) for w in start.weights],
                               start.optimizer if start.optimizer is not None else initial_optimizer(reader.model))
        # (sliced: the driver only serves the start, read-only views of the spec's payload, and each owner takes its
        # replica's fresh optimizer state)
        return _FitRequest(
            backend=choice.backend, backend_reason=choice.reason, start=start, request=request, reader=reader,
            trainable=tuple(trainable), train_df=train_df, validation_df=validation_df, budget=plan.budget, plan=plan,
            cluster=cluster, state_bytes=state_bytes,
        )

    # ---- step 2: the data -------------------------------------------------------------------

    def _prepare(self, settings: _FitSettings, request: _FitRequest):
        """The check and caching jobs of the training (and validation) data; warnings about what
        they found. The data jobs read the whole input: they are bounded by ``dataTimeout``, not
        by ``roundTimeout``.

        Raises:
            SchemaError: what the check job found (nulls, NaN, lengths, labels, weights, no rows).
        """
        from sparkdl.keras.custom_objects import registered
        from sparkdl.spark.training.tasks import warm_replica

        config, plan = settings.config, request.plan

        def check_job(action, description):
            return run_job(plan.spark, action, description, f"sparkdl-{settings.fit_id}-check", config.data_timeout_s)

        warm = None
        if not registered():  # the check tasks build (and trace) the replica the training tasks of their Python worker reuse
            warm = functools.partial(warm_replica, settings.spec.architecture_only(), settings.compile_spec, config.seed,
                                     config.mixed_precision, None if plan.task_gpus else request.reader.row_specs, config.batch_size)
        columns = request.request  # no warm-up step on a GPU a worker may never train on (above)
        modules = tuple(sorted({getattr(obj, "__module__", None) or "__main__" for obj in registered().values()} - {"__main__"}))
        if modules:  # the check tasks import them: a module the executors lack fails the fit at once, not after retries
            columns = dataclasses.replace(columns, custom_modules=modules)
        prepared = prepare(request.train_df, request.validation_df, columns, settings.loss, settings.task, config.num_workers,
                           keep_partitioning=config.keep_partitioning, run_job=check_job, warm=warm)
        for warning in prepared.warnings:
            warnings.warn(warning, stacklevel=4)
        workers = len(prepared.data.partition_rows)
        if config.min_workers_per_round is not None and config.min_workers(workers) >= workers:
            warnings.warn(f"minWorkersPerRound={config.min_workers_per_round!r} asks for all {workers} workers: every round "
                          "waits for every worker (no straggler is dropped)", stacklevel=4)
        return prepared.data, prepared.validation

    # ---- step 3: the driver loop -------------------------------------------------------------

    def _train(self, settings: _FitSettings, request: _FitRequest, data, validation, observers: list):
        """Build the fit's job, policy, transport, callbacks, validator and snapshots, and run the
        driver loop. Returns ``(job, final fit state, loop)``."""
        from sparkdl.keras.callbacks import DriverCallbacks
        from sparkdl.keras.custom_objects import registered
        from sparkdl.keras.progress import FitProgress
        from sparkdl.spark.training import faults
        from sparkdl.spark.training.checkpoint import Snapshots
        from sparkdl.spark.training.loop import TrainingLoop
        from sparkdl.spark.training.validation import Validator
        from sparkdl.spark.backends import get_transport
        from sparkdl.spark.training.contract import TransportOptions

        config, fit_id = settings.config, settings.fit_id
        workers = len(data.partition_rows)
        policy = self._policy(config.mode, list(request.trainable), workers)
        plan = RoundPlan(data.partition_rows, config.batch_size, config.local_steps)
        job = TrainJob(fit_id, settings.spec, settings.compile_spec, data, plan, config, request.reader,
                       names=tuple(decode_arrays(settings.spec.weights, copy=False).names), trainable=request.trainable,
                       validation=validation, budget_bytes=request.budget, custom_objects=registered(), hooks=faults.active(),
                       cluster=request.cluster, state_bytes=request.state_bytes)
        asynchronous = policy.asynchronous
        snapshots = Snapshots(request.plan.spark, fit_identity(job, policy), config.checkpoint_dir, config.checkpoint_every,
                              epochs_only=asynchronous, warn_inexact=config.mode != "sync" or config.compression is not None,
                              keep_sliced=request.backend == "sharded")
        validator = Validator(request.plan.spark, validation, job.task_spec(), request.reader, config.data_timeout_s) if validation else None
        backups = any(type(c).__name__ == "BackupAndRestore" for c in settings.callbacks)
        snapshot = config.checkpoint_dir is not None or backups
        pause_at_epochs = validation is not None or (asynchronous and snapshot)
        transport = get_transport(request.backend, job, policy, TransportOptions(pause_at_epochs=pause_at_epochs, snapshots=snapshot))
        progress = [FitProgress(config.verbose, data.total_rows, f"sparkdl fit {fit_id[:8]}")]  # verbose=0: the DEBUG log only
        observers.extend(progress)
        every = [*settings.callbacks, *settings.trackers, *progress]
        reader = request.reader
        # the callbacks get the model itself when one reads it (its weights, its summary); else the metrics' probe,
        # and the driver drops the model: its weights (and its optimizer's) are not kept through the fit
        needs_model = reader.probe is None or any(getattr(c, "needs_weights", True) or getattr(c, "needs_model", False) for c in every)
        callbacks = DriverCallbacks(every, reader.model if needs_model else reader.probe, config.epochs, transport.rounds_per_epoch)
        if not needs_model:
            reader.release_model()
        log.info("fit %s: %d rows on %d workers, mode %s on backend %s (%s), %d epochs x %d rounds", fit_id[:8], data.total_rows,
                 workers, config.mode, transport.name, request.backend_reason, config.epochs, transport.rounds_per_epoch)
        if config.verbose:
            print(f"sparkdl fit {fit_id[:8]}: backend {transport.name} ({request.backend_reason})", flush=True)
        loop = TrainingLoop(job, transport, callbacks, validator, snapshots)
        fit = loop.run(FitState(identity=snapshots.identity, master=request.start))
        changed = callbacks.changed_state()  # EarlyStopping(restore_best_weights=True) and the like, at on_train_end
        if changed is not None:
            fit.master = ModelState([np.asarray(w) for w in changed.weights], fit.master.optimizer)
            fit.info["weights_from_callbacks"] = True
        check_state_dtypes(settings.start.weights, fit.master.weights, "the fitted master weights")  # float32 in, float32 out
        loop.transport_info = transport.info()
        return job, fit, loop

    # ---- step 4: the fitted model -----------------------------------------------------------

    def _fitted_model(self, settings: _FitSettings, request: _FitRequest, job, fit: FitState, loop, seconds: dict) -> KerasModel:
        config, data = settings.config, job.data
        per_row = row_bytes(data.columns)
        validation = job.validation
        info = {**fit.info, **loop.transport_info}
        first_round = info.pop("first_round_s", loop.first_round_s or 0.0)
        fit_info = {
            "fit_id": settings.fit_id,
            "rounds": fit.rounds,
            "rounds_per_epoch": job.plan.rounds_per_epoch,
            "local_steps": job.plan.tau,
            "epoch_seconds": loop.epoch_seconds,
            "epochs_run": len(loop.epoch_seconds),
            "partition_rows": list(data.partition_rows),
            "rows": data.total_rows,
            "backend": request.backend,
            "backend_reason": request.backend_reason,
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
        if fit_info.get("local_state_resets"):  # a state that lived on a lost executor: said, not left to fitInfo alone
            warnings.warn(f"{fit_info['local_state_resets']} worker attempt(s) ran on another executor than their previous one "
                          "and found none of the state a worker keeps there (its own optimizer with keepLocalOptimizer or "
                          "diloco, its carried round with overlap, its residual with compression): they started it afresh, so "
                          "this model differs from an uninterrupted fit's (fitInfo['local_state_resets'])", stacklevel=4)
        if config.min_workers(job.workers) < job.workers:
            fit_info["min_workers_per_round"] = config.min_workers(job.workers)
        fit_info["seconds"] = fit_seconds(seconds, first_round, sum(loop.epoch_seconds), loop.first_round_end, loop.round_seconds)
        spec = settings.spec
        model = KerasModel._from_fit(spec.with_weights(fit.master.weights), fit.history, fit_info,
                                     optimizer_state=fit.master.optimizer)
        self._copyValues(model)
        model._set(task=settings.task)
        if self.getLearningRate() is not None:  # the optimizer that trained: its config with the fit's rate
            model._set(optimizer=settings.compile_spec.optimizer)
        for tracker in settings.trackers:
            if hasattr(tracker, "log_model"):  # MLflow: the fitted model as an artifact folder KerasModel.load reads
                model.fitInfo["mlflow_run_id"] = tracker.run_id
                model.fitInfo["mlflow_model_uri"] = tracker.log_model(model)
        log.info("fit %s: done in %.1f s, %d rounds%s", settings.fit_id[:8], fit_info["seconds"]["total"], fit.rounds,
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
            from sparkdl.serialization.columns import decoder_name

            params = {param.name: value for param, value in self.extractParamMap().items()}
            if isinstance(params.get("decoders"), dict):  # a function by its name, as a save writes it
                params["decoders"] = {c: decoder_name(d) for c, d in params["decoders"].items()}
            trackers.append(MlflowLogger(params=params))
            observers.append(trackers[-1])
            trackers[-1].on_train_begin()
        return trackers


# The Args section of the docstring and the keywords' signature come from the Param declarations.
KerasEstimator.__doc__ = KerasEstimator.__doc__.replace("        <generated from sparkdl.param_specs>", args_docstring(indent=8))
KerasEstimator.__init__.__signature__ = keyword_signature()
KerasEstimator.setParams.__signature__ = keyword_signature()
