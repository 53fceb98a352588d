"""Parameter-server throughput: push+pull round trips against a loopback ParameterServer.

For each model size (float32 parameters split over ``--arrays`` arrays) the script starts a
:class:`sparkdl.server.ParameterServer` with the additive Downpour rule, runs ``--clients``
client threads that each repeat ``push(Δ)`` then ``pull()`` for ``--seconds`` seconds, and
compares the median round-trip time with the codec's own ``encode_arrays`` + ``decode_arrays``
time for the same arrays (``sparkdl.serialization.arrow_codec``), measured in this process with as
many threads coding at once as there are clients (the same contention for the cores).

Output: a table, then one JSON line per measurement, e.g.::

    {"benchmark": "ps_roundtrip", "params": 10000000, "clients": 2, "roundtrip_s": 0.05,
     "codec_s": 0.03, "ratio": 1.7, "roundtrips_per_s": 40.0, "mb_per_s": 3200.0}

``roundtrip_s`` is the mean wall time of one client's push+pull (seconds); ``mb_per_s`` is
the bytes moved by all clients (pushed + pulled, 10^6 bytes) per second of wall time.

Section ``fit``: fit samples/s of mode ``sync`` on backend ``ps`` and on backend ``rounds``
against plain ``keras.Model.fit`` in one process, on the MNIST CNN of conf/mnist_cnn.yaml
(``sparkdl.keras.zoo:mnist_cnn``, 8,000 rows, batch 64, Adam 0.002) with 2 workers on
``local[2]`` and τ = ``--local-steps`` (16). Each backend runs one untimed 1-epoch fit first
(executor Python workers import TensorFlow once per session), then ``--repeats`` timed fits,
alternating; medians are reported, one JSON line per backend::

    {"benchmark": "fit", "backend": "ps", "mode": "sync", "local_steps": 16, "samples_per_s": 1500,
     "keras_samples_per_s": 1600, "ratio": 0.94}

Usage::

    python benchmarks/ps_throughput.py                       # 1M and 10M params, 1 and 2 clients
    python benchmarks/ps_throughput.py roundtrip --params 10000000 --clients 2 --seconds 5
    python benchmarks/ps_throughput.py fit --epochs 3 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np

from sparkdl.core.modes.asynchronous import DownpourRule
from sparkdl.core.state import ModelState
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays
from sparkdl.server import ParameterServer, ParameterServerClient
from sparkdl.server.flight import DEFAULT_CHUNK_BYTES


def make_arrays(params: int, n_arrays: int, seed: int = 0) -> list[np.ndarray]:
    """``n_arrays`` float32 arrays holding ``params`` values in all (the last takes the rest)."""
    rng = np.random.default_rng(seed)
    per = params // n_arrays
    sizes = [per] * (n_arrays - 1) + [params - per * (n_arrays - 1)]
    return [rng.standard_normal(n, dtype=np.float32) for n in sizes]


def codec_seconds(arrays: list[np.ndarray], repeats: int = 5, threads: int = 1) -> float:
    """Median wall time (seconds) of one encode_arrays + decode_arrays, with ``threads`` threads
    coding at once: the same contention for the cores as ``threads`` clients (the codec releases
    the GIL in its copies, as Flight does)."""
    times: list[float] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(repeats):
            t0 = time.perf_counter()
            decode_arrays(encode_arrays(arrays))
            with lock:
                times.append(time.perf_counter() - t0)

    decode_arrays(encode_arrays(arrays))  # warm-up
    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return float(np.median(times))


def roundtrip(params: int, clients: int, seconds: float, n_arrays: int = 4, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> dict:
    """Runs the push+pull loop and returns one measurement (see the module docstring)."""
    arrays = make_arrays(params, n_arrays)
    delta = [np.full_like(a, 1e-6) for a in arrays]
    codec_s = codec_seconds(arrays, threads=clients)
    nbytes = sum(a.nbytes for a in arrays)
    times: list[float] = []
    errors: list[BaseException] = []
    times_lock = threading.Lock()
    with ParameterServer(ModelState(arrays), DownpourRule(), chunk_bytes=chunk_bytes) as server:
        start = threading.Barrier(clients + 1)

        def work(worker: int) -> None:
            try:
                with ParameterServerClient(server.location, server.token, timeout_s=120, chunk_bytes=chunk_bytes) as client:
                    version, _ = client.pull()  # warm-up: connection, signature
                    start.wait()
                    deadline = time.perf_counter() + seconds
                    seq = 0
                    while time.perf_counter() < deadline:
                        t0 = time.perf_counter()
                        client.push(delta, worker=worker, attempt=0, seq=seq, base_version=version, rows=1)
                        version, _ = client.pull()
                        dt = time.perf_counter() - t0
                        with times_lock:
                            times.append(dt)
                        seq += 1
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
                start.abort()

        threads = [threading.Thread(target=work, args=(w,), name=f"ps-bench-{w}") for w in range(clients)]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        stats = server.stats()
    if errors:
        raise errors[0]
    n = len(times)
    return {
        "benchmark": "ps_roundtrip",
        "params": params,
        "arrays": n_arrays,
        "clients": clients,
        "chunk_bytes": chunk_bytes,
        "roundtrips": n,
        "roundtrip_s": round(float(np.mean(times)), 5),
        "roundtrip_p50_s": round(float(np.median(times)), 5),
        "codec_s": round(codec_s, 5),
        "ratio": round(float(np.median(times)) / codec_s, 2),
        "roundtrips_per_s": round(n / wall, 2),
        "mb_per_s": round(2 * nbytes * n / wall / 1e6, 1),
        "staleness_mean": round(stats["staleness_mean"], 3),
    }


def fit_section(epochs: int, local_steps: int, workers: int, repeats: int, batch_size: int = 64) -> list[dict]:
    """Median fit samples/s of ``sync`` on ps and on rounds, and of plain Keras (see the module docstring)."""
    import os
    import statistics

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    for key, value in (("PYSPARK_PYTHON", sys.executable), ("KERAS_BACKEND", "tensorflow"), ("TF_CPP_MIN_LOG_LEVEL", "2"),
                       ("SPARK_LOCAL_IP", "127.0.0.1")):
        os.environ.setdefault(key, value)
    import keras
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    from sparkdl.keras.zoo import mnist_cnn
    from sparkdl import KerasEstimator

    path = os.path.join(root, "data", "mnist10k", "train.parquet")
    table = pq.read_table(path)
    x = np.stack(table.column("pixels").to_numpy(zero_copy_only=False)).astype(np.float32)
    y = table.column("label").to_numpy().astype(np.int64)
    spark = (SparkSession.builder.master(f"local[{workers}]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    train = spark.read.parquet(path)

    def sparkdl_fit(backend: str, n_epochs: int) -> float:
        est = KerasEstimator(model=mnist_cnn(), optimizer=keras.optimizers.Adam(0.002), loss="sparse_categorical_crossentropy",
                             metrics=["accuracy"], featuresCol="pixels", labelCol="label", numWorkers=workers, epochs=n_epochs,
                             batchSize=batch_size, localSteps=local_steps, mode="sync", backend=backend, verbose=0)
        started = time.perf_counter()
        est.fit(train)
        return n_epochs * len(x) / (time.perf_counter() - started)

    def keras_fit() -> float:
        model = mnist_cnn()
        model.compile(optimizer=keras.optimizers.Adam(0.002), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        started = time.perf_counter()
        model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=True, verbose=0)
        return epochs * len(x) / (time.perf_counter() - started)

    runs: dict[str, list[float]] = {"keras": [], "ps": [], "rounds": []}
    for backend in ("ps", "rounds"):
        sparkdl_fit(backend, 1)  # warm-up, untimed
    for _ in range(repeats):
        runs["keras"].append(keras_fit())
        for backend in ("ps", "rounds"):
            runs[backend].append(sparkdl_fit(backend, epochs))
    spark.stop()
    keras_sps = statistics.median(runs["keras"])
    rows = []
    for backend in ("ps", "rounds"):
        sps = statistics.median(runs[backend])
        rows.append({"benchmark": "fit", "backend": backend, "mode": "sync", "local_steps": local_steps, "workers": workers,
                     "epochs": epochs, "repeats": repeats, "samples_per_s": round(sps, 1),
                     "keras_samples_per_s": round(keras_sps, 1), "ratio": round(sps / keras_sps, 3),
                     "runs_samples_per_s": [round(v, 1) for v in runs[backend]]})
    return rows


def print_table(rows: list[dict]) -> None:
    header = f"{'params':>10} {'clients':>7} {'rt/s':>8} {'rt p50 s':>9} {'codec s':>8} {'ratio':>6} {'MB/s':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['params']:>10} {r['clients']:>7} {r['roundtrips_per_s']:>8} {r['roundtrip_p50_s']:>9} "
              f"{r['codec_s']:>8} {r['ratio']:>6} {r['mb_per_s']:>8}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="section")
    rt = sub.add_parser("roundtrip", help="push+pull round trips against a loopback server (default)")
    for p in (parser, rt):
        p.add_argument("--params", type=int, nargs="+", default=[1_000_000, 10_000_000], help="float32 parameters per model")
        p.add_argument("--clients", type=int, nargs="+", default=[1, 2], help="client threads")
        p.add_argument("--seconds", type=float, default=3.0, help="duration of each measurement (s)")
        p.add_argument("--arrays", type=int, default=4, help="arrays per model")
        p.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES, help="bytes of values per record batch")
    fit = sub.add_parser("fit", help="fit samples/s: sync on ps vs on rounds vs plain Keras (MNIST CNN)")
    fit.add_argument("--epochs", type=int, default=3)
    fit.add_argument("--local-steps", type=int, default=16, help="τ")
    fit.add_argument("--workers", type=int, default=2)
    fit.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    if args.section == "fit":
        rows = fit_section(args.epochs, args.local_steps, args.workers, args.repeats)
        print(f"{'backend':>8} {'samples/s':>10} {'keras':>8} {'ratio':>6}")
        for r in rows:
            print(f"{r['backend']:>8} {r['samples_per_s']:>10} {r['keras_samples_per_s']:>8} {r['ratio']:>6}")
        for r in rows:
            print(json.dumps(r))
        return 0
    rows = []
    if args.section in (None, "roundtrip"):
        for params in args.params:
            for clients in args.clients:
                rows.append(roundtrip(params, clients, args.seconds, args.arrays, args.chunk_bytes))
    print_table(rows)
    for r in rows:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
