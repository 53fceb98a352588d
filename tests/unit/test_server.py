"""The Arrow Flight parameter server and its client, on loopback (no Spark, no Keras)."""

import contextlib
import http.server
import json
import pickle
import re
import socket
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from sparkdl.core.modes.asynchronous import DownpourRule, HogwildRule, StalenessAwareRule
from sparkdl.core.state import ModelState, WorkerLocal
from sparkdl.errors import ConfigError, ServerError, SparkDLError
from sparkdl.server import ParameterServer, ParameterServerClient
from sparkdl.server.auth import auth_headers
from sparkdl.server.tls import SERVER_NAME, TLSPin, load_identity, self_signed
from sparkdl.server.wire import ArraySpec, Assembler, iter_batches, wire_schema
from tests.unit.modes_helpers import assert_arrays_equal, fit_of, run_round

NAMES = ["dense/kernel", "dense/bias"]


def _initial():
    return ModelState([np.arange(6, dtype=np.float32).reshape(3, 2), np.array([1.0, 2.0], np.float32)])


def _delta(scale=1.0):
    return [np.full((3, 2), scale, np.float32), np.array([0.5, -1.0], np.float32) * scale]


@pytest.fixture
def server():
    with ParameterServer(_initial(), DownpourRule(), names=NAMES) as srv:
        yield srv


@pytest.fixture
def client(server):
    with ParameterServerClient(server.location, server.token, timeout_s=10) as c:
        yield c


def _assert_unchanged(server, version=0, state=None):
    v, st = server.state()
    assert v == version
    expected = state or _initial()
    for a, b in zip(st.weights, expected.weights, strict=True):
        np.testing.assert_array_equal(a, b)


def _push(client, update=None, **kw):
    args = {"worker": "w0", "attempt": 0, "seq": 0, "base_version": 0, "rows": 4, **kw}
    return client.push(update if update is not None else _delta(), **args)


# ---------------------------------------------------------------------------- round trip
def test_pull_push_round_trip_follows_the_rule(server, client):
    version, state = client.pull()
    assert version == 0 and state.optimizer is None
    np.testing.assert_array_equal(state.weights[0], _initial().weights[0])
    assert state.weights[0].flags.writeable
    reply = _push(client, base_version=version)
    assert reply == {"applied": True, "dropped": None, "version": 1, "staleness": 0}
    version, state = client.pull()
    assert version == 1 == server.version == client.version()
    np.testing.assert_array_equal(state.weights[0], _initial().weights[0] + 1)
    np.testing.assert_array_equal(state.weights[1], [1.5, 1.0])
    stats = client.stats()
    assert stats["updates_applied"] == 1 and stats["pulls"] == 2 and stats["bytes_pushed"] >= 32
    assert stats["bytes_pulled"] >= 64
    assert [s.name for s in client.signature()] == NAMES


def test_optimizer_arrays_travel_and_rule_sees_meta():
    seen = []

    def rule(master, update, meta):
        seen.append(dict(meta))
        opt = update.optimizer if update.optimizer is not None else master.optimizer
        return ModelState([m + u for m, u in zip(master.weights, update.weights, strict=True)], opt)

    initial = ModelState([np.zeros(3, np.float32)], [np.array(0, np.int64), np.ones((2, 2))])
    with ParameterServer(initial, rule, optimizer_names=["iterations", "m"]) as srv:
        with ParameterServerClient(srv.location, srv.token, timeout_s=10) as c:
            v, st = c.pull()
            assert st.optimizer[0].shape == () and st.optimizer[0].dtype == np.int64
            assert [(s.name, s.role) for s in c.signature()][1:] == [("iterations", "optimizer"), ("m", "optimizer")]
            c.push(ModelState([np.ones(3, np.float32)], [np.array(5, np.int64), np.zeros((2, 2))]),
                   worker=3, attempt=1, seq=7, base_version=v, rows=9)
            c.push([np.ones(3, np.float32)], worker=3, attempt=1, seq=8, base_version=v, rows=2)  # weights only
            v, st = c.pull()
    assert v == 2 and st.optimizer[0] == 5 and np.all(st.optimizer[1] == 0)
    np.testing.assert_array_equal(st.weights[0], [2, 2, 2])
    assert seen[0] == {"kind": "update", "worker": "3", "attempt": 1, "seq": 7, "base_version": 0, "rows": 9, "nbytes": seen[0]["nbytes"],
                       "encoding": None, "staleness": 0, "version": 0}
    assert seen[1]["staleness"] == 1


def test_wait_version_action(server, client):
    assert client.wait_version(0, 0.0) is True
    t0 = time.monotonic()
    assert client.wait_version(1, 0.2) is False
    assert time.monotonic() - t0 >= 0.15
    timer = threading.Timer(0.2, lambda: _push(ParameterServerClient(server.location, server.token)))
    timer.start()
    assert client.wait_version(1, 5.0) is True
    timer.join()


# ---------------------------------------------------------------------------- authentication
def test_missing_or_wrong_token_is_rejected_before_anything_happens(server):
    raw = flight.FlightClient(server.location, generic_options=[("grpc.enable_http_proxy", 0)])
    no_token = flight.FlightCallOptions(timeout=5)
    with pytest.raises(flight.FlightUnauthenticatedError):
        raw.do_get(flight.Ticket(b"state"), no_token).read_all()
    schema = wire_schema([ArraySpec(n, a.shape, a.dtype) for n, a in zip(NAMES, _delta(), strict=True)])
    command = json.dumps({"worker": "x", "attempt": 0, "seq": 0, "base_version": 0, "rows": 1, "nbytes": 40}).encode()
    with pytest.raises(flight.FlightUnauthenticatedError):
        writer, _ = raw.do_put(flight.FlightDescriptor.for_command(command), schema, no_token)
        for batch in iter_batches(schema, _delta()):
            writer.write_batch(batch)
        writer.close()
    with pytest.raises(flight.FlightUnauthenticatedError):
        list(raw.do_action(flight.Action("stats", b""), no_token))
    raw.close()
    with ParameterServerClient(server.location, "0" * 64, timeout_s=5) as bad:
        with pytest.raises(ServerError, match="token") as info:
            bad.pull()
        assert isinstance(info.value.__cause__, flight.FlightUnauthenticatedError)
        with pytest.raises(ServerError, match="token"):
            _push(bad, names=NAMES)
    _assert_unchanged(server)
    stats = server.stats()
    assert stats["unauthenticated"] >= 5 and stats["pushes"] == 0 and stats["bytes_pushed"] == 0


# ---------------------------------------------------------------------------- no pickle
class _Marker:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):  # unpickling this would create the marker file
        return (open, (self.path, "w"))


def _pb(field, payload):
    """One length-delimited protobuf field (wire type 2)."""

    def varint(n):
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    return varint(field << 3 | 2) + varint(len(payload)) + payload


def test_pickle_bodies_are_rejected_without_unpickling(server, tmp_path):
    marker = tmp_path / "unpickled"
    evil = pickle.dumps(_Marker(str(marker)))
    options = flight.FlightCallOptions(timeout=5, headers=auth_headers(server.token))
    raw = flight.FlightClient(server.location, generic_options=[("grpc.enable_http_proxy", 0)])
    with pytest.raises(flight.FlightError):
        list(raw.do_action(flight.Action("wait_version", evil), options))
    with pytest.raises(flight.FlightError):
        raw.do_get(flight.Ticket(evil), options).read_all()
    schema = wire_schema([ArraySpec(n, a.shape, a.dtype) for n, a in zip(NAMES, _delta(), strict=True)])
    with pytest.raises(flight.FlightError, match="UTF-8 JSON"):
        writer, _ = raw.do_put(flight.FlightDescriptor.for_command(evil), schema, options)
        for batch in iter_batches(schema, _delta()):
            writer.write_batch(batch)
        writer.close()
    raw.close()

    # A raw gRPC DoPut whose FlightData carries the pickle where the Arrow IPC header and body belong.
    grpc = pytest.importorskip("grpc")
    command = json.dumps({"worker": "x", "attempt": 0, "seq": 0, "base_version": 0, "rows": 1, "nbytes": 10}).encode()
    descriptor = _pb(1, b"\x08\x02" + _pb(2, command))  # FlightDescriptor{type: CMD, cmd}
    message = descriptor + _pb(2, evil) + _pb(1000, evil)  # data_header, data_body
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}", options=[("grpc.enable_http_proxy", 0)])
    do_put = channel.stream_stream("/arrow.flight.protocol.FlightService/DoPut")
    with pytest.raises(grpc.RpcError):
        list(do_put(iter([message, _pb(2, evil) + _pb(1000, evil)]), timeout=5,
                    metadata=[("authorization", f"Bearer {server.token}")]))
    channel.close()

    assert not marker.exists()
    _assert_unchanged(server)
    with ParameterServerClient(server.location, server.token, timeout_s=5) as c:  # still healthy
        assert c.pull()[0] == 0


# ---------------------------------------------------------------------------- signature
@pytest.mark.parametrize(
    "update, names, match",
    [
        ([np.zeros((2, 2), np.float32), np.zeros(2, np.float32)], NAMES,
         r"array 'dense/kernel' of shape \(3, 2\) float32. Received: array 'dense/kernel' of shape \(2, 2\) float32"),
        ([np.zeros((3, 2), np.float64), np.zeros(2, np.float32)], NAMES, r"float32. Received: .* float64"),
        ([np.zeros((3, 2), np.float32), np.zeros(2, np.float32)], ["other", "dense/bias"], "Received: array 'other'"),
        ([np.zeros((3, 2), np.float32)], ["dense/kernel"], "must hold 2 weight arrays"),
    ],
)
def test_updates_that_do_not_fit_the_model_are_rejected(server, client, update, names, match):
    with pytest.raises(ServerError, match=match) as info:
        _push(client, update, names=names)
    assert server.location in str(info.value) and isinstance(info.value, SparkDLError)
    _assert_unchanged(server)
    assert server.stats()["rejected"] == 1
    assert _push(client)["applied"]  # same seq: the rejected push was not recorded


def test_raising_rule_leaves_state_unchanged_and_seq_unused():
    calls = []

    def rule(master, update, meta):
        calls.append(1)
        if len(calls) == 1:
            master.weights[0] + np.ones(7)  # raises: shapes do not broadcast
        if len(calls) == 2:
            return ModelState([np.zeros(1)], None)  # wrong signature
        return DownpourRule()(master, update, meta)

    with ParameterServer(_initial(), rule, names=NAMES) as srv, ParameterServerClient(srv.location, srv.token) as c:
        with pytest.raises(ServerError, match="master state is unchanged.*ValueError"):
            _push(c)
        with pytest.raises(ServerError, match="rule returned 1 arrays"):
            _push(c)
        _assert_unchanged(srv)
        assert _push(c) == {"applied": True, "dropped": None, "version": 1, "staleness": 0}
        assert srv.stats()["rejected"] == 2


def test_base_version_ahead_of_server_is_rejected(server, client):
    with pytest.raises(ServerError, match="base_version must be <= the server version 0. Received: 3"):
        _push(client, base_version=3)
    _assert_unchanged(server)


# ---------------------------------------------------------------------------- size limit
def test_body_over_the_size_limit_is_rejected_before_or_while_reading():
    initial = ModelState([np.zeros(4000, np.float32)])  # 16000 bytes
    with ParameterServer(initial, DownpourRule(), max_message_bytes=4096, names=["w"]) as srv:
        with ParameterServerClient(srv.location, srv.token, timeout_s=10, chunk_bytes=1024) as c:
            with pytest.raises(ServerError, match=r"at most max_message_bytes=4096 bytes. Received: a declared body of \d+ bytes; nothing was read"):
                _push(c, [np.ones(4000, np.float32)])
            assert srv.stats()["bytes_pushed"] == 0
            # A client that understates its size: the server stops at the batch that passes the limit.
            schema = wire_schema([ArraySpec("w", (4000,), np.dtype(np.float32))])
            command = json.dumps({"worker": "liar", "attempt": 0, "seq": 0, "base_version": 0, "rows": 1, "nbytes": 100})
            raw = flight.FlightClient(srv.location, generic_options=[("grpc.enable_http_proxy", 0)])
            options = flight.FlightCallOptions(timeout=10, headers=auth_headers(srv.token))
            with pytest.raises(flight.FlightError, match="stopped reading"):
                writer, _ = raw.do_put(flight.FlightDescriptor.for_command(command.encode()), schema, options)
                for batch in iter_batches(schema, [np.ones(4000, np.float32)], chunk_bytes=1024):
                    writer.write_batch(batch)
                writer.done_writing()
                writer.close()
            raw.close()
            stats = srv.stats()
            assert 4096 < stats["bytes_pushed"] <= 4096 + 1024 + 64  # read at most one batch past the limit
            assert stats["rejected"] == 2 and stats["version"] == 0
            assert c.pull()[0] == 0  # healthy
            assert np.all(srv.state()[1].weights[0] == 0)
    with ParameterServer(initial, DownpourRule()) as srv:
        assert srv.max_message_bytes == 4 * 16000 + (1 << 20)


# ---------------------------------------------------------------------------- binding and lifecycle
def test_taken_fixed_port_gives_a_clear_error_and_port_zero_works():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ServerError, match=rf"127.0.0.1:{port} could not be bound.*serverPort, or 0"):
            ParameterServer(_initial(), DownpourRule(), port=port).start()
    with ParameterServer(_initial(), DownpourRule(), port=0) as first:
        assert first.port > 0 and first.location == f"grpc+tcp://127.0.0.1:{first.port}"
        with pytest.raises(ServerError, match=str(first.port)):
            ParameterServer(_initial(), DownpourRule(), port=first.port).start()
    with pytest.raises(ConfigError, match="port must be an integer"):
        ParameterServer(_initial(), DownpourRule(), port=70000)


def _python_threads():
    return {t for t in threading.enumerate() if not isinstance(t, threading._DummyThread)}


@pytest.mark.parametrize("raised", [None, RuntimeError, KeyboardInterrupt])
def test_context_exit_frees_the_port_and_leaves_no_thread(raised):
    before = _python_threads()
    srv = ParameterServer(_initial(), DownpourRule())
    with contextlib.suppress(RuntimeError, KeyboardInterrupt):
        with srv:
            port = srv.port
            with ParameterServerClient(srv.location, srv.token) as c:
                _push(c)
            if raised:
                raise raised("inside the with block")
    assert _python_threads() == before
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
    with ParameterServer(_initial(), DownpourRule(), port=port) as again:
        assert again.port == port


# ---------------------------------------------------------------------------- exactly once
def test_duplicate_push_is_applied_once(server, client):
    assert _push(client, seq=0)["applied"]
    assert _push(client, seq=0) == {"applied": False, "dropped": "duplicate", "version": 1, "staleness": None}
    assert _push(client, seq=1)["applied"]
    assert _push(client, seq=0)["dropped"] == "duplicate"  # older seq
    assert _push(client, seq=1, worker="w1")["applied"]  # seqs are per worker
    stats = server.stats()
    assert stats["updates_applied"] == 3 and stats["duplicates_dropped"] == 2 and stats["version"] == 3
    np.testing.assert_array_equal(server.state()[1].weights[1], [2.5, -1.0])


def test_push_from_superseded_attempt_is_dropped(server, client):
    assert _push(client, attempt=0, seq=5)["applied"]
    assert _push(client, attempt=1, seq=6)["applied"]  # a retry continues after the last applied slot
    assert _push(client, attempt=0, seq=7) == {"applied": False, "dropped": "superseded_attempt", "version": 2, "staleness": None}
    assert _push(client, attempt=1, seq=5)["dropped"] == "duplicate"  # a slot replayed by the retry
    assert server.stats()["duplicates_dropped"] == 2 and server.version == 2


def test_a_zombie_attempt_and_its_retry_apply_a_slot_once(server, client):
    """A retry (attempt 1) reads the progress (slot 3 applied); the older attempt, still running,
    then pushes slot 4 before the retry does: slot 4 is applied once, not twice."""
    assert _push(client, attempt=0, seq=3)["applied"]
    assert _push(client, attempt=0, seq=4)["applied"]  # the zombie, before the retry's first push
    assert _push(client, attempt=1, seq=4)["dropped"] == "duplicate"
    assert server.version == 2



def test_a_heartbeat_tells_a_superseded_attempt_to_end(server, client):
    """Spark resubmits a stage (an executor lost, a fetch failure) while an older attempt of a worker
    still runs and holds a task slot: once the later attempt is heard, the older one's heartbeats
    say ``superseded`` (it then ends), the later one's do not, nor another worker's."""
    assert client.heartbeat(0, attempt=18)["superseded"] is False
    assert client.heartbeat(1, attempt=19)["superseded"] is False
    assert client.heartbeat(0, attempt=23)["superseded"] is False  # the resubmitted attempt of worker 0
    assert client.heartbeat(0, attempt=18)["superseded"] is True
    assert client.heartbeat(0, "error", "SupersededAttempt", attempt=18)["superseded"] is True  # says nothing of worker 0
    assert client.heartbeat(0, attempt=23)["superseded"] is False and client.heartbeat(1, attempt=19)["superseded"] is False
    assert server.contacts()["0"]["state"] == "alive" and server.contacts()["0"]["attempt"] == 23

# ---------------------------------------------------------------------------- staleness
def test_staleness_is_recorded_per_update():
    with ParameterServer(_initial(), StalenessAwareRule(), names=NAMES) as srv:
        with ParameterServerClient(srv.location, srv.token) as a, ParameterServerClient(srv.location, srv.token) as b:
            va, _ = a.pull()
            vb, _ = b.pull()
            assert a.push([np.zeros((3, 2), np.float32), np.array([0.5, -1.0], np.float32)], worker="a", attempt=0, seq=0,
                          base_version=va, rows=1)["staleness"] == 0
            assert b.push([np.zeros((3, 2), np.float32), np.array([0.5, -1.0], np.float32)], worker="b", attempt=0, seq=0,
                          base_version=vb, rows=1)["staleness"] == 1
        stats = srv.stats()
    assert stats["staleness_mean"] == 0.5 and stats["staleness_max"] == 1 and stats["staleness_counts"] == {"0": 1, "1": 1}
    # [1, 2] + [0.5, -1] / 1 + [0.5, -1] / max(1, 1) = [2, 0]
    np.testing.assert_allclose(srv.state()[1].weights[1], [2.0, 0.0])


def test_hogwild_server_applies_without_lock():
    with ParameterServer(_initial(), HogwildRule(), names=NAMES) as srv:
        assert srv.lock is False

        def work(w):
            with ParameterServerClient(srv.location, srv.token) as c:
                for seq in range(5):
                    _push(c, worker=w, seq=seq)

        threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert srv.version == 10
        np.testing.assert_allclose(srv.state()[1].weights[1], [6.0, -8.0])


# ---------------------------------------------------------------------------- transport
def test_proxy_environment_does_not_reach_the_client(server, monkeypatch):
    for var in ("http_proxy", "https_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")  # a dead proxy
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with ParameterServerClient(server.location, server.token, timeout_s=5, retries=0) as c:
        version, _ = c.pull()
        assert _push(c, base_version=version)["applied"]
    assert server.version == 1


class _HtmlHandler(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        body = b"<html><body><h1>Welcome to nginx!</h1></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PRI = do_PUT = _answer

    def log_message(self, *args):
        pass


def test_plain_http_server_gives_a_clear_error_within_the_timeout():
    stub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HtmlHandler)
    thread = threading.Thread(target=stub.serve_forever, name="html-stub", daemon=True)
    thread.start()
    location = f"grpc+tcp://127.0.0.1:{stub.server_address[1]}"
    try:
        with ParameterServerClient(location, "t", timeout_s=3, retries=1) as c:
            for call in (c.pull, lambda: c.push([np.zeros(2, np.float32)], worker=0, attempt=0, seq=0, base_version=0,
                                                rows=1, names=["a"])):
                t0 = time.monotonic()
                with pytest.raises(ServerError, match=re.escape(f"parameter server at {location}")):
                    call()
                assert time.monotonic() - t0 < 10
    finally:
        stub.shutdown()
        stub.server_close()
        thread.join()


def test_tls_with_a_self_signed_certificate_pinned_by_the_client():
    identity = self_signed()
    pin = identity.pin()
    assert pin.server_name == SERVER_NAME and pin.cert_pem == identity.cert_pem and len(pin.fingerprint) == 64
    assert b"PRIVATE KEY" not in pin.cert_pem  # what travels to the workers holds no key
    with ParameterServer(_initial(), DownpourRule(), names=NAMES, tls=identity) as srv:
        assert srv.location.startswith("grpc+tls://127.0.0.1:")
        with ParameterServerClient(srv.location, srv.token, timeout_s=10, tls=pin) as c:
            assert _push(c)["applied"]
            version, state = c.pull()
            assert version == 1
            np.testing.assert_array_equal(state.weights[1], [1.5, 1.0])
        other = self_signed().pin()  # another fit's certificate, of the same server name
        with ParameterServerClient(srv.location, srv.token, timeout_s=3, retries=0, tls=other) as stranger:
            with pytest.raises(ServerError, match=re.escape(srv.location)):
                stranger.pull()
            with pytest.raises(ServerError):
                _push(stranger, names=NAMES)
        with pytest.raises(ConfigError, match="grpc\\+tls.*pinned certificate.*no pin"):
            ParameterServerClient(srv.location, srv.token, timeout_s=3)
        forged = TLSPin(other.cert_pem, pin.fingerprint)  # a certificate that does not hash to the pin
        with pytest.raises(ConfigError, match="pinned fingerprint"):
            ParameterServerClient(srv.location, srv.token, timeout_s=3, tls=forged)
        # a plain-TCP client cannot talk to a TLS server either
        plain = srv.location.replace("grpc+tls://", "grpc+tcp://")
        with ParameterServerClient(plain, srv.token, timeout_s=3, retries=0) as c:
            with pytest.raises(ServerError):
                c.pull()
        assert srv.stats()["updates_applied"] == 1 and srv.version == 1


def test_tls_with_the_users_own_certificate_files(tmp_path):
    made = self_signed("ps.example.test")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_bytes(made.cert_pem)
    key.write_bytes(made.key_pem)
    identity = load_identity(str(cert), str(key))
    assert identity.server_name == "ps.example.test" and identity.fingerprint == made.fingerprint
    with ParameterServer(_initial(), DownpourRule(), tls=identity) as srv:
        with ParameterServerClient(srv.location, srv.token, timeout_s=10, tls=identity.pin()) as c:
            assert c.pull()[0] == 0
    with pytest.raises(ConfigError, match="readable PEM files"):
        load_identity(str(tmp_path / "missing.pem"), str(key))
    with pytest.raises(ConfigError, match="PEM certificate"):
        load_identity(str(key), str(key))


def test_wire_batches_respect_chunk_size_and_bools_round_trip():
    arrays = [np.arange(1000, dtype=np.float32), np.array([True, False, True]), np.zeros((0, 3))]
    specs = [ArraySpec(str(i), a.shape, a.dtype) for i, a in enumerate(arrays)]
    schema = wire_schema(specs)
    batches = list(iter_batches(schema, arrays, chunk_bytes=1024))
    assert len(batches) == 4 and all(b.num_rows == 1 for b in batches)
    asm = Assembler(specs)
    for b in batches:
        asm.add(b)
    out = asm.finish()
    for a, b in zip(arrays, out, strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype and a.shape == b.shape
    assert isinstance(pa.Table.from_batches(batches), pa.Table)


def test_round_board_over_flight_serves_starts_decodes_compressed_pushes_and_drops_a_late_push():
    """bmuf through the server: the driver opens each round on the board with the policy's starts;
    workers pull W + η·Δ (ticket state:<worker>); a 1bit push and an fp16 push are decoded against
    it; the driver closes round 1 with one push (its decision, e.g. at its deadline) and the other
    worker's push is answered dropped="late"."""
    from sparkdl.core.board import RoundBoard
    from sparkdl.core.compression import encode_update, quantize
    from sparkdl.core.modes import get_policy
    from sparkdl.core.state import RoundUpdates

    policy = get_policy("bmuf", block_momentum=0.5, nesterov=True)
    fit = fit_of(_initial())
    board = RoundBoard(2)
    with ParameterServer(fit.master, board, names=NAMES) as srv, ParameterServerClient(srv.location, srv.token, timeout_s=10) as c:
        assert c.wait_round(0, 0.05) == {"round": -1, "open": False, "late": False, "stop": False, "learning_rate": None,
                                         "collect": False, "validate": None}
        board.open(0, policy.starts(fit), {0, 1}, learning_rate=0.01)
        reply = c.wait_round(0, 1.0, worker=0)
        assert reply["open"] and reply["learning_rate"] == 0.01 and srv.contacts()["0"]["state"] == "alive"
        _, start = c.pull(worker=0)
        assert_arrays_equal(start.weights, fit.master.weights)
        target = [w + 1.0 for w in start.weights]  # both workers move every value by +1
        payload, _ = quantize([t - s for t, s in zip(target, start.weights)], None, "1bit")
        c.push([np.frombuffer(payload, np.uint8)], names=["payload"], worker=0, attempt=1, seq=1, base_version=0, rows=5, encoding="1bit")
        half = encode_update(ModelState(target), start, "fp16")
        c.push(half, worker=1, attempt=1, seq=1, base_version=0, rows=5, encoding="fp16")
        assert board.wait_pushed(2, 5.0)
        collection = board.close()
        assert collection.workers == [(0, 5), (1, 5)] and collection.nbytes > 0
        run_round(policy, fit, RoundUpdates(collection.rows, mean=collection.mean))
        for got, s in zip(fit.master.weights, start.weights):  # G = +1, Δ = 1, W = W₀ + 1
            np.testing.assert_allclose(got, s + 1.0, rtol=1e-6)
        assert_arrays_equal(srv.state()[1].weights, _initial().weights)  # the server's master is not the round's
        board.open(1, policy.starts(fit), {0, 1})
        assert c.wait_round(1, 1.0)["open"]
        _, served = c.pull(worker=1)
        for got, m in zip(served.weights, fit.master.weights):  # Nesterov: W + η·Δ
            np.testing.assert_allclose(got, m + 0.5, rtol=1e-6)
        c.push(served.weights, worker=0, attempt=1, seq=2, base_version=2, rows=5)
        assert board.wait_pushed(1, 5.0) and not board.wait_pushed(2, 0.1)
        assert c.wait_round(1, 0.0)["open"]  # the board never closes a round by itself
        collection = board.close()  # the driver closes it with the minimum
        assert collection.missing == [1] and collection.workers == [(0, 5)]
        reply = c.wait_round(1, 1.0, worker=1)
        assert reply["late"] and not reply["open"]
        reply = c.push(served.weights, worker=1, attempt=1, seq=2, base_version=2, rows=5)
        assert reply["dropped"] == "late" and not reply["applied"] and srv.stats()["late_dropped"] == 1
        assert c.progress(1) == (1, 2)  # the late slot is done: a retry does not push it again
        with pytest.raises(ServerError, match="payload"):
            c.push(_delta(), worker=0, attempt=1, seq=3, base_version=2, rows=5, encoding="1bit")
        board.stop()
        assert c.wait_round(2, 5.0)["stop"]


def test_validation_in_the_tasks_over_flight_serves_the_posted_weights_and_records_each_workers_sums():
    """The val:<epoch> ticket serves what the driver posted (and nothing for another epoch); a wait
    for a round wakes with "validate"; the "validation" action records a worker's rows and sums once
    and refuses malformed sums and a worker id that is not the fit's; wait_validation says done."""
    from sparkdl.core.board import RoundBoard, encode_metric_sums

    board = RoundBoard(2)
    with ParameterServer(_initial(), board, names=NAMES, workers=2) as srv, \
            ParameterServerClient(srv.location, srv.token, timeout_s=10) as c:
        posted = [w + 3.0 for w in _initial().weights]
        board.post_validation(0, posted, {0, 1})
        assert c.wait_round(0, 5.0, worker=1)["validate"] == 0
        assert_arrays_equal(c.validation_weights(0), posted)
        with pytest.raises(ServerError, match="val:<epoch>"):
            c.validation_weights(1)
        sums = [np.array([1.5, 2.0]), np.array(4.0)]
        assert c.report_validation(1, 7, 0, 4, encode_metric_sums(sums))
        assert not c.report_validation(1, 8, 0, 4, encode_metric_sums(sums))  # once per worker
        with pytest.raises(ServerError, match="validation metrics"):
            c.report_validation(0, 7, 0, 4, [["not a shape", [1.0]]])
        with pytest.raises(ServerError, match="worker"):
            c.report_validation(5, 7, 0, 4, None)
        assert c.wait_validation(0, 0, 0.0) == {"validate": 0, "done": False, "stop": False}
        assert c.report_validation(0, 7, 0, 2, None)
        reports = board.close_validation()
        assert reports[1][0] == 4 and float(reports[1][1][0][1]) == 2.0 and reports[0] == (2, None)
        assert c.wait_validation(0, 0, 5.0) == {"validate": None, "done": True, "stop": False}


def test_round_actions_need_a_round_board(server, client):
    with pytest.raises(ServerError, match="wait_round needs a round rule"):
        client.wait_round(0, 0.1)
    with pytest.raises(ServerError, match="round rule"):
        client.pull(worker=0)
    _assert_unchanged(server)


def test_the_drivers_orders_reach_the_workers_with_pulls_and_heartbeats(server, client):
    client.pull()
    assert client.control == {"stop": False, "learning_rate": None}
    server.set_control(learning_rate=0.125)
    client.pull(weights_only=True)
    assert client.control == {"stop": False, "learning_rate": 0.125}
    server.set_control(stop=True)  # the learning rate stays
    assert client.heartbeat("w0") == {"version": 0, "superseded": False, "stop": True, "learning_rate": 0.125}
    client.pull()
    assert client.control == {"stop": True, "learning_rate": 0.125}


def test_the_control_action_answers_the_drivers_orders(server, client):
    server.set_control(stop=True, learning_rate=0.5)
    assert client.orders() == {"stop": True, "learning_rate": 0.5}


def test_the_control_action_over_raw_flight(server):
    server.set_control(learning_rate=0.5)
    options = flight.FlightCallOptions(timeout=5, headers=auth_headers(server.token))
    raw = flight.FlightClient(server.location, generic_options=[("grpc.enable_http_proxy", 0)])
    (result,) = list(raw.do_action(flight.Action("control", b""), options))
    raw.close()
    assert json.loads(result.body.to_pybytes()) == {"stop": False, "learning_rate": 0.5}


def test_set_state_replaces_the_master_of_the_same_signature(server, client):
    new = ModelState([np.full((3, 2), 7.0, np.float32), np.zeros(2, np.float32)])
    server.set_state(new)
    version, state = client.pull()
    assert version == 0
    assert_arrays_equal(state.weights, new.weights)
    with pytest.raises(ValueError, match="dense/kernel"):
        server.set_state(ModelState([np.zeros((2, 2), np.float32), np.zeros(2, np.float32)]))
    assert_arrays_equal(server.state()[1].weights, new.weights)


def test_a_workers_own_state_goes_up_and_comes_back(server, client):
    assert client.pull_local("w0") is None
    local = WorkerLocal(0, [np.ones((3, 2), np.float32), np.array([0.5, -0.5], np.float32)], None)
    assert client.push_local(local, worker="w0", attempt=1, seq=1) == {"applied": True, "dropped": None}
    back = client.pull_local("w0")
    assert back.version == 0 and back.optimizer is None
    assert_arrays_equal(back.residual, local.residual)
    assert server.local("w0").version == 0 and server.local("other") is None
    only_optimizer = WorkerLocal(1, None, [np.array(3, np.int64), np.array([True, False])])
    client.push_local(only_optimizer, worker="w0", attempt=1, seq=2)
    back = client.pull_local("w0")
    assert back.version == 1 and back.residual is None
    assert_arrays_equal(back.optimizer, only_optimizer.optimizer)
    assert _push(client, attempt=2, seq=3)["applied"]  # attempt 2 supersedes attempt 1
    assert client.push_local(local, worker="w0", attempt=1, seq=4) == {"applied": False, "dropped": "superseded_attempt"}
    assert client.pull_local("w0").version == 1 and server.stats()["local_puts"] == 2
    _assert_unchanged(server, version=1, state=ModelState([w + d for w, d in zip(_initial().weights, _delta(), strict=True)]))


def test_a_resumed_server_starts_from_its_marks_and_the_workers_own_state():
    local = WorkerLocal(4, None, [np.array(9, np.int64)])
    with ParameterServer(_initial(), DownpourRule(), names=NAMES, marks={"w0": [2, 5]}, local={"w0": local}) as srv, \
            ParameterServerClient(srv.location, srv.token, timeout_s=10) as c:
        assert c.progress("w0") == (2, 5) and srv.marks() == {"w0": [2, 5]}
        assert _push(c, attempt=3, seq=5)["dropped"] == "duplicate"  # slot 5 was applied before the snapshot
        assert _push(c, attempt=1, seq=6)["dropped"] == "superseded_attempt"
        back = c.pull_local("w0")
        assert back.version == 4 and back.residual is None and back.optimizer[0] == 9
        assert _push(c, attempt=3, seq=6)["applied"] and srv.marks() == {"w0": [3, 6]}


def test_the_location_advertises_another_address_than_the_bound_one():
    with ParameterServer(_initial(), DownpourRule(), host="127.0.0.1", advertise="ps.example.test") as srv:
        assert srv.location == f"grpc+tcp://ps.example.test:{srv.port}"
        with ParameterServerClient(f"grpc+tcp://127.0.0.1:{srv.port}", srv.token, timeout_s=10) as c:
            assert c.pull()[0] == 0
    with pytest.raises(ConfigError, match="advertise must be a non-empty string"):
        ParameterServer(_initial(), DownpourRule(), advertise="")


# ---------------------------------------------------------------------------- bounds (issue 31)
def test_a_token_holder_cannot_push_past_the_fits_slots_or_supersede_a_workers_real_attempts():
    """Marked, a push of seq 10**9 dropped every real push of its worker as a duplicate, and one of a
    far-ahead attempt every real one as superseded: both are refused now, and the real pushes apply."""
    with ParameterServer(_initial(), DownpourRule(), names=NAMES, workers=2, max_seq=4) as srv:
        with ParameterServerClient(srv.location, srv.token, timeout_s=10) as c:
            with pytest.raises(ServerError, match=r"push: seq must be a slot of the fit, in \[0, 4\]\. Received: 1000000000"):
                _push(c, worker="0", attempt=7, seq=10**9)
            assert _push(c, worker="0", attempt=7, seq=1)["applied"]  # not a "duplicate" of the refused push
            far = 7 + (1 << 20) + 1
            with pytest.raises(ServerError, match=rf"push: attempt must be at most 1048576 above the highest task attempt "
                                                  rf"heard \(7\)\. Received: {far}"):
                _push(c, worker="0", attempt=far, seq=2)
            with pytest.raises(ServerError, match="attempt must be at most"):
                c.heartbeat(0, attempt=far)
            assert _push(c, worker="0", attempt=7, seq=2)["applied"]  # not "superseded" by the refused attempt
            assert _push(c, worker="1", attempt=9, seq=4)["applied"]  # the last slot, a retry's higher attempt: fine
            assert srv.marks() == {"0": [7, 2], "1": [9, 4]} and srv.version == 3
            assert srv.contacts()["0"]["attempt"] == 7


def test_a_token_holder_cannot_register_worker_ids_beyond_the_fits_partitions():
    with ParameterServer(_initial(), DownpourRule(), names=NAMES, workers=2, max_seq=4) as srv:
        with ParameterServerClient(srv.location, srv.token, timeout_s=10) as c:
            for worker in ("2", "w0", "01", "-1", "1" * 200):
                with pytest.raises(ServerError, match=r"heartbeat: worker must be one of the fit's 2 partitions, '0' to '1'"):
                    c.heartbeat(worker, attempt=1)
            with pytest.raises(ServerError, match="progress: worker must be one of the fit's 2 partitions"):
                c.progress("5")
            with pytest.raises(ServerError, match="push: worker must be one of the fit's 2 partitions"):
                _push(c, worker="5", seq=1)
            with pytest.raises(ServerError, match=r"ticket local:<worker>: worker must be one of the fit's 2 partitions"):
                c.pull_local("9")
            c.heartbeat(1, attempt=3)
            assert set(srv.contacts()) == {"1"} and srv.marks() == {} and srv.version == 0  # nothing of the others recorded
    with ParameterServer(_initial(), DownpourRule(), names=NAMES) as srv:  # a server not told the fit: any id, as before
        with ParameterServerClient(srv.location, srv.token, timeout_s=10) as c:
            c.heartbeat("w0", attempt=1)
            assert _push(c, worker="w0", attempt=10**12, seq=10**9)["applied"]


def test_a_plain_server_on_a_non_loopback_address_warns_that_the_token_travels_in_clear():
    import warnings

    from sparkdl.server.service import is_loopback

    assert [is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost")] == [True] * 5
    assert [is_loopback(h) for h in ("0.0.0.0", "10.0.0.5", "::", "driver.example.test")] == [False] * 4
    with pytest.warns(UserWarning, match=r"^parameter server listens on 0\.0\.0\.0:\d+ without TLS \(serverTls=False\): the "
                                         r"fit's bearer token and the weights travel in clear"):
        with ParameterServer(_initial(), DownpourRule(), host="0.0.0.0", advertise="127.0.0.1"):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: loopback, or TLS
        with ParameterServer(_initial(), DownpourRule(), host="127.0.0.1"):
            pass
        with ParameterServer(_initial(), DownpourRule(), host="0.0.0.0", advertise="127.0.0.1", tls=self_signed()):
            pass
