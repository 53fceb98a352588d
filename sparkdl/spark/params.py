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


class HasBatchSize(Params):
    batchSize = Param(Params._dummy(), "batchSize", "rows per training step and per inference batch (> 0)", TypeConverters.toInt)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

    def setBatchSize(self, value: int):
        return self._set(batchSize=value)


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
    HasFeaturesCol, HasPredictionCol, HasRawPredictionCol, HasProbabilityCol, HasScoreColumnType, HasBatchSize, HasTask, HasCompileParams,
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
            batchSize=32,
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


class KerasEstimatorParams(KerasSharedParams, HasLabelCol, HasSeed):
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
        "training mode: 'sync' (model averaging), 'async' (Downpour), 'hogwild', 'staleness_aware', 'ssp'",
        TypeConverters.toString,
    )
    backend = Param(
        Params._dummy(), "backend",
        "'rounds' (one Spark job per round, sync only), 'ps' (parameter server, one barrier stage) or "
        "'auto' (rounds for sync, ps for the asynchronous modes)",
        TypeConverters.toString,
    )
    staleness = Param(Params._dummy(), "staleness", "ssp: a worker more than this many clocks ahead of the slowest waits (>= 0)",
                      TypeConverters.toInt)
    serverPort = Param(Params._dummy(), "serverPort", "ps: the parameter server's TCP port on the driver (0: a free port)",
                       TypeConverters.toInt)
    workerTimeout = Param(Params._dummy(), "workerTimeout",
                          "ps: seconds a worker may stay silent before the fit fails naming its partition", TypeConverters.toFloat)
    shuffle = Param(Params._dummy(), "shuffle", "shuffle each partition's rows every epoch (seeded)", TypeConverters.toBoolean)
    verbose = Param(Params._dummy(), "verbose", "0 silent, 1 one line per epoch", TypeConverters.toInt)
    roundTimeout = Param(Params._dummy(), "roundTimeout", "seconds a round may take before it is cancelled", TypeConverters.toFloat)
    keepPartitioning = Param(
        Params._dummy(),
        "keepPartitioning",
        "train on the input's own partitions, one worker each (their number as executed), instead of "
        "spreading rows round-robin over numWorkers partitions (default False)",
        TypeConverters.toBoolean,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            labelCol="label",
            seed=0,
            numWorkers=2,
            epochs=1,
            localSteps=None,
            mode="sync",
            shuffle=True,
            verbose=1,
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

    def setLabelCol(self, value: str):
        return self._set(labelCol=value)

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

    def setRoundTimeout(self, value: float):
        return self._set(roundTimeout=value)
