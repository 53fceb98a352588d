"""A fit's TensorBoard event files (logDir) and MLflow run (mlflow=True or an active run), read back
and compared with the fit's own history (issue 12)."""

import numpy as np
import pytest

from sparkdl import KerasEstimator, KerasModel
from tests.keras.test_tracking import read_events
from tests.spark.test_callbacks import linear_df, linear_model

import keras  # noqa: E402

mlflow = pytest.importorskip("mlflow")


def fit(df, **params):
    return KerasEstimator(model=linear_model(), optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"], featuresCol="x",
                          labelCol="y", numWorkers=2, batchSize=4, localSteps=2, epochs=2, verbose=0, validationSplit=0.3,
                          **params).fit(df)


def test_logdir_and_mlflow_hold_the_fit_history_and_model(spark, tracking, tmp_path):
    df, *_ = linear_df(spark)
    fitted = fit(df, logDir=str(tmp_path / "tb"), mlflow=True)
    history, info = fitted.history, fitted.fitInfo
    assert len(history["val_loss"]) == 2

    train, plugins = read_events(str(tmp_path / "tb" / "train"))
    validation, _ = read_events(str(tmp_path / "tb" / "validation"))
    assert [step for step, _ in train["epoch_loss"]] == [0, 1]
    assert [v for _, v in train["epoch_loss"]] == pytest.approx(history["loss"], rel=1e-6)
    assert [v for _, v in train["epoch_mae"]] == pytest.approx(history["mae"], rel=1e-6)
    assert [v for _, v in validation["epoch_loss"]] == pytest.approx(history["val_loss"], rel=1e-6)
    rounds = info["rounds"]
    assert [step for step, _ in train["round_loss"]] == list(range(rounds))  # one point per round, steps across epochs
    assert train["round_loss"][info["rounds_per_epoch"] - 1][1] == pytest.approx(history["loss"][0], rel=1e-6)
    assert plugins["epoch_loss"] == "scalars"

    runs = mlflow.search_runs(output_format="list")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run_id = runs[0].info.run_id
    assert runs[0].data.params["numWorkers"] == "2" and runs[0].data.params["epochs"] == "2"
    for key in ("loss", "mae", "val_loss"):
        logged = sorted(tracking.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [m.step for m in logged] == [0, 1]
        assert [m.value for m in logged] == pytest.approx(history[key], rel=1e-6), key
    assert info["mlflow_run_id"] == run_id
    uri = info["mlflow_model_uri"]
    local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp_path / "download"))
    loaded = KerasModel.load(local)
    for got, want in zip(loaded.getKerasModel().get_weights(), fitted.getKerasModel().get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    assert loaded.history == history


@pytest.mark.slow
def test_mlflow_follows_an_active_run_and_stays_off_without_one(spark, tracking):
    df, *_ = linear_df(spark)
    fitted = fit(df)  # mlflow=None and no active run: nothing logged
    assert "mlflow_model_uri" not in fitted.fitInfo and mlflow.search_runs(output_format="list") == []
    with mlflow.start_run() as run:
        inside = fit(df)
        assert mlflow.active_run().info.run_id == run.info.run_id  # the user's run stays open
    logged = tracking.get_metric_history(run.info.run_id, "loss")
    assert [m.value for m in sorted(logged, key=lambda m: m.step)] == pytest.approx(inside.history["loss"], rel=1e-6)
    assert inside.fitInfo["mlflow_model_uri"].startswith(tracking.get_run(run.info.run_id).info.artifact_uri)
    fit(df, mlflow=False)
    assert len(mlflow.search_runs(output_format="list")) == 1


def test_progress_and_tensorboard_on_backend_ps(spark, tmp_path, capsys):
    """async on backend ps: the observers run as each epoch completes (the loop's round is the epoch's
    pushes): a progress line, epoch scalars and one round point per epoch, and each epoch's val_*,
    validated as the epoch ends."""
    df, *_ = linear_df(spark)
    fitted = KerasEstimator(model=linear_model(), optimizer=keras.optimizers.SGD(0.05), loss="mse", featuresCol="x", labelCol="y",
                            numWorkers=2, batchSize=4, epochs=2, mode="async", verbose=2, logDir=str(tmp_path / "tb"),
                            validationSplit=0.3).fit(df)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Epoch ")]
    assert [line.split(" - ")[0] for line in lines] == ["Epoch 1/2", "Epoch 2/2"]
    train, _ = read_events(str(tmp_path / "tb" / "train"))
    validation, _ = read_events(str(tmp_path / "tb" / "validation"))
    assert [v for _, v in train["epoch_loss"]] == pytest.approx(fitted.history["loss"], rel=1e-6)
    assert [(step, v) for step, v in validation["epoch_loss"]] == [(0, pytest.approx(fitted.history["val_loss"][0], rel=1e-6)),
                                                                   (1, pytest.approx(fitted.history["val_loss"][1], rel=1e-6))]
    assert [step for step, _ in train["round_loss"]] == [0, 1]  # the loop's rounds of an asynchronous fit are its epochs


def test_a_failed_fit_ends_its_mlflow_run_as_failed_and_a_bad_store_fails_before_any_job(spark, tracking, monkeypatch, tmp_path):
    from sparkdl.errors import ConfigError
    from tests.conftest import jobs_started

    df, *_ = linear_df(spark)

    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fit(df, mlflow=True, callbacks=[Boom()])
    runs = mlflow.search_runs(output_format="list")
    assert [r.info.status for r in runs] == ["FAILED"] and mlflow.active_run() is None
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # MLflow >= 3.7 refuses a new file: store without it
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "refused").as_uri())
    from packaging.version import Version

    if Version(mlflow.__version__) >= Version("3.7"):
        bad = KerasEstimator(model=linear_model(), loss="mse", featuresCol="x", labelCol="y", verbose=0, mlflow=True)
        assert jobs_started(spark, lambda: pytest.raises(ConfigError, bad.fit, df)) == 0
