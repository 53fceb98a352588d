"""Keras callbacks on the driver (issue 12, case C17): one decision for every worker, the master
weights in the callbacks' model, learning rates that reach the replicas, progress lines."""

import csv
import math
import time

import numpy as np
import pytest

from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError
from tests.conftest import jobs_started, partitioned_df

import keras  # noqa: E402


def linear_df(spark, n=40, slope=1.0, seed=0, partitions=2):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2)).astype(np.float32)
    y = slope * x[:, 0] + 0.5 * x[:, 1]
    rows = [(x[i].tolist(), float(y[i])) for i in range(n)]
    size = -(-n // partitions)
    return partitioned_df(spark, [rows[i : i + size] for i in range(0, n, size)], "x array<float>, y double"), x, y


def linear_model(zeros=False):
    keras.utils.set_random_seed(0)
    init = "zeros" if zeros else "glorot_uniform"
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer=init, bias_initializer="zeros")])


def estimator(model, **params):
    base = dict(model=model, optimizer=keras.optimizers.SGD(0.05), loss="mse", featuresCol="x", labelCol="y", numWorkers=2,
                batchSize=4, localSteps=2, verbose=0, seed=1)
    base.update(params)
    return KerasEstimator(**base)


@pytest.mark.backends
@pytest.mark.parametrize("backend", [pytest.param("rounds", marks=pytest.mark.slow), "ps"])
def test_c17_early_stopping_on_a_constant_target_stops_every_worker_in_the_same_round(spark, backend):
    """C17: 40 rows, 2 workers, a constant target (the zero model is exact at once, so val_loss never
    improves), EarlyStopping(patience=1), epochs=20: fit returns after epoch 2 with a 2-epoch history."""
    rng = np.random.default_rng(0)
    rows = [(rng.normal(size=2).astype(np.float32).tolist(), 0.0) for _ in range(40)]
    df = partitioned_df(spark, [rows[:20], rows[20:]], "x array<float>, y double")
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, restore_best_weights=True)
    started = time.monotonic()
    fitted = estimator(linear_model(zeros=True), epochs=20, validationSplit=0.25, callbacks=[stop], backend=backend).fit(df)
    assert time.monotonic() - started < 120
    assert len(fitted.history["loss"]) == 2 and len(fitted.history["val_loss"]) == 2
    assert fitted.history["val_loss"] == [0.0, 0.0]
    info = fitted.fitInfo
    assert info["stopped"]["epoch"] == 2 and stop.stopped_epoch == 1
    assert info["rounds"] == 2 * info["rounds_per_epoch"]  # no worker ran a round of epoch 3
    assert info["stopped"]["round"] == info["rounds"]
    assert len(info["epoch_seconds"]) == 2
    np.testing.assert_array_equal(fitted.getKerasModel().get_weights()[0], np.zeros((2, 1), np.float32))
    assert cached_fits(spark).isdisjoint({info["fit_id"]})  # the early stop freed the executors' rows, replica and validation rows


def cached_fits(spark) -> set:
    """The fit ids whose rows or replica the executors' Python workers still cache."""
    import pyarrow as pa

    def probe(batches):
        from sparkdl.spark.partitions import WORKER_CACHE

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist([{"fit": fit} for fit in WORKER_CACHE.fits()], schema=pa.schema([("fit", pa.string())]))

    return {row.fit for row in spark.range(0, 4, 1, 4).mapInArrow(probe, "fit string").collect()}


@pytest.mark.parametrize("backend", ["rounds", pytest.param("ps", marks=pytest.mark.slow)])
def test_restore_best_weights_gives_the_master_weights_of_the_best_epoch(spark, backend):
    """Training pulls the slope to +1 while the validation rows have slope -1: val_loss is best after
    epoch 1, and the restored weights equal a 1-epoch fit's (same seed, same rounds)."""
    train, *_ = linear_df(spark, n=32, slope=1.0)
    val, *_ = linear_df(spark, n=16, slope=-1.0, seed=1)
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
    fitted = estimator(linear_model(), epochs=10, callbacks=[stop], backend=backend).fit(train, validationData=val)
    losses = fitted.history["val_loss"]
    assert len(losses) == 3 and losses[0] < losses[1] < losses[2]
    assert fitted.fitInfo["weights_from_callbacks"] is True
    one = estimator(linear_model(), epochs=1).fit(train)
    for got, want in zip(fitted.getKerasModel().get_weights(), one.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    three = estimator(linear_model(), epochs=3).fit(train)
    assert not np.allclose(three.getKerasModel().get_weights()[0], one.getKerasModel().get_weights()[0], atol=1e-3)


@pytest.mark.backends
@pytest.mark.parametrize("backend", ["rounds", pytest.param("ps", marks=pytest.mark.slow)])
def test_reduce_lr_on_plateau_reaches_the_replicas_from_the_next_round(spark, backend):
    """ReduceLROnPlateau halves the learning rate at the end of epochs 2 and 3 (min_delta so large that
    no epoch after the first improves); the learning rate read back from the optimizer state the
    replicas returned is the new one from the next round on."""
    df, *_ = linear_df(spark)
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=1e9)
    fitted = estimator(linear_model(), epochs=4, callbacks=[plateau], backend=backend).fit(df)
    per_epoch = fitted.fitInfo["rounds_per_epoch"]
    rates = fitted.fitInfo["learning_rates"]  # (round, rate sent, rate in the replicas' returned optimizer state)
    assert [r for r, *_ in rates] == list(range(2 * per_epoch, 4 * per_epoch))  # from the first round after the first change
    for round_index, sent, replicas in rates:
        want = 0.025 if round_index < 3 * per_epoch else 0.0125
        assert sent == pytest.approx(want) and replicas == pytest.approx(want, rel=1e-6), round_index
    assert fitted.history["learning_rate"] == pytest.approx([0.05, 0.05, 0.025, 0.0125])  # as Keras logs it, before a change


def test_learning_rate_scheduler_and_a_round_level_callback(spark):
    df, *_ = linear_df(spark)

    class Recorder(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.rounds, self.epoch_weights = [], []

        def on_train_batch_end(self, batch, logs=None):
            self.rounds.append((batch, sorted(logs)))

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_weights.append([w.copy() for w in self.model.get_weights()])

    recorder = Recorder()
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 * 0.5**epoch)
    shuffled = df.orderBy("y")  # an input out of a shuffle (AQE-coalesced partitions)
    fitted = estimator(linear_model(), epochs=2, callbacks=[schedule, recorder]).fit(shuffled)
    per_epoch = fitted.fitInfo["rounds_per_epoch"]
    assert per_epoch == 3  # 20 rows per worker, batches of 4, τ = 2
    assert recorder.rounds == [(r, ["learning_rate", "loss"]) for r in range(per_epoch)] * 2
    sent = [(r, s) for r, s, _ in fitted.fitInfo["learning_rates"]]
    assert sent == [(r, pytest.approx(0.1 if r < per_epoch else 0.05)) for r in range(2 * per_epoch)]
    for got, want in zip(recorder.epoch_weights[-1], fitted.getKerasModel().get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)  # the callbacks' model holds the master weights at epoch end


@pytest.mark.parametrize("backend", ["rounds", pytest.param("ps", marks=pytest.mark.slow)])
def test_checkpoint_csv_logger_and_terminate_on_nan(spark, tmp_path, backend):
    df, *_ = linear_df(spark)
    from sparkdl.keras.callbacks import ModelCheckpoint

    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt-{epoch:02d}.keras"))
    through_arrow = ModelCheckpoint((tmp_path / "arrow" / "best.weights.h5").as_uri(), save_weights_only=True, save_best_only=True,
                                    monitor="loss")  # a URI: written through pyarrow.fs
    every_two_rounds = keras.callbacks.ModelCheckpoint(str(tmp_path / "rounds" / "e{epoch}-r{batch}.weights.h5"), save_weights_only=True,
                                                       save_freq=2)  # Keras' batches are the fit's rounds
    csv_path = tmp_path / "history.csv"
    callbacks = [checkpoint, through_arrow, every_two_rounds, keras.callbacks.CSVLogger(str(csv_path))]
    fitted = estimator(linear_model(), epochs=2, callbacks=callbacks, backend=backend).fit(df)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.keras")) == ["ckpt-01.keras", "ckpt-02.keras"]
    assert fitted.fitInfo["rounds"] == 6 and len(list((tmp_path / "rounds").glob("*.weights.h5"))) == 3
    last = keras.saving.load_model(tmp_path / "ckpt-02.keras")
    for got, want in zip(last.get_weights(), fitted.getKerasModel().get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    assert fitted.history["loss"][1] < fitted.history["loss"][0]  # so the best is the last epoch
    best = linear_model()
    best.load_weights(tmp_path / "arrow" / "best.weights.h5")
    for got, want in zip(best.get_weights(), fitted.getKerasModel().get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ConfigError, match="pyarrow.fs"):
        ModelCheckpoint("nosuchscheme://bucket/ckpt.keras")
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert [float(r["loss"]) for r in rows] == pytest.approx(fitted.history["loss"], rel=1e-6)

    # An exploding learning rate: the loss turns inf/NaN; TerminateOnNaN stops the fit in that round and
    # the master keeps the last finite weights (without the callback the fit fails on the invariant).
    exploding = dict(optimizer=keras.optimizers.SGD(1e12), epochs=5, backend=backend)
    nan = estimator(linear_model(), callbacks=[keras.callbacks.TerminateOnNaN()], **exploding).fit(df)
    assert nan.fitInfo["stopped"]["epoch"] == 1 and "not finite" in nan.fitInfo["stopped_reason"]
    assert all(np.isfinite(w).all() for w in nan.getKerasModel().get_weights())
    assert not math.isfinite(nan.history["loss"][-1]) or nan.history["loss"][-1] > 1e6
    from sparkdl.errors import InvariantError

    with pytest.raises(InvariantError, match="finite"):
        estimator(linear_model(), **exploding).fit(df)


def test_callbacks_are_checked_and_never_params():
    with pytest.raises(ConfigError, match=r"keras.callbacks.Callback objects. Received: str at position 0"):
        estimator(linear_model(), callbacks=["early"])
    est = estimator(linear_model(), callbacks=[keras.callbacks.EarlyStopping()])
    assert len(est.getCallbacks()) == 1 and "callbacks" not in {p.name for p in est.params}  # not a Param: never saved
    assert est.copy().getCallbacks() == est.getCallbacks()  # CrossValidator's copies, fit(validationData=) keep them



def test_verbose_lines_per_epoch_and_job_descriptions(spark, capsys):
    from tests.spark.test_data_labels import _job_descriptions

    df, *_ = linear_df(spark)
    sc = spark.sparkContext
    sc.setJobGroup("callbacks-descriptions", "descriptions")
    try:
        fitted = estimator(linear_model(), epochs=2, verbose=2, backend="rounds").fit(df)  # a job per round: its description
        descriptions = _job_descriptions(sc, "callbacks-descriptions")
    finally:
        sc.setJobGroup("", "")
    fit_id = fitted.fitInfo["fit_id"][:8]
    assert f"sparkdl fit {fit_id}: round 1/6 (epoch 1/2, round 1/3)" in descriptions, descriptions
    assert f"sparkdl fit {fit_id}: round 6/6 (epoch 2/2, round 3/3)" in descriptions, descriptions
    out = capsys.readouterr().out
    assert f"sparkdl fit {fit_id}: backend rounds (backend='rounds' was set)" in out
    lines = [line for line in out.splitlines() if line.startswith("Epoch ")]
    assert [line.split(" - ")[0] for line in lines] == ["Epoch 1/2", "Epoch 2/2"]
    assert all("samples/s" in line and "loss: " in line for line in lines)
    estimator(linear_model(), epochs=1, verbose=0).fit(df)
    assert "Epoch" not in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"verbose must be 0, 1 or 2. Received: verbose=3"):
        estimator(linear_model(), verbose=3).fit(df)


@pytest.mark.slow  # the default run's 25-minute budget: tests/spark/test_resume.py runs resume on both backends
@pytest.mark.parametrize("backend", [pytest.param("rounds", marks=pytest.mark.slow), "ps"])  # rounds: tests/spark/test_resume.py
def test_backup_and_restore_resumes_a_failed_fit_where_it_stopped(spark, tmp_path, backend):
    """A fit that fails after epoch 2 resumes from keras.callbacks.BackupAndRestore's backup at epoch 3,
    with the master weights and Adam's state of then: it ends with the weights of an uninterrupted fit."""
    df, *_ = linear_df(spark)

    class Crash(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("executor lost")

    adam = dict(optimizer=keras.optimizers.Adam(0.05), epochs=4, backend=backend)
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="executor lost"):
        estimator(linear_model(), callbacks=[keras.callbacks.BackupAndRestore(backup), Crash()], **adam).fit(df)
    resumed = estimator(linear_model(), callbacks=[keras.callbacks.BackupAndRestore(backup)], **adam).fit(df)
    assert resumed.fitInfo["resumed_from_epoch"] == 2 and resumed.fitInfo["epochs_run"] == 2
    whole = estimator(linear_model(), **adam).fit(df)
    assert resumed.history["loss"] == pytest.approx(whole.history["loss"], rel=1e-5)  # the whole fit's history
    for got, want in zip(resumed.getKerasModel().get_weights(), whole.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert not (tmp_path / "backup").exists()  # deleted once the fit ended well, as Keras does


def test_a_callback_object_serves_one_fit_at_a_time(spark):
    """CrossValidator(parallelism=2) would run two fits sharing one EarlyStopping (its best value, its
    model): the second is refused while the first runs; one after the other they work."""
    import threading

    df, *_ = linear_df(spark)
    started, release = threading.Event(), threading.Event()

    class Hold(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            started.set()
            release.wait(60)

    shared = keras.callbacks.EarlyStopping(monitor="loss")
    first = estimator(linear_model(), callbacks=[shared, Hold()])
    errors = []
    thread = threading.Thread(target=lambda: errors.append(first.fit(df)))
    thread.start()
    try:
        assert started.wait(60)
        with pytest.raises(ConfigError, match=r"one fit at a time.*\['EarlyStopping'\]"):
            estimator(linear_model(), callbacks=[shared]).fit(df)
    finally:
        release.set()
        thread.join(120)
    assert len(errors) == 1 and len(errors[0].history["loss"]) == 1
    assert len(estimator(linear_model(), callbacks=[shared]).fit(df).history["loss"]) == 1


def test_asynchronous_modes_run_epoch_callbacks_as_observers_and_stop_every_worker_at_its_next_slot(spark):
    """async on ps: the loop's round is an epoch (its pushes, applied as they came); on_epoch_end sees
    the server's master; EarlyStopping stops every worker at its next slot, not at a common round."""
    df, *_ = linear_df(spark, n=64)
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)  # no epoch improves by 1e9: stops after 2

    class Seen(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs, self.weights = [], []

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append(epoch)
            self.weights.append([w.copy() for w in self.model.get_weights()])

    seen = Seen()
    from sparkdl.spark.training import faults

    slow = faults.Faults((faults.Delay(partition=0, seconds=0.3), faults.Delay(partition=1, seconds=0.3)))
    with faults.inject(slow):  # 0.3 s a slot: the driver's stop reaches the workers before they run far ahead
        fitted = estimator(linear_model(), mode="async", epochs=10, callbacks=[stop, seen]).fit(df)
    info = fitted.fitInfo
    assert len(fitted.history["loss"]) == 2 and info["stopped"]["epoch"] == 2 and seen.epochs == [0, 1]
    for got, want in zip(seen.weights[-1], fitted.getKerasModel().get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)  # the fitted model is the master the last epoch's callbacks saw
    late = sum(e["updates_applied"] for e in info["ps_epochs"][2:])
    assert late <= 2 * 2, info["ps_epochs"]  # after the stop, about a slot in flight per worker, far from 8 epochs' 64
