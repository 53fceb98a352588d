"""``backend="auto"`` (the default): which transport a fit runs on and why, decided before any job
(:func:`sparkdl.spark.backends.choose_backend`) on the real ``local[2]`` session; dynamic
allocation is asserted in the fresh session of ``test_ps_cluster_checks.py`` (C35), a remote
Spark Connect server on the stand-in sessions of ``test_connect.py``. One fit asserts the choice
and its reason in ``fitInfo``."""

import numpy as np
import pytest

from sparkdl import KerasEstimator
from sparkdl.config import FitConfig
from sparkdl.spark.cluster import ClusterFacts
from sparkdl.spark.session import FitPlan
from sparkdl.spark.backends import choose_backend
from tests.spark.test_connect import _session

import keras  # noqa: E402  (conftest selected the backend)


def test_auto_picks_ps_on_a_static_session_with_a_slot_per_worker(spark):
    choice = choose_backend(FitPlan.read(spark).cluster, FitConfig(num_workers=2, mode="sync"))
    assert choice.backend == "ps"
    assert choice.reason == "auto: static allocation, 2 task slots for 2 workers and a driver the executors reach"
    assert choose_backend(FitPlan.read(spark).cluster, FitConfig(num_workers=1, mode="gossip")).backend == "ps"


def test_auto_falls_back_to_rounds_with_too_few_slots_or_kept_partitions(spark):
    choice = choose_backend(FitPlan.read(spark).cluster, FitConfig(num_workers=3, mode="bmuf"))
    assert choice.backend == "rounds"
    assert choice.reason == "auto: too few task slots for backend 'ps': 2 for numWorkers=3 (it runs every worker at once)"
    choice = choose_backend(FitPlan.read(spark).cluster, FitConfig(num_workers=2, keep_partitioning=True))
    assert choice.backend == "rounds" and "keepPartitioning=True" in choice.reason


def test_auto_keeps_what_the_user_set_and_puts_asynchronous_modes_on_ps(spark):
    assert choose_backend(FitPlan.read(spark).cluster, FitConfig(num_workers=2, backend="rounds")) == ("rounds", "backend='rounds' was set")
    # the asynchronous modes exist only on ps, even when ps would not be auto's choice for a round mode
    choice = choose_backend(FitPlan.read(spark).cluster, FitConfig(num_workers=3, mode="ssp"))
    assert choice.backend == "ps" and choice.reason == "auto: mode 'ssp' is asynchronous and runs only on backend 'ps'"


def test_auto_on_spark_connect_needs_a_local_server_or_a_ps_host(monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_REMOTE", raising=False)
    remote = _session("spark://master:7077", "connect.example.com", **{"spark.executor.instances": "2", "spark.executor.cores": "2"})
    choice = choose_backend(FitPlan.read(remote).cluster, FitConfig(num_workers=2))
    assert choice.backend == "rounds"
    assert "remote Spark Connect server" in choice.reason and "spark.sparkdl.ps.host" in choice.reason
    remote.conf.values["spark.sparkdl.ps.host"] = "10.0.0.5"
    assert choose_backend(FitPlan.read(remote).cluster, FitConfig(num_workers=2)).backend == "ps"
    assert choose_backend(FitPlan.read(_session("local[2]", "127.0.0.1")).cluster, FitConfig(num_workers=2)).backend == "ps"
    unknown = choose_backend(FitPlan.read(_session("yarn", "connect.example.com")).cluster, FitConfig(num_workers=2))
    assert unknown.backend == "rounds" and "task slots of this Spark Connect cluster are unknown" in unknown.reason
    dynamic = _session("local[2]", "127.0.0.1", **{"spark.dynamicAllocation.enabled": "true"})
    assert choose_backend(FitPlan.read(dynamic).cluster, FitConfig(num_workers=2)) == (
        "rounds", "auto: spark.dynamicAllocation.enabled is true, and backends 'ps' and 'sharded' hold a task slot per worker for "
                  "the whole fit")


@pytest.mark.slow  # the default run's 25-minute budget: tests/docs/test_statements.py::test_auto_picks_ps_on_local_2_with_the_line_the_pages_quote runs its kind
def test_a_default_fit_reports_its_backend_and_why(spark, capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype(np.float32)
    df = spark.createDataFrame([([float(v) for v in xi], float(xi[0] > 0)) for xi in x], "x array<float>, y double")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    fitted = KerasEstimator(model=model, optimizer="sgd", loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y",
                            numWorkers=2, epochs=1, batchSize=8, verbose=2).fit(df)
    info = fitted.fitInfo
    assert info["backend"] == "ps" and info["rounds"] == 1
    assert info["backend_reason"] == "auto: static allocation, 2 task slots for 2 workers and a driver the executors reach"
    assert f"sparkdl fit {info['fit_id'][:8]}: backend ps (auto: static allocation" in capsys.readouterr().out
    seconds = info["seconds"]
    assert set(seconds) >= {"checks", "prepare_data", "first_step", "first_round", "other_rounds", "total"}
    assert 0 < seconds["first_step"] <= seconds["total"] and all(isinstance(v, float) for v in seconds.values())


def _facts(**kw):
    base = dict(master="spark://m:7077", connect=False, local_server=False, local=False, dynamic_allocation=False, slots=16,
                ps_host=None, driver_host="10.0.0.1", driver_bind=None, session="classic session", driver_memory_bytes=24 * 2**30)
    return ClusterFacts(**{**base, **kw})


def test_auto_picks_sharded_when_the_state_would_crowd_the_driver_on_ps():
    """ps holds about 10 states on the driver at a round's peak: a 1.2 GB state (100M parameters with
    Adam) on a 24 GB machine is more than a third of it, so auto picks sharded; 120 MB is not."""
    big, small = 1200 * 2**20, 120 * 2**20
    choice = choose_backend(_facts(), FitConfig(num_workers=2), state_bytes=big)
    assert choice.backend == "sharded" and "10.2 copies" in choice.reason and "24 GB" in choice.reason
    assert choose_backend(_facts(), FitConfig(num_workers=2), state_bytes=small).backend == "ps"
    assert choose_backend(_facts(), FitConfig(num_workers=8), state_bytes=small).backend == "ps"  # not for speed alone
    # what sharded does not run stays on ps: validation data, straggler-tolerant rounds, a mode it cannot slice
    assert choose_backend(_facts(), FitConfig(num_workers=2), state_bytes=big, validation=True).backend == "ps"
    assert choose_backend(_facts(), FitConfig(num_workers=2, min_workers_per_round=1), state_bytes=big).backend == "ps"
    assert choose_backend(_facts(), FitConfig(num_workers=2, compression="1bit"), state_bytes=big).backend == "sharded"
    assert choose_backend(_facts(), FitConfig(num_workers=2, mode="easgd"), state_bytes=big).backend == "ps"
    # and dynamic allocation keeps the round modes on rounds whatever the state
    assert choose_backend(_facts(dynamic_allocation=True), FitConfig(num_workers=2), state_bytes=big).backend == "rounds"
