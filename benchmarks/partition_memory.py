"""Python worker memory of a fit whose partitions exceed the task budget: on disk vs in memory.

A synthetic DataFrame of ``--gb`` GB of float32 features (``--width`` floats a row, a 0/1 label
from the first feature) is generated on the executors (``spark.range`` and ``rand``, never
collected) and a one-layer model (``Dense(1, sigmoid)``, binary cross-entropy, Adam) is fitted
for one epoch, one round (``localSteps=None``), 2 workers on ``local[2]``. Each mode runs in a
fresh process (its own JVM and Python workers, so peaks do not mix):

- ``disk`` (called ``memmap`` before the partitions stopped being memory-mapped; still accepted):
  ``maxTaskMemoryMB=--budget-mb`` (128): each partition (about half the data) is larger than the
  budget, so its Arrow batches are converted one at a time and appended to ``.npy`` files with
  plain writes, and training reads each batch of rows from them with ``os.pread``
  (``sparkdl.spark.partitions.FileArray``); nothing is mapped, so ``worker_peak_mapped_npy_mb``
  (the partition files' pages mapped into a worker, from ``smaps``) should be 0;
- ``memory``: ``maxTaskMemoryMB`` far above the partition: the partition is converted into arrays
  preallocated to its rows and held in memory (plus a ``.npy`` copy for the executor's other
  Python workers).

Each process first fits the same model on a few batches of rows (untimed): its Python workers
import TensorFlow and build their replicas, as in any session after its first fit. Their resident
memory then is the warm baseline (``worker_baseline_*``; about 627 MB measured: ~265 MB of heap,
~360 MB of TensorFlow's mapped shared libraries); their peaks are reset (``clear_refs``) and the
timed fit starts. During it a thread samples, every ``--interval`` s, the memory of this process's
descendant Python processes started as ``pyspark.daemon`` (the daemon and the Python workers it
forks; other sessions' Spark processes on the machine are not descendants) from
``/proc/<pid>/status``: ``VmRSS`` and its parts ``RssAnon`` (heap: what memory pressure cannot
take back) and ``RssFile`` (mapped file pages: TensorFlow's shared libraries and any mapped
``.npy`` file), and every fifth sample ``/proc/<pid>/smaps``, summed by kind (``.npy`` files,
shared libraries, other files, ``[heap]``, other anonymous mappings, the largest anonymous
mappings), kept at each worker's highest-RSS smaps sample (``worker_peak_smaps``; for the warm
baseline ``worker_baseline_smaps``, both of the worker with the highest peak). Before Spark
stops, each process's ``VmHWM`` is read (the kernel's exact peak).

The per-worker RSS includes TensorFlow's warm baseline, so the goal of issue 8 (worker peak RSS
under 400 MB) is reported two ways:

- absolute: ``worker_peak_hwm_mb`` (VmHWM) < 400 → ``worker_rss_goal_met`` (not reachable while a
  warm TensorFlow worker alone holds ~627 MB);
- growth: ``worker_peak_growth_mb`` = VmHWM − the same worker's warm-baseline VmRSS < 400 →
  ``worker_growth_goal_met``; ``worker_anon_growth_mb`` is the same for the heap (sampled peak
  ``RssAnon`` − baseline ``RssAnon``). ``partition_mb`` is the largest partition's converted size
  (rows × bytes a row: features + the label, counted as 8 bytes) and
  ``worker_growth_vs_partition`` = growth / that: about 1 or more holds the partition in the
  worker, near 0 a few batches.

samples/s = rows / ``fitInfo["seconds"]["total"]`` (the data's generation on the executors, the
shuffle and the check job are in ``prepare_data``, the same work in both modes); train samples/s
= rows / the rounds' seconds (the first round converts the partitions, then trains). The 1-minute
load average before and after each run is reported: others' work on the machine slows both.

Prints one JSON line per run, e.g. ``{"benchmark": "partition_memory", "mode": "disk",
"worker_peak_hwm_mb": 689.3, "worker_peak_growth_mb": 62.8, "samples_per_s": 16604.3, ...}``, a
JSON line with the ratio of median samples/s (disk / memory; with ``--repeats`` the order
alternates) and the peaks, then a Markdown table.

Usage: python benchmarks/partition_memory.py [--gb 1.0] [--width 256] [--budget-mb 128]
       [--batch-size 1024] [--modes disk,memory] [--arrow-batch 10000] [--driver-memory 6g]
       [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

import setup_env  # noqa: F401  (sys.path and the environment, before pyspark/keras)

HERE = os.path.dirname(os.path.abspath(__file__))
MB = 2**20
GOAL_MB = 400
MARKERS = ("pyspark.daemon", "pyspark/daemon", "pyspark/worker", "pyspark.worker", "sparkdl.spark.daemon")


# --- /proc sampling -------------------------------------------------------------------------------

def _status(pid: int) -> dict[str, int]:
    """``VmRSS``, ``RssAnon``, ``RssFile``, ``VmHWM`` (bytes) of a process; {} once it has gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        return {}
    return out


def _smaps(pid: int) -> dict:
    """Resident bytes of a process's mappings by kind, from ``/proc/<pid>/smaps``: ``npy`` (the
    partition files, ``sparkdl-<fit>/*.npy`` in Spark's directory), ``so`` (shared libraries),
    ``file`` (other files), ``heap`` (``[heap]``: glibc's main arena), ``anon`` (other anonymous
    mappings: mmap'd allocations, thread arenas and stacks), ``anon_top`` (the 5 largest anonymous
    mappings, (size, resident) MB) and ``anon_mappings`` (how many hold resident pages); {} once
    it has gone."""
    out = {"npy": 0, "so": 0, "file": 0, "heap": 0, "anon": 0}
    anonymous: list[tuple[int, int]] = []
    kind, size = None, 0
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and line[0] in "0123456789abcdef" and not head.endswith(":"):  # a mapping's header line
                    low, high = (int(v, 16) for v in head.split("-"))
                    size = high - low
                    fields = line.split(None, 5)
                    name = fields[5].strip() if len(fields) > 5 else ""
                    if "/sparkdl-" in name and ".npy" in name:
                        kind = "npy"
                    elif name == "[heap]":
                        kind = "heap"
                    elif not name or name.startswith("[anon") or name in ("[stack]",):
                        kind = "anon"
                    elif name.startswith("["):
                        kind = None  # [vdso], [vvar], ...
                    elif ".so" in name:
                        kind = "so"
                    else:
                        kind = "file"
                elif kind and line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                    out[kind] += rss
                    if kind == "anon" and rss:
                        anonymous.append((rss, size))
    except OSError:
        return {}
    anonymous.sort(reverse=True)
    out["anon_top"] = [(round(size / MB, 1), round(rss / MB, 1)) for rss, size in anonymous[:5]]
    out["anon_mappings"] = len(anonymous)
    return out


def _processes() -> dict[int, tuple[int, str]]:
    """Every process: pid → (parent pid, command line)."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])  # the name in (...) may hold spaces
        table[int(name)] = (ppid, cmdline)
    return table


def _descendants(root: int, table: dict[int, tuple[int, str]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


class Sampler(threading.Thread):
    """Peak memory of this process's Python workers (and the daemon that forks them) and its JVM."""

    def __init__(self, interval: float):
        super().__init__(daemon=True)
        self.interval = interval
        self.stopped = threading.Event()
        self.python: dict[int, dict[str, int]] = {}  # pid → peak of each field
        self.roles: dict[int, str] = {}  # pid → "daemon" | "worker"
        self.jvm: dict[int, dict[str, int]] = {}
        self.peak_sum_rss = self.peak_sum_anon = 0
        self.samples = 0
        self.baseline: dict[int, dict[str, int]] = {}
        self.smaps: dict[int, tuple[int, dict]] = {}  # pid → (VmRSS, smaps by kind) at its highest-RSS smaps sample
        self.baseline_smaps: dict[int, dict] = {}  # pid → smaps by kind after the warm-up fit

    def sample(self) -> None:
        table = _processes()
        pythons = {}
        for pid in _descendants(os.getpid(), table):
            ppid, cmdline = table[pid]
            if any(m in cmdline for m in MARKERS):
                pythons[pid] = ppid
            elif "java" in cmdline.split(" ", 1)[0]:
                status = _status(pid)
                peak = self.jvm.setdefault(pid, {})
                for key, value in status.items():
                    peak[key] = max(peak.get(key, 0), value)
        total_rss = total_anon = 0
        smaps = self.samples % 5 == 0  # reading smaps costs more: every fifth sample
        for pid, ppid in pythons.items():
            status = _status(pid)
            if not status:
                continue
            if smaps:
                kinds = _smaps(pid)
                status["MappedData"] = kinds.get("npy", 0)
                if kinds and status.get("VmRSS", 0) >= self.smaps.get(pid, (-1, None))[0]:
                    self.smaps[pid] = (status.get("VmRSS", 0), kinds)
            self.roles[pid] = "worker" if ppid in pythons else "daemon"  # workers are forked by the daemon
            peak = self.python.setdefault(pid, {})
            for key, value in status.items():
                peak[key] = max(peak.get(key, 0), value)
            total_rss += status.get("VmRSS", 0)
            total_anon += status.get("RssAnon", 0)
        self.peak_sum_rss = max(self.peak_sum_rss, total_rss)
        self.peak_sum_anon = max(self.peak_sum_anon, total_anon)
        self.samples += 1

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.sample()

    def reset(self) -> dict[int, dict[str, int]]:
        """Forget the peaks so far and reset each Python process's ``VmHWM`` (``clear_refs`` 5);
        returns each one's current memory (after a warm-up fit: the baseline)."""
        self.sample()
        now = {pid: _status(pid) for pid in self.python}
        for pid in list(self.python) + list(self.jvm):
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                pass
        self.python, self.jvm, self.peak_sum_rss, self.peak_sum_anon, self.samples = {}, {}, 0, 0, 0
        self.smaps = {}
        self.baseline = {pid: s for pid, s in now.items() if s and self.roles.get(pid) == "worker"}
        self.baseline_smaps = {pid: _smaps(pid) for pid in self.baseline}
        return self.baseline

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        self.samples -= self.samples % 5  # the last sample reads smaps too
        self.sample()  # the last values and each live process's VmHWM, before Spark stops its workers

    def report(self) -> dict:
        def mb(value):
            return round(value / MB, 1)

        workers = {pid: p for pid, p in self.python.items() if self.roles.get(pid) == "worker"}
        daemons = {pid: p for pid, p in self.python.items() if self.roles.get(pid) == "daemon"}

        def peak(group, key):
            return mb(max((p.get(key, 0) for p in group.values()), default=0))

        based = {pid: p for pid, p in workers.items() if pid in self.baseline}  # workers that were warm before the fit
        growth = [p.get("VmHWM", 0) - self.baseline[pid].get("VmRSS", 0) for pid, p in based.items()]
        anon_growth = [p.get("RssAnon", 0) - self.baseline[pid].get("RssAnon", 0) for pid, p in based.items()]
        top = max(workers, key=lambda pid: workers[pid].get("VmHWM", 0), default=None)  # the worker with the highest peak
        smaps_rss, kinds = self.smaps.get(top, (0, {}))

        def by_kind(kinds, rss=None):
            head = {"rss_mb": mb(rss)} if rss is not None else {}
            return {**head, **{k: (mb(v) if k in ("npy", "so", "file", "heap", "anon") else v) for k, v in kinds.items()}}
        return {
            "worker_processes": len(workers),
            "worker_processes_warm": len(based),
            "worker_baseline_rss_mb": mb(max((s.get("VmRSS", 0) for s in self.baseline.values()), default=0)),
            "worker_baseline_anon_mb": mb(max((s.get("RssAnon", 0) for s in self.baseline.values()), default=0)),
            "worker_baseline_file_mb": mb(max((s.get("RssFile", 0) for s in self.baseline.values()), default=0)),
            "worker_peak_growth_mb": mb(max(growth, default=0)),
            "worker_growths_mb": sorted((mb(g) for g in growth), reverse=True),
            "worker_anon_growth_mb": mb(max(anon_growth, default=0)),
            "worker_peak_rss_mb": peak(workers, "VmRSS"),
            "worker_peak_hwm_mb": peak(workers, "VmHWM"),
            "worker_peak_anon_mb": peak(workers, "RssAnon"),
            "worker_peak_file_mb": peak(workers, "RssFile"),
            "worker_peak_mapped_npy_mb": peak(workers, "MappedData"),
            "worker_peaks_rss_mb": sorted((mb(p.get("VmRSS", 0)) for p in workers.values()), reverse=True),
            "worker_peaks_hwm_mb": sorted((mb(p.get("VmHWM", 0)) for p in workers.values()), reverse=True),
            "worker_peak_smaps": by_kind(kinds, smaps_rss) if kinds else {},
            "worker_baseline_smaps": by_kind(self.baseline_smaps.get(top, {})),
            "daemon_peak_rss_mb": peak(daemons, "VmRSS"),
            "python_peak_sum_rss_mb": mb(self.peak_sum_rss),
            "python_peak_sum_anon_mb": mb(self.peak_sum_anon),
            "jvm_peak_rss_mb": peak(self.jvm, "VmHWM"),
            "samples": self.samples,
        }


# --- one mode, in a fresh process ---------------------------------------------------------------

def run_mode(args) -> dict:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    load_before = os.getloadavg()[0]
    builder = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", args.driver_memory)
               .config("spark.python.worker.reuse", "true"))
    if args.arrow_batch:
        builder = builder.config("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.arrow_batch))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    import keras

    from sparkdl import KerasEstimator

    def data(rows):
        features = F.array(*[F.rand(args.seed + i).cast("float") for i in range(args.width)]).alias("x")
        df = spark.range(0, rows, numPartitions=2).select(features)
        return df.select("x", (F.col("x")[0] > 0.5).cast("double").alias("y"))  # learnable: the first feature decides

    budget_mb = args.budget_mb if args.mode in ("disk", "memmap") else 1e6

    def estimator():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((args.width,)), keras.layers.Dense(1, activation="sigmoid")])
        return KerasEstimator(
            model=model, optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy", metrics=["accuracy"],
            featuresCol="x", labelCol="y", numWorkers=2, epochs=1, batchSize=args.batch_size, localSteps=None,
            maxTaskMemoryMB=budget_mb, verbose=0, seed=0, roundTimeout=7200.0,
        )

    # A small warm-up fit first: the Python workers import TensorFlow and build their replicas, as
    # in any session after its first fit; their memory then is the baseline the big fit adds to.
    sampler = Sampler(args.interval)
    started = time.perf_counter()
    estimator().fit(data(4 * args.batch_size))
    warm_up_s = time.perf_counter() - started
    sampler.reset()
    rows = int(args.gb * 2**30 / (4 * args.width))
    driver_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sampler.start()
    started = time.perf_counter()
    fitted = estimator().fit(data(rows))
    fit_s = time.perf_counter() - started
    sampler.stop()
    driver_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    info = fitted.fitInfo
    seconds = info["seconds"]
    trained = info["rows"]
    train_s = seconds["first_round"] + seconds["other_rounds"]
    memory = sampler.report()
    partition_mb = max(info["partition_rows"]) * (4 * args.width + 8) / MB  # float32 features + the label (at most 8 bytes, < 1% of a row)
    result = {
        "benchmark": "partition_memory", "mode": args.mode, "gb": args.gb, "width": args.width, "rows": trained,
        "partition_rows": info["partition_rows"], "batch_size": args.batch_size, "budget_mb": round(budget_mb, 1),
        "task_budget_bytes": info["task_budget_bytes"], "partitions_on_disk": info["partitions_on_disk"],
        "arrow_max_records_per_batch": spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch"),
        "rounds": info["rounds"], "loss": round(float(fitted.history["loss"][-1]), 4),
        "accuracy": round(float(fitted.history["accuracy"][-1]), 4),
        "fit_s": round(fit_s, 2), "seconds": seconds, "warm_up_fit_s": round(warm_up_s, 2),
        "samples_per_s": round(trained / seconds["total"], 1),
        "train_samples_per_s": round(trained / train_s, 1) if train_s else None,
        **memory,
        "partition_mb": round(partition_mb, 1),
        "worker_growth_vs_partition": round(memory["worker_peak_growth_mb"] / partition_mb, 3) if partition_mb else None,
        "worker_anon_growth_vs_partition": round(memory["worker_anon_growth_mb"] / partition_mb, 3) if partition_mb else None,
        "worker_rss_goal_mb": GOAL_MB, "worker_rss_goal_met": memory["worker_peak_hwm_mb"] < GOAL_MB,
        "worker_growth_goal_met": memory["worker_peak_growth_mb"] < GOAL_MB,
        "driver_peak_rss_mb": round(driver_peak, 1), "driver_rss_before_fit_mb": round(driver_before, 1),
        "load_avg_1m_before": round(load_before, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }
    spark.stop()
    return result


# --- side by side -------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="GB of float32 features")
    parser.add_argument("--width", type=int, default=256, help="features a row")
    parser.add_argument("--budget-mb", type=float, default=128.0, help="maxTaskMemoryMB of the disk mode")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--modes", default="disk,memory", help="comma-separated: disk (or memmap, its old name), memory")
    parser.add_argument("--arrow-batch", type=int, default=None,
                        help="spark.sql.execution.arrow.maxRecordsPerBatch (default: Spark's, 10,000)")
    parser.add_argument("--driver-memory", default="6g", help="spark.driver.memory (holds the cached DataFrame)")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between RSS samples")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each mode, the order alternating; medians reported")
    parser.add_argument("--mode", help=argparse.SUPPRESS)  # set in the child process of one mode
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args)), flush=True)
        return
    modes = [{"memmap": "disk"}.get(m.strip(), m.strip()) for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - {"disk", "memory"}
    if unknown:
        raise SystemExit(f"--modes: unknown {sorted(unknown)}; use disk, memory")
    results = []
    for repeat in range(args.repeats):
        for mode in modes if repeat % 2 == 0 else modes[::-1]:  # alternate which mode runs first
            out = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--mode", mode],  # the last --mode wins
                                 capture_output=True, text=True, timeout=4 * 3600, cwd=HERE, check=False)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            if out.returncode != 0 or not lines:
                raise SystemExit(f"mode {mode} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
            results.append({**json.loads(lines[-1]), "repeat": repeat})
            print(json.dumps(results[-1]), flush=True)
    runs = {mode: [r for r in results if r["mode"] == mode] for mode in modes}
    median = {mode: {key: statistics.median(r[key] for r in runs[mode]) for key in ("samples_per_s", "train_samples_per_s")}
              for mode in modes}
    if {"disk", "memory"} <= set(modes):
        on_disk, held = median["disk"], median["memory"]
        peak = {mode: max(r["worker_peak_hwm_mb"] for r in runs[mode]) for mode in modes}
        growth = {mode: max(r["worker_peak_growth_mb"] for r in runs[mode]) for mode in modes}
        anon_growth = {mode: max(r["worker_anon_growth_mb"] for r in runs[mode]) for mode in modes}
        baseline = {mode: max(r["worker_baseline_rss_mb"] for r in runs[mode]) for mode in modes}
        summary = {
            "benchmark": "partition_memory", "summary": True, "repeats": args.repeats,
            "ratio_samples_per_s": round(on_disk["samples_per_s"] / held["samples_per_s"], 3),
            "ratio_train_samples_per_s": round(on_disk["train_samples_per_s"] / held["train_samples_per_s"], 3),
            "ratios_per_repeat": [round(a["samples_per_s"] / b["samples_per_s"], 3) for a, b in zip(runs["disk"], runs["memory"])],
            "train_ratios_per_repeat": [round(a["train_samples_per_s"] / b["train_samples_per_s"], 3)
                                        for a, b in zip(runs["disk"], runs["memory"])],
            "samples_per_s_median": median, "worker_baseline_rss_mb": baseline, "worker_peak_hwm_mb": peak,
            "worker_peak_growth_mb": growth, "worker_anon_growth_mb": anon_growth,
            "partition_mb": max(r["partition_mb"] for r in results),
            "worker_growth_vs_partition": {mode: max(r["worker_growth_vs_partition"] for r in runs[mode]) for mode in modes},
            "worker_rss_goal_met": peak["disk"] < GOAL_MB, "worker_growth_goal_met": growth["disk"] < GOAL_MB,
            "cpus": os.cpu_count(),
            "load_avg_1m": [max(r["load_avg_1m_before"], r["load_avg_1m_after"]) for r in results],
        }
        print(json.dumps(summary), flush=True)
    print("\n| mode (repeat) | partitions on disk | worker peak RSS MB (HWM) | warm baseline MB | growth MB (× partition) "
          "| anon peak / growth MB | file peak MB | .npy mapped MB | Python sum MB | driver MB | JVM MB | fit s | prepare s "
          "| first round s | samples/s | train samples/s | load 1m |"
          "\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        s = r["seconds"]
        print(f"| {r['mode']} ({r['repeat']}) | {r['partitions_on_disk']}/{len(r['partition_rows'])} | {r['worker_peak_hwm_mb']:,} "
              f"| {r['worker_baseline_rss_mb']:,} | {r['worker_peak_growth_mb']:,} ({r['worker_growth_vs_partition']}) "
              f"| {r['worker_peak_anon_mb']:,} / {r['worker_anon_growth_mb']:,} | {r['worker_peak_file_mb']:,} "
              f"| {r['worker_peak_mapped_npy_mb']:,} | {r['python_peak_sum_rss_mb']:,} | {r['driver_peak_rss_mb']:,} "
              f"| {r['jvm_peak_rss_mb']:,} | {s['total']} | {s['prepare_data']} | {s['first_round']} "
              f"| {r['samples_per_s']:,} | {r['train_samples_per_s']:,} | {r['load_avg_1m_before']} → {r['load_avg_1m_after']} |")
    if {"disk", "memory"} <= set(modes):
        print(f"\nratio disk / memory samples/s (medians): {summary['ratio_samples_per_s']} "
              f"(training rounds only: {summary['ratio_train_samples_per_s']}); partition {summary['partition_mb']} MB")
        print(f"disk worker peak {peak['disk']} MB (warm baseline {baseline['disk']} MB) vs goal {GOAL_MB} MB: "
              f"{'met' if summary['worker_rss_goal_met'] else 'NOT met'} as absolute RSS; growth {growth['disk']} MB "
              f"({summary['worker_growth_vs_partition']['disk']} × the partition): "
              f"{'met' if summary['worker_growth_goal_met'] else 'NOT met'} as growth over the warm baseline")
        for r in runs["disk"]:
            print(f"disk ({r['repeat']}) top worker smaps (MB) at its highest sampled RSS: {json.dumps(r['worker_peak_smaps'])}; "
                  f"warm baseline: {json.dumps(r['worker_baseline_smaps'])}")


if __name__ == "__main__":
    main()
