"""The ps backend's pure parts: SyncRoundRule, EpochRecorder, the config rules, and the server's
heartbeat / progress / SSP-clock actions over real Flight."""

import threading
import time

import numpy as np
import pytest

from sparkdl.config import FitConfig
from sparkdl.core.async_rules import DownpourRule, HogwildRule
from sparkdl.core.modes import SyncAveraging, get_policy
from sparkdl.core.ps_rules import EpochRecorder, SyncRoundRule, decode_metric_sums, encode_metric_sums
from sparkdl.core.state import ModelState, WorkerUpdate
from sparkdl.errors import ConfigError
from sparkdl.server import ParameterServer, ParameterServerClient


def _state(w, it=0):
    return ModelState([np.array(w, np.float32)], [np.array(it, np.int64), np.array([w[0]] * 2, np.float32)])


def test_sync_round_rule_equals_sync_averaging_and_waits_for_every_worker():
    master = _state([0.0, 0.0])
    a, b, empty = _state([1.0, 2.0], 4), _state([4.0, 8.0], 2), ModelState([np.zeros(2, np.float32)])
    rule = SyncRoundRule(3)
    assert rule(master, a, {"rows": 30}) is master and rule(master, empty, {"rows": 0}) is master
    got = rule(master, b, {"rows": 10})
    want = SyncAveraging().apply(master, [WorkerUpdate(0, 30, 1, a), WorkerUpdate(1, 0, 0, None), WorkerUpdate(2, 10, 1, b)])
    for g, w in zip([*got.weights, *got.optimizer], [*want.weights, *want.optimizer], strict=True):
        np.testing.assert_array_equal(g, w)
        assert isinstance(g, np.ndarray)
    np.testing.assert_allclose(got.weights[0], [1.75, 3.5])
    assert int(got.optimizer[0]) == 4  # rint((30*4 + 10*2) / 40) = 3.5 -> 4
    assert rule.pending == 0
    # a round where nobody trained keeps the master
    for _ in range(3):
        kept = rule(got, empty, {"rows": 0})
    assert kept is got


def test_epoch_recorder_counts_each_applied_push_once_with_its_metrics():
    recorder = EpochRecorder(DownpourRule(), epochs=2)
    master = ModelState([np.zeros(2, np.float32)])
    sums = [np.array(3.0), np.array([1.0, 2.0])]
    assert [a.tolist() for a in decode_metric_sums(encode_metric_sums(sums))] == [3.0, [1.0, 2.0]]
    extra = {"epoch": 1, "metrics": encode_metric_sums(sums), "pulled": 100}
    new = recorder(master, ModelState([np.ones(2, np.float32)]), {"rows": 5, "staleness": 2, "nbytes": 8, "extra": extra})
    recorder(new, ModelState([np.ones(2, np.float32)]), {"rows": 7, "staleness": 0, "nbytes": 8, "extra": {**extra, "final": True, "worker_rows": 12}})
    np.testing.assert_array_equal(new.weights[0], [1.0, 1.0])
    assert recorder.rows(0) == 0 and recorder.rows(1) == 12
    assert recorder.summaries()[1] == {"updates_applied": 2, "staleness_mean": 1.0, "staleness_max": 2, "bytes_pushed": 16, "bytes_pulled": 200}
    assert [a.tolist() for a in recorder.epochs[1].sums.total()] == [6.0, [2.0, 4.0]]
    assert recorder.lock is True and EpochRecorder(HogwildRule(), 1).lock is False


def test_config_backends_and_modes():
    assert FitConfig(mode="async", backend="auto").resolved_backend == "ps"
    assert FitConfig(mode="sync", backend="auto").resolved_backend == "rounds"
    assert FitConfig(mode="sync", backend="ps").resolved_backend == "ps"
    with pytest.raises(ConfigError, match="backend 'ps'"):
        FitConfig(mode="ssp", backend="rounds")
    with pytest.raises(ConfigError, match="staleness"):
        FitConfig(mode="ssp", backend="ps", staleness=-1)
    with pytest.raises(ConfigError, match="serverPort"):
        FitConfig(server_port=70000)
    with pytest.raises(ConfigError, match="workerTimeout"):
        FitConfig(worker_timeout_s=0)
    assert get_policy("staleness_aware").rule().name == "staleness_aware"
    with pytest.raises(ConfigError, match="backend 'ps'"):
        get_policy("async").apply_mean(None, None, 0)


def test_server_heartbeat_progress_and_ssp_clock():
    master = ModelState([np.zeros(3, np.float32)])
    with ParameterServer(master, DownpourRule()) as server, ParameterServerClient(server.location, server.token, timeout_s=10) as client:
        server.register_clocks(["0", "1"])
        assert client.progress(0) == (None, None)
        client.heartbeat(0)
        assert server.contacts()["0"]["state"] == "alive" and server.contacts()["0"]["seconds"] < 5
        delta = [np.ones(3, np.float32)]
        for seq in (1, 2):
            client.push(delta, worker=0, attempt=7, seq=seq, base_version=0, rows=1, extra={"clock": seq})
        assert client.progress(0) == (7, 2)
        assert server.clocks() == {"0": 2, "1": 0}
        assert client.wait_clock(0, 2, 0.1) is True  # 2 ahead of the slowest: allowed with s = 2
        assert client.wait_clock(0, 1, 0.1) is False  # not with s = 1
        released = []
        waiter = threading.Thread(target=lambda: released.append(client.wait_clock(0, 1, 5.0)))
        started = time.perf_counter()
        waiter.start()
        time.sleep(0.3)
        client.heartbeat(1, "done")  # a finished worker no longer holds the others back
        waiter.join()
        assert released == [True] and time.perf_counter() - started < 3
        assert server.contacts()["1"]["state"] == "done" and server.clocks() == {"0": 2}
        client.heartbeat(0, "error", "boom")
        assert server.contacts()["0"]["message"] == "boom"


def test_weights_only_pull_leaves_out_the_optimizer_arrays():
    master = _state([1.0, 2.0], 3)
    with ParameterServer(master, DownpourRule()) as server, ParameterServerClient(server.location, server.token, timeout_s=10) as client:
        version, full = client.pull()
        assert full.optimizer is not None and len(full.optimizer) == 2
        before = server.stats()["bytes_pulled"]
        version, weights = client.pull(weights_only=True)
        assert weights.optimizer is None and weights.weights[0].tolist() == [1.0, 2.0] and version == 0
        assert server.stats()["bytes_pulled"] - before < before  # 8 bytes of weights, not 24 of everything


def test_round_rule_closes_with_the_minimum_after_the_deadline_and_drops_a_late_push():
    """Straggler-tolerant rounds: 3 workers, minimum 2, deadline 5 s (a fake clock)."""
    now = [0.0]
    rule = SyncRoundRule(3, min_workers=2, deadline_s=5.0, rounds_per_epoch=1, clock=lambda: now[0])
    master = ModelState([np.zeros(2, np.float32)])
    a, b = ModelState([np.array([2.0, 4.0], np.float32)]), ModelState([np.array([4.0, 8.0], np.float32)])
    assert rule(master, a, {"worker": "0", "seq": 1, "rows": 10}) is master
    assert rule(master, b, {"worker": "1", "seq": 1, "rows": 30}) is master  # two in, but the deadline is not past
    assert rule.close_if_due(master) is None and rule.round == 0
    now[0] = 5.0
    closed = rule.close_if_due(master)
    np.testing.assert_allclose(closed.weights[0], [3.5, 7.0])  # (10·a + 30·b) / 40, worker 2 missing
    assert rule.round == 1 and rule.dropped == [[2]] and list(rule.snapshots) == [0]
    late = {"worker": "2", "seq": 1, "rows": 10}
    assert rule.is_late(late) and rule(closed, a, late) is closed and rule.late == 1
    # round 1: every worker in before the deadline closes it at once
    for w in "012":
        out = rule(closed, a, {"worker": w, "seq": 2, "rows": 5})
    np.testing.assert_allclose(out.weights[0], [2.0, 4.0])
    assert rule.round == 2 and rule.dropped == [[2], []]


def test_round_rule_serves_each_worker_its_start_and_decodes_compressed_updates():
    """gossip through the rule: after a round each worker is served its pair's mean; an fp16 push is
    a difference from the state the worker was served."""
    from sparkdl.core.compression import encode_update

    rule = SyncRoundRule(2, get_policy("gossip", workers=2, seed=0))
    master = ModelState([np.zeros(2, np.float32)])
    assert rule.served("1", master) is master
    a = ModelState([np.array([1.0, 3.0], np.float32)])
    b = encode_update(ModelState([np.array([3.0, 7.0], np.float32)]), master, "fp16")
    b = ModelState([w.astype(np.float32) for w in b.weights])  # as the server hands it to the rule: float16 cast back
    rule(master, a, {"worker": "0", "seq": 1, "rows": 4})
    new = rule(master, b, {"worker": "1", "seq": 1, "rows": 4, "encoding": "fp16"})
    np.testing.assert_allclose(new.weights[0], [2.0, 5.0])
    for w in ("0", "1"):
        np.testing.assert_allclose(rule.served(w, new).weights[0], [2.0, 5.0])
