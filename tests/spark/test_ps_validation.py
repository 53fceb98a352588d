"""Validation with no Spark job of its own (issue 31 item 6): each worker's partition holds its
share of the validation rows. On backend ``ps`` (a round mode) the workers evaluate each epoch's
master in their long-lived tasks and the driver adds up their exact metric sums; on ``rounds`` the
next epoch's first round runs ahead of the callbacks and its tasks evaluate the master, the round
run again when a callback changed its orders. Both give the same ``val_*`` history, the training
of the rows alone, a callback's early stop validated as in Keras, and a worker killed while it
validates retried by Spark with the same history (``local[2,4]``)."""

import numpy as np
import pytest

import keras
from sparkdl import KerasEstimator
from tests.conftest import jobs_started, run_spark_script


def _df(spark, n=96, seed=0):
    """Rows out of a shuffle (``orderBy``): AQE decides its partitions at run time; ``v``: a quarter
    of them are validation rows (``validationCol="v"``)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.float64)
    rows = [(x[i].tolist(), float(y[i]), i % 4 == 0, float(rng.normal())) for i in range(n)]
    return spark.createDataFrame(rows, "x array<float>, y double, v boolean, k double").orderBy("k").drop("k")


def _estimator(**kw):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2, activation="softmax")])
    params = dict(model=model, optimizer=keras.optimizers.Adam(0.02), loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  featuresCol="x", labelCol="y", numWorkers=2, batchSize=8, localSteps=2, epochs=3, verbose=0)
    params.update(kw)
    return KerasEstimator(**params)


def test_ps_workers_validate_in_their_tasks_with_no_job_and_the_history_of_rounds(spark):
    df = _df(spark)
    fits = {}

    def fit(backend, **kw):
        fits[backend] = _estimator(backend=backend, **kw).fit(df)

    one_epoch = jobs_started(spark, lambda: _estimator(backend="ps", validationCol="v", epochs=1).fit(df))
    three_epochs = jobs_started(spark, lambda: fit("ps", validationCol="v"))
    fit("rounds", validationCol="v")
    ps, rounds = fits["ps"], fits["rounds"]
    assert ps.fitInfo["validations_in_tasks"] == 3 and "validations_in_tasks" not in rounds.fitInfo
    # on rounds the validations of epochs 1 and 2 rode the first rounds of epochs 2 and 3; the last one is a job
    assert rounds.fitInfo["validations_riding_rounds"] == 2 and "rounds_run_again" not in rounds.fitInfo
    assert three_epochs == one_epoch  # no Spark job per epoch: one stage trains and validates
    assert ps.fitInfo["validation_rows"] == rounds.fitInfo["validation_rows"] > 0
    assert ps.fitInfo["rows"] + ps.fitInfo["validation_rows"] == 96
    for name in ("loss", "val_loss", "val_accuracy"):
        assert len(ps.history[name]) == 3
        np.testing.assert_allclose(ps.history[name], rounds.history[name], atol=1e-5)
    # validation rows beside the training rows change nothing of what is trained: the fit of the training rows alone
    alone = _estimator(backend="ps").fit(df.where(~df.v).drop("v"))
    np.testing.assert_allclose(alone.history["loss"], ps.history["loss"], atol=1e-6)
    for got, want in zip(ps.getKerasModel().get_weights(), alone.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_learning_rate_set_at_an_epochs_start_runs_the_round_that_ran_ahead_again(spark):
    """LearningRateScheduler sets a new rate as each epoch begins: on rounds the first round of epoch
    2, run ahead with epoch 1's validation at the old rate, is run again at the new one (and no
    round runs ahead after that); the history equals ps', where the workers validate in their tasks."""
    schedule = lambda epoch, lr: 0.05 / (epoch + 1)  # noqa: E731
    df = _df(spark)
    got = {backend: _estimator(backend=backend, validationCol="v", callbacks=[keras.callbacks.LearningRateScheduler(schedule)]).fit(df)
           for backend in ("ps", "rounds")}
    ps, rounds = got["ps"], got["rounds"]
    assert rounds.fitInfo["rounds_run_again"] == 1 and rounds.fitInfo["validations_riding_rounds"] == 1
    for name in ("loss", "val_loss", "learning_rate"):
        np.testing.assert_allclose(rounds.history[name], ps.history[name], atol=1e-5)
    assert rounds.history["learning_rate"] == pytest.approx([0.05, 0.025, 0.05 / 3])


def test_a_stop_inside_an_epoch_is_validated_in_the_tasks_as_keras_does(spark):
    """A callback stops the fit after the first round of epoch 2 (of 3 rounds): the workers waiting
    for the next round evaluate that master, the history ends with its val_loss, equal to rounds'."""

    class StopInEpoch2(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == 1 and batch == 0:
                self.model.stop_training = True

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

    df = _df(spark)
    got = {backend: _estimator(backend=backend, validationCol="v", callbacks=[StopInEpoch2()]).fit(df) for backend in ("ps", "rounds")}
    ps, rounds = got["ps"], got["rounds"]
    assert ps.fitInfo["rounds_per_epoch"] >= 2 and ps.fitInfo["stopped"]["epoch"] == 2
    assert ps.fitInfo["validations_in_tasks"] == 2
    assert len(ps.history["val_loss"]) == 2
    np.testing.assert_allclose(ps.history["val_loss"], rounds.history["val_loss"], atol=1e-5)


SCRIPT = """
import json, os, sys, tempfile
import numpy as np
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("OFF")
import keras
from sparkdl import KerasEstimator
from sparkdl.spark.training import faults

rng = np.random.default_rng(0)
x = rng.normal(size=(96, 4)).astype(np.float32)
y = (x[:, 0] - x[:, 1] > 0).astype(np.float64)
df = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range(96)], "x array<float>, y double")

def fit(backend, index=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2, activation="softmax")])
    est = KerasEstimator(model=model, optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy", featuresCol="x",
                         labelCol="y", numWorkers=2, epochs=3, batchSize=8, localSteps=2, verbose=0, backend=backend, validationSplit=0.25)
    if index is None:
        return est.fit(df), False
    markers = tempfile.mkdtemp()
    with faults.inject(faults.Fault(partition=1, index=index, how="kill", marker_dir=markers)):
        return est.fit(df), bool(os.listdir(markers))  # the fault fired

out = {}
for backend in ("ps", "rounds"):
    base, _ = fit(backend)
    # ps: as partition 1 evaluates epoch 2's master (index -2); rounds: the first round of epoch 3, which carries epoch 2's validation
    got, fired = fit(backend, -2 if backend == "ps" else 2 * base.fitInfo["rounds_per_epoch"])
    out[backend] = {"val_loss": [base.history["val_loss"], got.history["val_loss"]], "loss": [base.history["loss"], got.history["loss"]],
                    "fired": fired, "attempts": got.fitInfo.get("task_attempts"), "riding": got.fitInfo.get("validations_riding_rounds"),
                    "in_tasks": got.fitInfo.get("validations_in_tasks"),
                    "difference": max(float(np.abs(p - q).max()) for p, q in zip(base.getKerasModel().get_weights(), got.getKerasModel().get_weights()))}
json.dump(out, open(sys.argv[1], "w"))
spark.stop()
"""


@pytest.mark.slow  # the default run's 25 minutes (66 s); a killed ps worker's retry runs in tests/spark/test_faults.py; make test-all
def test_a_worker_killed_while_it_validates_is_retried_with_the_same_history(tmp_path):
    """SIGKILL of partition 1's Python worker as it evaluates epoch 2's master (ps: in its long-lived
    task; rounds: in the task of the round that carries the validation): Spark runs the task again
    (on ps it skips the slots its worker pushed and evaluates the validation it had not reported),
    and the fit ends with the undisturbed fit's model and history."""
    out = run_spark_script(SCRIPT, tmp_path)
    assert out["ps"]["attempts"]["1"] == 2 and out["ps"]["attempts"]["0"] == 1 and out["ps"]["in_tasks"] == 3
    assert out["rounds"]["riding"] == 2
    for backend in ("ps", "rounds"):
        got = out[backend]
        assert got["fired"] and got["difference"] < 1e-6, backend
        np.testing.assert_allclose(got["val_loss"][1], got["val_loss"][0], atol=1e-6)
        np.testing.assert_allclose(got["loss"][1], got["loss"][0], atol=1e-6)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
