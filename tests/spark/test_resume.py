"""Resume built on the fit's whole state (issue 20): a fit that fails after epoch 2 and is fitted
again with the same ``BackupAndRestore`` folder or ``checkpointDir`` ends where an uninterrupted
4-epoch fit ends (1e-6), for every round mode, each compression and straggler-tolerant rounds, on
both transports, on an input out of a shuffle; and callbacks that set weights or optimizer
variables between epochs train as ``keras.Model.fit`` does."""

import numpy as np
import pytest

import keras
from sparkdl import KerasEstimator


class Crash(keras.callbacks.Callback):
    """Fails the fit as epoch 3 begins (index 2), after epoch 2's snapshot."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise RuntimeError("driver lost")


def _shuffled(spark, n=48):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32) > 0).astype(np.float64)
    df = spark.createDataFrame([(x[i].tolist(), float(y[i]), float(rng.normal())) for i in range(n)], "x array<float>, y double, k double")
    return df.orderBy("k").drop("k")  # out of a shuffle: partitions as AQE makes them


def _estimator(settings: dict, **extra):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.BatchNormalization(),
                              keras.layers.Dense(2, activation="softmax")])
    params = dict(model=model, optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  featuresCol="x", labelCol="y", numWorkers=2, epochs=4, batchSize=8, localSteps=2, verbose=0, seed=5)
    params.update(settings)
    params.update(extra)
    return KerasEstimator(**params)


CONFIGS = {
    "sync": {},
    "bmuf": {"mode": "bmuf", "blockMomentum": 0.5},
    "easgd": {"mode": "easgd"},
    "gossip": {"mode": "gossip"},
    "fp16": {"compression": "fp16"},
    "1bit": {"compression": "1bit"},
    "threshold": {"compression": "threshold", "compressionThreshold": 0.01},
    "stragglers": {"minWorkersPerRound": 1, "roundDeadline": 60.0},  # the straggler path, nobody late
}


def _assert_equal_fits(resumed, whole):
    assert resumed.fitInfo["resumed_from_epoch"] == 2 and resumed.fitInfo["epochs_run"] == 2, resumed.fitInfo
    for got, want in zip(resumed.getKerasModel().get_weights(), whole.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(resumed.history["loss"], whole.history["loss"], rtol=1e-6)


SLOW = pytest.mark.slow  # the same path as a default-run case: in make test-all


@pytest.mark.parametrize("name", [pytest.param(n, marks=SLOW) if n in ("gossip", "fp16", "threshold", "stragglers", "bmuf", "easgd", "1bit") else n for n in CONFIGS])
def test_backup_and_restore_on_rounds_resumes_equal_to_an_uninterrupted_fit(spark, tmp_path, name):
    df = _shuffled(spark)
    settings = {**CONFIGS[name], "backend": "rounds"}
    whole = _estimator(settings).fit(df)
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="driver lost"):
        _estimator(settings, callbacks=[keras.callbacks.BackupAndRestore(backup), Crash()]).fit(df)
    resumed = _estimator(settings, callbacks=[keras.callbacks.BackupAndRestore(backup)]).fit(df)
    _assert_equal_fits(resumed, whole)


@pytest.mark.parametrize("name", ["sync", *(pytest.param(n, marks=SLOW) for n in ("easgd", "bmuf", "gossip", "1bit"))])
def test_checkpoint_dir_on_ps_resumes_equal_to_an_uninterrupted_fit(spark, tmp_path, name, capsys):
    df = _shuffled(spark)
    settings = {**CONFIGS[name], "backend": "ps"}
    whole = _estimator(settings).fit(df)
    folder = str(tmp_path / "checkpoints")
    with pytest.raises(RuntimeError, match="driver lost"):
        _estimator(settings, checkpointDir=folder, callbacks=[Crash()]).fit(df)
    capsys.readouterr()
    resumed = _estimator(settings, checkpointDir=folder, verbose=2).fit(df)
    _assert_equal_fits(resumed, whole)
    printed = capsys.readouterr().out  # issue 31 item 9: a resumed fit says so on the console
    assert f"sparkdl: resumed from epoch 2 of 4 (round {resumed.fitInfo['resumed_from_round']}) with the snapshot in {folder}; " \
           "epochs 3-4 to train" in printed, printed
    assert "Epoch 3/4" in printed and "Epoch 2/4" not in printed
    again = _estimator(settings, checkpointDir=folder).fit(df)  # a finished fit resumes finished: nothing to train
    assert again.fitInfo["epochs_run"] == 0 and again.fitInfo["resumed_from_epoch"] == 4
    assert "resumed" not in capsys.readouterr().out  # verbose=0 prints nothing
    for got, want in zip(again.getKerasModel().get_weights(), resumed.getKerasModel().get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


class HalveWeights(keras.callbacks.Callback):
    """Sets the model's weights between epochs (every epoch but the last)."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch < 2:
            self.model.set_weights([w * 0.5 for w in self.model.get_weights()])


class ResetMomentum(keras.callbacks.Callback):
    """Sets an optimizer variable between epochs: SGD's momentum buffers back to zero."""

    def on_epoch_end(self, epoch, logs=None):
        for variable in self.model.optimizer.variables:
            if "momentum" in variable.path:
                variable.assign(np.zeros(variable.shape, variable.dtype))


@pytest.mark.parametrize("backend, callback", [("rounds", HalveWeights), ("ps", HalveWeights), ("rounds", ResetMomentum),
                                               pytest.param("ps", ResetMomentum, marks=SLOW)])
def test_weights_and_optimizer_variables_a_callback_sets_train_as_keras_fit(spark, backend, callback):
    from tests.conftest import partitioned_df

    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = (x @ np.array([0.5, -1.0, 2.0], np.float32)).astype(np.float32)
    df = partitioned_df(spark, [[(x[i].tolist(), float(y[i])) for i in range(40)]], "x array<float>, y double")

    def model():
        keras.utils.set_random_seed(2)
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])

    plain = model()
    plain.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    history = plain.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[callback()])
    fitted = KerasEstimator(model=model(), optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse", featuresCol="x",
                            labelCol="y", numWorkers=1, keepPartitioning=True, shuffle=False, epochs=3, batchSize=8, verbose=0,
                            backend=backend, callbacks=[callback()]).fit(df)
    assert fitted.fitInfo["weights_from_callbacks"] is True
    for got, want in zip(fitted.getKerasModel().get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(fitted.history["loss"], history.history["loss"], rtol=1e-6)


@pytest.mark.slow  # the default run's budget: tests/integration/test_sharded_faults.py's killed driver resumes from the owners' slices
def test_checkpoint_dir_on_sharded_each_owner_writes_its_slice_and_resumes_equal_to_an_uninterrupted_fit(spark, tmp_path):
    """bmuf, whose block momentum lives in the slices: the owners write their slices beside the
    snapshot (the driver writes the manifest), a fit run again resumes from them on sharded, and
    on ps (the driver assembles the slices)."""
    import glob
    import json

    df = _shuffled(spark)
    settings = {**CONFIGS["bmuf"], "backend": "sharded"}
    whole = _estimator(settings).fit(df)
    folder = str(tmp_path / "checkpoints")
    with pytest.raises(RuntimeError, match="driver lost"):
        _estimator(settings, checkpointDir=folder, callbacks=[Crash()]).fit(df)
    snapshots = sorted(glob.glob(f"{folder}/snapshot-*.json"))
    meta = json.loads(open(snapshots[-1]).read())
    assert len(meta["sliced"]["uris"]) == 2 and "master.w" not in meta["layout"] and not meta["mode_keys"]  # no master array in the driver's file
    assert len(glob.glob(f"{folder}/{snapshots[-1].rsplit('/', 1)[1][:-5]}.slice-*-of-2.arrow")) == 2
    resumed = _estimator(settings, checkpointDir=folder).fit(df)
    _assert_equal_fits(resumed, whole)
    with pytest.raises(RuntimeError, match="driver lost"):
        _estimator(settings, checkpointDir=str(tmp_path / "again"), callbacks=[Crash()]).fit(df)
    on_ps = _estimator({**settings, "backend": "ps"}, checkpointDir=str(tmp_path / "again")).fit(df)
    _assert_equal_fits(on_ps, whole)


KILLED_MID_WRITE = r"""
import os, signal, sys
from sparkdl.spark.persistence import scratch_folder
with scratch_folder() as folder:  # as write_bytes stages a snapshot's bytes before they go up
    with open(os.path.join(folder, "data"), "wb") as f:
        f.write(b"\0" * 1_000_000)
    print(folder, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the driver killed mid-write
"""


def test_a_resumed_run_removes_the_snapshot_bytes_a_killed_driver_left_in_its_temp_folder(spark, tmp_path, monkeypatch):
    """Issue 31 item 14: a driver killed while writing a snapshot left its bytes in the driver's temp
    folder (108 MB for a 9M-parameter Adam state), never removed. The store of the next run removes the
    scratch folders of processes that are gone, and keeps those of live ones (another driver's)."""
    import os
    import subprocess
    import sys
    import tempfile

    from sparkdl.spark import persistence
    from sparkdl.spark.training.checkpoint import FitStateStore
    from tests.conftest import ROOT

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch), PYTHONPATH=ROOT)
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE], env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9
    left = killed.stdout.strip()
    assert os.path.getsize(os.path.join(left, "data")) == 1_000_000 and os.path.dirname(left) == str(scratch)
    mine = scratch / f"{persistence.SCRATCH_PREFIX}{os.getpid()}-live"  # this driver's, in use
    mine.mkdir()
    other = scratch / "sparkdl-train-abc"  # not a scratch folder: not ours to judge
    other.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    FitStateStore(spark, str(tmp_path / "checkpoints"))  # what the resumed fit builds for its checkpointDir
    assert sorted(p.name for p in scratch.iterdir()) == sorted([mine.name, other.name])
    persistence.write_bytes(str(tmp_path / "checkpoints" / "x.bin"), b"abc", spark)  # a write leaves nothing either
    assert persistence.read_bytes(str(tmp_path / "checkpoints" / "x.bin"), spark) == b"abc"
    assert sorted(p.name for p in scratch.iterdir()) == sorted([mine.name, other.name])
