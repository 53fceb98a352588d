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
from sparkdl.keras.replica import initial_optimizer, trainable_mask
from sparkdl.serialization.arrow_codec import decode_arrays
from sparkdl.spark.daemon import prepare_workers
from sparkdl.spark.data import check_columns, check_dataframe, prepare
from sparkdl.spark.jobs import interrupted_fit, run_job
from sparkdl.spark.model import KerasModel
from sparkdl.param_specs import PARAMS, args_docstring, check_keywords, keyword_signature
from sparkdl.spark.params import COMPILE_PARAMS, KerasEstimatorParams
from sparkdl.spark.partitions import row_bytes
from sparkdl.spark.persistence import KerasStageIO
from sparkdl.spark.session import FitPlan
from sparkdl.spark.training.job import TrainJob

log = logging.getLogger("sparkdl")


@dataclass(frozen=True)
class _FitSettings:
    """What a fit resolved from the estimator alone, before any job: its id, settings, model, compile
    arguments, start state (its optimizer state may be None: a backend with a master on the driver
    starts from a fresh optimizer's), task, losses (one :class:`~sparkdl.keras.losses.LossInfo` per
    output), callbacks, trackers, the mode's Param values (:attr:`~sparkdl.core.modes.base.Mode.PARAMS`)
    and the column Params (:func:`~sparkdl.spark.data.map_columns`'s keywords). Neither the DataFrame
    nor its session."""

    fit_id: str
    config: FitConfig
    spec: object
    compile_spec: object
    start: ModelState
    task: str
    loss: list
    callbacks: list
    trackers: list
    mode_params: dict
    columns: dict


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

    def _fit(self, dataset: DataFrame) -> KerasModel:
        from sparkdl.keras.callbacks import abort_all, exclusive

        observers: list = []  # this fit's progress display and trackers: stopped, closed, ended as failed if it fails
        fit_ids: list[str] = []  # the fit's id once its checks made one: an interrupt cancels its jobs by tag
        with exclusive(self._callbacks):  # a callback object serves one fit at a time
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
        """The fit's steps, each handed to the module that owns it (``docs/architecture.md``, the walk).
        Before any job: the estimator's own checks (:meth:`_settings`); the session's facts, read once
        (:class:`~sparkdl.spark.session.FitPlan`); the workers' Python and daemon
        (:func:`~sparkdl.spark.daemon.prepare_workers`); the columns
        (:func:`~sparkdl.spark.data.check_columns`); the compile arguments on one dummy row
        (:class:`~sparkdl.keras.metrics.MetricReader`); the backend
        (:func:`~sparkdl.spark.backends.preflight`). Then the data's check and caching jobs
        (:func:`~sparkdl.spark.data.prepare`, bounded by ``dataTimeout``), the driver loop
        (:meth:`~sparkdl.spark.training.loop.TrainingLoop.for_fit`) and the fitted model. Spark's
        console progress bar is off while a verbose fit prints its lines. The fit's id is appended to
        ``fit_ids`` once its checks passed (its jobs' tags start with it)."""
        from sparkdl.keras.custom_objects import registered
        from sparkdl.keras.metrics import MetricReader
        from sparkdl.spark.backends import preflight
        from sparkdl.spark.internals import progress_bar_hidden
        from sparkdl.spark.training import faults
        from sparkdl.spark.training.loop import TrainingLoop
        from sparkdl.spark.training.tasks import warm_replica

        seconds = {"started": time.perf_counter()}
        settings = self._settings(observers)
        config, spec, fit_id = settings.config, settings.spec, settings.fit_id
        plan = FitPlan.read(dataset.sparkSession, self.getMaxTaskMemoryMB())  # the session's facts, once
        with progress_bar_hidden(plan.spark, hide=config.verbose > 0):  # Spark's stage bars off the fit's own lines
            prepare_workers(plan)  # the workers' Python checked; a plain local session's workers fork from sparkdl's daemon
            for problem in plan.warnings:  # Python workers not reused; GPUs shared or switched by tasks
                warnings.warn(problem, stacklevel=5)
            checked = check_columns(dataset, spec, settings.loss, settings.columns, config.seed, self._validation_data,
                                    self.getValidationCol(), self.getValidationSplit())
            # Compile arguments that cannot work (loss_weights for missing outputs, a metric that cannot read
            # these labels) fail here on one dummy row, before any Spark job; the loop reuses it.
            request = checked.request
            reader = MetricReader(spec, settings.compile_spec, [s for _, s, _, _ in request.inputs], [d for _, _, d, _ in request.inputs],
                                  [s for s, _ in checked.label_specs], [d for _, d in checked.label_specs],
                                  weighted=bool(request.weight or request.class_weight))
            trainable = trainable_mask(reader.model)
            chosen = preflight(plan, config, reader.model, checked.validation_df is not None)  # ps, sharded: slots, reachability; rounds: result sizes
            start = settings.start
            if not chosen.sliced:  # the driver's master: arrays of its own, and a fresh optimizer's state to begin with
                start = ModelState([np.array(w) for w in start.weights],
                                   start.optimizer if start.optimizer is not None else initial_optimizer(reader.model))
            if fit_ids is not None:
                fit_ids.append(fit_id)
            seconds["checked"] = time.perf_counter()
            warm = None  # the check tasks build (and trace) the replica the training tasks of their Python worker reuse,
            if not registered():  # not on a GPU a worker may never train on
                warm = functools.partial(warm_replica, spec.architecture_only(), settings.compile_spec, config.seed,
                                         config.mixed_precision, None if plan.task_gpus else reader.row_specs, config.batch_size)
            modules = tuple(sorted({getattr(obj, "__module__", None) or "__main__" for obj in registered().values()} - {"__main__"}))
            # the check tasks import them: a module the executors lack fails the fit at once, not after retries
            check_job = functools.partial(run_job, plan.spark, tag=f"sparkdl-{fit_id}-check", timeout_s=config.data_timeout_s)
            prepared = prepare(checked.train_df, checked.validation_df, dataclasses.replace(request, custom_modules=modules),
                               settings.loss, settings.task, config.num_workers, keep_partitioning=config.keep_partitioning,
                               run_job=check_job, warm=warm)
            data, validation = prepared.data, prepared.validation
            workers = len(data.partition_rows)
            try:
                for warning in prepared.warnings:
                    warnings.warn(warning, stacklevel=5)
                if config.min_workers_per_round is not None and config.min_workers(workers) >= workers:
                    warnings.warn(f"minWorkersPerRound={config.min_workers_per_round!r} asks for all {workers} workers: every round "
                                  "waits for every worker (no straggler is dropped)", stacklevel=5)
                seconds["prepared"] = time.perf_counter()
                job = TrainJob(fit_id, spec, settings.compile_spec, data, RoundPlan(data.partition_rows, config.batch_size, config.local_steps),
                               config, reader, names=tuple(decode_arrays(spec.weights, copy=False).names), trainable=tuple(trainable),
                               validation=validation, budget_bytes=plan.budget, custom_objects=registered(), hooks=faults.active(),
                               cluster=chosen.cluster, state_bytes=chosen.state_bytes)
                policy = build_policy(config.mode, settings.mode_params, trainable=list(trainable), workers=workers)
                loop = TrainingLoop.for_fit(job, policy, chosen.backend, chosen.reason, [*settings.callbacks, *settings.trackers], observers)
                fit = loop.train(start)
                seconds["trained"] = time.perf_counter()
            finally:
                data.df.unpersist()
                if validation is not None:
                    validation.df.unpersist()
        return self._fitted_model(settings, chosen, job, fit, loop, seconds)

    # ---- what the estimator alone decides, before the session is read ---------------------------

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
        if config.overlap:  # its sync points are the rounds after a snapshot at an epoch's end or every checkpointEvery rounds
            for callback in user_callbacks:
                if type(callback).__name__ == "BackupAndRestore" and getattr(callback, "save_freq", "epoch") != "epoch":
                    raise ConfigError(f"overlap waits for the exchange after snapshots at epoch ends (or every checkpointEvery "
                                      f"rounds), so a resumed fit equals an uninterrupted one: use BackupAndRestore(save_freq='epoch') "
                                      f"or checkpointDir with checkpointEvery. Received: BackupAndRestore(save_freq="
                                      f"{callback.save_freq!r}) with overlap=True")
        mode_params = {name: self.getOrDefault(self.getParam(name)) for name in policy_class(config.mode).PARAMS}
        # the mode's settings checked now (η outside [0, 1), ζ <= 0, α·workers >= 1); built again once the workers are counted
        build_policy(config.mode, mode_params, trainable=[True] * len(start.weights), workers=config.num_workers)
        columns = dict(features_col=self.getFeaturesCol(), features_cols=self.getFeaturesCols(), label_col=self.getLabelCol(),
                       label_cols=self.getLabelCols(), weight_col=self.getSampleWeightCol(), class_weight=self.getClassWeight(),
                       decoders=self.getDecoders(), handle_invalid=self.getHandleInvalid(), pad_value=self.getPadValue())
        return _FitSettings(fit_id=uuid.uuid4().hex, config=config, spec=spec, compile_spec=compile_spec, start=start, task=task,
                            loss=loss, callbacks=user_callbacks, trackers=trackers, mode_params=mode_params, columns=columns)

    # ---- the fitted model --------------------------------------------------------------------

    def _fitted_model(self, settings: _FitSettings, chosen, job, fit: FitState, loop, seconds: dict) -> KerasModel:
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
            "backend": chosen.backend,
            "backend_reason": chosen.reason,
            "mode": config.mode,
            "compression": config.compression,
            "rows_skipped": data.skipped,
            "validation_rows": validation.total_rows if validation is not None else 0,
            "validation_rows_skipped": validation.skipped if validation is not None else 0,
            "task_budget_bytes": job.budget_bytes,
            "partitions_on_disk": sum(1 for n in data.partition_rows if n * per_row > job.budget_bytes),
            **info,
        }
        if config.compression == "threshold":
            fit_info["compression_threshold"] = config.compression_threshold
        if fit_info.get("local_state_resets"):  # a state that lived on a lost executor: said, not left to fitInfo alone
            warnings.warn(f"{fit_info['local_state_resets']} worker attempt(s) ran on another executor than their previous one "
                          "and found none of the state a worker keeps there (its own optimizer with keepLocalOptimizer or "
                          "diloco, its carried round with overlap, its residual with compression): they started it afresh, so "
                          "this model differs from an uninterrupted fit's (fitInfo['local_state_resets'])", stacklevel=5)
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
