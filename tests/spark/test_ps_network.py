"""Backend ``ps`` on the network (issue 21): TLS by default with a per-fit certificate the workers
pin, so a recording proxy between a worker and the server sees neither the token nor the weights
(and sees both without TLS). A driver bound to 0.0.0.0 advertising ``spark.driver.host``: the C39
test in test_ps_cluster_checks.py."""

import socket
import threading

import numpy as np

from sparkdl.core.modes.asynchronous import DownpourRule
from sparkdl.core.state import ModelState
from sparkdl.server import ParameterServer, ParameterServerClient
from sparkdl.server.tls import self_signed


class RecordingProxy:
    """A TCP proxy on loopback that forwards every byte to ``port`` and keeps a copy of all of them."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.recorded = bytearray()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source, sink) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                for s in (source, sink):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            with self.lock:
                self.recorded += data
            try:
                sink.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()


def _session(tls):
    marker = np.full(64, 12345.678, np.float32)  # a weight value to look for on the wire
    server = ParameterServer(ModelState([marker]), DownpourRule(), tls=tls).start()
    proxy = RecordingProxy(server.port)
    scheme = "tls" if tls is not None else "tcp"
    client = ParameterServerClient(f"grpc+{scheme}://127.0.0.1:{proxy.port}", server.token, tls=tls.pin() if tls else None,
                                   timeout_s=10, retries=0)
    version, state = client.pull()
    client.push(ModelState([np.ones(64, np.float32)]), worker=0, attempt=1, seq=1, base_version=version, rows=8)
    client.heartbeat(0, attempt=1)
    client.close()
    server.shutdown()
    proxy.close()
    return bytes(proxy.recorded), server.token.encode(), marker.tobytes()[:16], state


def test_a_recording_proxy_sees_no_token_and_no_weights_with_tls_and_both_without():
    recorded, token, weights, state = _session(self_signed())
    assert len(recorded) > 1000 and token not in recorded and weights not in recorded
    assert float(state.weights[0][0]) == 12345.678 or abs(float(state.weights[0][0]) - 12345.678) < 1e-2  # the pull went through
    plain, token, weights, _ = _session(None)  # the control: the same calls in clear text show both
    assert token in plain and weights in plain
