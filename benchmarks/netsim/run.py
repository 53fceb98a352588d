"""Each backend's sync round on the emulated cluster (:mod:`cluster`): seconds per round and the
bytes each host's link carries per round, beside the formulas.

For each N of ``--workers`` (default 2) the benchmark brings up an :class:`~cluster.EmulatedCluster`
(N worker hosts and a driver host, each link ``--rate`` Mbit/s each way, a Spark standalone master
on the driver host, one 1-core Worker per worker host), runs the driver (this script with
``--child``) inside the driver host's namespace, and there fits, once per backend of
``--backends`` (``rounds``, ``ps``, ``sharded``), an MLP ``784 → h → 10`` of about ``--params``
parameters with Adam (state S = weights + two moments, float32: 12 bytes per parameter), mode
``sync``, τ = 1 (``localSteps=1``), ``numWorkers = N``, ``--epochs`` epochs of ``--rounds`` rounds of
``--batch-size`` rows per worker. A Keras callback on the driver reads every host's link counters
(:func:`cluster.read_counters`) at each round's start and end (``on_train_batch_begin`` /
``_end``, once per round on the driver) and at each epoch's start and end.

Per backend it prints a JSON line: ``round_s`` (the median of the rounds after the first epoch,
timed by the callback; ``fitinfo_round_s``: ``fitInfo["seconds"]["other_rounds"]`` over the rounds
after the first, for comparison), and per host ``in_mb`` / ``out_mb`` per round: the bytes its link
received / sent over the epochs after the first, divided by their rounds (every frame's headers
counted: × 1514/1448 = 1.0456 over the TCP payload at MTU 1500; the per-round windows are in
``per_round``: a ps worker's push may land in the next round's window, an epoch's do not move),
``state_mb`` (S), ``drops`` (packets the links' queues dropped: TCP sent them again, counted on
the sender), and the formulas' bytes (payload × the header factor) and the measured share of them:

- ``ps``: the driver receives and sends N·S per round (each worker pulls S, pushes S);
- ``sharded``: each worker (2N−1)/N·S each way (it pulls the other N−1 slices, puts its pieces of
  them, and puts its own slice's new state to its backup holder: (N−1)/N + (N−1)/N + 1/N), the
  driver the coordination alone (a few KB);
- ``rounds``: no formula is checked (the broadcast's blocks travel between executors too).

``sharded`` runs in the settings named after a ``+`` (``sharded+overlap``, ``sharded+overlap+int8``,
``sharded+int4``, ...): ``overlap`` (rounds that never block training) and a ``compression``; its
formula then counts the puts in their bytes a value (S_q: 2 with fp16, 1 + 4/256 with int8, 0.5 +
4/256 with int4, 1/8 with 1bit, against 4) and the pulls and the backup in float32: (N−1)/N·(S_q + S_f)
+ S_f/N each way, S_f the state that travels (S; the weights alone, S/3 with Adam, with int8 / int4 /
1bit, whose workers keep their optimizer state). With ``--local-steps`` τ > 1 the data grows to τ batches a round (made on the executors), and
each line adds the compute share: a worker's training seconds per round (``fitInfo``'s
``worker_train_ms``, every round of the fit) over the wall seconds per round of the epochs after the
first (``epoch_round_s``), and ``samples_per_s`` (N·τ·batch over ``epoch_round_s``).

Then a Markdown table. Needs root and iproute2 (``ip netns``, ``tc``); without them it prints a
``SKIP:`` line and exits 0.

Usage: python benchmarks/netsim/run.py [--workers 2 3 4] [--rate 200] [--params 1e6] [--rounds 6]
       [--epochs 2] [--batch-size 32] [--local-steps 1] [--backends rounds ps sharded sharded+overlap+int8] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/: setup_env, round_overhead

import cluster as netsim  # noqa: E402

MB = 1e6
MARK = '{"benchmark": "netsim"'
# bytes a float value a worker puts (1bit: a bit a value; its two float32 scales a column are left out: a piece of
# a sliced array travels as one column of many values)
PUT_BYTES = {None: 4.0, "fp16": 2.0, "int8": 1 + 4 / 256, "int4": 0.5 + 4 / 256, "1bit": 1 / 8}
KEEP_OPTIMIZER = ("int8", "int4", "1bit")  # compressions whose workers keep their optimizer state: the weights alone travel
SETTINGS = ("overlap", "fp16", *KEEP_OPTIMIZER)


def setting(text: str) -> str:
    """``--backends`` entry: a backend, and for ``sharded`` its settings after ``+``."""
    backend, *extra = text.split("+")
    if backend not in ("rounds", "ps", "sharded") or (extra and backend != "sharded") or any(e not in SETTINGS for e in extra) \
            or sum(e in PUT_BYTES for e in extra) > 1:
        raise argparse.ArgumentTypeError(f"a backend (rounds, ps, sharded) and for sharded settings among {SETTINGS} joined by +, "
                                         f"one compression at most. Received: {text!r}")
    return text


def parse_setting(text: str) -> tuple[str, bool, str | None]:
    """``(backend, overlap, compression)`` of a ``--backends`` entry."""
    backend, *extra = text.split("+")
    return backend, "overlap" in extra, next((e for e in extra if e in PUT_BYTES), None)


# ---- the driver, in the driver host's namespace ----------------------------------------------------

def make_probe(description: dict):
    import keras

    class Probe(keras.callbacks.Callback):
        needs_weights = False  # it reads no weights: on sharded the driver fetches no master for it

        def __init__(self) -> None:
            super().__init__()
            self.rounds: list[dict] = []
            self.epochs: list[dict] = []
            self.epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            self._epoch0 = (time.perf_counter(), netsim.read_counters(description))
            self._batches = 0

        def on_epoch_end(self, epoch, logs=None):
            t0, c0 = self._epoch0
            self.epochs.append({"epoch": epoch, "seconds": time.perf_counter() - t0, "rounds": self._batches,
                                "bytes": delta(c0, netsim.read_counters(description))})

        def on_train_batch_begin(self, batch, logs=None):
            self._round0 = (time.perf_counter(), netsim.read_counters(description))

        def on_train_batch_end(self, batch, logs=None):
            t0, c0 = self._round0
            seconds = time.perf_counter() - t0
            self._batches += 1
            self.rounds.append({"epoch": self.epoch, "round": batch, "round_s": seconds,
                                "bytes": delta(c0, netsim.read_counters(description))})

    return Probe()


def delta(before: dict, after: dict) -> dict:
    return {h: {"in": after[h]["rx"] - before[h]["rx"], "out": after[h]["tx"] - before[h]["tx"],
                "drops": after[h]["drops"] - before[h]["drops"]} for h in after}


def run_child(args) -> None:
    """Every backend on the cluster of ``NETSIM_CLUSTER``; one JSON line each."""
    import setup_env  # noqa: F401  (sys.path and the environment, before pyspark/keras)
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    from pyspark.sql import SparkSession

    import round_overhead as ro
    from sparkdl import KerasEstimator
    from sparkdl.keras.replica import state_nbytes

    description = json.loads(os.environ["NETSIM_CLUSTER"])
    n = len(description["hosts"]) - 1
    builder = (SparkSession.builder.master(description["master"]).appName(f"netsim-{n}")
               .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "2g")
               .config("spark.executor.memory", args.executor_memory).config("spark.sql.shuffle.partitions", str(n)))
    for key, value in json.loads(os.environ["NETSIM_CONF"]).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    deadline = time.monotonic() + 300
    while sc._jsc.sc().getExecutorMemoryStatus().size() - 1 < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n} executors must register within 300 s")
        time.sleep(1)

    params, batch, tau = int(args.params), args.batch_size, args.local_steps
    rows = n * args.rounds * batch * tau
    if tau == 1:
        rng = np.random.default_rng(1)
        x = rng.random((rows, ro.INPUTS), dtype=np.float32)
        y = rng.integers(0, ro.CLASSES, rows)
        df = spark.createDataFrame([(r.tolist(), float(v)) for r, v in zip(x, y)], "features array<float>, label double")
    else:  # τ batches a round: made on the executors, not sent from here
        df = spark.range(0, rows, numPartitions=n).mapInArrow(random_rows, "features array<float>, label double")
    df = df.cache()
    df.count()
    step_s = ro.step_seconds(params, batch, repeats=5)
    model = ro.build_model(params)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.optimizer.build(model.trainable_variables)
    state = state_nbytes(model)
    factor = netsim.wire_factor(description["mtu"])
    for entry in args.backends:
        backend, overlap, compression = parse_setting(entry)
        probe = make_probe(description)
        extra = {"overlap": True} if overlap else {}
        est = KerasEstimator(
            model=ro.build_model(params), optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), numWorkers=n, epochs=args.epochs,
            batchSize=batch, localSteps=tau, verbose=0, roundTimeout=1800.0, mode="sync", callbacks=[probe], backend=backend,
            compression=compression, **extra,
        )
        started = time.perf_counter()
        fitted = est.fit(df)
        fit_s = time.perf_counter() - started
        print(json.dumps(summarize(entry, n, description, args, probe, fitted.fitInfo, state, factor, step_s, fit_s)), flush=True)
    spark.stop()


def random_rows(batches):
    """Rows of random features (784 float32 in [0, 1)) and labels, seeded by the first id of each batch."""
    import numpy as np
    import pyarrow as pa

    inputs, classes = 784, 10  # round_overhead's INPUTS and CLASSES (benchmarks/ is not on the executors' path)
    for batch in batches:
        ids = batch.column(0).to_numpy()
        rng = np.random.default_rng(int(ids[0]) if len(ids) else 0)
        x = rng.random((len(ids), inputs), dtype=np.float32)
        features = pa.ListArray.from_arrays(pa.array(np.arange(0, x.size + 1, inputs, dtype=np.int32)), pa.array(x.reshape(-1)))
        labels = pa.array(rng.integers(0, classes, len(ids)).astype(np.float64))
        yield pa.RecordBatch.from_arrays([features, labels], names=["features", "label"])


def summarize(entry, n, description, args, probe, info, state, factor, step_s, fit_s) -> dict:
    backend, overlap, compression = parse_setting(entry)
    hosts = [h["name"] for h in description["hosts"]]
    warm_epochs = [e for e in probe.epochs if e["epoch"] > 0] or probe.epochs
    warm_rounds = [r for r in probe.rounds if r["epoch"] > 0] or probe.rounds
    rounds = sum(e["rounds"] for e in warm_epochs)
    per_host = {h: {"in_mb": round(sum(e["bytes"][h]["in"] for e in warm_epochs) / rounds / MB, 4),
                    "out_mb": round(sum(e["bytes"][h]["out"] for e in warm_epochs) / rounds / MB, 4),
                    "drops": sum(e["bytes"][h]["drops"] for e in warm_epochs)} for h in hosts}
    s = state / MB
    formula = None
    if backend == "ps":
        formula = {"driver": n * s, **{h: s for h in hosts[1:]}}
    elif backend == "sharded":
        synced = s / 3 if compression in KEEP_OPTIMIZER else s  # the weights alone (the workers keep Adam's state)
        put = synced * PUT_BYTES[compression] / 4
        carried = put / n if overlap and compression is None else 0.0  # overlap, no encoding: its own piece to its holder too
        formula = {"driver": 0.0, **{h: (n - 1) / n * (put + synced) + synced / n + carried for h in hosts[1:]}}
    seconds = info.get("seconds", {})
    total_rounds = len(probe.rounds)
    epoch_round_s = sum(e["seconds"] for e in warm_epochs) / rounds
    result = {
        "benchmark": "netsim", "backend": backend, "setting": entry, "overlap": overlap, "compression": compression,
        "workers": n, "rate_mbit": description["rate_mbit"], "mtu": description["mtu"],
        "params": int(args.params), "state_mb": round(s, 4), "local_steps": args.local_steps, "mode": "sync", "batch_size": args.batch_size,
        "epoch_round_s": round(epoch_round_s, 4), "samples_per_s": round(n * args.local_steps * args.batch_size / epoch_round_s, 2),
        "rounds_per_epoch": args.rounds, "epochs": args.epochs, "measured_rounds": rounds,
        "round_s": round(statistics.median(r["round_s"] for r in warm_rounds), 4),
        "round_s_mean": round(statistics.fmean(r["round_s"] for r in warm_rounds), 4),
        "fitinfo_round_s": round(seconds["other_rounds"] / (total_rounds - 1), 4) if total_rounds > 1 and "other_rounds" in seconds else None,
        "step_s": round(step_s, 5), "fit_s": round(fit_s, 2), "header_factor": round(factor, 5), "hosts": per_host,
        "load_average": round(os.getloadavg()[0], 1),
    }
    if formula is not None:
        result["formula_mb"] = {h: round(v * factor, 4) for h, v in formula.items()}  # payload × the frames' headers
        result["measured_per_formula"] = {
            h: {"in": round(per_host[h]["in_mb"] / (v * factor), 4), "out": round(per_host[h]["out_mb"] / (v * factor), 4)}
            for h, v in formula.items() if v > 0}
    if backend == "ps":
        result["server_pushed_mb"] = round(info.get("bytes_pushed", 0) / total_rounds / MB, 4)
        result["server_pulled_mb"] = round(info.get("bytes_pulled", 0) / total_rounds / MB, 4)
    if backend == "sharded":
        result["slice_mb"] = round(info.get("slice_bytes", 0) / MB, 4)
        if info.get("worker_train_ms"):
            train_s = statistics.fmean(info["worker_train_ms"]) / 1000 / total_rounds
            result["train_s_per_round"] = round(train_s, 4)
            result["compute_share"] = round(train_s / epoch_round_s, 4)
            result["wait_s_per_round"] = round(statistics.fmean(info["worker_wait_ms"]) / 1000 / total_rounds, 4)
        if info.get("worker_bytes_pushed"):
            result["worker_pushed_mb"] = round(statistics.fmean(info["worker_bytes_pushed"]) / total_rounds / MB, 4)
            result["worker_pulled_mb"] = round(statistics.fmean(info["worker_bytes_pulled"]) / total_rounds / MB, 4)
    result["per_round"] = [{"epoch": r["epoch"], "round": r["round"], "round_s": round(r["round_s"], 4),
                            **{h: [round(r["bytes"][h]["in"] / MB, 3), round(r["bytes"][h]["out"] / MB, 3)] for h in hosts}}
                           for r in probe.rounds]
    return result


# ---- the orchestrator, in the root namespace ---------------------------------------------------------

def print_table(results: list[dict]) -> None:
    print("\n| backend | N | Mbit/s | S MB | τ | round s | compute share | driver in / out MB per round | each worker in / out MB per round "
          "| formula MB (driver; worker) | measured / formula | drops |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        workers = [h for h in r["hosts"] if h != "driver"]
        win = statistics.fmean(r["hosts"][h]["in_mb"] for h in workers)
        wout = statistics.fmean(r["hosts"][h]["out_mb"] for h in workers)
        d = r["hosts"]["driver"]
        if "formula_mb" in r:
            f = r["formula_mb"]
            formula = f"{f['driver']:.2f}; {f[workers[0]]:.2f}"
            ratios = [v for h in r["measured_per_formula"] for v in r["measured_per_formula"][h].values()]
            measured = f"{min(ratios):.3f}–{max(ratios):.3f}"
        else:
            formula = measured = "-"
        drops = sum(h["drops"] for h in r["hosts"].values())
        share = f"{r['compute_share']:.3f}" if r.get("compute_share") is not None else "-"
        print(f"| {r.get('setting', r['backend'])} | {r['workers']} | {r['rate_mbit']:g} | {r['state_mb']:.2f} | {r.get('local_steps', 1)} "
              f"| {r.get('epoch_round_s', r['round_s']):.3f} | {share} "
              f"| {d['in_mb']:.3f} / {d['out_mb']:.3f} | {win:.3f} / {wout:.3f} | {formula} | {measured} | {drops} |")


def run_cluster(n: int, args) -> list[dict]:
    """One cluster of ``n`` workers; the driver run in its namespace; its JSON lines."""
    import setup_env  # noqa: F401

    with netsim.EmulatedCluster(workers=n, rate_mbit=args.rate, mtu=args.mtu, worker_memory=args.worker_memory) as cluster:
        env = cluster.daemon_env(cluster.driver, NETSIM_CLUSTER=json.dumps(cluster.describe()),
                                 NETSIM_CONF=json.dumps(cluster.spark_conf()), KERAS_BACKEND=os.environ.get("KERAS_BACKEND", "tensorflow"),
                                 TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("SPARK_NO_DAEMONIZE", None)
        forwarded = [a for a in sys.argv[1:]]
        log = os.path.join(cluster.workdir, "driver.log")
        with open(log, "w") as err:
            proc = subprocess.Popen(["ip", "netns", "exec", cluster.driver.ns, sys.executable, os.path.abspath(__file__),
                                     *forwarded, "--child"], env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                                    start_new_session=True)
            cluster.driver.procs.append(proc)
            try:
                out, _ = proc.communicate(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate(timeout=30)
                sys.stderr.write(f"the driver ran past {args.timeout} s; killed\n")
        results = [json.loads(line) for line in out.splitlines() if line.startswith(MARK)]
        if proc.returncode != 0 or len(results) < len(args.backends):
            with open(log) as f:
                sys.stderr.write(f"driver exit {proc.returncode}; its log ({log}):\n{f.read()[-6000:]}\n")
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=lambda s: [int(v) for v in s.split(",")], default=[2],
                        help="worker hosts, comma-separated: 2,3,4")
    parser.add_argument("--rate", type=float, default=200, help="each link's rate each way, Mbit/s")
    parser.add_argument("--mtu", type=int, default=1500)
    parser.add_argument("--params", type=float, default=1e6)
    parser.add_argument("--rounds", type=int, default=6, help="rounds per epoch")
    parser.add_argument("--epochs", type=int, default=2, help="the first is warm-up, not measured")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--backends", nargs="+", default=["rounds", "ps", "sharded"], type=setting,
                        help="rounds, ps, sharded, or sharded+<settings>: overlap, fp16, int8, int4, 1bit (sharded+overlap+int8)")
    parser.add_argument("--local-steps", type=int, default=1, help="τ: batches a worker trains each round")
    parser.add_argument("--executor-memory", default="1g")
    parser.add_argument("--worker-memory", default="2g")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for one cluster's fits")
    parser.add_argument("--out", help="also append the JSON lines to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args)
        return
    reason = netsim.unavailable()
    if reason:
        print(f"SKIP: {reason}")
        return
    results = []
    for n in args.workers:
        for r in run_cluster(n, args):
            line = json.dumps(r)
            print(line, flush=True)
            results.append(r)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(line + "\n")
    if results:
        print_table(results)
    if len(results) < len(args.workers) * len(args.backends):
        sys.exit(1)


if __name__ == "__main__":
    main()
