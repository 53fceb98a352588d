"""Backend ``ps`` on the network (issue 21): TLS by default with a per-fit certificate the workers
pin, so a recording proxy between a worker and the server sees neither the token nor the weights
(and sees both without TLS); a driver bound to 0.0.0.0 advertises ``spark.driver.host``."""

import socket
import threading

import numpy as np

from sparkdl.core.modes.asynchronous import DownpourRule
from sparkdl.core.state import ModelState
from sparkdl.server import ParameterServer, ParameterServerClient
from sparkdl.server.tls import self_signed
from tests.conftest import run_spark_script


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


BIND = """
import json, sys
import numpy as np
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.bindAddress", "0.0.0.0").config("spark.driver.host", "127.0.0.1").getOrCreate())
spark.sparkContext.setLogLevel("OFF")
import keras
from sparkdl import KerasEstimator
rows = [([float(i % 3), 1.0], float(i % 2)) for i in range(32)]
df = spark.createDataFrame(rows, "x array<float>, y double")
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
fitted = KerasEstimator(model=model, optimizer="adam", loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y",
                        numWorkers=2, epochs=1, batchSize=8, verbose=0, backend="ps").fit(df)
json.dump({k: fitted.fitInfo[k] for k in ("server_bind", "server_location", "server_tls")}, open(sys.argv[1], "w"))
spark.stop()
"""


def test_a_driver_bound_to_all_interfaces_advertises_its_host(tmp_path):
    out = run_spark_script(BIND, tmp_path)
    assert out["server_bind"] == "0.0.0.0" and out["server_location"].startswith("grpc+tls://127.0.0.1:") and out["server_tls"] is True
