"""Issue 10 item 6: saves record what wrote them, a save of an earlier sparkdl keeps loading (the
committed fixture), and a plain Keras model or ``.keras`` file wraps into a KerasModel for scoring."""

import glob
import json
import os

import numpy as np
import pytest

import keras
import sparkdl
from sparkdl import KerasModel
from sparkdl.errors import ConfigError, IncompleteSaveError
from sparkdl.spark.persistence import SAVE_FORMAT

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def _metadata_file(path):
    return glob.glob(os.path.join(path, "metadata", "part-*"))[0]


@pytest.mark.parametrize("name", sorted(os.path.basename(p) for p in glob.glob(os.path.join(FIXTURES, "keras_model_*")) if os.path.isdir(p)))
def test_saves_of_earlier_versions_load_and_score_as_they_did(spark, name):
    path = os.path.join(FIXTURES, name)
    with open(path + ".json") as f:
        expected = json.load(f)
    loaded = KerasModel.load(path)
    assert loaded.history == expected["history"] and loaded.optimizerState is not None
    df = spark.createDataFrame([(row, 0) for row in expected["rows"]], "features array<float>, label int")
    scored = {tuple(r["features"]): r for r in loaded.transform(df).collect()}
    for row, probability, prediction in zip(expected["rows"], expected["probability"], expected["prediction"], strict=True):
        got = scored[tuple(np.float32(row).tolist())]
        np.testing.assert_allclose(got["probability"].toArray(), probability, atol=1e-6)
        assert got["prediction"] == prediction


@pytest.mark.parametrize("name", ["keras_model_0_1_0", "keras_model_0_2_0"])
def test_a_format_1_save_loads_with_the_training_params_at_their_defaults(spark, name):
    """Format 1 did not record the estimator's training Params nor handleInvalid: they read as their defaults, and
    the Params the save did record keep their values."""
    loaded = KerasModel.load(os.path.join(FIXTURES, name))
    assert (loaded.getEpochs(), loaded.getNumWorkers(), loaded.getMode(), loaded.getSeed()) == (1, 2, "sync", 0)
    assert not loaded.isSet("epochs") and loaded.getHandleInvalid() == "error"
    assert loaded.getBatchSize() == 2 and loaded.getTask() == "classification"  # recorded in format 1
    # saved while checkFeatures defaulted to True: it loads with the default it was saved with (the docs say so)
    assert loaded.getCheckFeatures() is True and KerasModel.fromKeras(loaded.getKerasModel()).getCheckFeatures() is False


def test_metadata_records_the_versions_and_a_newer_format_is_refused(spark, tmp_path):
    with open(os.path.join(FIXTURES, "keras_model_0_1_0.json")) as f:
        rows = json.load(f)["rows"]
    model = KerasModel.load(os.path.join(FIXTURES, "keras_model_0_1_0"))
    path = str(tmp_path / "m")
    model.save(path)
    with open(_metadata_file(path)) as f:
        metadata = json.load(f)
    versions = metadata["versions"]
    assert versions["sparkdl"] == sparkdl.__version__ and versions["keras"] == keras.__version__
    assert versions["backend"] == keras.backend.backend() and versions["format"] == SAVE_FORMAT == 2 and versions["backendVersion"]
    metadata["versions"]["format"] = 99
    with open(_metadata_file(path), "w") as f:
        json.dump(metadata, f)
    for crc in glob.glob(os.path.join(path, "metadata", ".*.crc")):
        os.remove(crc)
    with pytest.raises(IncompleteSaveError, match="format 99.*upgrade sparkdl"):
        KerasModel.load(path)
    assert len(rows) == 6


def test_from_keras_wraps_a_model_and_a_keras_file(spark, tmp_path):
    keras.utils.set_random_seed(5)
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    plain.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x = np.random.default_rng(0).normal(size=(7, 4)).astype(np.float32)
    want = plain.predict(x, verbose=0)
    file = str(tmp_path / "plain.keras")
    plain.save(file)
    df = spark.createDataFrame([(row.tolist(), i) for i, row in enumerate(x)], "x array<float>, id int")
    for source in (plain, file):
        wrapped = KerasModel.fromKeras(source, featuresCol="x", inferenceBatchSize=3)
        assert wrapped.getLoss() == "sparse_categorical_crossentropy" and wrapped.getInferenceBatchSize() == 3
        assert wrapped.optimizerState is None
        out = sorted(wrapped.transform(df).collect(), key=lambda r: r["id"])
        np.testing.assert_allclose([r["probability"].toArray() for r in out], want, atol=1e-6)
        assert [r["prediction"] for r in out] == want.argmax(axis=1).tolist()
    # wrapped, saved and loaded like any fitted model
    wrapped.save(str(tmp_path / "wrapped"))
    again = KerasModel.load(str(tmp_path / "wrapped"))
    np.testing.assert_allclose(again.getKerasModel().predict(x, verbose=0), want, atol=1e-6)
    uncompiled = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    regressor = KerasModel.fromKeras(uncompiled, featuresCol="x")
    assert [f.name for f in regressor.transform(df).schema.fields] == ["x", "id", "prediction"]
    with pytest.raises(ConfigError, match="no file at"):
        KerasModel.fromKeras(str(tmp_path / "missing.keras"))
    with pytest.raises(ConfigError, match="keras.Model or the path"):
        KerasModel.fromKeras(42)


def test_a_missing_custom_object_on_load_names_itself(spark, tmp_path):
    @keras.saving.register_keras_serializable(package="sparkdl_missing")
    class Twice(keras.layers.Layer):
        def call(self, x):
            return x * 2.0

    plain = keras.Sequential([keras.Input((2,)), Twice(), keras.layers.Dense(1)])
    file = str(tmp_path / "custom.keras")
    plain.save(file)
    del keras.saving.get_custom_objects()["sparkdl_missing>Twice"]
    with pytest.raises(ConfigError, match=r"not registered here: \['sparkdl_missing>Twice'\]"):
        KerasModel.fromKeras(file)
    wrapped = KerasModel.fromKeras(file, customObjects={"sparkdl_missing>Twice": Twice})
    np.testing.assert_allclose(wrapped.getKerasModel().predict(np.ones((1, 2), np.float32), verbose=0),
                               plain.predict(np.ones((1, 2), np.float32), verbose=0), atol=1e-6)
    del keras.saving.get_custom_objects()["sparkdl_missing>Twice"]


def test_from_keras_takes_dict_outputs_per_output_losses_and_file_uris(spark, tmp_path):
    """Review findings: a model with a dict of outputs scores (Keras returns them keyed by the dict's
    keys, not the layers' names); per-output compile losses do not stop the wrapping; file: URIs,
    directories and unknown Params."""
    keras.utils.set_random_seed(9)
    inp = keras.Input((3,), name="x")
    hidden = keras.layers.Dense(4)(inp)
    model = keras.Model(inp, {"b": keras.layers.Dense(1, name="reg")(hidden),
                              "a": keras.layers.Dense(2, activation="softmax", name="cls")(hidden)})
    model.compile(optimizer="sgd", loss={"a": "categorical_crossentropy", "b": "mse"})
    x = np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32)
    want = model.predict(x, verbose=0)
    df = spark.createDataFrame([(row.tolist(), i) for i, row in enumerate(x)], "features array<float>, id int")
    with pytest.warns(UserWarning, match=r"compile arguments \['loss'\] out .*outputs are \['cls', 'reg'\]"):
        wrapped = KerasModel.fromKeras(model)  # Keras keys the losses by the dict's keys, sparkdl names outputs by layer
    assert not wrapped.isSet(wrapped.loss) and wrapped.isSet(wrapped.optimizer)
    rows = sorted(wrapped.transform(df).collect(), key=lambda r: r["id"])
    np.testing.assert_allclose([r["cls"] for r in rows], want["a"], atol=1e-6)
    np.testing.assert_allclose([r["reg"] for r in rows], want["b"][:, 0], atol=1e-6)
    file = tmp_path / "dict.keras"
    model.save(str(file))
    again = KerasModel.fromKeras(file.as_uri(), loss="mse")  # file:///..., an explicit loss: nothing to leave out
    assert again.getLoss() == "mse"
    with pytest.raises(ConfigError, match="no file at"):
        KerasModel.fromKeras(str(tmp_path))  # a directory
    with pytest.raises(ConfigError, match=r"unknown names: \['featureCol'\]"):
        KerasModel.fromKeras(model, featureCol="x")


def test_an_unregistered_custom_function_or_class_is_named_on_load(tmp_path):
    from sparkdl.keras.spec import missing_custom_objects

    config = {"module": "keras", "class_name": "Sequential", "config": {"layers": [
        {"module": "keras.layers", "class_name": "Dense", "registered_name": None,
         "config": {"activation": {"module": "builtins", "class_name": "function", "config": "gone_pkg>act", "registered_name": "function"}}},
        {"module": "no_such_module_xyz", "class_name": "Scale3", "registered_name": "Scale3", "config": {}},
        {"module": "keras.layers", "class_name": "Dense", "registered_name": None, "config": {"activation": "relu"}},
    ]}}
    assert missing_custom_objects(config) == ["Scale3", "gone_pkg>act"]
