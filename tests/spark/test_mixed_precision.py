"""Mixed precision (issue 11, item 2): the replicas compute in 16 bits under a Keras dtype policy while
variables, the master weights, their averaging and the Arrow wire stay float32."""

import json
import os
import time

import numpy as np
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdl import KerasEstimator
from sparkdl.core.pieces import split_state
from sparkdl.core.state import ModelState
from sparkdl.errors import ConfigError, InvariantError
from sparkdl.keras.replica import Replica, check_state_dtypes, mixed_architecture
from sparkdl.keras.spec import CompileSpec, ModelSpec
from tests.conftest import ROOT, partitioned_df

import keras  # noqa: E402  (conftest selected the backend)

XY = T.StructType([T.StructField("x", T.ArrayType(T.FloatType())), T.StructField("y", T.DoubleType())])


def _mlp(seed=3):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3, activation="softmax")])


def _data(n=192, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
    return x, y


def _df(spark, x, y, parts=2):
    rows = [([float(v) for v in xi], float(yi)) for xi, yi in zip(x, y)]
    return partitioned_df(spark, [rows[i::parts] for i in range(parts)], XY)


# ---- the replica, without Spark --------------------------------------------------------------------------


@pytest.mark.parametrize("policy, optimizer", [("mixed_bfloat16", "Adam"), ("mixed_float16", "LossScaleOptimizer")])
def test_a_mixed_replica_computes_in_16_bits_and_returns_float32_state(policy, optimizer):
    spec = ModelSpec.from_model(_mlp())
    compile_spec = CompileSpec.create(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", ["accuracy"])
    plain = Replica(spec, compile_spec, seed=0)
    mixed = Replica(spec, compile_spec, seed=0, mixed_precision=policy)
    assert [layer.dtype_policy.name for layer in mixed.model.layers] == [policy, "float32"]  # the output layer stays float32
    assert [layer.compute_dtype for layer in mixed.model.layers] == [policy.split("_")[1], "float32"]
    assert type(mixed.model.optimizer).__name__ == optimizer  # Keras adds loss scaling for float16 only
    assert keras.config.dtype_policy().name == "float32"  # the process's global policy is restored
    x, y = _data()
    start = ModelState([np.asarray(v.numpy()) for v in plain.model.weights], None)
    for replica in (plain, mixed):
        replica.set_state(start)
        replica.train(x, y, batch_size=32)
    got, want = mixed.get_state(), plain.get_state()
    assert [a.dtype for a in got.weights] == [np.dtype(np.float32)] * 4  # what goes on the wire
    # the optimizer state that travels has the float32 replica's layout (a LossScaleOptimizer's scale stays local)
    assert [(a.shape, a.dtype) for a in got.optimizer] == [(a.shape, a.dtype) for a in want.optimizer]
    assert int(got.optimizer[0]) == 6  # Adam's iteration counter: 192 rows / 32
    assert all(piece.dtype == "<f4" for piece in split_state(ModelState(got.weights), 64))  # the Arrow pieces' dtype
    difference = max(float(np.abs(a - b).max()) for a, b in zip(got.weights, want.weights, strict=True))
    assert 1e-6 < difference < 0.05  # 16-bit compute: close to float32 training, not identical


def test_a_replica_refuses_to_return_weights_in_another_dtype_than_the_master():
    spec = ModelSpec.from_model(_mlp())
    replica = Replica(spec, CompileSpec.create("adam", "mse", []), seed=0, mixed_precision="mixed_bfloat16")
    master64 = [np.asarray(v.numpy(), np.float64) for v in replica.model.weights]
    replica.set_state(ModelState(master64, None))  # the master is float64, the replica's variables float32
    with pytest.raises(InvariantError, match="mixedPrecision='mixed_bfloat16'"):
        replica.get_state()


def test_the_driver_check_fails_loudly_on_16_bit_weights():
    master = [np.zeros((4, 16), np.float32), np.zeros(16, np.float32)]
    check_state_dtypes(master, [a.copy() for a in master], "weights")  # float32: fine
    with pytest.raises(InvariantError) as info:
        check_state_dtypes(master, [master[0].astype(np.float16), master[1]], "the fitted master weights")
    assert "(0, 'float32', 'float16')" in str(info.value)
    with pytest.raises(InvariantError, match="one per weight"):
        check_state_dtypes(master, master[:1], "weights")


def test_mixed_architecture_keeps_inputs_outputs_and_other_dtypes():
    inputs = keras.Input((4,), name="a")
    hidden = keras.layers.Dense(3, name="h")(inputs)
    wide = keras.layers.Dense(3, name="wide", dtype="float64")(inputs)
    out = keras.layers.Dense(2, name="out")(keras.layers.Concatenate(name="cat")([hidden, keras.layers.Activation("linear", dtype="float32", name="down")(wide)]))
    config = json.loads(mixed_architecture(keras.Model(inputs, out).to_json(), "mixed_bfloat16"))
    layers = {layer.get("name", layer["config"].get("name")): layer["config"].get("dtype") for layer in config["config"]["layers"]}
    name = lambda d: d["config"]["name"] if isinstance(d, dict) else d  # noqa: E731
    assert name(layers["h"]) == "mixed_bfloat16" and name(layers["cat"]) == "mixed_bfloat16"
    assert name(layers["out"]) == "float32"  # the model's output layer
    assert name(layers["wide"]) == "float64"  # another dtype is the user's choice
    assert name(layers["a"]) == "float32"  # the input's dtype
    # the Cast layers older Keras inserts keep their target dtype (a string, not a policy)
    assert all(d in ("float32", "float64") for n, d in layers.items() if n.startswith("cast"))
    model = keras.models.model_from_json(json.dumps(config))  # and it builds
    policies = {layer.name: layer.dtype_policy.name for layer in model.layers}
    assert (policies["h"], policies["out"], policies["wide"]) == ("mixed_bfloat16", "float32", "float64")


# ---- on Spark ------------------------------------------------------------------------------------------


def test_mixed_precision_is_refused_before_any_job_naming_the_param_and_values(spark):
    x, y = _data(32)
    df = _df(spark, x, y)
    sc = spark.sparkContext
    before = len(sc.statusTracker().getJobIdsForGroup())
    with pytest.raises(ConfigError) as info:  # refused where it is set: its declared choices
        KerasEstimator(model=_mlp(), loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y", verbose=0,
                       mixedPrecision="float16").fit(df)
    message = str(info.value)
    assert "mixedPrecision" in message and "'mixed_float16'" in message and "'mixed_bfloat16'" in message
    assert "Received: mixedPrecision='float16'" in message
    assert len(sc.statusTracker().getJobIdsForGroup()) == before


@pytest.mark.parametrize("backend, policy", [pytest.param("rounds", "mixed_bfloat16", marks=pytest.mark.slow), ("ps", "mixed_bfloat16"),
                                             pytest.param("rounds", "mixed_float16", marks=pytest.mark.slow)])
def test_mixed_training_decreases_the_loss_and_keeps_a_float32_model(spark, backend, policy):
    x, y = _data()
    df = _df(spark, x, y)

    def fit(mixed):
        est = KerasEstimator(model=_mlp(), optimizer=keras.optimizers.Adam(0.02), loss="sparse_categorical_crossentropy",
                             metrics=["accuracy"], featuresCol="x", labelCol="y", numWorkers=2, epochs=4, batchSize=16,
                             localSteps=3, seed=5, verbose=0, backend=backend, mixedPrecision=mixed)
        return est.fit(df)

    fitted = fit(policy)  # mixed_float16: each replica's LossScaleOptimizer, the master's plain Adam state
    losses = fitted.history["loss"]
    assert losses[-1] < 0.8 * losses[0]  # it trains
    plain = fit(None).history["loss"]
    assert losses != plain and np.allclose(losses, plain, rtol=0.1)  # 16-bit compute on the executors, close to float32
    model = fitted.getKerasModel()
    assert model.dtype_policy.name == "float32" and [layer.dtype_policy.name for layer in model.layers] == ["float32"] * 2
    assert all(np.asarray(w).dtype == np.float32 for w in model.get_weights())
    assert fitted._optimizer_state is not None and all(
        a.dtype in (np.float32, np.int64) for a in fitted._optimizer_state)  # Adam's moments and counter, as without
    # transform runs the float32 model
    scored = fitted.transform(df).orderBy(F.col("x")).collect()
    rows = np.array([r["x"] for r in scored], np.float32)
    np.testing.assert_allclose([r["probability"].toArray() for r in scored], model.predict(rows, verbose=0), atol=1e-5)


def test_mixed_precision_is_a_job_config_key():
    from jobs.train import FIT_KEYS

    assert FIT_KEYS["mixed_precision"] == "mixedPrecision"


@pytest.mark.slow
def test_bfloat16_mnist_cnn_reaches_97_percent(spark):
    """conf/mnist_cnn.yaml's model and settings with mixedPrecision='mixed_bfloat16', on CPU."""
    import yaml

    from sparkdl.keras.zoo import mnist_cnn

    with open(os.path.join(ROOT, "conf", "mnist_cnn.yaml")) as f:
        config = yaml.safe_load(f)
    fit = config["fit"]
    folder = os.path.join(ROOT, "conf")  # the config's paths are relative to its own folder
    train = spark.read.parquet(os.path.normpath(os.path.join(folder, config["data"]["train"])))
    test = spark.read.parquet(os.path.normpath(os.path.join(folder, config["data"]["test"])))
    est = KerasEstimator(
        model=mnist_cnn(**config["model"]["kwargs"]), optimizer=fit["optimizer"], loss=fit["loss"], metrics=fit["metrics"],
        featuresCol="pixels", labelCol="label", numWorkers=fit["num_workers"], epochs=fit["epochs"], batchSize=fit["batch_size"],
        localSteps=fit["local_steps"], mode=fit["mode"], seed=fit["seed"], verbose=1, mixedPrecision="mixed_bfloat16",
    )
    started = time.perf_counter()
    fitted = est.fit(train)
    seconds = time.perf_counter() - started
    scored = fitted.transform(test)
    accuracy = scored.select(F.avg((F.col("prediction") == F.col("label")).cast("double"))).first()[0]
    print(f"mixed_bfloat16 mnist CNN: test accuracy {accuracy:.4f}, fit {seconds:.1f} s, history {fitted.history}")
    assert all(np.asarray(w).dtype == np.float32 for w in fitted.getKerasModel().get_weights())
    assert accuracy >= 0.97
