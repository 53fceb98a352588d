"""The data plane of a sharded parameter server, measured on real executors before it is built:
Arrow Flight throughput between executors' Python workers, one executor's rate to pack, sum and
apply a slice, the time to start a slice server, and the time until a slice is served again after
its executor JVM is SIGKILLed. The constants feed ``benchmarks/scaling_model.py``'s ``sharded``
backend.

For each N (default 2, 3, 4) a fresh process starts ``local-cluster[N,1,1024]`` (N executor JVMs of
one core and 1024 MB, each with its own Python worker; ``spark.task.maxFailures`` 4, nothing else
tuned) and runs, after one warm-up job (Python workers started, pyarrow imported):

1. ``flight``: one Spark job of N long-lived tasks (``mapPartitionsWithIndex``, one per executor).
   Each task starts two ``pyarrow.flight.FlightServerBase`` servers on ``127.0.0.1`` port 0, one
   plain (``grpc+tcp``) and one with TLS (``grpc+tls``, the ECDSA P-256 self-signed certificate of
   ``sparkdl.server.tls.self_signed``, pinned by the client with ``override_hostname`` as
   ``sparkdl.server.client`` does) and both with sparkdl's bearer-token middleware
   (``sparkdl.server.auth``), and publishes their locations as a JSON file in a folder the
   driver made and passed in the closure. When all N are known, task 0 moves ``--sizes`` MB
   (10^6 bytes) of float32 values to task 1 with ``DoPut`` and reads them back with ``DoGet``,
   over ``--streams`` parallel streams (threads, each with its own ``FlightClient`` and TCP
   connection, each moving 1/k of the bytes in record batches of ``--batch-mb`` MB), connections
   opened and warmed before the clock starts; ``gb_s`` = bytes / wall seconds, 10^9 bytes/s,
   median of ``--repeats``. ``rpc_ms``: the median round trip of an empty ``DoAction`` between the
   two (500 calls). ``shift``: every task at once puts ``min(--sizes)`` MB to task ``(i + 1) % N``
   and gets them back (4 streams each; the reduce-scatter's and all-gather's pattern: each
   executor sends and receives at the same time); ``gb_s`` per executor = its bytes / the slowest
   task's seconds.
2. ``compute``: in one task (the other executors idle), a slice of ``--slice-mvalues`` million
   float32 values (25M: 100 MB) and N contributions: ``pack`` (the slice's pieces of 37 arrays of
   a flattened state copied into one contiguous buffer, then cut into zero-copy ``pyarrow``
   RecordBatches of ``--batch-mb`` MB), ``sum32`` (row-weighted sum of the N float32
   contributions in float32, then divided by the rows), ``sum64`` (the same in float64 as
   ``sparkdl.core.aggregation.WeightedMean`` does today: ``np.multiply(a, w, dtype=np.float64)``
   added into a float64 sum, the mean cast to float32), ``sum16`` (N float16 contributions decoded
   and summed into float32: fp16 pushes), ``apply`` (BMUF's elementwise rule on the slice:
   ``d = 0.9·d + (mean − w); w += d``), each three ways: ``numpy`` (whole-array numpy calls, no
   pool), ``pool1`` and ``poolK`` (the slice cut into chunks of ``--chunk-mb`` MB mapped over a
   ``concurrent.futures.ThreadPoolExecutor`` of 1 and ``os.cpu_count()`` threads; numpy releases
   the GIL). ``gb_s`` = slice bytes (4 bytes × values) / seconds, median of ``--repeats``;
   ``contrib_gb_s`` (the sums) = the N contributions' float32-equivalent bytes / seconds.
   ``total`` = pack + sum32 + apply, each at its best way.
3. ``startup``: (a) inside a running task, the seconds to construct and start a TLS Flight
   server (``start_s``) and until a fresh client's first ``DoAction`` is answered
   (``first_call_s``: the TLS handshake included), plain TCP for reference; (b) a new Spark job of
   N tasks each starting a TLS server, from submitting it until the driver has had an answer from
   all N (``serving_s``); (c) an empty Spark job of N tasks (``sc.parallelize(range(N), N)``,
   ``collect``). Medians of ``--repeats`` (at least 3).
4. ``kill``: a long-lived job of N tasks, each serving a slice (``--kill-slice-mb``) over TLS and
   registering its location in the shared folder with its attempt number. Task 1 writes a marker
   (wall time) and SIGKILLs its executor JVM (the Python worker's parent, found as
   ``sparkdl.spark.training.faults.executor_pid`` does) once. The driver polls its executor list
   (``getExecutorMemoryStatus``, every 20 ms) and the folder, and reports seconds after the kill
   until: the executor left the driver's list (``lost_s``), the new executor's JVM process started
   (``jvm_start_s``), it registered with the driver (``registered_s``), its pyspark daemon and the
   Python worker of the retried task started (``daemon_start_s``, ``worker_start_s``: process
   start times from ``/proc``, 10 ms resolution), the retried task entered its function
   (``task_started_s``), its server was up (``server_up_s``) and its slice was read back with
   ``DoGet`` from the driver (``served_s``).

Prints one JSON line per measurement (``{"benchmark": "data_plane", "section": ..., "executors":
N, ...}``), appends them to ``--out`` (default ``benchmarks/data_plane.jsonl``; every line carries
its ``run``, the run's start time, and ``scaling_model.py`` reads the latest run), then Markdown
tables. The machine's cores are shared by the N executors, the driver and whatever else runs
(each line has ``cores`` and ``load_average``): with N > cores the executors are oversubscribed,
and sender and receiver of a loopback transfer share the cores, so the rates are lower bounds
for dedicated executors; loopback has no NIC, so a transfer is bounded by the endpoints' CPUs
(gRPC framing, copies, TLS's AES-GCM), not by a line rate.

Needs Linux (``/proc``). Usage::

    python benchmarks/data_plane.py [--n 2 3 4] [--sizes 64 256] [--streams 1 4 8] [--repeats 3]
        [--transports tcp tls] [--sections flight compute startup kill] [--slice-mvalues 25]
        [--out benchmarks/data_plane.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import setup_env  # noqa: E402,F401  (sys.path and the environment, before pyspark)

ROOT = setup_env.ROOT
MB = 1e6
GB = 1e9
WAIT_S = 300.0  # the longest any task or the driver waits for the others
CLIENT_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.use_local_subchannel_pool", 1)]  # a TCP connection per client


# ---- files in the shared folder (the tasks' and the driver's only channel besides Flight) ---------

def _write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _wait_files(paths: list[str], timeout_s: float = WAIT_S, poll_s: float = 0.005) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            missing = [p for p in paths if not os.path.exists(p)]
            raise TimeoutError(f"waited {timeout_s} s for {missing}")
        time.sleep(poll_s)


def _barrier(folder: str, name: str, index: int, n: int) -> None:
    """Every task of the job reaches ``name`` before any goes on."""
    open(os.path.join(folder, f"{name}-{index}"), "w").close()
    _wait_files([os.path.join(folder, f"{name}-{i}") for i in range(n)])


# ---- Flight: a server and its clients -------------------------------------------------------------

def _server_class():
    import pyarrow.flight as flight

    class BenchServer(flight.FlightServerBase):
        """Keeps each put table under its descriptor's command; serves it back on DoGet."""

        def __init__(self, location, **kwargs) -> None:
            super().__init__(location, **kwargs)
            self.store: dict[bytes, object] = {}
            self.lock = threading.Lock()

        def do_put(self, context, descriptor, reader, writer):
            table = reader.read_all()
            with self.lock:
                self.store[descriptor.command] = table

        def do_get(self, context, ticket):
            return flight.RecordBatchStream(self.store[ticket.ticket])

        def do_action(self, context, action):
            if action.type == "clear":
                with self.lock:
                    self.store.clear()
            return [flight.Result(b"ok")]

    return BenchServer


def start_server(transport: str, ident: dict, store: dict | None = None):
    """A BenchServer on 127.0.0.1 port 0 with sparkdl's bearer-token middleware (and TLS)."""
    import pyarrow.flight as flight

    from sparkdl.server.auth import BearerTokenMiddlewareFactory

    kwargs = {"middleware": {"auth": BearerTokenMiddlewareFactory(ident["token"])}}
    if transport == "tls":
        kwargs["tls_certificates"] = [flight.CertKeyPair(ident["cert_pem"], ident["key_pem"])]
    server = _server_class()(f"grpc+{transport}://127.0.0.1:0", **kwargs)
    if store:
        server.store.update(store)
    return server, f"grpc+{transport}://127.0.0.1:{server.port}"


def client(location: str, ident: dict):
    """A FlightClient on its own TCP connection and call options carrying the token."""
    import pyarrow.flight as flight

    from sparkdl.server.auth import auth_headers

    kwargs = {"generic_options": CLIENT_OPTIONS}
    if location.startswith("grpc+tls"):
        kwargs["tls_root_certs"] = ident["cert_pem"]
        kwargs["override_hostname"] = ident["server_name"]
    return flight.FlightClient(location, **kwargs), flight.FlightCallOptions(timeout=WAIT_S, headers=auth_headers(ident["token"]))


def ping(c, options) -> None:
    import pyarrow.flight as flight

    list(c.do_action(flight.Action("ping", b""), options))


def _batches(values, batch_values: int):
    import pyarrow as pa

    return [pa.RecordBatch.from_arrays([pa.array(values[i : i + batch_values])], names=["v"])
            for i in range(0, len(values), batch_values)]


def transfer(location: str, ident: dict, payload, streams: int, batch_values: int, repeats: int, key: str = "p") -> dict:
    """Put ``payload`` (float32) to the server at ``location`` over ``streams`` parallel streams, then
    get it back, ``repeats`` times: median seconds of each."""
    import numpy as np
    import pyarrow.flight as flight

    pieces = np.array_split(payload, streams)
    batches = [_batches(p, batch_values) for p in pieces]
    clients = [client(location, ident) for _ in range(streams)]
    for c, o in clients:
        ping(c, o)  # connection and handshake before the clock
    list(clients[0][0].do_action(flight.Action("clear", b""), clients[0][1]))
    times = {"put": [], "get": []}

    def put(i: int) -> None:
        c, o = clients[i]
        writer, _ = c.do_put(flight.FlightDescriptor.for_command(f"{key}{i}"), batches[i][0].schema, o)
        for b in batches[i]:
            writer.write_batch(b)
        writer.close()

    def get(i: int) -> None:
        c, o = clients[i]
        table = c.do_get(flight.Ticket(f"{key}{i}".encode()), o).read_all()
        assert table.num_rows == len(pieces[i])

    for _ in range(repeats):
        for op, fn in (("put", put), ("get", get)):
            threads = [threading.Thread(target=fn, args=(i,)) for i in range(streams)]
            started = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            times[op].append(time.perf_counter() - started)
    list(clients[0][0].do_action(flight.Action("clear", b""), clients[0][1]))
    for c, _ in clients:
        c.close()
    return {op: statistics.median(v) for op, v in times.items()}


# ---- section 1: Flight between executors ----------------------------------------------------------

def flight_task(index: int, folder: str, n: int, ident: dict, cfg: dict) -> list[dict]:
    """One long-lived task of the flight job (see the module docstring); returns its measurements."""
    import numpy as np

    servers = {t: start_server(t, ident) for t in cfg["transports"]}
    _write_json(os.path.join(folder, f"loc-{index}.json"), {t: loc for t, (_, loc) in servers.items()})
    _wait_files([os.path.join(folder, f"loc-{i}.json") for i in range(n)])
    locations = [json.load(open(os.path.join(folder, f"loc-{i}.json"))) for i in range(n)]
    batch_values = int(cfg["batch_mb"] * MB / 4)
    rng = np.random.default_rng(index)
    out: list[dict] = []
    if index == 0:
        for transport in cfg["transports"]:
            c, o = client(locations[1][transport], ident)
            for _ in range(20):
                ping(c, o)
            lat = []
            for _ in range(500):
                t0 = time.perf_counter()
                ping(c, o)
                lat.append(time.perf_counter() - t0)
            c.close()
            out.append({"section": "flight", "op": "rpc", "transport": transport, "rpc_ms": round(1e3 * statistics.median(lat), 4),
                        "rpc_p90_ms": round(1e3 * sorted(lat)[int(0.9 * len(lat))], 4)})
            for size in cfg["sizes"]:
                payload = rng.random(int(size * MB / 4), dtype=np.float32)
                for streams in cfg["streams"]:
                    t = transfer(locations[1][transport], ident, payload, streams, batch_values, cfg["repeats"])
                    for op in ("put", "get"):
                        out.append({"section": "flight", "op": op, "transport": transport, "size_mb": size, "streams": streams,
                                    "seconds": round(t[op], 4), "gb_s": round(payload.nbytes / t[op] / GB, 4)})
                del payload
        open(os.path.join(folder, "directed-done"), "w").close()
    else:
        _wait_files([os.path.join(folder, "directed-done")], timeout_s=3 * WAIT_S)
    # every task at once to its successor: the reduce-scatter's pattern
    size = min(cfg["sizes"])
    payload = rng.random(int(size * MB / 4), dtype=np.float32)
    for transport in cfg["transports"]:
        target = locations[(index + 1) % n][transport]
        times = {"put": [], "get": []}
        for r in range(cfg["repeats"]):
            _barrier(folder, f"shift-{transport}-{r}", index, n)
            t = transfer(target, ident, payload, cfg["shift_streams"], batch_values, 1, key=f"s{index}-")
            times["put"].append(t["put"])
            times["get"].append(t["get"])
        for op in ("put", "get"):
            out.append({"section": "shift", "op": op, "transport": transport, "size_mb": size, "streams": cfg["shift_streams"],
                        "task": index, "seconds_each": [round(s, 4) for s in times[op]]})
    _barrier(folder, "done", index, n)
    for server, _ in servers.values():
        server.shutdown()
    return out


def _flight_partition(folder, n, ident, cfg):
    def run(index, _):
        yield json.dumps(flight_task(index, folder, n, ident, cfg))
    return run


def run_flight(sc, n: int, ident: dict, cfg: dict) -> list[dict]:
    folder = tempfile.mkdtemp(prefix="dataplane-flight-")
    lines = sc.parallelize(range(n), n).mapPartitionsWithIndex(_flight_partition(folder, n, ident, cfg)).collect()
    shutil.rmtree(folder, ignore_errors=True)
    results = [r for line in lines for r in json.loads(line)]
    out = [r for r in results if r["section"] == "flight"]
    shift = [r for r in results if r["section"] == "shift"]
    for transport in cfg["transports"]:
        for op in ("put", "get"):
            rows = [r for r in shift if r["transport"] == transport and r["op"] == op]
            if not rows:
                continue
            # per repeat: every task's bytes over the slowest task's seconds
            slowest = [max(r["seconds_each"][k] for r in rows) for k in range(len(rows[0]["seconds_each"]))]
            seconds = statistics.median(slowest)
            nbytes = int(rows[0]["size_mb"] * MB / 4) * 4
            out.append({"section": "shift", "op": op, "transport": transport, "size_mb": rows[0]["size_mb"], "streams": rows[0]["streams"],
                        "seconds": round(seconds, 4), "gb_s": round(nbytes / seconds / GB, 4),
                        "aggregate_gb_s": round(n * nbytes / seconds / GB, 4)})
    return out


# ---- section 2: pack, sum, apply in one executor --------------------------------------------------

def _ranges(n_values: int, chunk_values: int) -> list[tuple[int, int]]:
    return [(a, min(a + chunk_values, n_values)) for a in range(0, n_values, chunk_values)]


def compute_task(n: int, cfg: dict) -> list[dict]:
    """Section 2 in the calling process (an executor's Python worker): see the module docstring."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import pyarrow as pa

    values = int(cfg["slice_mvalues"] * 1e6)
    slice_bytes = 4 * values
    batch_values = int(cfg["batch_mb"] * MB / 4)
    chunk_values = int(cfg["chunk_mb"] * MB / 4)
    rng = np.random.default_rng(0)
    # a flattened state of 2 slices in 37 arrays of random sizes; the slice is [values/2, 3·values/2)
    cuts = np.sort(rng.choice(np.arange(1, 2 * values), 36, replace=False))
    arrays = [rng.random(int(b - a), dtype=np.float32) for a, b in zip([0, *cuts], [*cuts, 2 * values])]
    starts = np.cumsum([0] + [len(a) for a in arrays])
    lo, hi = values // 2, values // 2 + values
    pieces = []  # (array index, start in it, start in the slice, length)
    for k, a in enumerate(arrays):
        s, e = max(lo, starts[k]), min(hi, starts[k + 1])
        if s < e:
            pieces.append((k, s - starts[k], s - lo, e - s))
    contributions = [(rng.random(values, dtype=np.float32) - 0.5) for _ in range(n)]
    half = [c.astype(np.float16) for c in contributions]
    rows = [64.0 * (i + 1) for i in range(n)]
    total_rows = sum(rows)
    acc = np.empty(values, np.float32)
    tmp = np.empty(values, np.float32)
    w = rng.random(values, dtype=np.float32)
    d = np.zeros(values, np.float32)
    packed = np.empty(values, np.float32)
    cores = os.cpu_count() or 1

    def make_batches(buf):
        batches = [pa.RecordBatch.from_arrays([pa.array(buf[i : i + batch_values])], names=["v"]) for i in range(0, values, batch_values)]
        assert batches[0].column(0).buffers()[1].address == buf.ctypes.data  # zero-copy
        return batches

    def pack_range(a: int, b: int) -> None:
        for k, src, dst, length in pieces:
            s, e = max(a, dst), min(b, dst + length)
            if s < e:
                packed[s:e] = arrays[k][src + s - dst : src + e - dst]

    def sum32_range(a: int, b: int) -> None:
        np.multiply(contributions[0][a:b], rows[0], out=acc[a:b])
        for c, r in zip(contributions[1:], rows[1:]):
            np.multiply(c[a:b], r, out=tmp[a:b])
            acc[a:b] += tmp[a:b]
        acc[a:b] *= np.float32(1 / total_rows)

    def sum64_range(a: int, b: int) -> None:
        s = np.multiply(contributions[0][a:b], rows[0], dtype=np.float64)
        for c, r in zip(contributions[1:], rows[1:]):
            np.add(s, np.multiply(c[a:b], r, dtype=np.float64), out=s)
        acc[a:b] = s / total_rows

    def sum16_range(a: int, b: int) -> None:
        np.multiply(half[0][a:b], rows[0], out=acc[a:b], dtype=np.float32)
        for c, r in zip(half[1:], rows[1:]):
            np.multiply(c[a:b], r, out=tmp[a:b], dtype=np.float32)
            acc[a:b] += tmp[a:b]
        acc[a:b] *= np.float32(1 / total_rows)

    def apply_range(a: int, b: int) -> None:  # BMUF: d = 0.9·d + (mean − w); w += d
        np.subtract(acc[a:b], w[a:b], out=tmp[a:b])
        d[a:b] *= np.float32(0.9)
        d[a:b] += tmp[a:b]
        w[a:b] += d[a:b]

    def pack_numpy() -> None:
        buf = np.concatenate([arrays[k][src : src + length] for k, src, _, length in pieces])
        make_batches(buf)

    ops = {"pack": pack_range, "sum32": sum32_range, "sum64": sum64_range, "sum16": sum16_range, "apply": apply_range}
    whole = {"pack": pack_numpy, **{k: (lambda f=f: f(0, values)) for k, f in ops.items() if k != "pack"}}
    out = []
    for ways in ("numpy", "pool1", "poolK"):
        pool = None if ways == "numpy" else ThreadPoolExecutor(1 if ways == "pool1" else cores)
        for op, fn in ops.items():
            if pool is None:
                run = whole[op]
            else:
                def run(fn=fn, op=op):
                    list(pool.map(lambda r: fn(*r), _ranges(values, chunk_values)))
                    if op == "pack":
                        make_batches(packed)
            run()  # warm-up (pages touched)
            times = []
            for _ in range(max(cfg["repeats"], 3)):
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            seconds = statistics.median(times)
            row = {"section": "compute", "op": op, "ways": ways, "threads": 0 if pool is None else pool._max_workers,
                   "slice_mb": slice_bytes / MB, "contributions": n, "seconds": round(seconds, 4),
                   "gb_s": round(slice_bytes / seconds / GB, 4)}
            if op.startswith("sum"):
                row["contrib_gb_s"] = round(n * slice_bytes / seconds / GB, 4)
            out.append(row)
        if pool is not None:
            pool.shutdown()
    best = {op: min((r for r in out if r["op"] == op), key=lambda r: r["seconds"]) for op in ops}
    total = sum(best[op]["seconds"] for op in ("pack", "sum32", "apply"))
    out.append({"section": "compute", "op": "total", "ways": "+".join(best[op]["ways"] for op in ("pack", "sum32", "apply")),
                "slice_mb": slice_bytes / MB, "contributions": n, "seconds": round(total, 4), "gb_s": round(slice_bytes / total / GB, 4)})
    return out


def _compute_partition(n, cfg):
    def run(_):
        yield json.dumps(compute_task(n, cfg))
    return run


# ---- section 3: starting a slice server -----------------------------------------------------------

def start_in_task(ident: dict, cfg: dict) -> list[dict]:
    """(a): construct and start a server, then a fresh client's first call, in this process."""
    out = []
    for transport in cfg["transports"]:
        starts, firsts = [], []
        for _ in range(max(cfg["repeats"], 5)):
            t0 = time.perf_counter()
            server, location = start_server(transport, ident)
            t1 = time.perf_counter()
            c, o = client(location, ident)
            ping(c, o)
            t2 = time.perf_counter()
            starts.append(t1 - t0)
            firsts.append(t2 - t1)
            c.close()
            server.shutdown()
        out.append({"section": "startup", "op": "in_task", "transport": transport, "start_s": round(statistics.median(starts), 4),
                    "first_call_s": round(statistics.median(firsts), 4),
                    "seconds": round(statistics.median([a + b for a, b in zip(starts, firsts)]), 4)})
    return out


def _startup_partition(folder, ident):
    def run(index, _):
        server, location = start_server("tls", ident)
        _write_json(os.path.join(folder, f"loc-{index}.json"), {"tls": location})
        _wait_files([os.path.join(folder, "release")])
        server.shutdown()
        yield index
    return run


def _in_task_partition(ident, cfg):
    def run(_):
        yield json.dumps(start_in_task(ident, cfg))
    return run


def run_startup(sc, n: int, ident: dict, cfg: dict) -> list[dict]:
    out = json.loads(sc.parallelize([0], 1).mapPartitions(_in_task_partition(ident, cfg)).collect()[0])
    serving, jobs, empty = [], [], []
    for r in range(max(cfg["repeats"], 3)):
        folder = tempfile.mkdtemp(prefix="dataplane-startup-")
        done = {}

        def job(folder=folder, done=done):
            done["result"] = sc.parallelize(range(n), n).mapPartitionsWithIndex(_startup_partition(folder, ident)).collect()
            done["t"] = time.perf_counter()

        started = time.perf_counter()
        thread = threading.Thread(target=job, daemon=True)
        thread.start()
        answered = set()
        deadline = time.monotonic() + WAIT_S
        while len(answered) < n:
            if time.monotonic() > deadline:
                raise TimeoutError("the startup job's servers did not all answer")
            for i in range(n):
                path = os.path.join(folder, f"loc-{i}.json")
                if i not in answered and os.path.exists(path):
                    c, o = client(json.load(open(path))["tls"], ident)
                    ping(c, o)
                    c.close()
                    answered.add(i)
            time.sleep(0.002)
        serving.append(time.perf_counter() - started)
        open(os.path.join(folder, "release"), "w").close()
        thread.join()
        jobs.append(done["t"] - started)
        shutil.rmtree(folder, ignore_errors=True)
        t0 = time.perf_counter()
        sc.parallelize(range(n), n).collect()
        empty.append(time.perf_counter() - t0)
    out.append({"section": "startup", "op": "job_serving", "transport": "tls", "seconds": round(statistics.median(serving), 4),
                "seconds_each": [round(s, 4) for s in serving], "job_end_s": round(statistics.median(jobs), 4)})
    out.append({"section": "startup", "op": "empty_job", "seconds": round(statistics.median(empty), 4),
                "seconds_each": [round(s, 4) for s in empty]})
    return out


# ---- section 4: an executor killed under a slice server -------------------------------------------

def executor_pid() -> int:
    """The JVM that started this Python worker (as ``sparkdl.spark.training.faults.executor_pid``)."""
    from sparkdl.spark.training.faults import executor_pid as pid

    return pid()


def process_starts() -> dict:
    """Wall-clock start times of this Python worker, its parent (pyspark's daemon) and the
    executor JVM (``/proc/<pid>/stat`` field 22, clock ticks after boot, against ``/proc/uptime``
    read now: ``btime`` is rounded to the second; 10 ms resolution)."""
    with open("/proc/uptime") as f:
        boot = time.time() - float(f.read().split()[0])
    tick = os.sysconf("SC_CLK_TCK")

    def start(pid: int) -> float:
        with open(f"/proc/{pid}/stat") as f:
            return boot + int(f.read().rsplit(")", 1)[1].split()[19]) / tick

    out = {"worker_start": start(os.getpid())}
    jvm = executor_pid()
    if os.getppid() != jvm:
        out["daemon_start"] = start(os.getppid())
    out["jvm_start"] = start(jvm)
    return out


def _kill_partition(folder, n, ident, slice_mb, victim):
    def run(index, _):
        entered = time.time()
        from pyspark import TaskContext

        attempt = TaskContext.get().attemptNumber()
        _write_json(os.path.join(folder, f"start-{index}-{attempt}.json"), {"t": entered, "pid": os.getpid(), **process_starts()})
        import numpy as np
        import pyarrow as pa

        values = np.full(int(slice_mb * MB / 4), float(index), np.float32)
        table = pa.Table.from_batches(_batches(values, int(4 * MB / 4)))
        server, location = start_server("tls", ident, {b"slice": table})
        _write_json(os.path.join(folder, f"loc-{index}-{attempt}.json"), {"tls": location, "t": time.time()})
        marker = os.path.join(folder, "killed")
        if index == victim and not os.path.exists(marker):
            _wait_files([os.path.join(folder, f"loc-{i}-0.json") for i in range(n)])
            jvm = executor_pid()
            _write_json(marker, {"t": time.time(), "jvm": jvm, "worker": os.getpid()})
            os.kill(jvm, signal.SIGKILL)
            time.sleep(0.5)
            os._exit(0)  # an orphan serving on would outlive the job
        _wait_files([os.path.join(folder, "stop")], timeout_s=3 * WAIT_S)
        server.shutdown()
        yield attempt
    return run


def run_kill(sc, n: int, ident: dict, cfg: dict) -> list[dict]:
    import pyarrow.flight as flight

    folder = tempfile.mkdtemp(prefix="dataplane-kill-")
    victim = 1
    jsc = sc._jsc.sc()

    def executors() -> set[str]:
        ids = jsc.getExecutorIds()  # excludes the driver
        return {str(ids.apply(i)) for i in range(ids.size())}

    before = executors()
    done = {}

    def job():
        try:
            done["attempts"] = sc.parallelize(range(n), n).mapPartitionsWithIndex(
                _kill_partition(folder, n, ident, cfg["kill_slice_mb"], victim)).collect()
        except Exception as exc:  # reported, not raised: the table still prints
            done["error"] = repr(exc)[:500]

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    events: dict[str, float] = {}
    marker = os.path.join(folder, "killed")
    deadline = time.monotonic() + WAIT_S
    while "served" not in events and "error" not in done:
        if time.monotonic() > deadline:
            done["error"] = "no retried server within the wait"
            break
        now = time.time()
        ids = executors()
        if os.path.exists(marker):
            if "lost" not in events and not before <= ids:
                events["lost"] = now
            if "registered" not in events and ids - before:
                events["registered"] = now
            started = os.path.join(folder, f"start-{victim}-1.json")
            if "task_started" not in events and os.path.exists(started):
                info = json.load(open(started))
                events["task_started"] = info["t"]
                for key in ("jvm_start", "daemon_start", "worker_start"):
                    if key in info:
                        events[key] = info[key]
            loc = os.path.join(folder, f"loc-{victim}-1.json")
            if "server_up" not in events and os.path.exists(loc):
                info = json.load(open(loc))
                events["server_up"] = info["t"]
                c, o = client(info["tls"], ident)
                table = c.do_get(flight.Ticket(b"slice"), o).read_all()
                assert table.num_rows == int(cfg["kill_slice_mb"] * MB / 4)
                c.close()
                events["served"] = time.time()
        time.sleep(0.02)
    open(os.path.join(folder, "stop"), "w").close()
    thread.join(timeout=WAIT_S)
    out = {"section": "kill", "op": "relaunch", "transport": "tls", "slice_mb": cfg["kill_slice_mb"],
           "max_failures": int(sc.getConf().get("spark.task.maxFailures"))}
    if os.path.exists(marker):
        killed = json.load(open(marker))["t"]
        for key, t in events.items():
            out[f"{key}_s"] = round(t - killed, 3)
        out["seconds"] = out.get("served_s")
    out["attempts"] = done.get("attempts")
    out["error"] = done.get("error")
    if "error" not in done:
        shutil.rmtree(folder, ignore_errors=True)
    return [out]


# ---- one N in this process ------------------------------------------------------------------------

def _warm(index, _):
    import pyarrow.flight  # noqa: F401

    import sparkdl.server.auth  # noqa: F401

    yield os.getpid()


def run_child(n: int, args) -> None:
    from pyspark.sql import SparkSession

    from sparkdl.server.auth import new_token
    from sparkdl.server.tls import self_signed

    path = os.pathsep.join([ROOT, HERE])
    spark = (SparkSession.builder.master(f"local-cluster[{n},1,1024]").appName(f"data_plane N={n}")
             .config("spark.executor.memory", "1024m").config("spark.driver.memory", "2g")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.task.maxFailures", "4")
             .config("spark.pyspark.python", sys.executable).config("spark.pyspark.driver.python", sys.executable)
             .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable).config("spark.executorEnv.PYTHONPATH", path)
             .config("spark.executorEnv.SPARK_LOCAL_IP", "127.0.0.1").config("spark.executorEnv.KERAS_BACKEND", "tensorflow")
             .getOrCreate())
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    deadline = time.monotonic() + 300
    while sc._jsc.sc().getExecutorIds().size() < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"local-cluster must register {n} executors within 300 s")
        time.sleep(0.5)
    identity = self_signed()
    ident = {"token": new_token(), "cert_pem": identity.cert_pem, "key_pem": identity.key_pem, "server_name": identity.server_name}
    cfg = {"sizes": args.sizes, "streams": args.streams, "repeats": args.repeats, "transports": args.transports,
           "batch_mb": args.batch_mb, "chunk_mb": args.chunk_mb, "slice_mvalues": args.slice_mvalues,
           "kill_slice_mb": args.kill_slice_mb, "shift_streams": args.shift_streams}
    sc.parallelize(range(n), n).mapPartitionsWithIndex(_warm).collect()
    common = {"benchmark": "data_plane", "run": args.run, "executors": n, "cores": os.cpu_count()}

    def emit(rows: list[dict]) -> None:
        for r in rows:
            print(json.dumps({**common, **r, "load_average": round(os.getloadavg()[0], 1)}), flush=True)

    if "flight" in args.sections:
        emit(run_flight(sc, n, ident, cfg))
    if "compute" in args.sections:
        emit(json.loads(sc.parallelize([0], 1).mapPartitions(_compute_partition(n, cfg)).collect()[0]))
    if "startup" in args.sections:
        emit(run_startup(sc, n, ident, cfg))
    if "kill" in args.sections:
        emit(run_kill(sc, n, ident, cfg))
    spark.stop()


# ---- tables ---------------------------------------------------------------------------------------

def print_tables(results: list[dict]) -> None:
    ns = sorted({r["executors"] for r in results})
    head = " | ".join(f"N={n}" for n in ns)
    sep = "---|" * len(ns)

    def cell(sel, key="gb_s"):
        return " | ".join(str(sel[n][key]) if n in sel and sel[n].get(key) is not None else "-" for n in ns)

    flight_rows = [r for r in results if r["section"] in ("flight", "shift") and r["op"] in ("put", "get")]
    if flight_rows:
        print(f"\nArrow Flight between two executors' Python workers, GB/s (10^9 bytes/s; shift: per executor, all at once)\n"
              f"| pattern | transport | op | MB | streams | {head} |\n|---|---|---|---|---|{sep}")
        keys = sorted({(r["section"], r["transport"], r["op"], r["size_mb"], r["streams"]) for r in flight_rows},
                      key=lambda k: (k[0], k[1], k[2], k[3], k[4]))
        for section, transport, op, size, streams in keys:
            sel = {r["executors"]: r for r in flight_rows if (r["section"], r["transport"], r["op"], r["size_mb"], r["streams"])
                   == (section, transport, op, size, streams)}
            cells = cell(sel) if section == "flight" else " | ".join(
                f"{sel[n]['gb_s']} ({sel[n]['aggregate_gb_s']} all)" if n in sel else "-" for n in ns)
            print(f"| {'0→1' if section == 'flight' else 'i→i+1'} | {transport} | {op} | {size:g} | {streams} | {cells} |")
    rpc = [r for r in results if r["section"] == "flight" and r["op"] == "rpc"]
    if rpc:
        print(f"\nempty DoAction round trip, ms (median; p90)\n| transport | {head} |\n|---|{sep}")
        for transport in sorted({r["transport"] for r in rpc}):
            sel = {r["executors"]: r for r in rpc if r["transport"] == transport}
            print(f"| {transport} | " + " | ".join(f"{sel[n]['rpc_ms']}; {sel[n]['rpc_p90_ms']}" if n in sel else "-" for n in ns) + " |")
    comp = [r for r in results if r["section"] == "compute"]
    if comp:
        print(f"\none executor, a slice of {comp[0]['slice_mb']:g} MB, N contributions: GB/s of slice bytes "
              f"(sums: contributions' GB/s in brackets)\n| op | ways | {head} |\n|---|---|{sep}")
        for op, ways in sorted({(r["op"], r["ways"]) for r in comp if r["op"] != "total"}, key=lambda k: (["pack", "sum32", "sum64", "sum16", "apply"].index(k[0]), k[1])):
            sel = {r["executors"]: r for r in comp if (r["op"], r["ways"]) == (op, ways)}
            print(f"| {op} | {ways} | " + " | ".join(
                (f"{sel[n]['gb_s']}" + (f" ({sel[n]['contrib_gb_s']})" if "contrib_gb_s" in sel[n] else "")) if n in sel else "-"
                for n in ns) + " |")
        sel = {r["executors"]: r for r in comp if r["op"] == "total"}
        print("| pack+sum32+apply | best each | " + cell(sel) + " |")
    start = [r for r in results if r["section"] == "startup"]
    if start:
        print(f"\nstarting a slice server, seconds (median)\n| what | {head} |\n|---|{sep}")
        for transport in sorted({r["transport"] for r in start if r["op"] == "in_task"}):
            sel = {r["executors"]: r for r in start if r["op"] == "in_task" and r["transport"] == transport}
            print(f"| in a running task, {transport}: start + first call | " + " | ".join(
                f"{sel[n]['start_s']} + {sel[n]['first_call_s']}" if n in sel else "-" for n in ns) + " |")
        sel = {r["executors"]: r for r in start if r["op"] == "job_serving"}
        print(f"| new job of N tasks until all N TLS servers answer | {cell(sel, 'seconds')} |")
        sel = {r["executors"]: r for r in start if r["op"] == "empty_job"}
        print(f"| empty job of N tasks | {cell(sel, 'seconds')} |")
    kill = [r for r in results if r["section"] == "kill"]
    if kill:
        print(f"\nexecutor JVM SIGKILLed under a slice server: seconds after the kill\n| event | {head} |\n|---|{sep}")
        sel = {r["executors"]: r for r in kill}
        for key in ("lost_s", "jvm_start_s", "registered_s", "daemon_start_s", "worker_start_s", "task_started_s", "server_up_s", "served_s"):
            print(f"| {key[:-2]} | {cell(sel, key)} |")
        errors = {n: r["error"] for n, r in sel.items() if r.get("error")}
        if errors:
            print(f"errors: {errors}")
    if results:
        cores = results[0]["cores"]
        loads = [r["load_average"] for r in results]
        print(f"\n{cores} cores for N executor JVMs and their Python workers, the driver and anything else (load average "
              f"{min(loads)}–{max(loads)}): N > {cores} is oversubscribed, and a loopback transfer's two ends share the cores.")


def load_lines(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[2, 3, 4], help="executors (local-cluster[N,1,1024])")
    parser.add_argument("--sizes", type=float, nargs="+", default=[64, 256], help="MB moved 0→1 per transfer")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8], help="parallel streams")
    parser.add_argument("--shift-streams", type=int, default=4, help="streams of each task in the all-at-once shift")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--transports", nargs="+", default=["tcp", "tls"], choices=["tcp", "tls"])
    parser.add_argument("--sections", nargs="+", default=["flight", "compute", "startup", "kill"],
                        choices=["flight", "compute", "startup", "kill"])
    parser.add_argument("--batch-mb", type=float, default=4.0, help="MB per record batch")
    parser.add_argument("--chunk-mb", type=float, default=4.0, help="MB per chunk of the thread pool")
    parser.add_argument("--slice-mvalues", type=float, default=25.0, help="million float32 values of the slice (section compute)")
    parser.add_argument("--kill-slice-mb", type=float, default=16.0, help="MB each task serves in section kill")
    parser.add_argument("--out", default=os.path.join(HERE, "data_plane.jsonl"), help="append the JSON lines here ('' for none)")
    parser.add_argument("--table", metavar="FILE", help="print the tables of FILE's latest run, and stop")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.table:
        lines = load_lines(args.table)
        print_tables([r for r in lines if r["run"] == lines[-1]["run"]])
        return
    if args.child is not None:
        import data_plane  # the tasks' functions pickled by reference: the executors import it (PYTHONPATH)

        data_plane.run_child(args.child, args)
        return
    run = time.strftime("%Y-%m-%dT%H:%M:%S")
    results = []
    for n in args.n:
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--run", run, "--child", str(n)]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE])))
        lines = [line for line in proc.stdout.splitlines() if line.startswith('{"benchmark": "data_plane"')]
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
        for line in lines:
            print(line, flush=True)
            results.append(json.loads(line))
            if args.out:
                with open(args.out, "a") as f:
                    f.write(line + "\n")
        print(f"# N={n}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print_tables(results)


if __name__ == "__main__":
    main()
