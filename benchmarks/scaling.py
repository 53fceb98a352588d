"""How a fit's costs grow with the number of executors: bytes into and out of the driver, driver
memory, Spark jobs and tasks, and overhead seconds per round, on ``local-cluster[N,1,512]``.

For each N (default 2, 4, 8) a fresh process starts ``local-cluster[N,1,512]`` (N executor JVMs
of one core and 512 MB, each with its own Python worker) and fits, with ``numWorkers = N``, an MLP
``784 → h → 10`` of about ``--params`` float32 parameters (Adam: each worker's state is weights
plus two moments, 12 MB for 1M parameters) in mode ``sync``, ``--epochs`` epochs of
``--rounds`` rounds of τ = ``--local-steps`` steps of ``--batch-size`` rows, once per setting:

- ``rounds`` (one Spark job per round), updates combined where sparkdl decides (``auto``: on the
  driver unless more than two workers send more than 64 MiB in all) and, with ``--reduce``,
  forced onto the executors (``reduce=executors``: the benchmark sets
  ``sparkdl.spark.backends.rounds.reduce.EXECUTOR_REDUCE_MIN_BYTES`` to 0 in the driver, as the tests do);
- ``ps`` (parameter server on the driver, one long-lived task per worker);
- ``sharded`` (the state in N slices owned and served by the workers' own long-lived tasks, the
  driver a coordinator: per round it should see only the workers' reports, a few hundred bytes
  each); ``sharded_lean``: ``sharded`` with ``keepLocalOptimizer=True`` (each worker puts its
  weights alone, not Adam's moments);
- each without compression and with ``--compression`` (default ``fp16``).

The machine has fewer cores than executors (on 2 cores, N = 8 is 4× oversubscribed), so the
benchmark measures costs and bytes, not speed. Per round, between a Keras callback's
``on_train_batch_begin`` and ``on_train_batch_end`` (both run on the driver, once per round),
it records:

- ``driver_in_mb`` / ``driver_out_mb``: TCP bytes received / sent by the driver's two processes
  (its Python process, where the ps server runs, and its JVM, which serves the broadcast blocks
  and receives the task results) on connections to any other process (executor JVMs, executor
  Python workers), read from the kernel's per-socket counters (``ss -tinp``: ``bytes_received``,
  ``bytes_acked``) before and after the round. Loopback TCP is what Spark and Flight use between
  processes here, as on a network; connections closed within a round are not counted (Spark and
  Flight keep theirs open);
- ``result_mb``: the task results Spark delivered to the driver (the stages' ``resultSize``,
  REST API at the UI port), ``broadcast_mb``: one start state (Arrow IPC of weights and optimizer
  state), what a round broadcasts (``rounds``) or what each worker pulls (``ps``);
- ``exec_cross_mb``: TCP bytes sent in the round by the executors' processes (their JVMs and
  the Python workers under them, from the same ``ss`` snapshots) to a process of another
  executor, summed over the executors (what a cluster's network would carry between executors:
  the slices' puts, pulls and backups on ``sharded``, the torrent broadcast's blocks on
  ``rounds``), ``exec_py_cross_mb`` the Python workers' share of it, ``exec_to_driver_mb``
  what they sent to the driver's processes; divide by N for one executor's. Bytes a process
  sends to itself (a worker pulling its own slice) or to its own executor's JVM (the task's
  Arrow input and results) are not counted;
- ``jobs`` and ``tasks`` started in the round (REST API ``/api/v1/applications/<id>/jobs``);
- ``driver_peak_mb`` / ``jvm_peak_mb``: peak resident memory of the driver's Python process and of
  its JVM during the round (``VmHWM`` of ``/proc/<pid>/status``, reset at the round's start by
  writing 5 to ``/proc/<pid>/clear_refs``);
- ``round_s`` and ``overhead_s`` = ``round_s − compute_s``, where ``compute_s`` = τ × one step's
  seconds (measured in this process on one thread, as each task has one CPU) × max(1, N / cores):
  the N workers' steps share the machine's cores. The workers do not report their compute time.

Rounds of the first epoch (replicas built, TensorFlow warm-up, data cached) are reported apart
(``per_round``); the table shows the later epochs' rounds but the fit's last (whose tasks close
their connections before the round's end is measured): bytes, jobs and tasks their mean (a ps
worker's push may land in the next round's window), seconds and memory their median.

Prints one JSON line per (N, setting), e.g. ``{"benchmark": "scaling", "executors": 4,
"backend": "rounds", "compression": null, "reduce": "auto", "driver_in_mb": 48.1,
"driver_out_mb": 12.6, ...}``, then a Markdown table. With ``--out FILE`` the JSON lines are also
written to FILE (``benchmarks/scaling_model.py --measured FILE`` fits its model to them).

Needs Linux (``/proc``) and ``ss`` (iproute2); the Spark UI must be enabled (it is by default).

Usage: python benchmarks/scaling.py [--executors 2 4 8] [--params 1e6] [--rounds 3] [--epochs 2]
       [--local-steps 4] [--backends rounds ps sharded sharded_lean] [--compression fp16] [--reduce] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

import setup_env  # noqa: F401  (sys.path and the environment, before pyspark/keras)

ROOT = setup_env.ROOT
MB = 1e6


# ---- the driver's resources, read from the kernel ------------------------------------------------

def peak_rss_mb(pid: int) -> float:
    """``VmHWM`` (peak resident set size) of process ``pid`` in MB (10^6 bytes)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / MB
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def reset_peak(pid: int) -> None:
    """Reset ``VmHWM`` of ``pid`` to its current RSS (Linux >= 4.0; the process's owner may)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


_SOCK = re.compile(r"^\S+\s+\d+\s+\d+\s+(\S+)\s+(\S+)\s+users:\(\(.*?pid=(\d+)")


def tcp_sockets() -> tuple[dict[tuple[str, str], tuple[int, int, int]], dict[str, int]]:
    """Every established TCP connection the kernel shows with its process: ``(local, peer) ->
    (pid, bytes sent and acknowledged, bytes received)``, and ``(local, peer) -> the peer's pid``
    (the process holding the socket ``(peer, local)``), from ``ss -tinpH``. A listening port's
    accepted connections share their local address, so a peer is found by the connection's both
    ends; a JVM's ``[::ffff:a.b.c.d]`` addresses are read as ``a.b.c.d``."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    owner: dict[str, int] = {}
    conns: dict[tuple[str, str], tuple[int, int, int]] = {}
    for head, info in zip(out[0::2], out[1::2]):  # ss prints each socket on two lines
        m = _SOCK.match(head)
        if not m:
            continue
        local, peer, pid = _address(m.group(1)), _address(m.group(2)), int(m.group(3))
        sent = re.search(r"bytes_acked:(\d+)", info)
        received = re.search(r"bytes_received:(\d+)", info)
        conns[(local, peer)] = (pid, int(sent.group(1)) if sent else 0, int(received.group(1)) if received else 0)
    for (local, peer) in conns:  # the process at the other end: the socket (peer, local), when this machine has it
        other = conns.get((peer, local))
        if other is not None:
            owner[(local, peer)] = other[0]
    return conns, owner


def _address(text: str) -> str:
    """``[::ffff:127.0.0.1]:5000`` (a JVM's IPv4-mapped socket) as ``127.0.0.1:5000`` (Python's), so
    that both ends of a loopback connection name each other alike."""
    m = re.match(r"^\[::ffff:([0-9.]+)\](:\d+)$", text)
    return m.group(1) + m.group(2) if m else text


def tcp_counters(pids: set[int], sockets=None) -> dict[tuple[str, str], tuple[int, int]]:
    """Per established TCP connection of a process in ``pids`` whose peer is another process:
    ``(local, peer) -> (bytes sent and acknowledged, bytes received)``, from ``ss -tinpH``."""
    conns, owner = sockets if sockets is not None else tcp_sockets()
    return {key: (s, r) for key, (pid, s, r) in conns.items() if pid in pids and owner.get(key) not in pids}


def executor_processes(driver_jvm: int) -> dict[int, tuple[int, bool]]:
    """The executors' processes on this machine: ``pid -> (its executor's JVM pid, is Python)``
    for every descendant of the driver's JVM (local-cluster: the executor JVMs are its children,
    their Python daemons and workers under them)."""
    parent, python = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        parent[int(name)], python[int(name)] = int(rest[1]), comm.startswith("python")
    groups: dict[int, tuple[int, bool]] = {}
    for pid in parent:
        chain, p = [], pid
        while p in parent and p != driver_jvm and p > 1:
            chain.append(p)
            p = parent[p]
        if p == driver_jvm and chain:
            groups[pid] = (chain[-1], python[pid])  # chain[-1]: the driver JVM's child, the executor's JVM
    return groups


def executor_tcp(groups: dict[int, tuple[int, bool]], driver_pids: set[int], sockets) -> dict[tuple[str, str], tuple[int, str]]:
    """Per connection of an executor process: ``(local, peer) -> (bytes sent, class)``, class one of
    ``py_cross`` / ``jvm_cross`` (to another executor's process, from a Python worker / a JVM),
    ``driver`` (to the driver's processes); connections within one executor are left out."""
    conns, owner = sockets
    out = {}
    for key, (pid, sent, _) in conns.items():
        if pid not in groups:
            continue
        peer = owner.get(key)
        if peer in driver_pids:
            out[key] = (sent, "driver")
        elif peer in groups and groups[peer][0] != groups[pid][0]:
            out[key] = (sent, "py_cross" if groups[pid][1] else "jvm_cross")
    return out


def executor_delta(before: dict, after: dict) -> dict[str, int]:
    """Bytes sent per class between two :func:`executor_tcp` snapshots (new connections count from 0)."""
    totals = {"py_cross": 0, "jvm_cross": 0, "driver": 0}
    for key, (sent, kind) in after.items():
        totals[kind] += max(0, sent - before.get(key, (0, kind))[0])
    return totals


def tcp_delta(before: dict, after: dict) -> tuple[int, int]:
    """(bytes out, bytes in) between two :func:`tcp_counters` snapshots (new connections count from 0)."""
    out = inn = 0
    for key, (s, r) in after.items():
        s0, r0 = before.get(key, (0, 0))
        out += max(0, s - s0)
        inn += max(0, r - r0)
    return out, inn


class SparkRest:
    """Jobs, tasks and result bytes of the application from the Spark UI's REST API."""

    def __init__(self, sc) -> None:
        self.base = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"

    def _get(self, path: str):
        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            return json.loads(r.read())

    def jobs(self) -> dict[int, dict]:
        return {j["jobId"]: j for j in self._get("/jobs")}

    def result_bytes(self, stage_ids: set[int]) -> int:
        total = 0
        for s in self._get("/stages"):
            if s["stageId"] in stage_ids:
                total += int(s.get("resultSize", 0))
        return total


# ---- one fit --------------------------------------------------------------------------------------

def make_probe(spark, pids: set[int], rest: SparkRest, jvm_pid: int):
    """A Keras callback measuring each round between its batch hooks (see the module docstring)."""
    import keras

    class Probe(keras.callbacks.Callback):
        needs_weights = False  # it reads no weights: on backend sharded the driver fetches no master for it

        def __init__(self) -> None:
            super().__init__()
            self.rounds: list[dict] = []
            self.epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            for pid in pids:
                reset_peak(pid)
            self._jobs = set(rest.jobs())
            sockets = tcp_sockets()
            self._groups = executor_processes(jvm_pid)
            self._tcp = tcp_counters(pids, sockets)
            self._exec = executor_tcp(self._groups, pids, sockets)
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            seconds = time.perf_counter() - self._t0
            sockets = tcp_sockets()
            tcp = tcp_counters(pids, sockets)
            groups = {**self._groups, **executor_processes(jvm_pid)}  # workers started within the round too
            executors = executor_delta(self._exec, executor_tcp(groups, pids, sockets))
            peaks = {pid: peak_rss_mb(pid) for pid in pids}
            time.sleep(0.3)  # the status store follows the listener bus
            jobs = rest.jobs()
            new = {j: jobs[j] for j in jobs if j not in self._jobs}
            stages = {s for j in new.values() for s in j["stageIds"]}
            out, inn = tcp_delta(self._tcp, tcp)
            self.rounds.append({
                "epoch": self.epoch, "round": batch, "round_s": seconds, "driver_out": out, "driver_in": inn,
                "result": rest.result_bytes(stages) if stages else 0, "jobs": len(new),
                "tasks": sum(j["numTasks"] - j.get("numSkippedTasks", 0) for j in new.values()),
                "peaks": peaks, "exec_cross": executors["py_cross"] + executors["jvm_cross"],
                "exec_py_cross": executors["py_cross"], "exec_to_driver": executors["driver"],
            })

    return Probe()


def run_child(n: int, args) -> None:
    """Every setting on ``local-cluster[n,1,512]``; prints one JSON line each."""
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    from pyspark.sql import SparkSession

    import round_overhead as ro
    import sparkdl.spark.backends.rounds.reduce as reduce_module
    from sparkdl import KerasEstimator
    from sparkdl.keras.replica import state_nbytes

    spark = (SparkSession.builder.master(f"local-cluster[{n},1,512]").config("spark.executor.memory", "512m")
             .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "2g")
             .config("spark.sql.shuffle.partitions", str(n)).getOrCreate())
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    deadline = time.monotonic() + 300
    while sc._jsc.sc().getExecutorMemoryStatus().size() - 1 < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"local-cluster must register {n} executors within 300 s")
        time.sleep(1)
    jvm_pid = int(sc._jvm.java.lang.ProcessHandle.current().pid())
    pids = {os.getpid(), jvm_pid}
    rest = SparkRest(sc)

    params, batch, tau = int(args.params), args.batch_size, args.local_steps
    rows = n * args.rounds * tau * batch
    rng = np.random.default_rng(1)
    x = rng.random((rows, ro.INPUTS), dtype=np.float32)
    y = rng.integers(0, ro.CLASSES, rows)
    df = spark.createDataFrame([(r.tolist(), float(v)) for r, v in zip(x, y)], "features array<float>, label double").cache()
    df.count()
    step_s = ro.step_seconds(params, batch)
    cores = os.cpu_count() or 1
    compute_s = tau * step_s * max(1.0, n / cores)
    state_mb = state_nbytes(_compiled(ro.build_model(params))) / MB

    default_min = reduce_module.EXECUTOR_REDUCE_MIN_BYTES
    settings = []
    for backend in args.backends:
        for compression in (None, *args.compression):
            if backend.startswith("sharded") and compression not in (None, "fp16"):
                continue  # sharded sends full precision or fp16
            settings.append((backend, compression, "auto"))
            if backend == "rounds" and args.reduce and n > 2 and compression is None and n * state_mb * MB <= default_min:
                settings.append((backend, compression, "executors"))
    for backend, compression, reduce in settings:
        reduce_module.EXECUTOR_REDUCE_MIN_BYTES = 0 if reduce == "executors" else default_min
        probe = make_probe(spark, pids, rest, jvm_pid)
        est = KerasEstimator(
            model=ro.build_model(params), optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), numWorkers=n, epochs=args.epochs,
            batchSize=batch, localSteps=tau, verbose=0, roundTimeout=1800.0, mode="sync",
            compression=compression, callbacks=[probe], **BACKENDS[backend],
        )
        for pid in pids:
            reset_peak(pid)
        started = time.perf_counter()
        fitted = est.fit(df)
        fit_s = time.perf_counter() - started
        info = fitted.fitInfo
        per_round = [{k: (v / MB if k in BYTE_KEYS else v) for k, v in r.items() if k != "peaks"}
                     for r in probe.rounds]
        warm = warm_rounds(probe.rounds)
        result = {
            "benchmark": "scaling", "executors": n, "cores": cores, "backend": backend, "compression": compression,
            "reduce": reduce if backend == "rounds" else None, "params": params, "state_mb": round(state_mb, 3),
            "local_steps": tau, "batch_size": batch, "rounds_per_epoch": args.rounds, "epochs": args.epochs,
            "reduced_on_executors": info.get("reduced_on_executors"),
            **summarize(per_round),
            "driver_peak_mb": round(statistics.median(r["peaks"][os.getpid()] for r in warm), 1),
            "jvm_peak_mb": round(statistics.median(r["peaks"][jvm_pid] for r in warm), 1),
            "step_s": round(step_s, 5), "compute_s": round(compute_s, 4),
            "first_round_s": round(probe.rounds[0]["round_s"], 3), "fit_s": round(fit_s, 2),
            "fit_driver_peak_mb": round(peak_rss_mb(os.getpid()), 1), "fit_jvm_peak_mb": round(peak_rss_mb(jvm_pid), 1),
            "load_average": round(os.getloadavg()[0], 1),  # the machine's, with whatever else runs on it
        }
        result["overhead_s"] = round(result["round_s"] - compute_s, 4)
        result["driver_in_out_per_state"] = round((result["driver_in_mb"] + result["driver_out_mb"]) / state_mb, 5)
        if info["backend"] == "sharded":
            total_rounds = args.epochs * args.rounds
            result["keep_local_optimizer"] = info.get("keep_local_optimizer")
            result["slice_mb"] = round(info["slice_bytes"] / MB, 3)
            result["worker_pushed_mb"] = round(statistics.fmean(info["worker_bytes_pushed"]) / total_rounds / MB, 3)
            result["worker_pulled_mb"] = round(statistics.fmean(info["worker_bytes_pulled"]) / total_rounds / MB, 3)
            result["driver_fetched_mb_at_end"] = round(info["driver_bytes_fetched"] / MB, 3)
            result["coordinator"] = info.get("coordinator")
        if backend == "ps":
            total_rounds = args.epochs * args.rounds
            result["server_pushed_mb"] = round(info["bytes_pushed"] / total_rounds / MB, 3)
            result["server_pulled_mb"] = round(info["bytes_pulled"] / total_rounds / MB, 3)
        result["per_round"] = [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in per_round]
        print(json.dumps(result), flush=True)
    reduce_module.EXECUTOR_REDUCE_MIN_BYTES = default_min
    spark.stop()


BACKENDS = {  # --backends name -> the fit's settings
    "rounds": {"backend": "rounds"},
    "ps": {"backend": "ps"},
    "sharded": {"backend": "sharded"},
    "sharded_lean": {"backend": "sharded", "keepLocalOptimizer": True},
}
BYTE_KEYS = ("driver_out", "driver_in", "result", "exec_cross", "exec_py_cross", "exec_to_driver")


def warm_rounds(rounds: list[dict]) -> list[dict]:
    """The rounds after the first epoch, less the fit's last (its tasks end and close their
    connections before the round's end is measured, so their bytes would go uncounted)."""
    return [r for r in rounds[:-1] if r["epoch"] > 0] or rounds


def summarize(per_round: list[dict]) -> dict:
    """The reported values of a setting from its rounds (bytes in MB): over :func:`warm_rounds`,
    bytes, jobs and tasks their mean (a ps worker's push may land in the next round's window),
    seconds their median."""
    warm = warm_rounds(per_round)
    mean = lambda key: statistics.fmean(r[key] for r in warm)  # noqa: E731
    executors = {f"{k}_mb": round(mean(k), 3) for k in ("exec_cross", "exec_py_cross", "exec_to_driver") if k in warm[0]}
    return {**executors, "driver_in_mb": round(mean("driver_in"), 3), "driver_out_mb": round(mean("driver_out"), 3),
            "result_mb": round(mean("result"), 3), "jobs": round(mean("jobs"), 2), "tasks": round(mean("tasks"), 2),
            "round_s": round(statistics.median(r["round_s"] for r in warm), 4), "warm_rounds": len(warm)}


def resummarize(path: str) -> None:
    """Recompute the summaries of a JSON-lines file from each line's ``per_round`` (in place)."""
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    with open(path, "w") as f:
        for r in lines:
            r.update(summarize(r["per_round"]))
            r["overhead_s"] = round(r["round_s"] - r["compute_s"], 4)
            f.write(json.dumps(r) + "\n")


def _compiled(model):
    import keras

    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.optimizer.build(model.trainable_variables)
    return model


def load_lines(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def print_table(results: list[dict]) -> None:
    print("\n| N | backend | compression | combined on | state MB | driver in MB/round | driver out MB/round | (in + out) / state "
          "| executors' cross MB/round (per executor) | results MB | jobs | tasks | driver peak MB | JVM peak MB | round s | compute s "
          "| overhead s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if r["backend"] == "rounds":
            where = "executors" if r["reduced_on_executors"] else "driver"
        else:
            where = "slice owners" if r["backend"].startswith("sharded") else "server"
        per_state = r.get("driver_in_out_per_state", round((r["driver_in_mb"] + r["driver_out_mb"]) / r["state_mb"], 5))
        cross = f"{r['exec_cross_mb']} ({r['exec_cross_mb'] / r['executors']:.3f})" if "exec_cross_mb" in r else "-"
        print(f"| {r['executors']} | {r['backend']} | {r['compression'] or '-'} | {where} | {r['state_mb']} | {r['driver_in_mb']} "
              f"| {r['driver_out_mb']} | {per_state:.2%} | {cross} | {r['result_mb']} | {r['jobs']:g} | {r['tasks']:g} | {r['driver_peak_mb']} "
              f"| {r['jvm_peak_mb']} | {r['round_s']} | {r['compute_s']} | {r['overhead_s']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executors", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--params", type=float, default=1e6)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=4, help="τ")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--backends", nargs="+", default=["rounds", "ps"], choices=list(BACKENDS))
    parser.add_argument("--compression", nargs="*", default=["fp16"], help="compressions besides none")
    parser.add_argument("--reduce", action="store_true", help="also rounds with the updates forced onto the executors (N > 2)")
    parser.add_argument("--out", help="also write the JSON lines to this file")
    parser.add_argument("--resummarize", metavar="FILE", help="recompute FILE's summaries from its per-round values, and stop")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.resummarize:
        resummarize(args.resummarize)
        print_table(load_lines(args.resummarize))
        return
    if args.child is not None:
        run_child(args.child, args)
        return
    results = []
    forwarded = [a for a in sys.argv[1:]]
    for n in args.executors:
        cmd = [sys.executable, os.path.abspath(__file__), *forwarded, "--child", str(n)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=dict(os.environ, PYTHONPATH=ROOT))
        lines = [line for line in proc.stdout.splitlines() if line.startswith('{"benchmark": "scaling"')]
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
        for line in lines:
            print(line, flush=True)
            results.append(json.loads(line))
            if args.out:
                with open(args.out, "a") as f:
                    f.write(line + "\n")
    print_table(results)


if __name__ == "__main__":
    main()
