"""Backend ``ps`` on real Spark (local[2]): sync equals rounds, async with one worker equals Keras,
each asynchronous mode's bookkeeping, and the handed cases C19 (server lifecycle) and C35 (too few
slots; dynamic allocation in tests/spark/test_ps_cluster_checks.py)."""

import socket
import threading
import time

import numpy as np
import pytest
from pyspark.sql import types as T

from sparkdl import KerasEstimator, KerasModel
from sparkdl.errors import ConfigError, ServerError
from tests.conftest import partitioned_df
from tests.spark.test_fit import _mlp, _rows, _toy

XY = T.StructType([T.StructField("x", T.ArrayType(T.FloatType())), T.StructField("y", T.DoubleType())])


def _estimator(**kwargs):
    args = dict(model=_mlp(), optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                featuresCol="x", labelCol="y", batchSize=10, keepPartitioning=True, verbose=0)
    args.update(kwargs)
    return KerasEstimator(**args)


def _unequal_df(spark):
    xa, ya = _toy(48, seed=1)
    xb, yb = _toy(30, seed=2)
    return partitioned_df(spark, [_rows(xa, ya), _rows(xb, yb)], XY)


@pytest.mark.slow  # the default run's 25-minute budget: tests/spark/test_sharded.py::test_the_same_seeded_fit_on_sharded_ps_and_rounds_gives_the_same_model runs it with sharded
@pytest.mark.backends  # also run under KERAS_BACKEND=jax and torch (make test, make test-all)
def test_sync_on_ps_equals_sync_on_rounds(spark):
    # 48 and 30 rows, batch 10: 5 and 3 steps per epoch; τ = 2: 3 rounds, partition 1 has no rows in round 3
    df = _unequal_df(spark)
    common = dict(numWorkers=2, epochs=2, localSteps=2, shuffle=True, seed=7)
    rounds = _estimator(backend="rounds", **common).fit(df)
    ps = _estimator(backend="ps", **common).fit(df)
    for got, want in zip(ps.getKerasModel().get_weights(), rounds.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    for got, want in zip(ps._optimizer_state, rounds._optimizer_state, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(ps.history["loss"], rounds.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(ps.history["accuracy"], rounds.history["accuracy"], rtol=1e-6)
    assert ps.fitInfo["backend"] == "ps" and ps.fitInfo["rounds"] == rounds.fitInfo["rounds"] == 6
    # a push per worker with rows in the round: partition 1 has none in the third round of each epoch
    assert ps.fitInfo["updates_applied"] == 10 and ps.fitInfo["duplicates_dropped"] == 0


@pytest.mark.backends  # also run under KERAS_BACKEND=jax and torch (make test, make test-all)
def test_async_one_worker_with_tau_one_epoch_equals_plain_keras(spark, tmp_path):
    x, y = _toy()
    df = partitioned_df(spark, [_rows(x, y)], XY)
    fitted = _estimator(numWorkers=1, epochs=3, localSteps=5, shuffle=False, mode="async").fit(df)  # 48 rows / 10: 5 steps
    plain = _mlp()
    plain.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = plain.fit(x, y, batch_size=10, epochs=3, shuffle=False, verbose=0).history
    for got, want in zip(fitted.getKerasModel().get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(fitted.history["loss"], history["loss"], rtol=1e-5)
    assert set(fitted.history) == {"loss", "accuracy"}  # the losses and metrics only: the server's counts are fitInfo's
    assert [e["updates_applied"] for e in fitted.fitInfo["ps_epochs"]] == [1, 1, 1]
    assert [e["staleness_max"] for e in fitted.fitInfo["ps_epochs"]] == [0, 0, 0]
    assert fitted.fitInfo["backend"] == "ps" and fitted.fitInfo["mode"] == "async"
    # the final optimizer state is the worker's own: Adam's iteration counter after 15 steps
    assert int(fitted._optimizer_state[0]) == 15
    fitted.save(str(tmp_path / "m"))  # history and fitInfo with the per-epoch ps counters persist
    loaded = KerasModel.load(str(tmp_path / "m"))
    assert loaded.history == fitted.history and [e["updates_applied"] for e in loaded.fitInfo["ps_epochs"]] == [1, 1, 1]
    for got, want in zip(loaded.getKerasModel().get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("mode", ["async", "hogwild", "staleness_aware", "ssp"])
def test_each_async_mode_reports_updates_staleness_and_bytes_per_epoch(spark, mode):
    import keras

    class Keys(keras.callbacks.Callback):  # what a Keras callback (TensorBoard, MLflow, CSVLogger) is given each epoch
        seen: list = []

        def on_epoch_end(self, epoch, logs=None):
            self.seen.append(sorted(logs or {}))

    df = _unequal_df(spark)
    fitted = _estimator(numWorkers=2, epochs=2, localSteps=2, mode=mode, staleness=1, callbacks=[Keys()]).fit(df)  # auto -> ps
    info = fitted.fitInfo
    assert info["backend"] == "ps" and info["mode"] == mode
    assert Keys.seen == [["accuracy", "loss"]] * 2  # the losses and metrics only: the server's counts are fitInfo's
    # per epoch: partition 0 pushes 3 times (5 steps, τ=2), partition 1 twice (3 steps)
    epochs = info["ps_epochs"]
    assert set(fitted.history) == {"loss", "accuracy"}
    assert [e["updates_applied"] for e in epochs] == [5, 5]
    assert info["updates_applied"] == 10 and info["duplicates_dropped"] == 0
    assert info["worker_pushes"] == [6, 4] and info["worker_steps"] == [10, 6]
    assert len(fitted.history["loss"]) == 2 and all(np.isfinite(fitted.history["loss"]))
    assert all(e["bytes_pushed"] > 0 and e["bytes_pulled"] > 0 for e in epochs)
    assert all(0 <= e["staleness_mean"] <= e["staleness_max"] for e in epochs)
    if mode == "ssp":
        assert info["staleness"] == 1


def test_rounds_refuses_async_modes_naming_ps(spark):
    with pytest.raises(ConfigError, match="backend 'ps'"):
        _estimator(mode="hogwild", backend="rounds").fit(_unequal_df(spark))


def test_c35_too_few_slots_fails_at_once_naming_both_numbers(spark):
    df = _unequal_df(spark)
    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    started = time.perf_counter()
    with pytest.raises(ConfigError) as raised:
        _estimator(numWorkers=3, mode="async").fit(df)
    assert time.perf_counter() - started < 10
    assert "numWorkers=3" in str(raised.value) and "task slots=2" in str(raised.value)
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) == jobs_before  # no job ran


def test_c19_port_in_use_fails_naming_it(spark):
    df = _unequal_df(spark)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ServerError, match=f"serverPort={port}"):
            _estimator(numWorkers=2, mode="async", serverPort=port).fit(df)


def test_c19_two_fits_in_a_row_on_one_port_leave_no_thread(spark):
    df = _unequal_df(spark)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    threads_before = {t.ident for t in threading.enumerate()}
    fits = [_estimator(numWorkers=2, epochs=1, localSteps=2, mode="ssp", serverPort=port).fit(df) for _ in range(2)]
    for a, b in zip(fits[0].getKerasModel().get_weights(), fits[1].getKerasModel().get_weights(), strict=True):
        assert a.shape == b.shape
    time.sleep(0.5)
    left = [t.name for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()]
    assert left == []
    with socket.socket() as again:  # the port is free again
        again.bind(("127.0.0.1", port))


def test_c19_a_dead_server_fails_a_worker_call_instead_of_hanging():
    """A worker's calls to a server that is gone fail within the call deadline, naming the server."""
    from sparkdl.core.modes.asynchronous import DownpourRule
    from sparkdl.core.state import ModelState
    from sparkdl.server import ParameterServer, ParameterServerClient

    server = ParameterServer(ModelState([np.zeros(3, np.float32)]), DownpourRule()).start()
    location, token = server.location, server.token
    server.shutdown()
    started = time.perf_counter()
    with ParameterServerClient(location, token, timeout_s=2.0, retries=1) as client, pytest.raises(ServerError, match=location.split("//")[1]):
        client.progress(0)
    assert time.perf_counter() - started < 30
