"""Chaos: seeded schedules of faults over fits, and what each fault cost.

For each master, backend and mode, one undisturbed fit and one fit with one fault injected at a
seeded (partition, round), through :mod:`sparkdl.spark.training.faults`:

- ``kill``: the task's Python worker is SIGKILLed (``local[2,4]``: Spark retries a task 3 times);
- ``raise``: the task raises once (``local[2,4]``);
- ``executor``: the executor's JVM is SIGKILLed (``local-cluster[2,1,1024]``: two executor JVMs);
- ``driver``: the driver process running the fit with a ``checkpointDir`` is SIGKILLed after its
  first snapshot, and the same fit is run again in a new process (``local[2]``).

Modes ``sync``, ``bmuf``, ``easgd`` on both backends, ``async`` and ``ssp`` on ``ps``. For each fit:
whether it completed, the largest weight difference from the undisturbed fit (the round modes
must be within 1e-5; the asynchronous ones differ by nature), the seconds it took and the seconds
the fault cost (disturbed − undisturbed; for ``driver``, the killed run plus the run again).
Prints one JSON line per fit and a Markdown table; ``--out`` also writes the JSON lines.

Usage: python benchmarks/chaos.py [--seed 0] [--kinds kill,raise,executor,driver] [--modes sync,async] [--out chaos.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from setup_env import ROOT  # noqa: E402  (sys.path and the environment, before pyspark/keras)

from sparkdl.core.modes import ROUND_MODES  # noqa: E402

GRID = [("rounds", "sync"), ("rounds", "bmuf"), ("rounds", "easgd"), ("ps", "sync"), ("ps", "bmuf"), ("ps", "easgd"),
        ("ps", "async"), ("ps", "ssp")]
EPOCHS, ROWS, WORKERS = 3, 512, 2

CHILD = """
import json, os, sys, tempfile, time
sys.path.insert(0, {root!r})
import numpy as np
from pyspark.sql import SparkSession
builder = (SparkSession.builder.master({master!r}).config("spark.ui.enabled", "false")
           .config("spark.ui.showConsoleProgress", "false").config("spark.executor.memory", "768m"))
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("OFF")
import keras
from sparkdl import KerasEstimator
from sparkdl.spark.training import faults

rng = np.random.default_rng(0)
x = rng.normal(size=({rows}, 16)).astype(np.float32)
y = (x[:, :3].sum(axis=1) > 0).astype(np.float64)
df = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range({rows})], "x array<float>, y double").repartition({workers}).cache()
df.count()

def fit(backend, mode, hook=None, **kw):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2, activation="softmax")])
    est = KerasEstimator(model=model, optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", featuresCol="x",
                         labelCol="y", numWorkers={workers}, epochs={epochs}, batchSize=16, localSteps=4, verbose=0, backend=backend,
                         mode=mode, **kw)
    started = time.perf_counter()
    if hook is None:
        fitted = est.fit(df)
    else:
        with faults.inject(hook):
            fitted = est.fit(df)
    return fitted, time.perf_counter() - started

def weights(fitted):
    return [w.tolist() for w in fitted.getKerasModel().get_weights()]

fit("rounds", "sync")  # warm the Python workers
out = []
for backend, mode, partition, index, how in json.loads(sys.argv[1]):
    base, base_s = fit(backend, mode)
    record = {{"backend": backend, "mode": mode, "fault": how, "partition": partition, "round": index, "undisturbed_s": base_s}}
    try:
        hit, hit_s = fit(backend, mode, hook=faults.Fault(partition=partition, index=index, how=how, marker_dir=tempfile.mkdtemp()))
        record.update(completed=True, seconds=hit_s, base=weights(base), hit=weights(hit),
                      attempts=hit.fitInfo.get("task_attempts"), updates=hit.fitInfo.get("updates_applied"))
    except Exception as exc:  # a fit that did not survive the fault: reported, not raised
        record.update(completed=False, error=f"{{type(exc).__name__}}: {{exc}}"[:400])
    out.append(record)
json.dump(out, open(sys.argv[2], "w"))
spark.stop()
"""

DRIVER = """
import json, sys, time
sys.path.insert(0, {root!r})
import numpy as np
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate()
spark.sparkContext.setLogLevel("OFF")
import keras
from sparkdl import KerasEstimator
rng = np.random.default_rng(0)
x = rng.normal(size=({rows}, 16)).astype(np.float32)
y = (x[:, :3].sum(axis=1) > 0).astype(np.float64)
df = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range({rows})], "x array<float>, y double").repartition({workers})
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2, activation="softmax")])
backend, mode, folder = sys.argv[2], sys.argv[3], sys.argv[4]
est = KerasEstimator(model=model, optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", featuresCol="x",
                     labelCol="y", numWorkers={workers}, epochs={epochs}, batchSize=16, localSteps=4, verbose=0, backend=backend,
                     mode=mode, checkpointDir=folder or None)
started = time.perf_counter()
fitted = est.fit(df)
json.dump({{"weights": [w.tolist() for w in fitted.getKerasModel().get_weights()], "seconds": time.perf_counter() - started,
           "resumed_from_epoch": fitted.fitInfo.get("resumed_from_epoch")}}, open(sys.argv[1], "w"))
spark.stop()
"""


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)


def _difference(a, b) -> float:
    import numpy as np

    return max(float(np.abs(np.array(p) - np.array(q)).max()) for p, q in zip(a, b, strict=True))


def schedule(seed: int, kinds: list[str], modes: list[str] | None = None) -> dict[str, list]:
    """Per master, the fits to run: ``[backend, mode, partition, round, how]``, the fault's
    partition and round drawn from ``seed`` (rounds of the first two epochs); ``modes`` keeps those
    modes of the grid (all when None)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rounds_per_epoch = -(-(ROWS // WORKERS) // 16) // 4  # 256 rows a worker, batch 16, τ = 4
    plan: dict[str, list] = {"local[2,4]": [], "local-cluster[2,1,1024]": [], "driver": []}
    for backend, mode in GRID:
        if modes is not None and mode not in modes:
            continue
        for how in kinds:
            partition, index = int(rng.integers(WORKERS)), int(rng.integers(1, 2 * rounds_per_epoch))
            if how in ("kill", "raise"):
                plan["local[2,4]"].append([backend, mode, partition, index, how])
            elif how == "executor":
                plan["local-cluster[2,1,1024]"].append([backend, mode, partition, index, how])
            elif how == "driver":
                plan["driver"].append([backend, mode, None, None, how])
    return plan


def run_master(master: str, fits: list, timeout_s: float) -> list[dict]:
    if not fits:
        return []
    with tempfile.TemporaryDirectory(prefix="sparkdl-chaos-") as tmp:
        out = os.path.join(tmp, "out.json")
        script = CHILD.format(root=ROOT, master=master, rows=ROWS, workers=WORKERS, epochs=EPOCHS)
        result = subprocess.run([sys.executable, "-c", script, json.dumps(fits), out], env=_env(), timeout=timeout_s,
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"the {master} run failed: {result.stderr[-2000:]}")
        records = json.load(open(out))
    for record in records:
        record["master"] = master
        if record.get("completed"):
            record["max_difference"] = _difference(record.pop("hit"), record.pop("base"))
            record["lost_s"] = record["seconds"] - record["undisturbed_s"]
    return records


def run_driver_kill(backend: str, mode: str, timeout_s: float) -> dict:
    """One fit run undisturbed, then with its driver SIGKILLed after the first snapshot and run again."""
    script = DRIVER.format(root=ROOT, rows=ROWS, workers=WORKERS, epochs=EPOCHS)
    with tempfile.TemporaryDirectory(prefix="sparkdl-chaos-driver-") as tmp:
        def run(name, folder, kill):
            out = os.path.join(tmp, f"{name}.json")
            started = time.perf_counter()
            process = subprocess.Popen([sys.executable, "-c", script, out, backend, mode, folder], env=_env(),
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
            if kill:
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline and not any(n.endswith(".done") for n in os.listdir(folder) if os.path.isdir(folder)):
                    if process.poll() is not None:
                        raise RuntimeError(f"the run to kill ended first: {process.stderr.read()[-2000:]}")
                    time.sleep(0.1)
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(60)
                return None, time.perf_counter() - started
            _, err = process.communicate(timeout=timeout_s)
            if process.returncode != 0:
                raise RuntimeError(f"the {name} run failed: {err[-2000:]}")
            return json.load(open(out)), time.perf_counter() - started

        folder = os.path.join(tmp, "checkpoints")
        os.makedirs(folder)
        base, base_s = run("base", "", False)
        _, killed_s = run("killed", folder, True)
        again, again_s = run("again", folder, False)
    return {"master": "local[2]", "backend": backend, "mode": mode, "fault": "driver", "completed": True,
            "undisturbed_s": base_s, "seconds": killed_s + again_s, "lost_s": killed_s + again_s - base_s,
            "max_difference": _difference(again["weights"], base["weights"]), "resumed_from_epoch": again["resumed_from_epoch"]}


def table(records: list[dict]) -> str:
    lines = ["| master | backend | mode | fault | completed | max weight difference | seconds (undisturbed) | lost |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        diff = f"{r['max_difference']:.1e}" if "max_difference" in r else "—"
        lines.append(f"| {r['master']} | {r['backend']} | {r['mode']} | {r['fault']} | {'yes' if r.get('completed') else 'NO'} | "
                     f"{diff}{'' if r['mode'] in ROUND_MODES else ' (async)'} | {r.get('seconds', 0):.1f} ({r['undisturbed_s']:.1f}) | "
                     f"{r.get('lost_s', float('nan')):.1f} s |")
    completed = [r for r in records if r.get("completed")]
    rounds = [r["max_difference"] for r in completed if r["mode"] in ROUND_MODES]
    lines.append("")
    lines.append(f"{len(records)} faults injected, {len(completed)} fits completed; round modes within "
                 f"{max(rounds, default=0.0):.1e} of undisturbed; at most {max((r['lost_s'] for r in completed), default=0.0):.1f} s "
                 "lost per fault")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", default="kill,raise,executor,driver")
    parser.add_argument("--modes", default=None, help="comma-separated modes of the grid to run (default: all)")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    plan = schedule(args.seed, args.kinds.split(","), args.modes.split(",") if args.modes else None)
    records = []
    for master in ("local[2,4]", "local-cluster[2,1,1024]"):
        records += run_master(master, plan[master], args.timeout)
    for backend, mode, *_ in plan["driver"]:
        records.append(run_driver_kill(backend, mode, args.timeout))
    for record in records:
        print(json.dumps(record), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    print()
    print(table(records))


if __name__ == "__main__":
    main()
