"""Chaos soak: real faults, found and fired from outside the library, over whole fits.

For each backend and its round modes (``rounds``: sync, bmuf, easgd; ``ps``: sync, bmuf, easgd;
``sharded``: sync, bmuf, diloco) and each seed, a child process starts a ``local-cluster[3,1,1024]``
application (three executor JVMs of one core each, workers forked from sparkdl's daemon), runs a short
warm-up fit, one undisturbed fit and one fit with K faults (default 4), and reports both. The fits:
360 rows of 8 features, a 16-unit hidden layer, batch 10, ``localSteps=2`` (6 rounds an epoch),
8 epochs on ``rounds``, 64 on ``ps``, 40 on ``sharded``: an undisturbed fit of about 20–40 s on 2
shared cores.

The faults: at seeded random times (seconds after the fit's first training task started: fault k
falls in the k-th of K equal bins of 10–90 % of the undisturbed fit's training time, so they spread
over the fit), of seeded random classes:

- ``kill_worker``: SIGKILL a Python worker (a forked child of an executor's ``pyspark.daemon`` /
  ``sparkdl.spark.daemon``, not the daemon), preferring one busy running a task (CPU time rising);
- ``kill_executor``: SIGKILL an executor JVM (a ``java`` process whose command line holds
  ``CoarseGrainedExecutorBackend``; with ``local-cluster`` they descend from the driver JVM, i.e.
  from the child process);
- ``stop_worker``: SIGSTOP a Python worker (busy preferred) for a seeded 30–60 s, then SIGCONT
  (if it still is the same process).

A thread of the child process fires them; it finds its targets in ``/proc`` among the child's own
descendants only (never another application's processes). The library is not told: no hook of
``sparkdl.spark.training.faults`` is used. When the fit's first training task started is read from
Spark's REST API (the UI on a free port): the first job described ``sparkdl fit <id>: round ...``
(``rounds``) or ``...: <mode> on ps|sharded ...``, its stage's first task launch.

Settings: ``spark.task.maxFailures=8``; ``workerTimeout=20`` (``--worker-timeout``): on ``ps`` and
``sharded`` a worker stopped for 30–60 s is silent past it, so its attempt is killed and retried
rather than waited for (after two such kills of one partition the fit fails, by design). On
``rounds`` nothing watches a worker's silence: a stopped worker is waited out (the round's job
resumes with SIGCONT; ``roundTimeout`` 3600 s).

Per run one JSON line: backend, mode, seed, the faults fired (class, target pid, seconds after the
first training task, for a stop its length and whether SIGCONT found it), completed or not (and the
error's first line), max |Δw| against the undisturbed fit, the task attempts ``fitInfo`` reports
(``task_attempts``, ``silent_attempts_killed``, ``worker_retrained`` where the backend has them),
Spark's task counts for the fit's jobs (REST: completed, failed, killed), the seconds of both fits
and the seconds lost per fault ((disturbed − undisturbed) / K). Then a Markdown table. A failed
run's child log (the driver's ``sparkdl`` logger at INFO, and each executor's stderr tail) is kept
next to ``--out`` (or in the temporary folder printed).

Each child process is killed with its whole process group at ``--timeout`` seconds, and every Spark
process it was seen to own (executors, daemons, workers) is killed after it ends if still there.

Usage: python benchmarks/chaos.py [--seeds 0,1,2] [--faults 4] [--backends rounds,ps,sharded]
       [--modes sync,bmuf,easgd,diloco] [--worker-timeout 20] [--timeout 1200] [--out chaos.jsonl]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

from setup_env import ROOT  # noqa: E402  (sys.path and the environment, before pyspark/keras)

MODES = {"rounds": ("sync", "bmuf", "easgd"), "ps": ("sync", "bmuf", "easgd"), "sharded": ("sync", "bmuf", "diloco")}
CLASSES = ("kill_worker", "kill_executor", "stop_worker")
MASTER = "local-cluster[3,1,1024]"
WORKERS, ROWS, FEATURES, BATCH, LOCAL_STEPS = 3, 360, 8, 10, 2  # 6 rounds an epoch
# epochs: an undisturbed fit of about 20-40 s on 2 shared cores (a round of `rounds` is a Spark job; ps and sharded
# run a round in a fraction of a second)
EPOCHS = {"rounds": 8, "ps": 64, "sharded": 40}
MAX_FAILURES = 8
STOP_S = (30.0, 60.0)
SPAN = (0.1, 0.9)  # the faults fall within these fractions of the undisturbed fit's training time
DAEMONS = ("pyspark.daemon", "sparkdl.spark.daemon")
TRAINING_JOB = re.compile(r"^sparkdl fit [0-9a-f]+: (round \d|\w+ on (ps|sharded)\b)")
LOG_TAIL = 200


# ---- the schedule ------------------------------------------------------------------------------

def schedule(seed: int, faults: int) -> list[dict]:
    """The seed's faults, the same for every backend and mode: per fault its class, its time as a
    fraction of the undisturbed fit's training time (fault k in the k-th of ``faults`` equal bins of
    ``SPAN``), the length of a stop and a number in [0, 1) that picks the target among the candidates."""
    import numpy as np

    rng = np.random.default_rng(seed)
    width = (SPAN[1] - SPAN[0]) / faults
    plan = []
    for k in range(faults):
        plan.append({"class": CLASSES[int(rng.integers(len(CLASSES)))], "fraction": round(SPAN[0] + width * (k + rng.random()), 4),
                     "stop_s": round(float(rng.uniform(*STOP_S)), 1), "pick": float(rng.random())})
    return plan


# ---- processes, from /proc ---------------------------------------------------------------------

def processes() -> dict[int, dict]:
    """Every process now: pid -> ppid, argv, CPU ticks (user + system), start time (ticks after boot), state."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:  # ended meanwhile
            continue
        rest = stat[stat.rindex(")") + 2:].split()
        out[int(name)] = {"pid": int(name), "ppid": int(rest[1]), "argv": argv, "cpu": int(rest[11]) + int(rest[12]),
                          "start": int(rest[19]), "state": rest[0]}
    return out


def descendants(root: int, table: dict[int, dict]) -> list[dict]:
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p["ppid"], []).append(p["pid"])
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(table[pid])
        todo.extend(children.get(pid, []))
    return out


def _daemon_module(p: dict) -> str | None:
    return next((m for m in DAEMONS if m in p["argv"]), None)


def spark_processes(root: int) -> dict[str, list[dict]]:
    """The executors, daemons and forked Python workers below process ``root`` (this application's)."""
    table = processes()
    mine = descendants(root, table)
    executors = [p for p in mine if p["argv"] and os.path.basename(p["argv"][0]) == "java"
                 and any("CoarseGrainedExecutorBackend" in a for a in p["argv"])]
    pythons = [p for p in mine if _daemon_module(p)]
    daemons = [p for p in pythons if _daemon_module(table.get(p["ppid"], {"argv": []})) is None]
    workers = [p for p in pythons if _daemon_module(table.get(p["ppid"], {"argv": []})) is not None]
    return {"executors": sorted(executors, key=lambda p: p["pid"]), "daemons": daemons,
            "workers": sorted(workers, key=lambda p: p["pid"])}


def same_process(p: dict) -> bool:
    try:
        with open(f"/proc/{p['pid']}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return int(stat[stat.rindex(")") + 2:].split()[19]) == p["start"]


def signal_process(p: dict, sig: int) -> bool:
    """Send ``sig`` to ``p`` if it still is the same process (not a reused pid)."""
    if not same_process(p):
        return False
    try:
        os.kill(p["pid"], sig)
        return True
    except ProcessLookupError:
        return False


def busy_workers(root: int, sample_s: float = 0.5) -> tuple[list[dict], list[dict]]:
    """(busy, all) running Python workers: busy = CPU time rose over ``sample_s``; stopped ones left out."""
    before = {p["pid"]: p for p in spark_processes(root)["workers"] if p["state"] != "T"}
    time.sleep(sample_s)
    after = [p for p in spark_processes(root)["workers"] if p["state"] != "T" and p["pid"] in before
             and p["start"] == before[p["pid"]]["start"]]
    return [p for p in after if p["cpu"] > before[p["pid"]]["cpu"]], after


# ---- the fault thread (in the child) ------------------------------------------------------------

class Chaos(threading.Thread):
    """Waits for the fit's first training task, then fires the planned faults at their times."""

    def __init__(self, rest: "Rest", after_job: int, plan: list[dict], train_s: float):
        super().__init__(daemon=True, name="chaos")
        self.rest, self.after_job, self.plan, self.train_s = rest, after_job, plan, train_s
        self.stop = threading.Event()
        self.started_at: float | None = None  # wall clock of the first training task's launch
        self.fired: list[dict] = []
        self.stopped: list[tuple[dict, dict, threading.Timer]] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            while self.started_at is None and not self.stop.wait(0.25):
                self.started_at = self.rest.training_started(self.after_job)
            if self.started_at is None:
                self.errors.append("the fit ended before its first training task was seen")
                return
            for fault in self.plan:
                at = self.started_at + fault["fraction"] * self.train_s
                if self.stop.wait(max(0.0, at - time.time())):
                    return
                self.fire(fault)
        except Exception as exc:  # noqa: BLE001 - reported in the run's record
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def fire(self, fault: dict) -> None:
        me = os.getpid()
        record = {"class": fault["class"], "planned_s": round(fault["fraction"] * self.train_s, 1)}
        deadline = time.time() + 15.0
        target = None
        while target is None and time.time() < deadline and not self.stop.is_set():
            if fault["class"] == "kill_executor":
                found = spark_processes(me)["executors"]
                record["busy"] = None
            else:
                busy, found = busy_workers(me)
                record["busy"] = bool(busy)
                found = busy or found
            if found:
                target = found[int(fault["pick"] * len(found)) % len(found)]
            else:
                time.sleep(1.0)
        record["at_s"] = round(time.time() - self.started_at, 1)
        if target is None:
            record.update(pid=None, fired=False, why="no such process found in 15 s")
            self.fired.append(record)
            return
        record["pid"] = target["pid"]
        if fault["class"] == "stop_worker":
            record["fired"] = signal_process(target, signal.SIGSTOP)
            record["stop_s"] = fault["stop_s"]
            if record["fired"]:
                timer = threading.Timer(fault["stop_s"], self._resume, args=(target, record))
                timer.daemon = True
                with self.lock:
                    self.stopped.append((target, record, timer))
                timer.start()
        else:
            record["fired"] = signal_process(target, signal.SIGKILL)
        self.fired.append(record)

    def _resume(self, target: dict, record: dict) -> None:
        with self.lock:
            if "continued" in record:
                return
            record["continued"] = signal_process(target, signal.SIGCONT)  # False: it was killed meanwhile (workerTimeout)

    def close(self) -> None:
        """Stop firing; continue every worker still stopped (nothing stays stopped after the fit)."""
        self.stop.set()
        self.join(30.0)
        with self.lock:
            pending = list(self.stopped)
        for target, record, timer in pending:
            timer.cancel()
            if "continued" not in record:
                self._resume(target, record)
                record["continued_early"] = True


class Rest:
    """Spark's REST API of this application (the UI on a free port)."""

    def __init__(self, sc):
        self.base = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"

    def get(self, path: str, tries: int = 3):
        for left in range(tries - 1, -1, -1):
            try:
                with urllib.request.urlopen(self.base + path, timeout=10) as reply:
                    return json.loads(reply.read())
            except OSError:  # a busy driver: again, at most ``tries`` times
                if not left:
                    raise
                time.sleep(1.0)

    def jobs(self, after: int) -> list[dict]:
        return [j for j in self.get("/jobs") if j["jobId"] > after]

    def last_job(self) -> int:
        return max((j["jobId"] for j in self.get("/jobs")), default=-1)

    def training_started(self, after: int) -> float | None:
        """Wall clock of the first training task's launch of the first training job after ``after``, or None yet."""
        jobs = sorted((j for j in self.jobs(after) if TRAINING_JOB.match(j.get("description") or "")), key=lambda j: j["jobId"])
        if not jobs:
            return None
        times = []
        for stage in jobs[0]["stageIds"]:
            for attempt in self.get(f"/stages/{stage}"):
                if attempt.get("firstTaskLaunchedTime"):
                    times.append(_wall(attempt["firstTaskLaunchedTime"]))
        if not times and jobs[0].get("submissionTime"):  # its stage not listed yet: the job's submission
            times.append(_wall(jobs[0]["submissionTime"]))
        return min(times) if times else None

    def executors(self) -> list[dict]:
        return [e for e in self.get("/executors") if e["id"] != "driver" and e.get("isActive", True)]


def _wall(stamp: str) -> float:
    """Spark's REST time stamp (``2026-12-06T20:49:33.123GMT``) as seconds since the epoch."""
    return datetime.datetime.strptime(stamp.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc).timestamp()


# ---- the child process: one backend, mode and seed ----------------------------------------------

def child(spec: dict, out_path: str) -> None:
    """One backend, mode and seed in this process: a warm-up fit, the undisturbed fit, the disturbed
    one; what each did into ``out_path`` (JSON), also when something failed."""
    import logging

    from pyspark.sql import SparkSession

    from sparkdl.spark.daemon import session_conf

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("sparkdl").setLevel(logging.INFO)  # the driver's sparkdl log, into the child's log
    builder = (SparkSession.builder.master(MASTER).appName("sparkdl-chaos").config("spark.ui.enabled", "true")
               .config("spark.ui.port", "0").config("spark.ui.showConsoleProgress", "false")
               .config("spark.executor.memory", "512m").config("spark.task.maxFailures", str(MAX_FAILURES))
               .config(map=session_conf("tensorflow")))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    record = {"app": spark.sparkContext.applicationId}
    seen: dict[int, dict] = {}
    try:
        _child_fits(spark, spec, record, seen, out_path)
    except BaseException:
        record["child_error"] = traceback.format_exc()
        raise
    finally:
        for group in spark_processes(os.getpid()).values():
            for p in group:
                seen[p["pid"]] = {"pid": p["pid"], "start": p["start"]}
        record["processes_seen"] = list(seen.values())
        with open(out_path, "w") as f:
            json.dump(record, f)
        spark.stop()


def _child_fits(spark, spec: dict, record: dict, seen: dict, out_path: str) -> None:
    import logging

    import numpy as np

    from sparkdl.spark.daemon import start_workers

    sc = spark.sparkContext
    rest = Rest(sc)

    def note_processes():
        for group in spark_processes(os.getpid()).values():
            for p in group:
                seen[p["pid"]] = {"pid": p["pid"], "start": p["start"]}

    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            if len(rest.executors()) >= WORKERS:
                break
        except OSError:
            pass
        time.sleep(0.5)
    record["executors_at_start"] = len(rest.executors())
    started = start_workers(spark)
    if started is not None:
        started.join()

    import keras

    from sparkdl import KerasEstimator

    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    y = (x[:, 0] - x[:, 1] + 0.5 * x[:, 2] > 0).astype(np.float64)
    df = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range(ROWS)], "x array<float>, y double")
    backend, mode = spec["backend"], spec["mode"]

    def fit(epochs=EPOCHS[backend], plan=None, train_s=None):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="tanh"),
                                  keras.layers.Dense(2, activation="softmax")])
        est = KerasEstimator(model=model, optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                             featuresCol="x", labelCol="y", numWorkers=WORKERS, epochs=epochs, batchSize=BATCH,
                             localSteps=LOCAL_STEPS, verbose=0, backend=backend, mode=mode, seed=1,
                             workerTimeout=spec["worker_timeout"])
        after = rest.last_job()
        chaos = Chaos(rest, after, plan or [], train_s or 0.0)
        chaos.start()
        began = time.time()
        try:
            fitted = est.fit(df)
        except BaseException as exc:
            note_processes()
            chaos.close()
            exc.chaos = {"faults": chaos.fired, "fault_thread_errors": chaos.errors, "seconds": round(time.time() - began, 2)}
            raise
        ended = time.time()
        note_processes()
        chaos.close()
        out = {"seconds": round(ended - began, 2), "faults": chaos.fired, "fault_thread_errors": chaos.errors,
               "train_s": round(ended - chaos.started_at, 2) if chaos.started_at else None, "started_after_s":
               round(chaos.started_at - began, 2) if chaos.started_at else None}
        jobs = rest.jobs(after)
        out["spark_tasks"] = {k: sum(j.get(f"num{k.capitalize()}Tasks", 0) for j in jobs) for k in ("completed", "failed", "killed")}
        out["spark_failed_stages"] = sum(j.get("numFailedStages", 0) for j in jobs)
        info = fitted.fitInfo
        out["fit_info"] = {k: info[k] for k in ("task_attempts", "silent_attempts_killed", "worker_retrained", "rounds_run_again",
                                                "node_lost", "local_state_resets") if k in info}
        out["weights"] = [w.tolist() for w in fitted.getKerasModel().get_weights()]
        return out

    if spec["warmup"]:
        record["warmup_s"] = fit(epochs=1)["seconds"]
    base = fit()
    record["undisturbed"] = base
    plan = schedule(spec["seed"], spec["faults"])
    record["plan"] = plan
    with open(out_path, "w") as f:  # what is known so far, should the disturbed fit hang
        json.dump(record, f)
    try:
        hit = fit(plan=plan, train_s=base["train_s"] or base["seconds"])
        record["disturbed"] = hit
        record["completed"] = True
    except Exception as exc:  # noqa: BLE001 - a fit that did not survive: reported, not raised
        record["completed"] = False
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["disturbed_failed"] = getattr(exc, "chaos", None)
        logging.getLogger("sparkdl.chaos").exception("the disturbed fit failed")


# ---- the parent: one child per (backend, mode, seed) --------------------------------------------

def _env() -> dict:
    return dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)


def _difference(a, b) -> float:
    import numpy as np

    return max(float(np.abs(np.array(p) - np.array(q)).max()) for p, q in zip(a, b, strict=True))


def _first_line(text: str | None) -> str | None:
    lines = (text or "").strip().splitlines()
    return lines[0][:300] if lines else None


def _kill_leftovers(pids: list[dict]) -> int:
    killed = 0
    for p in pids:
        if signal_process(p, signal.SIGCONT) and signal_process(p, signal.SIGKILL):
            killed += 1
    return killed


def _executor_logs(app: str | None) -> str:
    """The tail of each executor's stderr of ``app`` (local-cluster writes them under SPARK_HOME/work)."""
    import pyspark

    if not app:
        return ""
    folder = os.path.join(os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__), "work", app)
    out = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name, "stderr")
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                lines = f.read().splitlines()[-60:]
            out.append(f"---- executor {name} stderr (last {len(lines)} lines)\n" + "\n".join(lines))
    return "\n".join(out)


def run_one(backend: str, mode: str, seed: int, args, folder: str) -> dict:
    tag = f"{backend}-{mode}-seed{seed}"
    out_path, log_path = os.path.join(folder, f"{tag}.json"), os.path.join(folder, f"{tag}.log")
    spec = {"backend": backend, "mode": mode, "seed": seed, "faults": args.faults, "worker_timeout": args.worker_timeout,
            "warmup": not args.no_warmup}
    record = {"backend": backend, "mode": mode, "seed": seed}
    began = time.time()
    with open(log_path, "w") as log:
        child_proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec), out_path], env=_env(),
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        seen: dict[int, dict] = {}
        timed_out = False
        while child_proc.poll() is None:  # note its Spark processes now and then: they are killed if left behind
            if time.time() - began > args.timeout:
                timed_out = True
                break
            for group in spark_processes(child_proc.pid).values():
                for p in group:
                    seen[p["pid"]] = {"pid": p["pid"], "start": p["start"]}
            time.sleep(2.0)
        if timed_out:
            for p in descendants(child_proc.pid, processes()):
                seen[p["pid"]] = {"pid": p["pid"], "start": p["start"]}
        try:
            os.killpg(child_proc.pid, signal.SIGKILL)  # the driver JVM and the executors share the child's group
        except ProcessLookupError:
            pass
        child_proc.wait(60)
    result = {}
    if os.path.exists(out_path):
        with open(out_path) as f:
            result = json.load(f)
    for p in result.get("processes_seen", []):
        seen[p["pid"]] = p
    time.sleep(2.0)  # the daemons end once their executor's pipe closes
    record["leftovers_killed"] = _kill_leftovers(list(seen.values()))
    base, hit = result.get("undisturbed"), result.get("disturbed")
    if timed_out:
        record.update(completed=False, error=f"the child process was killed at the bound ({args.timeout:g} s)")
    elif base is None:
        error = (result.get("child_error") or "").strip().splitlines()  # a traceback: its last line
        record.update(completed=False, error="the undisturbed fit did not complete" + (f": {error[-1][:300]}" if error else ""))
    else:
        record.update(completed=bool(result.get("completed")), error=_first_line(result.get("error")))
    failed = result.get("disturbed_failed") or {}
    record["faults_fired"] = (hit or failed).get("faults")
    if hit is None:
        record["plan"] = result.get("plan")
        record["failed_after_s"] = failed.get("seconds")
    record["undisturbed_s"] = base["seconds"] if base else None
    record["seconds"] = hit["seconds"] if hit else None
    if base and hit:
        record["max_abs_dw"] = _difference(hit["weights"], base["weights"])
        record["lost_per_fault_s"] = round((hit["seconds"] - base["seconds"]) / args.faults, 2)
        record["fit_info"] = hit["fit_info"]
        record["spark_tasks"] = hit["spark_tasks"]
        record["spark_failed_stages"] = hit["spark_failed_stages"]
        record["undisturbed_spark_tasks"] = base["spark_tasks"]
        record["fault_thread_errors"] = hit["fault_thread_errors"] or None
        record["first_training_task_after_s"] = hit["started_after_s"]
    record["warmup_s"] = result.get("warmup_s")
    record["child_s"] = round(time.time() - began, 1)
    if not record["completed"]:
        with open(log_path, errors="replace") as f:  # JVM stack frames left out
            lines = [line for line in f.read().splitlines() if not re.match(r"\s+(at |\.\.\. \d+ more)", line)]
        tail = "\n".join(lines[-LOG_TAIL:])
        kept = os.path.join(args.log_dir, f"chaos-{tag}.log")
        with open(kept, "w") as f:
            f.write(tail + "\n" + _executor_logs(result.get("app")) + "\n")
        record["log"] = kept
    return record


def table(records: list[dict], faults: int) -> str:
    short = {"kill_worker": "kw", "kill_executor": "ke", "stop_worker": "st"}
    lines = [f"| backend | mode | seed | faults fired (kw kill worker, ke kill executor, st stop) | completed | max \\|Δw\\| | "
             "attempts | seconds (undisturbed) | lost per fault |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        fired = r.get("faults_fired") or []
        kinds = " ".join(f"{short[f['class']]}@{f['at_s']:.0f}s" + ("" if f.get("fired") else "(missed)") for f in fired) or "—"
        info = r.get("fit_info") or {}
        attempts = info.get("task_attempts")
        if attempts is None and r.get("spark_tasks"):
            t = r["spark_tasks"]
            attempts = f"failed {t['failed']}, killed {t['killed']}"
        diff = f"{r['max_abs_dw']:.1e}" if r.get("max_abs_dw") is not None else "—"
        secs = f"{r['seconds']:.1f} ({r['undisturbed_s']:.1f})" if r.get("seconds") else f"— ({r.get('undisturbed_s') or 0:.1f})"
        lost = f"{r['lost_per_fault_s']:.1f} s" if r.get("lost_per_fault_s") is not None else "—"
        done = "yes" if r.get("completed") else f"NO: {(r.get('error') or '')[:120]}"
        lines.append(f"| {r['backend']} | {r['mode']} | {r['seed']} | {kinds} | {done} | {diff} | {attempts if isinstance(attempts, str) else json.dumps(attempts)} | {secs} | {lost} |")
    completed = [r for r in records if r.get("completed")]
    diffs = [r["max_abs_dw"] for r in completed if r.get("max_abs_dw") is not None]
    fired = sum(sum(1 for f in (r.get("faults_fired") or []) if f.get("fired")) for r in records)
    lines.append("")
    lines.append(f"{len(records)} runs of {faults} faults each ({fired} fired), {len(completed)} completed; "
                 f"largest max |Δw| {max(diffs, default=float('nan')):.1e}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--faults", type=int, default=4)
    parser.add_argument("--backends", default="rounds,ps,sharded")
    parser.add_argument("--modes", default=None, help="comma-separated round modes (default: each backend's all); "
                        "a mode a backend does not run is left out for it")
    parser.add_argument("--worker-timeout", type=float, default=20.0, help="workerTimeout (ps, sharded), seconds")
    parser.add_argument("--timeout", type=float, default=1200.0, help="bound of each child process (its three fits), seconds")
    parser.add_argument("--no-warmup", action="store_true", help="no one-epoch fit before the undisturbed one")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child[0]), args.child[1])
        return
    if args.faults < 1:
        parser.error("--faults must be >= 1")
    seeds = [int(s) for s in args.seeds.split(",")]
    backends = args.backends.split(",")
    for backend in backends:
        if backend not in MODES:
            parser.error(f"--backends: {backend!r} is not one of {sorted(MODES)}")
    wanted = args.modes.split(",") if args.modes else None
    runs = [(b, m, s) for b in backends for m in MODES[b] if wanted is None or m in wanted for s in seeds]
    if not runs:
        parser.error("no backend runs any of --modes")
    records = []
    sink = open(args.out, "w") if args.out else None
    with tempfile.TemporaryDirectory(prefix="sparkdl-chaos-") as folder:
        args.log_dir = os.path.dirname(os.path.abspath(args.out)) if args.out else tempfile.gettempdir()
        try:
            for backend, mode, seed in runs:  # one at a time: each child is a whole Spark application
                record = run_one(backend, mode, seed, args, folder)
                records.append(record)
                print(json.dumps(record), flush=True)
                if sink:
                    sink.write(json.dumps(record) + "\n")
                    sink.flush()
        finally:
            if sink:
                sink.close()
    print()
    print(table(records, args.faults))


if __name__ == "__main__":
    main()
