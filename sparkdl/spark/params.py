"""Spark ML Params of the Keras estimator and model, as shared ``Has*`` mixins.

Column Params reuse pyspark's own mixins; compile Params hold Keras serialization configs
(JSON-able), so ``DefaultParamsWriter`` can store them in the stage's metadata.
"""

from __future__ import annotations

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasRawPredictionCol,
    HasSeed,
)

from sparkdl.errors import ConfigError

TASKS = ("auto", "classification", "regression")
# ``keras.Model.compile`` argument -> the Param that holds it.
COMPILE_PARAMS = {
    "optimizer": "optimizer",
    "loss": "loss",
    "metrics": "metrics",
    "weighted_metrics": "weightedMetrics",
    "loss_weights": "lossWeights",
    "jit_compile": "jitCompile",
}
SCORE_COLUMN_TYPES = ("vector", "array")


def _optional_int(value):
    return None if value is None else TypeConverters.toInt(value)


def _compile_converter(kind: str):
    def convert(value):
        from sparkdl.keras import spec

        return getattr(spec, f"normalize_{kind}")(value)

    return convert


def _choice(name: str, choices):
    def convert(value):
        value = TypeConverters.toString(value)
        if value not in choices:
            raise ConfigError(f"{name} must be one of {list(choices)}. Received: {value!r}")
        return value

    return convert


def _features_cols(value):
    """``featuresCols``: None, a list of column names (assembled into the one model input, in
    order) or a dict model input name -> a column name or a list of them."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        out = {}
        for name, cols in value.items():
            cols = [cols] if isinstance(cols, str) else cols
            if not isinstance(cols, (list, tuple)) or not cols or not all(isinstance(c, str) for c in cols):
                raise ConfigError(f"featuresCols must map each model input name to a column name or a list of them. Received: {value!r}")
            out[str(name)] = list(cols)
        if not out:
            raise ConfigError("featuresCols must name at least one column. Received: {}")
        return out
    if isinstance(value, (list, tuple)) and value and all(isinstance(c, str) for c in value):
        return list(value)
    raise ConfigError(f"featuresCols must be a list of column names or a dict input name -> column(s). Received: {value!r}")


def _label_cols(value):
    """``labelCols``: None, a list of columns (one per model output, in output order) or a dict
    output name -> column."""
    if value is None:
        return None
    if isinstance(value, dict) and value and all(isinstance(k, str) and isinstance(c, str) for k, c in value.items()):
        return dict(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(c, str) for c in value):
        return list(value)
    raise ConfigError(f"labelCols must be a list of column names or a dict output name -> column. Received: {value!r}")


def _class_weight(value):
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"classWeight must be a dict class index -> weight, as Keras' class_weight. Received: {value!r}")
    out = {}
    for k, v in value.items():
        try:
            index, weight = int(k), float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"classWeight must map integer class indices to numbers. Received: {value!r}") from None
        if index < 0 or not weight >= 0 or weight == float("inf"):
            raise ConfigError(f"classWeight must map class indices >= 0 to finite weights >= 0. Received: {k!r}: {v!r}")
        out[index] = weight
    return out


def _decoders(value):
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) and ":" in v for k, v in value.items()):
        raise ConfigError(f"decoders must map column names to 'module:function' names. Received: {value!r}")
    return dict(value)


def _optional_fraction(value):
    value = TypeConverters.toFloat(value)
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"validationSplit must be a fraction in [0, 1). Received: {value!r}")
    return value


def _workers_count_or_fraction(value):
    """None, an int count (kept an int) or a float fraction (kept a float): the type carries the meaning."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise TypeError(f"minWorkersPerRound must be None, an int count or a float fraction. Received: {value!r}")


def _optional_string(value):
    return None if value is None else TypeConverters.toString(value)


def _optional_positive_float(value):
    if value is None:
        return None
    value = TypeConverters.toFloat(value)
    if not value > 0:
        raise ConfigError(f"maxTaskMemoryMB must be > 0 (MB). Received: {value}")
    return value


def _output_cols(value):
    if value is None:
        return None
    if isinstance(value, dict) and value and all(isinstance(k, str) and isinstance(c, str) for k, c in value.items()):
        return dict(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(c, str) for c in value):
        return list(value)
    raise ConfigError(f"outputCols must be a list of column names or a dict output name -> column. Received: {value!r}")


class HasInputColumns(Params):
    """Where a model's inputs come from, besides ``featuresCol``: several columns and binary decoders."""

    featuresCols = Param(
        Params._dummy(), "featuresCols",
        "columns of the model input instead of featuresCol: a list of columns (scalars, arrays or vectors) "
        "concatenated per row in the given order into the one input, or a dict model input name -> column "
        "(or list of columns) for multi-input models; each cast to its input's dtype",
        _features_cols,
    )
    decoders = Param(
        Params._dummy(), "decoders",
        "binary columns' decoders: dict column -> 'module:function', a function importable on the executors "
        "that turns one row's bytes into a numeric array of the input's shape",
        _decoders,
    )

    outputCols = Param(
        Params._dummy(), "outputCols",
        "transform of a multi-output model: the column of each output, a list in output order or a dict output name -> "
        "column (default: each output's name)",
        _output_cols,
    )

    def getOutputCols(self):
        return self.getOrDefault(self.outputCols)

    def setOutputCols(self, value):
        return self._set(outputCols=value)

    def getFeaturesCols(self):
        return self.getOrDefault(self.featuresCols)

    def setFeaturesCols(self, value):
        return self._set(featuresCols=value)

    def getDecoders(self):
        return self.getOrDefault(self.decoders)

    def setDecoders(self, value):
        return self._set(decoders=value)


# inferenceBatchSize=None: rows per predict call so that one batch's input is about this many bytes,
# within [batchSize, INFERENCE_BATCH_MAX] (on 2 CPU cores the mnist CNN scores fastest at 512-2048 rows).
INFERENCE_BATCH_BYTES = 4 << 20
INFERENCE_BATCH_MAX = 2048


def _positive_int_or_none(name: str):
    def convert(value):
        if value is None:
            return None
        value = TypeConverters.toInt(value)
        if value <= 0:
            raise ConfigError(f"{name} must be a positive number of rows, or None. Received: {value!r}")
        return value

    return convert


class HasBatchSize(Params):
    batchSize = Param(Params._dummy(), "batchSize", "rows per training step (> 0)", TypeConverters.toInt)
    inferenceBatchSize = Param(
        Params._dummy(), "inferenceBatchSize",
        "rows per predict call in transform (> 0; evaluate uses batchSize); None: as many rows as make about 4 MiB of input, "
        "between batchSize and 2048",
        _positive_int_or_none("inferenceBatchSize"),
    )

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

    def setBatchSize(self, value: int):
        return self._set(batchSize=value)

    def getInferenceBatchSize(self) -> int | None:
        return self.getOrDefault(self.inferenceBatchSize)

    def setInferenceBatchSize(self, value: int | None):
        return self._set(inferenceBatchSize=value)

    def _inference_rows(self, row_bytes: int) -> int:
        """Rows per predict call: ``inferenceBatchSize``, or for None about 4 MiB of ``row_bytes``-byte
        input rows, at least ``batchSize`` and at most 2048."""
        rows = self.getInferenceBatchSize()
        if rows is not None:
            return rows
        return max(self.getBatchSize(), min(INFERENCE_BATCH_MAX, INFERENCE_BATCH_BYTES // max(1, row_bytes)))


class HasTask(Params):
    task = Param(
        Params._dummy(),
        "task",
        "'classification' (prediction = class index, probability = class scores), 'regression' "
        "(prediction = output value) or 'auto' (classification for cross-entropy and hinge losses)",
        _choice("task", TASKS),
    )

    def getTask(self) -> str:
        return self.getOrDefault(self.task)

    def setTask(self, value: str):
        return self._set(task=value)


class HasCompileParams(Params):
    """Keras compile arguments: each a built-in name, a Keras object (stored as its config) or a config dict."""

    optimizer = Param(Params._dummy(), "optimizer", "Keras optimizer: name, object or config", _compile_converter("optimizer"))
    loss = Param(Params._dummy(), "loss", "Keras loss: name, object or config", _compile_converter("loss"))
    metrics = Param(Params._dummy(), "metrics", "Keras metrics: list of names, objects or configs", _compile_converter("metrics"))

    def getOptimizer(self):
        return self.getOrDefault(self.optimizer)

    def getLoss(self):
        return self.getOrDefault(self.loss)

    def getMetrics(self) -> list:
        return self.getOrDefault(self.metrics)

    def setOptimizer(self, value):
        return self._set(optimizer=value)

    def setLoss(self, value):
        return self._set(loss=value)

    def setMetrics(self, value):
        return self._set(metrics=value)


def _compile_spec_converter(name: str):
    def convert(value):
        from sparkdl.keras.spec import CompileSpec

        return getattr(CompileSpec, f"normalize_{name}")(value)

    return convert


class HasCompileOptions(Params):
    """The other kept ``keras.Model.compile`` arguments: ``weighted_metrics``, ``loss_weights``, ``jit_compile``.

    Stored as JSON-able Params, so ``save``/``load`` keep them, and sent to the executors in the
    :class:`~sparkdl.keras.spec.CompileSpec` that :meth:`_compile_spec` builds.
    """

    weightedMetrics = Param(
        Params._dummy(), "weightedMetrics", "Keras weighted_metrics: list of names, objects or configs", _compile_converter("metrics")
    )
    lossWeights = Param(
        Params._dummy(), "lossWeights", "Keras loss_weights: None, a float, a list of floats or a dict output name -> float",
        _compile_spec_converter("loss_weights"),
    )
    jitCompile = Param(
        Params._dummy(), "jitCompile", "Keras jit_compile: True, False or 'auto' (XLA compilation of the train step)",
        _compile_spec_converter("jit_compile"),
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(weightedMetrics=[], lossWeights=None, jitCompile="auto")

    def getWeightedMetrics(self) -> list:
        return self.getOrDefault(self.weightedMetrics)

    def getLossWeights(self):
        return self.getOrDefault(self.lossWeights)

    def getJitCompile(self):
        return self.getOrDefault(self.jitCompile)

    def setWeightedMetrics(self, value):
        return self._set(weightedMetrics=value)

    def setLossWeights(self, value):
        return self._set(lossWeights=value)

    def setJitCompile(self, value):
        return self._set(jitCompile=value)

    def _compile_spec(self):
        """The :class:`~sparkdl.keras.spec.CompileSpec` of every kept compile Param (``loss`` must be defined)."""
        from sparkdl.keras.spec import CompileSpec

        return CompileSpec(
            self.getOrDefault("optimizer"), self.getOrDefault("loss"), tuple(self.getOrDefault("metrics")),
            tuple(self.getWeightedMetrics()), self.getLossWeights(), self.getJitCompile(),
        )


class HasScoreColumnType(Params):
    scoreColumnType = Param(
        Params._dummy(),
        "scoreColumnType",
        "type of the rawPrediction and probability columns: 'vector' (pyspark.ml.linalg DenseVector, as Spark's "
        "classifiers write them and its evaluators read them) or 'array' (array<double>)",
        _choice("scoreColumnType", SCORE_COLUMN_TYPES),
    )

    def getScoreColumnType(self) -> str:
        return self.getOrDefault(self.scoreColumnType)

    def setScoreColumnType(self, value: str):
        return self._set(scoreColumnType=value)


class HasCheckFeatures(Params):
    checkFeatures = Param(
        Params._dummy(),
        "checkFeatures",
        "transform counts null and wrongly sized feature rows over the whole input in one Spark-SQL pass "
        "when it is called, and raises SchemaError with the counts (True, default); False keeps transform "
        "fully lazy: a bad row then fails its task with SchemaError naming the partition and batch",
        TypeConverters.toBoolean,
    )

    def getCheckFeatures(self) -> bool:
        return self.getOrDefault(self.checkFeatures)

    def setCheckFeatures(self, value: bool):
        return self._set(checkFeatures=value)


class KerasSharedParams(
    HasFeaturesCol, HasInputColumns, HasPredictionCol, HasRawPredictionCol, HasProbabilityCol, HasScoreColumnType, HasBatchSize, HasTask, HasCompileParams,
    HasCompileOptions, HasCheckFeatures,
):
    """Params that the estimator and its fitted model share (copied from one to the other on fit)."""

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            featuresCol="features",
            predictionCol="prediction",
            rawPredictionCol="rawPrediction",
            probabilityCol="probability",
            scoreColumnType="vector",
            checkFeatures=True,
            featuresCols=None,
            outputCols=None,
            decoders=None,
            batchSize=32,
            inferenceBatchSize=None,
            task="auto",
            optimizer="adam",
            metrics=[],
        )

    def setFeaturesCol(self, value: str):
        return self._set(featuresCol=value)

    def setPredictionCol(self, value: str):
        return self._set(predictionCol=value)

    def setProbabilityCol(self, value: str):
        return self._set(probabilityCol=value)

    def setRawPredictionCol(self, value: str):
        return self._set(rawPredictionCol=value)


class HasEvaluationColumns(HasLabelCol):
    """The label and weight columns ``KerasModel.evaluate`` reads, as ``fit`` reads them.

    ``fit`` copies the estimator's ``labelCol``, ``labelCols`` and ``sampleWeightCol`` into the
    fitted model; a loaded or wrapped model takes them as Params too.
    """

    labelCols = Param(
        Params._dummy(), "labelCols",
        "labels of a multi-output model: a list of columns in output order or a dict output name -> column "
        "(instead of labelCol)",
        _label_cols,
    )
    sampleWeightCol = Param(
        Params._dummy(), "sampleWeightCol",
        "column of per-row loss weights (numeric, finite, >= 0), Keras' sample_weight, used in training, validation "
        "and evaluate",
        _optional_string,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(labelCols=None, sampleWeightCol=None)

    def setLabelCol(self, value: str):
        return self._set(labelCol=value)

    def getLabelCols(self):
        return self.getOrDefault(self.labelCols)

    def setLabelCols(self, value):
        return self._set(labelCols=value)

    def getSampleWeightCol(self) -> str | None:
        return self.getOrDefault(self.sampleWeightCol)

    def setSampleWeightCol(self, value: str | None):
        return self._set(sampleWeightCol=value)


class KerasEstimatorParams(KerasSharedParams, HasEvaluationColumns, HasSeed):
    """Training Params of :class:`~sparkdl.spark.estimator.KerasEstimator`."""

    numWorkers = Param(Params._dummy(), "numWorkers", "model replicas, one Spark task each (> 0)", TypeConverters.toInt)
    epochs = Param(Params._dummy(), "epochs", "passes over the data (> 0)", TypeConverters.toInt)
    localSteps = Param(
        Params._dummy(),
        "localSteps",
        "τ: local steps per worker between averaging rounds; None = one pass over the partition (one round per epoch)",
        _optional_int,
    )
    mode = Param(
        Params._dummy(), "mode",
        "training mode: 'sync' (model averaging), 'bmuf' (block momentum), 'easgd' (elastic averaging), 'gossip' "
        "(pairwise averaging), 'async' (Downpour), 'hogwild', 'staleness_aware', 'ssp'",
        TypeConverters.toString,
    )
    blockMomentum = Param(Params._dummy(), "blockMomentum", "bmuf: block momentum η in [0, 1); None = 1 - 1/numWorkers",
                          lambda v: None if v is None else TypeConverters.toFloat(v))
    blockLearningRate = Param(Params._dummy(), "blockLearningRate", "bmuf: block learning rate ζ (> 0)", TypeConverters.toFloat)
    nesterov = Param(Params._dummy(), "nesterov", "bmuf: workers start each block from W + η·Δ", TypeConverters.toBoolean)
    elasticForce = Param(Params._dummy(), "elasticForce", "easgd: elastic force α (> 0, numWorkers·α < 1); None = 0.9/numWorkers",
                         lambda v: None if v is None else TypeConverters.toFloat(v))
    compressionThreshold = Param(Params._dummy(), "compressionThreshold",
                                 "compression='threshold': t (> 0): residual entries with |r| >= t are sent as ±t",
                                 TypeConverters.toFloat)
    minWorkersPerRound = Param(
        Params._dummy(), "minWorkersPerRound",
        "straggler-tolerant rounds of the round modes (either backend): a round may close once this many workers (int) or "
        "this fraction of them (float in (0, 1]) sent their update; later updates are dropped and counted. None = wait for all",
        _workers_count_or_fraction,
    )
    roundDeadline = Param(Params._dummy(), "roundDeadline",
                          "with minWorkersPerRound: seconds a round waits for every worker before it closes with the minimum (>= 0)",
                          TypeConverters.toFloat)
    compression = Param(
        Params._dummy(), "compression",
        "how workers send their updates: None (full-precision state), 'fp16' (the update relative to the round's start, "
        "as float16, averaged in float32), '1bit' (one bit per value and two float32 values per column, error feedback; "
        "Seide et al. 2014) or 'threshold' (±compressionThreshold at sparse indices, error feedback; Strom 2015)",
        lambda v: None if v is None else TypeConverters.toString(v),
    )
    mixedPrecision = Param(
        Params._dummy(), "mixedPrecision",
        "Keras dtype policy of the replicas: None (the model's dtypes), 'mixed_float16' (float16 compute, loss scaling) or "
        "'mixed_bfloat16'; variables, master weights, averaging and the Arrow wire stay float32",
        lambda v: None if v is None else TypeConverters.toString(v),
    )
    backend = Param(
        Params._dummy(), "backend",
        "'rounds' (one Spark job per round; the round modes sync, bmuf, easgd, gossip), 'ps' (parameter server, one barrier stage) or "
        "'auto' (rounds for the round modes, ps for the asynchronous modes)",
        TypeConverters.toString,
    )
    staleness = Param(Params._dummy(), "staleness", "ssp: a worker more than this many clocks ahead of the slowest waits (>= 0)",
                      TypeConverters.toInt)
    serverPort = Param(Params._dummy(), "serverPort", "ps: the parameter server's TCP port on the driver (0: a free port)",
                       TypeConverters.toInt)
    workerTimeout = Param(Params._dummy(), "workerTimeout",
                          "ps: seconds a worker may stay silent before the fit fails naming its partition", TypeConverters.toFloat)
    shuffle = Param(Params._dummy(), "shuffle", "shuffle each partition's rows every epoch (seeded)", TypeConverters.toBoolean)
    verbose = Param(Params._dummy(), "verbose",
                    "0 silent, 1 a live progress bar (one line per epoch when stdout is not a terminal), 2 one line per epoch",
                    TypeConverters.toInt)
    logDir = Param(Params._dummy(), "logDir",
                   "folder of TensorBoard event files (train/, validation/: scalars per epoch and per round); None = none",
                   lambda v: None if v is None else TypeConverters.toString(v))
    mlflow = Param(Params._dummy(), "mlflow",
                   "log params, per-epoch metrics and the fitted model to MLflow: True, False, or None = when mlflow is "
                   "installed and a run is active", lambda v: None if v is None else TypeConverters.toBoolean(v))
    roundTimeout = Param(Params._dummy(), "roundTimeout", "seconds a round may take before it is cancelled", TypeConverters.toFloat)
    keepPartitioning = Param(
        Params._dummy(),
        "keepPartitioning",
        "train on the input's own partitions, one worker each (their number as executed), instead of "
        "spreading rows round-robin over numWorkers partitions (default False)",
        TypeConverters.toBoolean,
    )

    classWeight = Param(
        Params._dummy(), "classWeight",
        "Keras class_weight: dict class index -> weight, each row's loss weighted by its class's weight",
        _class_weight,
    )
    validationCol = Param(
        Params._dummy(), "validationCol",
        "boolean column: rows where it is true are the validation set, the others are trained on",
        _optional_string,
    )
    validationSplit = Param(
        Params._dummy(), "validationSplit",
        "fraction of rows held out for validation, chosen by a seeded hash of each row (the same rows every run)",
        _optional_fraction,
    )
    handleInvalid = Param(
        Params._dummy(), "handleInvalid",
        "rows with a null, NaN or infinite value in a model column: 'error' (fail before training, naming the "
        "column and the count) or 'skip' (drop them, the count logged and in fitInfo)",
        _choice("handleInvalid", ("error", "skip")),
    )
    maxTaskMemoryMB = Param(
        Params._dummy(), "maxTaskMemoryMB",
        "a task's budget for its partition (MB, a float > 0): a larger partition is written once to a local file and "
        "kept on disk and read a batch at a time; None derives it from spark.executor.pyspark.memory (else spark.executor.memory) "
        "divided by the executor's task slots",
        _optional_positive_float,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            blockMomentum=None,
            blockLearningRate=1.0,
            nesterov=True,
            elasticForce=None,
            compression=None,
            compressionThreshold=0.01,
            mixedPrecision=None,
            minWorkersPerRound=None,
            roundDeadline=0.0,
            classWeight=None,
            validationCol=None,
            validationSplit=0.0,
            handleInvalid="error",
            maxTaskMemoryMB=None,
            labelCol="label",
            seed=0,
            numWorkers=2,
            epochs=1,
            localSteps=None,
            mode="sync",
            shuffle=True,
            verbose=1,
            logDir=None,
            mlflow=None,
            roundTimeout=3600.0,
            keepPartitioning=False,
            backend="auto",
            staleness=2,
            serverPort=0,
            workerTimeout=600.0,
        )

    def getNumWorkers(self) -> int:
        return self.getOrDefault(self.numWorkers)

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)

    def getLocalSteps(self) -> int | None:
        return self.getOrDefault(self.localSteps)

    def getMode(self) -> str:
        return self.getOrDefault(self.mode)

    def getBackend(self) -> str:
        return self.getOrDefault(self.backend)

    def setBackend(self, value: str):
        return self._set(backend=value)

    def getStaleness(self) -> int:
        return self.getOrDefault(self.staleness)

    def setStaleness(self, value: int):
        return self._set(staleness=value)

    def getServerPort(self) -> int:
        return self.getOrDefault(self.serverPort)

    def setServerPort(self, value: int):
        return self._set(serverPort=value)

    def getWorkerTimeout(self) -> float:
        return self.getOrDefault(self.workerTimeout)

    def setWorkerTimeout(self, value: float):
        return self._set(workerTimeout=value)

    def getShuffle(self) -> bool:
        return self.getOrDefault(self.shuffle)

    def getVerbose(self) -> int:
        return self.getOrDefault(self.verbose)

    def getRoundTimeout(self) -> float:
        return self.getOrDefault(self.roundTimeout)

    def getKeepPartitioning(self) -> bool:
        return self.getOrDefault(self.keepPartitioning)

    def setKeepPartitioning(self, value: bool):
        return self._set(keepPartitioning=value)

    def getBlockMomentum(self):
        return self.getOrDefault(self.blockMomentum)

    def setBlockMomentum(self, value):
        return self._set(blockMomentum=value)

    def getBlockLearningRate(self) -> float:
        return self.getOrDefault(self.blockLearningRate)

    def setBlockLearningRate(self, value: float):
        return self._set(blockLearningRate=value)

    def getCompression(self):
        return self.getOrDefault(self.compression)

    def setCompression(self, value):
        return self._set(compression=value)

    def getMixedPrecision(self):
        return self.getOrDefault(self.mixedPrecision)

    def setMixedPrecision(self, value):
        return self._set(mixedPrecision=value)

    def getElasticForce(self):
        return self.getOrDefault(self.elasticForce)

    def setElasticForce(self, value):
        return self._set(elasticForce=value)

    def getCompressionThreshold(self) -> float:
        return self.getOrDefault(self.compressionThreshold)

    def setCompressionThreshold(self, value: float):
        return self._set(compressionThreshold=value)

    def getMinWorkersPerRound(self):
        return self.getOrDefault(self.minWorkersPerRound)

    def setMinWorkersPerRound(self, value):
        return self._set(minWorkersPerRound=value)

    def getRoundDeadline(self) -> float:
        return self.getOrDefault(self.roundDeadline)

    def setRoundDeadline(self, value: float):
        return self._set(roundDeadline=value)

    def getNesterov(self) -> bool:
        return self.getOrDefault(self.nesterov)

    def setNesterov(self, value: bool):
        return self._set(nesterov=value)

    def getClassWeight(self):
        return self.getOrDefault(self.classWeight)

    def setClassWeight(self, value):
        return self._set(classWeight=value)

    def getValidationCol(self):
        return self.getOrDefault(self.validationCol)

    def setValidationCol(self, value):
        return self._set(validationCol=value)

    def getValidationSplit(self) -> float:
        return self.getOrDefault(self.validationSplit)

    def setValidationSplit(self, value: float):
        return self._set(validationSplit=value)

    def getHandleInvalid(self) -> str:
        return self.getOrDefault(self.handleInvalid)

    def setHandleInvalid(self, value: str):
        return self._set(handleInvalid=value)

    def getMaxTaskMemoryMB(self):
        return self.getOrDefault(self.maxTaskMemoryMB)

    def setMaxTaskMemoryMB(self, value):
        return self._set(maxTaskMemoryMB=value)

    def setSeed(self, value: int):
        return self._set(seed=value)

    def setNumWorkers(self, value: int):
        return self._set(numWorkers=value)

    def setEpochs(self, value: int):
        return self._set(epochs=value)

    def setLocalSteps(self, value: int | None):
        return self._set(localSteps=value)

    def setMode(self, value: str):
        return self._set(mode=value)

    def setShuffle(self, value: bool):
        return self._set(shuffle=value)

    def setVerbose(self, value: int):
        return self._set(verbose=value)

    def getLogDir(self) -> str | None:
        return self.getOrDefault(self.logDir)

    def setLogDir(self, value: str | None):
        return self._set(logDir=value)

    def getMlflow(self) -> bool | None:
        return self.getOrDefault(self.mlflow)

    def setMlflow(self, value: bool | None):
        return self._set(mlflow=value)

    def setRoundTimeout(self, value: float):
        return self._set(roundTimeout=value)
