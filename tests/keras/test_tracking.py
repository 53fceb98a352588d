"""Driver-side tracking (sparkdl.tracking): TensorBoard event files and MLflow runs.

The callbacks are driven by hand the way the estimator drives them (set_model, set_params,
on_train_begin, per round on_train_batch_end, on_epoch_end, on_train_end), with real Keras,
real TensorFlow summary writers and a real MLflow file store under tmp_path; what they wrote
is read back with TensorFlow's event-file reader and MlflowClient.
"""

import glob
import os
import sys

import numpy as np
import pytest

import keras

from sparkdl.errors import ConfigError
from sparkdl.tracking import MlflowLogger, TensorBoardLogger, mlflow_requested

mlflow = pytest.importorskip("mlflow")

PARAMS = {"epochs": 2, "steps": 2, "verbose": 0}
# Two epochs of two rounds each: (round index in the fit, running training logs after it).
ROUNDS = [
    (0, {"loss": 1.5, "accuracy": 0.25, "learning_rate": 0.125}),
    (1, {"loss": 1.25, "accuracy": 0.5, "learning_rate": 0.125}),
    (2, {"loss": 1.0, "accuracy": 0.5, "learning_rate": 0.0625}),
    (3, {"loss": 0.75, "accuracy": 0.75, "learning_rate": 0.0625}),
]
EPOCHS = [
    (0, {"loss": 1.25, "accuracy": 0.5, "val_loss": 2.0, "val_accuracy": 0.25}),
    (1, {"loss": 0.75, "accuracy": 0.75, "val_loss": 1.5, "val_accuracy": 0.5}),
]


def small_model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax", name="head")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def drive(callback, model, epochs=EPOCHS):
    """Run ``callback``'s hooks as the estimator does on the driver."""
    callback.set_model(model)
    callback.set_params(dict(PARAMS))
    callback.on_train_begin()
    for epoch, logs in epochs:
        callback.on_epoch_begin(epoch)
        for index, round_logs in ROUNDS[2 * epoch : 2 * epoch + 2]:
            callback.on_train_batch_end(index % PARAMS["steps"], dict(round_logs))  # Keras' batch: the round in the epoch
        callback.on_epoch_end(epoch, dict(logs))
    callback.on_train_end(dict(epochs[-1][1]))


def read_events(folder):
    """{tag: [(step, value)]} and {tag: plugin name} of every event file in ``folder``."""
    import tensorflow as tf

    values, plugins = {}, {}
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name:
                    plugins.setdefault(value.tag, value.metadata.plugin_data.plugin_name)
                data = tf.make_ndarray(value.tensor)
                data = data.item().decode() if data.dtype == object else float(data)
                values.setdefault(value.tag, []).append((event.step, data))
    return values, plugins


# -- TensorBoard --------------------------------------------------------------------------------


def test_tensorboard_logger_writes_the_keras_layout(tmp_path):
    log_dir = tmp_path / "tb"
    logger = TensorBoardLogger(str(log_dir))
    drive(logger, small_model())
    assert sorted(os.listdir(log_dir)) == ["train", "validation"]
    train, train_plugins = read_events(str(log_dir / "train"))
    val, val_plugins = read_events(str(log_dir / "validation"))

    assert train["epoch_loss"] == [(0, 1.25), (1, 0.75)]
    assert train["epoch_accuracy"] == [(0, 0.5), (1, 0.75)]
    assert val["epoch_loss"] == [(0, 2.0), (1, 1.5)]  # val_loss, without the prefix, in validation/
    assert val["epoch_accuracy"] == [(0, 0.25), (1, 0.5)]
    assert train["round_loss"] == [(0, 1.5), (1, 1.25), (2, 1.0), (3, 0.75)]
    assert train["round_learning_rate"] == [(0, 0.125), (1, 0.125), (2, 0.0625), (3, 0.0625)]
    # the epoch logs carry no learning rate: the last round's is written, as Keras adds the optimizer's
    assert train["epoch_learning_rate"] == [(0, 0.125), (1, 0.0625)]
    assert sorted(val) == ["epoch_accuracy", "epoch_loss"]
    assert not [tag for tag in train if "val_" in tag]
    assert set(train_plugins.values()) == {"scalars", "text"} and set(val_plugins.values()) == {"scalars"}
    (step, summary), = train["model_summary"]
    assert step == 0 and "head" in summary and "Total params" in summary
    assert logger._writers == {}  # closed at train end


def test_tensorboard_logger_skips_rounds_and_non_numbers_on_request(tmp_path):
    logger = TensorBoardLogger(tmp_path / "tb", write_rounds=False, write_model_summary=False)
    drive(logger, small_model(), epochs=[(0, {"loss": 0.5, "note": "text", "val_loss": float("nan")})])
    train, _ = read_events(str(tmp_path / "tb" / "train"))
    val, _ = read_events(str(tmp_path / "tb" / "validation"))
    assert sorted(train) == ["epoch_learning_rate", "epoch_loss"] and train["epoch_loss"] == [(0, 0.5)]
    assert np.isnan(val["epoch_loss"][0][1])  # NaN stays visible


def test_tensorboard_logger_errors(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    logger = TensorBoardLogger(str(blocker))
    logger.set_model(small_model())
    with pytest.raises(ConfigError, match="logDir must be a folder TensorFlow can create"):
        logger.on_train_begin()
    with pytest.raises(ConfigError, match="non-empty"):
        TensorBoardLogger("")
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # as if TensorFlow were not installed
    with pytest.raises(ConfigError, match="logDir needs the tensorflow package.*tensorflow-cpu"):
        TensorBoardLogger(str(tmp_path / "tb"))


# -- MLflow -------------------------------------------------------------------------------------


def history(client, run_id, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def test_mlflow_logger_starts_logs_and_ends_its_own_run(spark, tracking, tmp_path):
    from sparkdl import KerasModel

    model = small_model()
    stage = KerasModel.fromKeras(model, featuresCol="x")
    params = {"epochs": 2, "featuresCol": "x", "optimizer": {"class_name": "SGD"}, "long": "a" * 7000}
    logger = MlflowLogger(params, run_name="unit-fit")
    drive(logger, model, epochs=[(0, {**EPOCHS[0][1], "bad": float("nan"), "note": "x"}), EPOCHS[1]])
    assert mlflow.active_run().info.run_id == logger.run_id  # open until the model is logged
    uri = logger.log_model(stage)
    assert mlflow.active_run() is None

    run = tracking.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "unit-fit"
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH as limit  # 6000 since MLflow 2

    assert run.data.params == {"epochs": "2", "featuresCol": "x", "optimizer": "{'class_name': 'SGD'}", "long": "a" * limit}
    assert history(tracking, logger.run_id, "loss") == [(0, 1.25), (1, 0.75)]
    assert history(tracking, logger.run_id, "val_loss") == [(0, 2.0), (1, 1.5)]
    assert history(tracking, logger.run_id, "val_accuracy") == [(0, 0.25), (1, 0.5)]
    assert sorted(run.data.metrics) == ["accuracy", "loss", "val_accuracy", "val_loss"]  # NaN and text skipped

    assert uri == run.info.artifact_uri.rstrip("/") + "/model"
    assert [a.path for a in tracking.list_artifacts(logger.run_id)] == ["model"]
    local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp_path / "download"))
    assert not glob.glob(os.path.join(local, "**", "*.crc"), recursive=True)
    loaded = KerasModel.load(local)
    assert loaded.getFeaturesCol() == "x"
    for got, want in zip(loaded.getKerasModel().get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_mlflow_logger_uses_an_active_run_and_leaves_it_open(tracking):
    with mlflow.start_run(run_name="outer") as outer:
        mlflow.log_param("epochs", "5")
        logger = MlflowLogger({"epochs": 5, "batchSize": 32})
        drive(logger, small_model(), epochs=EPOCHS[:1])
        assert logger.run_id == outer.info.run_id
        logger.end_run()  # not its run: stays open
        assert mlflow.active_run().info.run_id == outer.info.run_id
        again = MlflowLogger({"epochs": 6, "batchSize": 32})  # a second fit in the same run
        again.set_model(small_model())
        with pytest.warns(UserWarning, match=r"other values.*\['epochs'\]"):
            again.on_train_begin()
    assert mlflow.active_run() is None
    run = tracking.get_run(outer.info.run_id)
    assert run.data.params == {"epochs": "5", "batchSize": "32"}
    assert history(tracking, outer.info.run_id, "loss") == [(0, 1.25)]


def test_mlflow_logger_errors(tracking, monkeypatch):
    with pytest.raises(ConfigError, match="after the fit"):
        MlflowLogger({}).log_model(None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")
    logger = MlflowLogger({"a": 1})
    with pytest.raises(ConfigError, match="could not start an MLflow run.*nosuchscheme"):
        logger.on_train_begin()
    assert mlflow.active_run() is None


def test_mlflow_requested_truth_table(tracking, monkeypatch):
    assert mlflow_requested(True) is True
    assert mlflow_requested(False) is False
    assert mlflow_requested(None) is False  # installed, no active run
    assert mlflow.active_run() is None  # asking starts nothing
    with mlflow.start_run():
        assert mlflow_requested(None) is True
        assert mlflow_requested(False) is False
    assert mlflow_requested(None) is False
    assert mlflow.active_run() is None
    with pytest.raises(ConfigError, match="True, False or None"):
        mlflow_requested("yes")
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if mlflow were not installed
    assert mlflow_requested(None) is False
    assert mlflow_requested(False) is False
    with pytest.raises(ConfigError, match=r"sparkdl-keras\[mlflow\]"):
        mlflow_requested(True)
    with pytest.raises(ConfigError, match="mlflow=True needs the mlflow package"):
        MlflowLogger({})
