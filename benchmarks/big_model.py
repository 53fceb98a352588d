"""A model too big for the driver to hold comfortably: does it train, how long is a round, how much
memory does each process take? One backend per fresh process, side by side on the same master.

For each backend of ``--backends`` (``sharded``: the state in one slice per worker, owned by the
workers' own tasks, the driver coordinating; ``sharded_lean``: the same with
``keepLocalOptimizer=True`` and ``compression="fp16"``; ``ps``; ``rounds``; a ``name:optimizer``
entry overrides ``--optimizer`` for that backend, e.g. ``ps:sgd``) a fresh Python process starts
a Spark session on ``--master`` (default ``local-cluster[2,1,4096]``: two executor JVMs of one core
and 4 GB, each with its own Python worker) and fits the MLP ``784 → h → 10`` of
``benchmarks/round_overhead.py`` with about ``--params`` float32 parameters (default 100M: Adam's
state is 12 bytes a parameter, 1.2 GB; SGD's 4, 0.4 GB) with ``--workers`` workers, ``--epochs``
epochs of ``--rounds`` rounds of one local step of ``--batch-size`` random rows (τ = 1: the
round's fixed cost dominates).

It reports:

- ``trained``: every epoch ran and every epoch's loss is finite; ``loss`` per epoch;
- ``round_s``: the last epoch's seconds per round (``fitInfo["epoch_seconds"]``), ``first_epoch_s``;
- ``driver_python_peak_mb`` / ``driver_jvm_peak_mb``: peak resident set (``VmHWM``) of the driver's
  Python process and JVM during ``fit()`` (reset with ``/proc/<pid>/clear_refs`` just before it);
  ``driver_python_growth_mb``: the Python peak minus its RSS when ``fit()`` began;
- ``executors_peak_mb``: the highest sum of the executors' processes' RSS (their JVMs and the
  Python workers under them, sampled every 0.25 s), and each such process's own ``VmHWM``
  (``executor_process_peaks_mb``: the Python workers hold the replicas and, on ``sharded``, the slices);
- ``min_available_mb``: the lowest ``MemAvailable`` of the machine during the fit (other work
  on the machine counts too).

A process the kernel kills (out of memory) shows as the fit's failure: the child's error tail and
its return code are printed in the JSON line (``error``), with the last memory sample.

Prints one JSON line per backend (``--out FILE`` appends them there too), then a Markdown table.

Usage: python benchmarks/big_model.py [--params 1e8] [--backends sharded,ps:sgd,rounds:sgd] [--optimizer adam]
       [--master 'local-cluster[2,1,4096]'] [--workers 2] [--epochs 2] [--rounds 3] [--batch-size 32]
       [--driver-memory 8g] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BACKENDS = {  # --backends name -> the fit's settings
    "rounds": {"backend": "rounds"},
    "ps": {"backend": "ps"},
    "sharded": {"backend": "sharded"},
    "sharded_lean": {"backend": "sharded", "keepLocalOptimizer": True, "compression": "fp16"},
}

CHILD = r"""
import json, math, os, sys, threading, time
sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks"))
args = json.loads(sys.argv[2])
import numpy as np
import round_overhead as ro
from pyspark.sql import SparkSession

executor_mb = int(args["master"].rstrip("]").split(",")[-1]) if args["master"].startswith("local-cluster") else None
builder = (SparkSession.builder.master(args["master"]).config("spark.ui.enabled", "false")
           .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", args["driver_memory"])
           .config("spark.driver.maxResultSize", "0").config("spark.sql.shuffle.partitions", str(args["workers"])))
if executor_mb:
    builder = builder.config("spark.executor.memory", f"{executor_mb}m")
spark = builder.getOrCreate()
sc = spark.sparkContext
sc.setLogLevel("ERROR")
if args["master"].startswith("local-cluster"):
    n = int(args["master"].split("[")[1].split(",")[0])
    deadline = time.monotonic() + 300
    while sc._jsc.sc().getExecutorMemoryStatus().size() - 1 < n:
        if time.monotonic() > deadline:
            raise RuntimeError("the executors did not register")
        time.sleep(1)
jvm = int(sc._jvm.java.lang.ProcessHandle.current().pid())
me = os.getpid()
import keras
from sparkdl import KerasEstimator


def status(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def available_mb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def descendants(root):
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out = []
    for pid in parent:
        p = pid
        while p in parent and p != root and p > 1:
            p = parent[p]
        if p == root and pid != root:
            out.append(pid)
    return out


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


rng = np.random.default_rng(1)
rows = args["rounds"] * args["batch_size"] * args["workers"]
x = rng.random((rows, ro.INPUTS), dtype=np.float32)
y = rng.integers(0, ro.CLASSES, rows)
df = spark.createDataFrame([(r.tolist(), float(v)) for r, v in zip(x, y)], "features array<float>, label double").cache()
df.count()
model = ro.build_model(args["params"])
exact = sum(int(np.prod(w.shape)) for w in model.weights)
state_mb = (3 if args["optimizer"] == "adam" else 1) * 4 * exact / 1e6
est = KerasEstimator(model=model, optimizer=ro.optimizer(args["optimizer"]),
                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), numWorkers=args["workers"],
                     epochs=args["epochs"], batchSize=args["batch_size"], localSteps=1, verbose=0, roundTimeout=3600.0,
                     **args["settings"])
sample = {"executors_peak_mb": 0.0, "min_available_mb": available_mb(), "last": {}}
stop = threading.Event()


def sampler():
    while not stop.is_set():
        pids = descendants(jvm)
        rss = {pid: status(pid, "VmRSS") for pid in pids}
        total = sum(rss.values())
        sample["executors_peak_mb"] = max(sample["executors_peak_mb"], total)
        sample["min_available_mb"] = min(sample["min_available_mb"], available_mb())
        sample["last"] = {"driver_python_mb": round(status(me, "VmRSS")), "driver_jvm_mb": round(status(jvm, "VmRSS")),
                          "executors_mb": round(total), "available_mb": round(available_mb())}
        print("SAMPLE " + json.dumps(sample["last"]), file=sys.stderr, flush=True)
        stop.wait(0.25)


for pid in (me, jvm, *descendants(jvm)):
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
before = status(me, "VmRSS")
thread = threading.Thread(target=sampler, daemon=True)
thread.start()
started = time.perf_counter()
error = None
try:
    fitted = est.fit(df)
except Exception as exc:  # noqa: BLE001 - reported in the JSON line
    error, fitted = f"{type(exc).__name__}: {str(exc)[:1500]}", None
fit_s = time.perf_counter() - started
stop.set()
thread.join()
peaks = {f"{comm(pid)}:{pid}": round(status(pid, "VmHWM")) for pid in descendants(jvm)}
result = {"benchmark": "big_model", "backend": args["name"], "settings": args["settings"], "optimizer": args["optimizer"],
          "params": exact, "state_mb": round(state_mb, 1), "master": args["master"], "workers": args["workers"],
          "epochs": args["epochs"], "rounds_per_epoch": args["rounds"], "batch_size": args["batch_size"],
          "fit_s": round(fit_s, 1), "driver_python_before_mb": round(before), "driver_python_peak_mb": round(status(me, "VmHWM")),
          "driver_python_growth_mb": round(status(me, "VmHWM") - before), "driver_jvm_peak_mb": round(status(jvm, "VmHWM")),
          "executors_peak_mb": round(sample["executors_peak_mb"]), "executor_process_peaks_mb": peaks,
          "min_available_mb": round(sample["min_available_mb"]), "load_average": round(os.getloadavg()[0], 1)}
if fitted is not None:
    info, history = fitted.fitInfo, fitted.history
    losses = [float(v) for v in history.get("loss", [])]
    result.update({"trained": len(info["epoch_seconds"]) == args["epochs"] and all(math.isfinite(v) for v in losses),
                   "loss": [round(v, 4) for v in losses], "first_epoch_s": round(info["epoch_seconds"][0], 2),
                   "round_s": round(info["epoch_seconds"][-1] / info["rounds_per_epoch"], 3),
                   "driver_bytes_fetched": info.get("driver_bytes_fetched")})
else:
    result.update({"trained": False, "error": error, "last_sample": sample["last"]})
print(json.dumps(result), flush=True)
spark.stop()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=1e8)
    parser.add_argument("--backends", default="sharded", help="comma-separated: sharded, sharded_lean, ps, rounds; name:sgd|adam "
                        "overrides --optimizer for one (e.g. sharded,ps:sgd,rounds:sgd)")
    parser.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    parser.add_argument("--master", default="local-cluster[2,1,4096]")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per epoch (τ = 1)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per backend")
    parser.add_argument("--out", help="also append the JSON lines to this file")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("KERAS_BACKEND", "tensorflow")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    results = []
    for entry in args.backends.split(","):
        name, _, optimizer = entry.partition(":")
        if name not in BACKENDS or optimizer not in ("", "adam", "sgd"):
            parser.error(f"--backends: unknown {entry!r}; known: {sorted(BACKENDS)}, each optionally :adam or :sgd")
        child = {"name": name, "settings": BACKENDS[name], "optimizer": optimizer or args.optimizer, "params": int(args.params),
                 "master": args.master, "workers": args.workers, "epochs": args.epochs, "rounds": args.rounds,
                 "batch_size": args.batch_size, "driver_memory": args.driver_memory}
        try:
            out = subprocess.run([sys.executable, "-c", CHILD, ROOT, json.dumps(child)], env=env, capture_output=True, text=True,
                                 timeout=args.timeout)
            stdout, stderr, rc = out.stdout, out.stderr, out.returncode
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            rc = "timeout"
        lines = [line for line in stdout.splitlines() if line.startswith('{"benchmark": "big_model"')]
        if lines:
            result = json.loads(lines[-1])
        else:
            samples = [line[7:] for line in stderr.splitlines() if line.startswith("SAMPLE ")]
            tail = "\n".join(line for line in stderr.splitlines() if not line.startswith("SAMPLE "))[-3000:]
            result = {"benchmark": "big_model", "backend": name, "optimizer": child["optimizer"], "params": child["params"],
                      "master": args.master, "trained": False, "error": f"the child ended with {rc}: {tail}",
                      "last_sample": json.loads(samples[-1]) if samples else None}
        result["returncode"] = rc
        results.append(result)
        print(json.dumps(result), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(result) + "\n")
    print("\n| backend | optimizer | parameters | state MB | trained | loss per epoch | round s | first epoch s | fit s "
          "| driver Python peak MB (growth) | driver JVM peak MB | executors' peak MB (sum) | min available MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['backend']} | {r.get('optimizer')} | {r.get('params', 0):,} | {r.get('state_mb', '-')} | {r['trained']} "
              f"| {', '.join(str(v) for v in r.get('loss', [])) or '-'} | {r.get('round_s', '-')} | {r.get('first_epoch_s', '-')} "
              f"| {r.get('fit_s', '-')} | {r.get('driver_python_peak_mb', '-')} ({r.get('driver_python_growth_mb', '-')}) "
              f"| {r.get('driver_jvm_peak_mb', '-')} | {r.get('executors_peak_mb', '-')} | {r.get('min_available_mb', '-')} |")
        if not r["trained"] and r.get("error"):
            flat = re.sub(r"[|\n]+", " ", r["error"])[-300:]
            print(f"|  | error: {flat} |")


if __name__ == "__main__":
    main()
