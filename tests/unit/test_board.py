"""What the parameter server keeps for the driver loop (RoundBoard, EpochLedger), the config rules
of backend ``ps``, and the server's heartbeat / progress / SSP-clock actions over real Flight."""

import threading
import time

import numpy as np
import pytest

from sparkdl.config import FitConfig
from sparkdl.core.board import LatePush, EpochLedger, RoundBoard, decode_metric_sums, encode_metric_sums
from sparkdl.core.modes import get_policy
from sparkdl.core.modes.asynchronous import DownpourRule, HogwildRule
from sparkdl.core.modes.averaging import SyncAveraging, row_weighted_mean
from sparkdl.core.state import ModelState, RoundUpdates, WorkerLocal, WorkerUpdate
from sparkdl.errors import ConfigError
from sparkdl.server import ParameterServer, ParameterServerClient
from tests.unit.modes_helpers import assert_arrays_equal, assert_states_equal, fit_of, run_round


def _state(w, it=0):
    return ModelState([np.array(w, np.float32)], [np.array(it, np.int64), np.array([w[0]] * 2, np.float32)])


def _meta(worker, round_, rows, **kw):
    """A push's meta as the server hands it to the board: the worker id as a string, seq = round + 1."""
    return {"worker": str(worker), "attempt": 0, "seq": round_ + 1, "rows": rows, **kw}


# ---- RoundBoard ----------------------------------------------------------------------------------


def test_a_round_collects_the_row_weighted_mean_and_the_policy_equals_sync_averaging():
    policy = SyncAveraging()
    fit = fit_of(_state([0.0, 0.0]))
    master = fit.master
    a, b, empty = _state([1.0, 2.0], 4), _state([4.0, 8.0], 2), ModelState([np.zeros(2, np.float32)])
    board = RoundBoard(3)
    board.open(0, policy.starts(fit), expected={0, 1, 2})
    assert board(master, a, _meta(0, 0, 30)) is master and board(master, empty, _meta(1, 0, 0)) is master
    assert board.pushed() == {0, 1} and not board.wait_pushed(3, 0.05)
    assert board(master, b, _meta(2, 0, 10)) is master  # the master changes only when the driver applies the round
    assert board.wait_pushed(3, 0.0)
    collection = board.close()
    assert collection.index == 0 and collection.workers == [(0, 30), (1, 0), (2, 10)] and collection.rows == 40
    assert collection.missing == [] and collection.updates is None and board.closed
    updates = [WorkerUpdate(0, 30, 1, a), WorkerUpdate(1, 0, 0, None), WorkerUpdate(2, 10, 1, b)]
    want, rows = row_weighted_mean(updates)
    assert rows == 40
    assert_states_equal(collection.mean, want)
    got = run_round(policy, fit, RoundUpdates(collection.rows, mean=collection.mean)).master
    assert_states_equal(got, policy.apply(fit_of(master), RoundUpdates(40, updates=updates)).master)
    np.testing.assert_allclose(got.weights[0], [1.75, 3.5])
    assert int(got.optimizer[0]) == 4  # rint((30*4 + 10*2) / 40) = 3.5 -> 4
    # a round where nobody trained keeps the master
    board.open(1, policy.starts(fit), expected={0, 1, 2})
    for w in range(3):
        board(got, empty, _meta(w, 1, 0))
    collection = board.close()
    assert collection.mean is None and collection.rows == 0 and collection.workers == [(0, 0), (1, 0), (2, 0)]
    assert run_round(policy, fit, RoundUpdates(collection.rows, mean=collection.mean)).master is got


def test_a_round_closes_early_only_when_the_driver_decides_and_a_late_push_is_dropped():
    """Straggler-tolerant rounds: 3 workers, the driver closes with 2 (its deadline is the transport's)."""
    board = RoundBoard(3)
    master = ModelState([np.zeros(2, np.float32)])
    a, b = ModelState([np.array([2.0, 4.0], np.float32)]), ModelState([np.array([4.0, 8.0], np.float32)])
    assert board.is_late(_meta(0, 0, 10))  # no round open yet: the server drops it as late; the board refuses it too
    with pytest.raises(LatePush):
        board(master, a, _meta(0, 0, 10))
    assert board.late == 1
    board.open(0, master, expected={0, 1, 2})
    assert board(master, a, _meta(0, 0, 10)) is master
    with pytest.raises(LatePush):  # a push for a round not open yet
        board(master, b, _meta(2, 1, 30))
    assert board.late == 2
    assert board(master, b, _meta(1, 0, 30)) is master
    assert not board.wait_pushed(3, 0.05)  # not every expected worker
    assert board.wait_pushed(2, 0.0)  # the minimum is in ...
    time.sleep(0.05)
    assert not board.closed and board.wait_open(0, 0.0)["open"] and board.pushed() == {0, 1}  # ... but the board never closes itself
    collection = board.close()
    np.testing.assert_allclose(collection.mean.weights[0], [3.5, 7.0])  # (10·a + 30·b) / 40, worker 2 missing
    assert collection.missing == [2] and collection.workers == [(0, 10), (1, 30)] and collection.rows == 40
    late = _meta(2, 0, 10)
    assert board.is_late(late)
    with pytest.raises(LatePush):
        board(master, a, late)
    assert board.late == 3
    # round 1: every worker pushes; worker 2's late push of round 0 is not in it
    board.open(1, master, expected={0, 1, 2})
    for w in range(3):
        assert not board.is_late(_meta(w, 1, 5))
        board(master, a, _meta(w, 1, 5))
    assert board.wait_pushed(3, 0.0)
    collection = board.close()
    np.testing.assert_allclose(collection.mean.weights[0], [2.0, 4.0])
    assert collection.missing == [] and collection.rows == 15


def test_rounds_open_one_after_the_other_and_a_worker_pushes_once_per_round():
    board = RoundBoard(2)
    master = ModelState([np.zeros(1, np.float32)])
    with pytest.raises(ValueError, match="closed already"):
        board.close()
    board.open(0, master, {0, 1})
    with pytest.raises(ValueError, match="round 1 after round 0 \\(open\\)"):
        board.open(1, master, {0, 1})
    board(master, master, _meta(0, 0, 1))
    with pytest.raises(ValueError, match="a second push from worker 0 for round 0"):
        board(master, master, _meta(0, 0, 1))
    board.close()
    with pytest.raises(ValueError, match="round 0 after round 0 \\(closed\\)"):
        board.open(0, master, {0, 1})
    board.open(2, master, {0, 1})  # an index may skip (a resumed fit)
    assert board.opened == 2
    with pytest.raises(ValueError, match="workers must be >= 1"):
        RoundBoard(0)


def test_wait_open_semantics():
    board = RoundBoard(2)
    master = ModelState([np.zeros(1, np.float32)])
    started = time.monotonic()
    reply = board.wait_open(0, 0.1)
    assert time.monotonic() - started >= 0.08  # waited: no round open
    assert reply == {"round": -1, "open": False, "late": False, "stop": False, "learning_rate": None, "collect": False, "validate": None}
    board.open(0, master, {0, 1}, learning_rate=0.25, collect=True)
    assert board.wait_open(0, 0.0) == {"round": 0, "open": True, "late": False, "stop": False, "learning_rate": 0.25, "collect": True,
                                       "validate": None}
    reply = board.wait_open(1, 0.05)  # round 1 is not open yet
    assert reply["round"] == 0 and not reply["open"] and not reply["late"]
    replies = []
    waiter = threading.Thread(target=lambda: replies.append(board.wait_open(1, 10.0)))
    waiter.start()
    time.sleep(0.1)
    board.close()
    started = time.monotonic()
    board.open(1, master, {0, 1})
    waiter.join(10.0)
    assert time.monotonic() - started < 5.0  # woken by the open, not its timeout
    assert replies[0]["round"] == 1 and replies[0]["open"] and replies[0]["learning_rate"] is None and not replies[0]["collect"]
    started = time.monotonic()
    reply = board.wait_open(0, 10.0)  # a later round opened without this worker: late, at once
    assert reply["late"] and not reply["open"] and reply["round"] == 1 and time.monotonic() - started < 5.0
    assert reply["learning_rate"] == 0.25  # the rate round 0 was opened with, not round 1's (overlap trains a round behind)
    board.close()
    reply = board.wait_open(1, 10.0)  # closed without this worker: late, at once
    assert reply["late"] and not reply["open"] and time.monotonic() - started < 5.0
    board.stop()
    reply = board.wait_open(2, 10.0)  # the fit stopped: no more rounds
    assert reply["stop"] and not reply["open"] and not reply["late"] and time.monotonic() - started < 5.0


def test_per_worker_rounds_serve_each_worker_its_start_and_decode_compressed_pushes():
    """gossip through the board: each worker is served its own model; an fp16 push is a difference
    from the state the worker was served."""
    from sparkdl.core.compression import encode_update

    policy = get_policy("gossip", workers=2, seed=0)
    fit = fit_of(ModelState([np.zeros(2, np.float32)]))
    master = fit.master
    board = RoundBoard(2, per_worker=True)
    assert board.served("1", master) is master  # before any round: the master
    board.open(0, policy.starts(fit), {0, 1})
    a = ModelState([np.array([1.0, 3.0], np.float32)])
    b = encode_update(ModelState([np.array([3.0, 7.0], np.float32)]), master, "fp16")
    b = ModelState([w.astype(np.float32) for w in b.weights])  # as the server hands it to the board: float16 cast back
    board(master, a, _meta(0, 0, 4))
    board(master, b, _meta(1, 0, 4, encoding="fp16"))
    collection = board.close()
    assert collection.mean is None and [(u.partition, u.rows) for u in collection.updates] == [(0, 4), (1, 4)]
    np.testing.assert_array_equal(collection.updates[1].state.weights[0], [3.0, 7.0])
    assert collection.updates[1].state.weights[0].dtype == np.float32
    run_round(policy, fit, RoundUpdates(collection.rows, updates=collection.updates))
    np.testing.assert_allclose(fit.master.weights[0], [2.0, 5.0])
    board.open(1, policy.starts(fit), {0, 1})
    for w in ("0", "1"):
        np.testing.assert_allclose(board.served(w, master).weights[0], [2.0, 5.0])
    c = encode_update(ModelState([np.array([4.0, 4.0], np.float32)]), policy.starts(fit)[0], "fp16")
    board(master, ModelState([w.astype(np.float32) for w in c.weights]), _meta(0, 1, 4, encoding="fp16"))
    np.testing.assert_allclose(board.close().updates[0].state.weights[0], [4.0, 4.0])  # decoded against [2, 5], not the master


def test_a_compressed_push_of_a_mean_round_is_decoded_against_the_round_start():
    from sparkdl.core.compression import encode_update

    board = RoundBoard(1)
    master = ModelState([np.zeros(2, np.float32)])
    start = ModelState([np.array([1.0, 1.0], np.float32)])  # e.g. BMUF's W + η·Δ
    board.open(0, start, {0})
    assert board.served("0", master) is start
    update = encode_update(ModelState([np.array([1.5, 3.0], np.float32)]), start, "fp16")
    board(master, ModelState([w.astype(np.float32) for w in update.weights]), _meta(0, 0, 2, encoding="fp16"))
    np.testing.assert_array_equal(board.close().mean.weights[0], [1.5, 3.0])


def test_a_round_brings_metrics_bytes_and_the_workers_own_state():
    board = RoundBoard(2)
    master = ModelState([np.zeros(1, np.float32)])
    board.open(0, master, {0, 1}, collect=True)
    sums = [np.array(3.0), np.array([1.0, 2.0])]
    local = WorkerLocal(0, None, [np.array([7.0], np.float32)])
    board.add_local(0, local)
    board(master, master, _meta(0, 0, 2, nbytes=100, extra={"metrics": encode_metric_sums(sums)}))
    board(master, master, _meta(1, 0, 3, nbytes=50, extra={"metrics": encode_metric_sums([2 * s for s in sums])}))
    collection = board.close()
    assert collection.nbytes == 150 and collection.local == {0: local}
    assert [[a.tolist() for a in m] for m in collection.metrics] == [[3.0, [1.0, 2.0]], [6.0, [2.0, 4.0]]]
    board.open(1, master, {0, 1})
    collection = board.close()  # nothing carried over from round 0
    assert collection.nbytes == 0 and collection.local == {} and collection.metrics == [] and collection.missing == [0, 1]


# ---- EpochLedger ---------------------------------------------------------------------------------


def test_metric_sums_travel_as_json_exactly():
    sums = [np.array(1 / 3), np.array([[1.0, 2.0]]), np.array([2**53], np.int64)]
    back = decode_metric_sums(encode_metric_sums(sums))
    assert [a.shape for a in back] == [(), (1, 2), (1,)] and all(a.dtype == np.float64 for a in back)
    assert float(back[0]) == 1 / 3 and back[2][0] == 2**53
    assert encode_metric_sums(None) is None


def test_epoch_ledger_counts_each_applied_push_once_with_its_metrics():
    ledger = EpochLedger(DownpourRule(), epochs=2)
    master = ModelState([np.zeros(2, np.float32)], [np.zeros(1, np.float32)])
    sums = [np.array(3.0), np.array([1.0, 2.0])]
    extra = {"epoch": 1, "metrics": encode_metric_sums(sums), "pulled": 100}
    new = ledger(master, ModelState([np.ones(2, np.float32)]), {"worker": "0", "rows": 5, "staleness": 2, "nbytes": 8, "extra": extra})
    np.testing.assert_array_equal(new.weights[0], [1.0, 1.0])
    assert new.optimizer is master.optimizer  # the rule combines weights only; the master keeps its optimizer state
    assert ledger.rows(1) == 5 and not ledger.wait_epoch(1, 12, 0.05)
    final = ModelState([np.ones(2, np.float32)], [np.array([4.0], np.float32)])
    newer = ledger(new, final, {"worker": "3", "rows": 7, "staleness": 0, "nbytes": 8,
                                "extra": {**extra, "final": True, "worker_rows": 12}})
    np.testing.assert_array_equal(newer.weights[0], [2.0, 2.0])
    assert newer.optimizer is master.optimizer
    assert ledger.rows(0) == 0 and ledger.rows(1) == 12 and ledger.wait_epoch(1, 12, 0.0)
    assert ledger.summaries()[1] == {"updates_applied": 2, "staleness_mean": 1.0, "staleness_max": 2, "bytes_pushed": 16, "bytes_pulled": 200}
    assert ledger.summaries()[0]["updates_applied"] == 0
    assert [a.tolist() for a in ledger.epochs[1].sums.total()] == [6.0, [2.0, 4.0]]
    assert list(ledger.optimizers) == [3] and ledger.optimizers[3][0].tolist() == [4.0]  # each worker's latest optimizer state
    assert ledger.final_optimizer.result()[0].tolist() == [4.0] and ledger.final_optimizer.total_weight == 12
    assert ledger.lock is True and EpochLedger(HogwildRule(), 1).lock is False and ledger.name == "downpour"


def test_epoch_ledger_records_a_push_only_once_the_rule_applied_it():
    def refusing(master, update, meta):
        raise ValueError("no")

    ledger = EpochLedger(refusing, epochs=1)
    with pytest.raises(ValueError):
        ledger(ModelState([np.zeros(1)]), ModelState([np.ones(1)]), {"worker": "0", "rows": 4, "extra": {"epoch": 0}})
    assert ledger.rows(0) == 0 and ledger.summaries()[0]["updates_applied"] == 0


def test_epoch_ledger_wakes_a_waiting_driver_when_the_epoch_is_in():
    ledger = EpochLedger(DownpourRule(), epochs=1)
    master = ModelState([np.zeros(1, np.float32)])
    done = []
    waiter = threading.Thread(target=lambda: done.append(ledger.wait_epoch(0, 6, 10.0)))
    waiter.start()
    started = time.monotonic()
    for rows in (2, 4):
        master = ledger(master, ModelState([np.ones(1, np.float32)]), {"worker": "0", "rows": rows, "extra": {"epoch": 0}})
    waiter.join(10.0)
    assert done == [True] and time.monotonic() - started < 5.0


# ---- config ----------------------------------------------------------------------------------------


def test_config_backends_and_modes():
    assert FitConfig().backend == "auto"  # resolved against the session: tests/spark/test_auto_backend.py
    # what each backend runs is the backends' registry's: tests/spark/test_backends_registry.py
    with pytest.raises(ConfigError, match="staleness"):
        FitConfig(mode="ssp", backend="ps", staleness=-1)
    with pytest.raises(ConfigError, match="serverPort"):
        FitConfig(server_port=70000)
    with pytest.raises(ConfigError, match="workerTimeout"):
        FitConfig(worker_timeout_s=0)
    assert FitConfig().backend == "auto"


@pytest.mark.parametrize("timeout", [5.0, 7.5, 20.0, 600.0, 86400.0])
def test_a_heartbeat_is_a_small_fraction_of_worker_timeout(timeout):
    """A fixed 2 s beat against workerTimeout=2 took one late beat for a dead worker: the beat is a
    tenth of the timeout (at most 2 s), so every timeout holds at least ten beats."""
    beat = FitConfig(worker_timeout_s=timeout).heartbeat_s
    assert 0 < beat <= timeout / 10 and beat <= 2.0
    assert beat == min(2.0, timeout / 10)


@pytest.mark.parametrize("timeout", [2.0, 4.99, 0.5, -1.0, float("nan")])
def test_a_worker_timeout_too_short_to_honour_is_refused(timeout):
    with pytest.raises(ConfigError, match=r"workerTimeout must be a number of seconds >= 5.*Received: workerTimeout="):
        FitConfig(worker_timeout_s=timeout)


def test_config_server_settings():
    with pytest.raises(ConfigError, match="serverCertFile and serverKeyFile must be given together"):
        FitConfig(backend="ps", server_cert_file="cert.pem")
    assert get_policy("staleness_aware").rule().name == "staleness_aware"


# ---- the server's actions over Flight ----------------------------------------------------------------


def test_server_heartbeat_progress_and_ssp_clock():
    master = ModelState([np.zeros(3, np.float32)])
    ledger = EpochLedger(DownpourRule(), 1)
    with ParameterServer(master, ledger) as server, ParameterServerClient(server.location, server.token, timeout_s=10) as client:
        server.register_clocks({"0": 0, "1": 0})
        assert client.progress(0) == (None, None)
        assert client.heartbeat(0, attempt=7) == {"version": 0, "superseded": False, "stop": False, "learning_rate": None}
        assert server.contacts()["0"]["state"] == "alive" and server.contacts()["0"]["seconds"] < 5
        assert server.contacts()["0"]["attempt"] == 7
        delta = [np.ones(3, np.float32)]
        for seq in (1, 2):
            client.push(delta, worker=0, attempt=7, seq=seq, base_version=0, rows=1, extra={"epoch": 0, "clock": seq})
        assert client.progress(0) == (7, 2) and server.marks() == {"0": [7, 2]}
        reply = client.push(delta, worker=0, attempt=7, seq=2, base_version=0, rows=1, extra={"epoch": 0, "clock": 2})
        assert reply["dropped"] == "duplicate" and ledger.rows(0) == 2  # a retried push is recorded once
        assert server.clocks() == {"0": 2, "1": 0}
        assert client.wait_clock(0, 2, 0.1) == {"reached": True, "stop": False, "learning_rate": None}  # 2 ahead: allowed with s = 2
        assert client.wait_clock(0, 1, 0.1)["reached"] is False  # not with s = 1
        # worker 1 fails: Spark will retry it, so it keeps its clock and the others still wait for it
        client.heartbeat(1, "error", "boom", attempt=0)
        assert server.contacts()["1"]["state"] == "error" and server.contacts()["1"]["message"] == "boom"
        assert server.clocks() == {"0": 2, "1": 0}
        started = time.monotonic()
        assert client.wait_clock(0, 1, 0.3)["reached"] is False and time.monotonic() - started >= 0.25
        # its retry (attempt 1) takes over; the failed attempt's late "done" says nothing of the worker
        client.heartbeat(1, attempt=1)
        client.heartbeat(1, "done", attempt=0)
        assert server.contacts()["1"]["state"] == "alive" and server.contacts()["1"]["attempt"] == 1
        assert server.clocks() == {"0": 2, "1": 0}
        client.push(delta, worker=1, attempt=1, seq=1, base_version=2, rows=1, extra={"epoch": 0, "clock": 1})
        assert server.clocks() == {"0": 2, "1": 1} and client.wait_clock(0, 1, 0.1)["reached"] is True
        released = []
        waiter = threading.Thread(target=lambda: released.append(client.wait_clock(0, 0, 5.0)))
        started = time.perf_counter()
        waiter.start()
        time.sleep(0.3)
        assert released == []
        client.heartbeat(1, "done", attempt=1)  # a finished worker no longer holds the others back
        waiter.join()
        assert released[0]["reached"] is True and time.perf_counter() - started < 3
        assert server.contacts()["1"]["state"] == "done" and server.clocks() == {"0": 2}
        assert server.attempts() == {"0": 1, "1": 2}
        server.register_clocks({"0": 1, "1": 2})  # the next stage registers its workers again; a clock never goes back
        assert server.clocks() == {"0": 2, "1": 2}


def test_a_stop_order_ends_a_clock_wait_at_once():
    master = ModelState([np.zeros(1, np.float32)])
    with ParameterServer(master, DownpourRule()) as server, ParameterServerClient(server.location, server.token, timeout_s=10) as client:
        server.register_clocks({"0": 3, "1": 0})
        replies = []
        waiter = threading.Thread(target=lambda: replies.append(client.wait_clock(0, 0, 8.0)))
        started = time.monotonic()
        waiter.start()
        time.sleep(0.2)
        server.set_control(stop=True, learning_rate=0.5)
        waiter.join()
        assert replies == [{"reached": False, "stop": True, "learning_rate": 0.5}] and time.monotonic() - started < 5


def test_weights_only_pull_leaves_out_the_optimizer_arrays():
    master = _state([1.0, 2.0], 3)
    with ParameterServer(master, DownpourRule()) as server, ParameterServerClient(server.location, server.token, timeout_s=10) as client:
        version, full = client.pull()
        assert full.optimizer is not None and len(full.optimizer) == 2
        before = server.stats()["bytes_pulled"]
        version, weights = client.pull(weights_only=True)
        assert weights.optimizer is None and weights.weights[0].tolist() == [1.0, 2.0] and version == 0
        assert server.stats()["bytes_pulled"] - before < before  # 8 bytes of weights, not 24 of everything
        assert_arrays_equal(full.optimizer, master.optimizer)


def test_validation_in_the_tasks_is_posted_run_by_each_expected_worker_once_and_closed():
    """The driver posts epoch 0's weights for workers 0 and 1 (2 has no validation rows): a worker
    waiting for the next round is woken with "validate", reports once (a retry's second report is
    not recorded), the driver sees the validation complete and closes it; then nothing is pending
    and a later worker's wait for that epoch says done at once."""
    board = RoundBoard(3)
    master = ModelState([np.zeros(2, np.float32)])
    board.open(0, master, {0, 1, 2})
    board.close()
    replies = []
    waiter = threading.Thread(target=lambda: replies.append(board.wait_open(1, 10.0, worker=1)))
    waiter.start()
    time.sleep(0.1)
    started = time.monotonic()
    board.post_validation(0, [np.ones(2, np.float32)], {0, 1})
    waiter.join(10.0)
    assert time.monotonic() - started < 5.0 and replies[0]["validate"] == 0 and not replies[0]["open"]
    assert board.wait_open(1, 0.0, worker=2)["validate"] is None  # no validation rows: not asked
    np.testing.assert_array_equal(board.validation_weights(0)[0], [1.0, 1.0])
    assert board.validation_weights(1) is None
    assert board.report_validation(1, 0, 10, [np.array([2.0]), np.array(10.0)])
    assert not board.report_validation(1, 0, 10, [np.array([9.0]), np.array(10.0)])  # a second report of worker 1
    assert not board.report_validation(2, 0, 5, None)  # not expected
    assert not board.report_validation(0, 1, 5, None)  # not the open epoch
    assert not board.validation_complete()
    assert board.wait_validation(0, 0, 0.0) == {"validate": 0, "done": False, "stop": False}
    assert board.report_validation(0, 0, 6, [np.array([3.0]), np.array(6.0)])
    assert board.validation_complete()
    with pytest.raises(ValueError, match="one after the other"):
        board.post_validation(1, [np.ones(2, np.float32)], {0})  # epoch 0 is still open
    reports = board.close_validation()
    assert sorted(reports) == [0, 1] and reports[1][0] == 10 and float(reports[1][1][0][0]) == 2.0
    assert board.validation_weights(0) is None
    started = time.monotonic()
    assert board.wait_validation(1, 0, 10.0) == {"validate": None, "done": True, "stop": False}
    assert time.monotonic() - started < 5.0
    with pytest.raises(ValueError, match="one after the other"):
        board.post_validation(0, [np.ones(2, np.float32)], {0})  # not after the last posted epoch
    board.post_validation(1, [np.ones(2, np.float32)], {0})
    board.stop()
    assert board.wait_validation(0, 1, 10.0)["stop"]


# ---- SliceBoard ----------------------------------------------------------------------------------


def test_a_slice_board_says_which_pieces_and_slices_a_waiting_round_lacks():
    """What a sharded round that times out names: the workers whose pieces it waits for, each
    slice's registered attempt and ready version (none for an owner not registered or not ready)."""
    from sparkdl.core.board import SliceBoard

    board = SliceBoard(3, 3)
    for owner, attempt in ((0, 26), (2, 23)):
        board.register(owner, attempt, {"location": f"grpc+tls://h:{owner}"})
    assert board.mark_ready(0, 26, 3) and board.mark_ready(2, 23, 3) and not board.mark_ready(2, 22, 4)
    board.open(3, None, {0, 1, 2})
    board.record(_meta(2, 3, 30))
    text = board.describe()
    assert text == ("round 4 of the fit open, waiting for the pieces of workers [0, 1]; slices 0: attempt 26, ready v3; "
                    "1: attempt none, ready none; 2: attempt 23, ready v3; slice map version 2"), text
    board.record(_meta(0, 3, 30))
    board.record(_meta(1, 3, 30))
    assert "waiting for the pieces of workers none" in board.describe()
