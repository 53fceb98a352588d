"""Params built from their declarations (sparkdl.param_specs): pyspark Param objects, getters,
setters and defaults as before, ConfigError from every converter, keyword checks, a streaming input
refused by fit, and a fitted model carrying its estimator's Params (after save/load, CrossValidator)."""

import json
import glob
import os
import re

import numpy as np
import pytest
from pyspark.ml.evaluation import RegressionEvaluator
from pyspark.ml.param import Param
from pyspark.ml.param.shared import HasFeaturesCol, HasHandleInvalid, HasLabelCol, HasSeed
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

import keras
from sparkdl import KerasEstimator, KerasModel
from sparkdl.errors import ConfigError
from sparkdl.param_specs import BY_NAME, KINDS, NO_DEFAULT, PARAMS, SHARED, TRAINING
from sparkdl.spark.params import CONVERTERS
from tests.conftest import jobs_started

# The accessors KerasEstimator and KerasModel had before the Params were generated: every one must stay.
ESTIMATOR_ACCESSORS_BEFORE = {
    "getBackend", "getBatchSize", "getBlockLearningRate", "getBlockMomentum", "getCallbacks", "getCheckFeatures",
    "getClassWeight", "getCompression", "getCompressionThreshold", "getDecoders", "getElasticForce", "getEpochs",
    "getFeaturesCol", "getFeaturesCols", "getHandleInvalid", "getInferenceBatchSize", "getJitCompile",
    "getKeepPartitioning", "getKerasModel", "getLabelCol", "getLabelCols", "getLocalSteps", "getLogDir", "getLoss",
    "getLossWeights", "getMaxTaskMemoryMB", "getMetrics", "getMinWorkersPerRound", "getMixedPrecision", "getMlflow",
    "getMode", "getNesterov", "getNumWorkers", "getOptimizer", "getOutputCols", "getPredictionCol", "getProbabilityCol",
    "getRawPredictionCol", "getRoundDeadline", "getRoundTimeout", "getSampleWeightCol", "getScoreColumnType", "getSeed",
    "getServerPort", "getShuffle", "getStaleness", "getTask", "getValidationCol", "getValidationSplit", "getVerbose",
    "getWeightedMetrics", "getWorkerTimeout", "setBackend", "setBatchSize", "setBlockLearningRate", "setBlockMomentum",
    "setCallbacks", "setCheckFeatures", "setClassWeight", "setCompression", "setCompressionThreshold", "setDecoders",
    "setElasticForce", "setEpochs", "setFeaturesCol", "setFeaturesCols", "setHandleInvalid", "setInferenceBatchSize",
    "setInitialModel", "setJitCompile", "setKeepPartitioning", "setLabelCol", "setLabelCols", "setLocalSteps", "setLogDir",
    "setLoss", "setLossWeights", "setMaxTaskMemoryMB", "setMetrics", "setMinWorkersPerRound", "setMixedPrecision",
    "setMlflow", "setMode", "setModel", "setNesterov", "setNumWorkers", "setOptimizer", "setOutputCols", "setParams",
    "setPredictionCol", "setProbabilityCol", "setRawPredictionCol", "setRoundDeadline", "setRoundTimeout",
    "setSampleWeightCol", "setScoreColumnType", "setSeed", "setServerPort", "setShuffle", "setStaleness", "setTask",
    "setValidationCol", "setValidationData", "setValidationSplit", "setVerbose", "setWeightedMetrics", "setWorkerTimeout",
}
MODEL_ACCESSORS_BEFORE = {
    "getBatchSize", "getCheckFeatures", "getDecoders", "getFeaturesCol", "getFeaturesCols", "getInferenceBatchSize",
    "getJitCompile", "getKerasModel", "getLabelCol", "getLabelCols", "getLoss", "getLossWeights", "getMetrics",
    "getOptimizer", "getOutputCols", "getPredictionCol", "getProbabilityCol", "getRawPredictionCol", "getSampleWeightCol",
    "getScoreColumnType", "getTask", "getWeightedMetrics", "setBatchSize", "setCheckFeatures", "setDecoders",
    "setFeaturesCol", "setFeaturesCols", "setInferenceBatchSize", "setJitCompile", "setLabelCol", "setLabelCols", "setLoss",
    "setLossWeights", "setMetrics", "setOptimizer", "setOutputCols", "setPredictionCol", "setProbabilityCol",
    "setRawPredictionCol", "setSampleWeightCol", "setScoreColumnType", "setTask", "setWeightedMetrics",
}
# The estimator's defaults before the Params were generated.
DEFAULTS_BEFORE = {
    "backend": "auto", "batchSize": 32, "blockLearningRate": 1.0, "blockMomentum": None, "checkFeatures": False,
    "classWeight": None, "compression": None, "compressionThreshold": 0.01, "decoders": None, "elasticForce": None,
    "epochs": 1, "featuresCol": "features", "featuresCols": None, "handleInvalid": "error", "inferenceBatchSize": None,
    "jitCompile": "auto", "keepPartitioning": False, "labelCol": "label", "labelCols": None, "localSteps": None,
    "logDir": None, "lossWeights": None, "maxTaskMemoryMB": None, "metrics": [], "minWorkersPerRound": None,
    "mixedPrecision": None, "mlflow": None, "mode": "sync", "nesterov": True, "numWorkers": 2, "optimizer": "adam",
    "outputCols": None, "predictionCol": "prediction", "probabilityCol": "probability", "rawPredictionCol": "rawPrediction",
    "roundDeadline": 0.0, "roundTimeout": 3600.0, "sampleWeightCol": None, "scoreColumnType": "vector", "seed": 0,
    "serverPort": 0, "shuffle": True, "staleness": 2, "task": "auto", "validationCol": None, "validationSplit": 0.0,
    "verbose": 1, "weightedMetrics": [], "workerTimeout": 600.0,
}
# A value of the wrong type for each kind of Param (a kind without one fails test_every_kind_has_a_wrong_value).
WRONG = {
    "int": "2x", "int?": "2x", "float": "1.5x", "float?": "1.5x", "bool": "yes", "bool?": "yes", "str": 12, "str?": 12,
    "choice": 12, "workers?": "1", "features_cols": 12,
    "label_cols": 12, "output_cols": 12, "decoders": 12, "class_weight": "x", "optimizer": 12, "loss": 12, "metrics": 12,
    "loss_weights": "heavy", "jit_compile": "yes",
}


def test_every_kind_has_a_converter_and_a_wrong_value():
    assert set(CONVERTERS) == set(KINDS)
    assert set(WRONG) == set(KINDS)


@pytest.mark.parametrize("spec", PARAMS, ids=lambda spec: spec.name)
def test_a_value_of_the_wrong_type_raises_config_error_naming_the_param(spec):
    bad = WRONG[spec.kind]
    with pytest.raises(ConfigError) as info:
        KerasEstimator(**{spec.name: bad})
    message = str(info.value)
    assert re.search(rf"\b{spec.name}\b", message) and "Received" in message, message
    model = KerasModel()
    for set_it in (lambda: model._set(**{spec.name: bad}), lambda: model.set(model.getParam(spec.name), bad)):
        with pytest.raises(ConfigError, match=rf"\b{spec.name}\b"):
            set_it()
    assert not model.isSet(spec.name)


@pytest.mark.parametrize("name, value, message", [
    ("numWorkers", "2x", "numWorkers must be a positive integer. Received: numWorkers='2x'"),
    ("numWorkers", True, "numWorkers must be a positive integer. Received: numWorkers=True"),
    ("epochs", 2.5, "epochs must be a positive integer. Received: epochs=2.5"),
    ("minWorkersPerRound", "1", "minWorkersPerRound must be None, a count >= 1 (int) or a fraction in (0, 1] (float). "
                                "Received: minWorkersPerRound='1'"),
    ("task", "clasification", "task must be one of ['auto', 'classification', 'regression']. Did you mean 'classification'? "
                             "Received: task='clasification'"),
    ("shuffle", "yes", "shuffle must be True or False. Received: shuffle='yes'"),
    ("featuresCol", 3, "featuresCol must be a string. Received: featuresCol=3"),
    ("validationSplit", 1.5, "validationSplit must be a fraction in [0, 1). Received: validationSplit=1.5"),
    ("maxTaskMemoryMB", 0, "maxTaskMemoryMB must be None or a number of MB > 0. Received: maxTaskMemoryMB=0.0"),
    ("lossWeights", "heavy", "lossWeights: loss_weights must hold finite numbers. Received: 'heavy'"),
    ("learningRate", 0, "learningRate must be None or a finite number > 0. Received: learningRate=0.0"),
    # ranges and choices, declared once (sparkdl.param_specs Rule), checked when set as FitConfig checks them
    ("numWorkers", 0, "numWorkers must be a positive integer. Received: numWorkers=0"),
    ("serverPort", 70000, "serverPort must be an integer in [0, 65535]. Received: serverPort=70000"),
    ("workerTimeout", 2, "workerTimeout must be a number of seconds >= 5: each worker sends a heartbeat every 0.1 of it "
                         "(at most every 2 s), and a shorter timeout would take a late beat on a busy machine for a dead "
                         "worker. Received: workerTimeout=2.0"),
    ("outerMomentum", 1.0, "outerMomentum must be a number in [0, 1). Received: outerMomentum=1.0"),
    ("mode", "synchronous", "mode must be one of ['sync', 'bmuf', 'easgd', 'gossip', 'diloco', 'async', 'hogwild', "
                            "'staleness_aware', 'ssp']. Did you mean 'sync'? Received: mode='synchronous'"),
    ("learningRate", "fast", "learningRate must be None or a finite number > 0. Received: learningRate='fast'"),
])
def test_converter_messages_state_the_rule_then_what_was_received(name, value, message):
    with pytest.raises(ConfigError) as info:
        KerasEstimator(**{name: value})
    assert str(info.value) == message


def test_values_of_the_right_type_convert_as_before():
    est = KerasEstimator(numWorkers=np.int64(3), epochs=2.0, roundTimeout=60, minWorkersPerRound=0.5, featuresCols="x",
                         classWeight={"0": 1, "1": "2.5"}, handleInvalid="keep")
    assert est.getNumWorkers() == 3 and type(est.getNumWorkers()) is int and est.getEpochs() == 2
    assert est.getRoundTimeout() == 60.0 and type(est.getRoundTimeout()) is float
    assert est.getMinWorkersPerRound() == 0.5 and KerasEstimator(minWorkersPerRound=2).getMinWorkersPerRound() == 2
    assert est.getFeaturesCols() == ["x"] and est.getClassWeight() == {0: 1.0, 1: 2.5}
    assert est.getHandleInvalid() == "keep"  # a value for the model: fit refuses it (test below)
    assert KerasEstimator(localSteps=None, mode="async").getLocalSteps() is None


def test_params_are_pyspark_params_with_the_old_accessors_and_defaults():
    est, model = KerasEstimator(), KerasModel()
    for spec in PARAMS:
        for stage in (KerasEstimator, KerasModel):
            assert isinstance(getattr(stage, spec.name), Param), (stage.__name__, spec.name)
            # the declared Param, not a pyspark mixin's of the same name (HasSeed, HasHandleInvalid, HasFeaturesCol, ...)
            assert getattr(stage, spec.name).typeConverter.__name__ == f"to_{spec.name}", (stage.__name__, spec.name)
        assert callable(getattr(est, f"get{spec.suffix}")) and callable(getattr(est, f"set{spec.suffix}"))
        assert callable(getattr(model, f"get{spec.suffix}"))
        assert hasattr(model, f"set{spec.suffix}") == (spec.stage == SHARED), spec.name  # training Params: read-only
        if spec.default is not NO_DEFAULT:
            assert getattr(est, f"get{spec.suffix}")() == spec.default == getattr(model, f"get{spec.suffix}")()
    assert all(isinstance(stage, (HasSeed, HasHandleInvalid, HasFeaturesCol, HasLabelCol)) for stage in (est, model))
    assert ESTIMATOR_ACCESSORS_BEFORE <= set(dir(KerasEstimator))
    assert MODEL_ACCESSORS_BEFORE <= set(dir(KerasModel))
    added = {"checkpointDir": None, "checkpointEvery": None, "dataTimeout": 86400.0, "serverTls": True, "serverCertFile": None,
             "serverKeyFile": None, "padValue": 0.0,  # issue 21's Params, after the declaration moved; issue 23's padValue
             "keepLocalOptimizer": False, "outerLearningRate": 0.7, "outerMomentum": 0.9,  # backend sharded's
             "learningRate": None,  # issue 31's
             "overlap": False}  # issue 43's
    assert {p.name: est.getOrDefault(p) for p in est.params if est.hasDefault(p)} == {**DEFAULTS_BEFORE, **added}
    assert sorted(p.name for p in est.params) == sorted(p.name for p in model.params) == sorted(BY_NAME)
    assert not est.isDefined("loss")
    assert est.explainParam("numWorkers").startswith("numWorkers: model replicas, one Spark task")


def test_copy_extract_param_map_and_param_grid():
    est = KerasEstimator(epochs=2, mode="bmuf")
    grid = ParamGridBuilder().addGrid(est.epochs, [1, 3]).addGrid(est.handleInvalid, ["error", "skip"]).build()
    copies = [est.copy(params) for params in grid]
    assert [(c.getEpochs(), c.getHandleInvalid(), c.getMode()) for c in copies] == [
        (1, "error", "bmuf"), (1, "skip", "bmuf"), (3, "error", "bmuf"), (3, "skip", "bmuf")]
    assert est.getEpochs() == 2  # the original is unchanged
    extracted = {p.name: v for p, v in est.extractParamMap().items()}
    assert extracted["epochs"] == 2 and extracted["mode"] == "bmuf" and extracted["numWorkers"] == 2
    assert all(copies[0].isSet(p) == (p.name in ("epochs", "mode", "handleInvalid")) for p in copies[0].params)


def test_unknown_keyword_is_refused_naming_the_closest():
    with pytest.raises(ConfigError, match=r"'numWorker' is none of them\. Did you mean 'numWorkers'\? Received: numWorker=4"):
        KerasEstimator(numWorker=4)
    with pytest.raises(ConfigError, match=r"Did you mean 'initialModel'\?"):
        KerasEstimator().setParams(initialModle=None)
    with pytest.raises(TypeError, match=r"^KerasEstimator takes keyword arguments only"):  # still a TypeError
        KerasEstimator(None)


def test_docstring_and_signature_come_from_the_declarations():
    import inspect

    doc = KerasEstimator.__doc__
    assert "<generated" not in doc
    for spec in PARAMS:
        assert re.search(rf"^        {spec.name} \(", doc, re.M), spec.name
    assert "        callbacks (list; default []): Keras callbacks" in doc
    signature = inspect.signature(KerasEstimator)
    assert signature.parameters["numWorkers"].default == 2 and signature.parameters["loss"].default is None
    assert set(signature.parameters) == set(BY_NAME) | {"model", "initialModel", "customObjects", "callbacks"}


# --- with Spark ---------------------------------------------------------------------------------


def _linear(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])


@pytest.fixture(scope="module")
def rows(spark):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 2))
    return spark.createDataFrame([(i, x[i].tolist(), float(x[i] @ [2.0, -1.0])) for i in range(16)], "id int, x array<double>, y double")


def _estimator(**params):
    return KerasEstimator(model=_linear(), optimizer=keras.optimizers.SGD(0.1), loss="mse", featuresCol="x", labelCol="y",
                          batchSize=4, verbose=0, **params)


def test_fit_refuses_a_streaming_dataframe_before_any_job(spark):
    stream = spark.readStream.format("rate").load()
    est = _estimator()
    raised = []
    assert jobs_started(spark, lambda: raised.append(pytest.raises(ConfigError, est.fit, stream))) == 0
    message = str(raised[0].value)
    assert message.startswith("KerasEstimator.fit needs a batch DataFrame") and "writeStream.foreachBatch" in message
    assert message.endswith("Received: a streaming DataFrame (isStreaming=True)")
    assert jobs_started(spark, lambda: pytest.raises(ConfigError, est.fit, stream, {est.epochs: 2})) == 0  # with a param map
    assert not spark.streams.active  # nothing was started


def test_fit_refuses_handle_invalid_keep_before_any_job(spark, rows):
    est = _estimator(handleInvalid="keep")
    raised = []
    assert jobs_started(spark, lambda: raised.append(pytest.raises(ConfigError, est.fit, rows))) == 0
    assert str(raised[0].value) == (
        "handleInvalid must be one of ['error', 'skip'] to fit; 'keep' is for the fitted model's transform: fit with one of "
        "those, then call setHandleInvalid('keep') on the KerasModel. Received: handleInvalid='keep'")


@pytest.mark.slow  # the default run's 25-minute budget: tests/spark/test_persistence.py runs save and load by default
def test_a_fitted_model_carries_its_estimators_params_also_after_save_and_load(spark, rows, tmp_path):
    est = _estimator(numWorkers=2, epochs=2, seed=3, localSteps=2, handleInvalid="skip", blockMomentum=0.25)
    model = est.fit(rows)
    for name in ("numWorkers", "epochs", "seed", "localSteps", "mode", "handleInvalid", "blockMomentum", "batchSize",
                 "shuffle", "roundTimeout", "validationSplit"):
        assert model.getOrDefault(name) == est.getOrDefault(name), name
    assert (model.getEpochs(), model.getNumWorkers(), model.getSeed(), model.getLocalSteps()) == (2, 2, 3, 2)
    assert model.getHandleInvalid() == "skip" and model.getBlockMomentum() == 0.25
    assert model.isSet("epochs") and not model.isSet("mode")  # set where the estimator's was set, defaults stay defaults
    assert model.fitInfo["local_steps"] == model.getLocalSteps()
    path = str(tmp_path / "model")
    model.save(path)
    with open(glob.glob(os.path.join(path, "metadata", "part-*"))[0]) as f:
        metadata = json.load(f)
    assert metadata["versions"]["format"] == 2
    assert metadata["paramMap"]["epochs"] == 2 and metadata["paramMap"]["seed"] == 3 and metadata["paramMap"]["handleInvalid"] == "skip"
    loaded = KerasModel.load(path)
    for name in ("numWorkers", "epochs", "seed", "localSteps", "mode", "handleInvalid", "blockMomentum"):
        assert loaded.getOrDefault(name) == est.getOrDefault(name), name
    assert loaded.isSet("epochs") and not loaded.isSet("mode")
    assert loaded.copy().getEpochs() == 2


def _recorded_learning_rate(fitted) -> float:
    """The learning rate held in a fitted model's optimizer state (its ``learning_rate`` variable)."""
    model = fitted.getKerasModel()
    optimizer = keras.optimizers.get(fitted.getOptimizer())
    optimizer.build(model.trainable_variables)
    index = [v.path.rsplit("/", 1)[-1] for v in optimizer.variables].index("learning_rate")
    return float(np.asarray(fitted.optimizerState[index]))


def test_a_learning_rate_grid_in_cross_validator_reaches_every_replica_and_the_best_models_state(spark):
    """Issue 31 item 5: learningRate is a Param, so CrossValidator tunes it (the docs' tuning page shows
    this grid); each fit's replicas train with it and the fitted optimizer state records it (2 workers:
    a replica left at SGD's own 0.01 would pull the averaged rate away from the grid's)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(48, 2))
    df = spark.createDataFrame([(x[i].tolist(), float(x[i] @ [2.0, -1.0])) for i in range(48)], "x array<double>, y double")
    est = KerasEstimator(model=_linear(), optimizer="sgd", loss="mse", featuresCol="x", labelCol="y", batchSize=4,
                         numWorkers=2, epochs=1, verbose=0)
    grid = ParamGridBuilder().addGrid(est.learningRate, [0.001, 0.1]).build()
    evaluator = RegressionEvaluator(labelCol="y", predictionCol="prediction", metricName="rmse")
    cv = CrossValidator(estimator=est, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=7).fit(df)
    assert abs(cv.avgMetrics[0] - cv.avgMetrics[1]) > 0.1 * max(cv.avgMetrics)  # the rate changed what was learned
    best = int(np.argmin(cv.avgMetrics))  # rmse: smaller is better
    assert grid[best][est.learningRate] == 0.1  # 6 SGD steps at 0.001 barely move the weights
    fitted = cv.bestModel  # refitted on all rows with the best map: it reports its grid point
    assert fitted.getOrDefault("learningRate") == grid[best][est.learningRate] and est.getLearningRate() is None
    assert fitted.getNumWorkers() == 2 and len(fitted.history["loss"]) == fitted.getEpochs() == 1
    assert _recorded_learning_rate(fitted) == pytest.approx(0.1)
    assert fitted.getOptimizer()["config"]["learning_rate"] == pytest.approx(0.1)  # the optimizer that trained
    assert fitted._compile_spec().optimizer["config"]["learning_rate"] == pytest.approx(0.1)  # evaluate and initialModel see it
