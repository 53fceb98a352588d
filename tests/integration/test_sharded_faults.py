"""Backend ``sharded`` survives real faults, end to end through Spark, each in a process of its own:
an executor JVM that owns a slice SIGKILLed mid-fit (``local-cluster[3,1,1024]``), the driver
SIGKILLed mid-fit and its job run again with the same ``checkpointDir``, and a slice owner cut off
rather than killed: a standalone Worker in a network namespace of its own (``ip netns``, as root)
whose link is taken down mid-round. Each ends with the model of an undisturbed fit (1e-5). The
executor kill in two shapes (no spare slot, so Spark resubmits the whole stage; a spare executor and
an input the user already repartitioned), the driver kill and the network cut run in the default
run; a slice found nowhere (it fails the fit at once, naming it) in ``make test-all``. A SIGKILLed Python worker is in ``tests/spark/test_faults.py``."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.conftest import ROOT


HEAD = textwrap.dedent(
    """
    import json, os, subprocess, sys, tempfile, time
    import numpy as np
    from pyspark.sql import SparkSession
    import keras
    from sparkdl import KerasEstimator
    from sparkdl.spark.training import faults
    builder = SparkSession.builder.master(os.environ["TEST_MASTER"]).config("spark.ui.enabled", "false") \\
        .config("spark.ui.showConsoleProgress", "false").config("spark.executor.memory", "512m")
    for key, value in json.loads(os.environ.get("TEST_CONF", "{}")).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    import logging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")  # into the run's log
    rng = np.random.default_rng(0)
    x = rng.normal(size=(90, 4)).astype(np.float32)
    y = (x[:, 0] - x[:, 1] > 0).astype(np.float64)
    df = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range(90)], "x array<float>, y double")

    def fit(hook=None, workers=3, **kw):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2, activation="softmax")])
        params = dict(numWorkers=workers, epochs=2, batchSize=5, localSteps=2, verbose=0, backend="sharded", seed=1)
        params.update(kw)
        est = KerasEstimator(model=model, optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy",
                             featuresCol="x", labelCol="y", **params)
        if hook is None:
            return est.fit(df)
        with faults.inject(hook):
            return est.fit(df)

    def weights(model):
        return [w.tolist() for w in model.getKerasModel().get_weights()]
    """
)


def _run(script: str, out, env: dict, timeout_s: float = 800, args=()) -> dict:
    full = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, **env)
    log = out.with_suffix(".log")
    with open(log, "w") as sink:
        try:
            code = subprocess.run([sys.executable, "-c", script, str(out), *args], env=full, timeout=timeout_s, stdout=sink,
                                  stderr=subprocess.STDOUT).returncode
        except subprocess.TimeoutExpired:
            code = f"killed at the test's timeout ({timeout_s} s)"
    assert code == 0, f"{code}: {log.read_text()[-6000:]}"
    return json.loads(out.read_text())


def _difference(a, b):
    return max(float(np.abs(np.array(p) - np.array(q)).max()) for p, q in zip(a, b, strict=True))


EXECUTOR_KILL = HEAD + textwrap.dedent(
    """
    if os.environ.get("TEST_REPARTITION"):  # an input the user already repartitioned (itself a shuffle's output)
        df = df.repartition(int(os.environ["TEST_REPARTITION"]))
    extra = {"overlap": True} if os.environ.get("TEST_OVERLAP") else {}
    base = fit(**extra)
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hit = fit(faults.Fault(partition=1, index=int(os.environ.get("TEST_FAULT_ROUND", "3")), how="executor",
                               marker_dir=tempfile.mkdtemp()), **extra)
    json.dump({"base": weights(base), "hit": weights(hit), "attempts": hit.fitInfo["task_attempts"], "overlap": hit.fitInfo["overlap"],
               "resets": hit.fitInfo.get("local_state_resets"), "rebuilt": hit.fitInfo.get("worker_starts_rebuilt"),
               "warned": [str(w.message) for w in caught if "local_state_resets" in str(w.message)],
               "retrained": hit.fitInfo["worker_retrained"], "loss": hit.history["loss"]}, open(sys.argv[1], "w"))
    spark.stop()
    """
)


@pytest.mark.parametrize(("master", "repartition"), [
    # no spare slot: the lost executor takes the library's repartition's shuffle output along, the retried task hits
    # FetchFailed and Spark resubmits the whole stage; every owner gets a new attempt while the old ones still run
    ("local-cluster[3,1,1024]", None),
    # one spare executor, and an input the user already repartitioned: the retry may run on the spare at once
    ("local-cluster[4,1,1024]", "3"),
], ids=["no-spare-slot", "spare-executor-repartitioned-input"])
def test_an_executor_jvm_that_owns_a_slice_killed_mid_fit_is_retried_with_the_same_model(tmp_path, master, repartition):
    """Slice 1's executor JVM is SIGKILLed before round 4: Spark runs its task again on another
    executor, the slice is served again from a copy its backup holder kept (in memory, or on its
    executor's disk when the holder's own task was superseded by a resubmitted stage), the other
    workers put their round-4 pieces to it again, and the fit ends as the undisturbed one."""
    env = {"TEST_MASTER": master, **({"TEST_REPARTITION": repartition} if repartition else {})}
    out = _run(EXECUTOR_KILL, tmp_path / "out.json", env, timeout_s=800)
    assert _difference(out["hit"], out["base"]) < 1e-5
    assert out["attempts"]["1"] >= 2 and out["retrained"][1] == 1, out
    assert out["resets"] == 0 and out["warned"] == []  # nothing a worker kept was lost: no warning
    assert len(out["loss"]) == 2 and all(np.isfinite(out["loss"]))


@pytest.mark.slow
def test_an_executor_jvm_killed_mid_fit_with_overlap_is_retried_with_the_same_model(tmp_path):
    """``overlap``: slice 1's executor JVM is SIGKILLed before round 5, which follows its worker's
    round 4 (3 rounds an epoch: not a sync point). The slice comes back from its backup holder (no
    spare slot: Spark resubmits the whole stage). The worker's own start of round 5 (its carried
    contribution to round 4) went with the executor's disk, and a worker whose new attempt runs on
    another executor than its last one finds none there either: each assembles it from the pieces the
    owners kept (its own slice's at its backup holder; a superseded attempt hands its pieces and its
    own start to an owner of the new stage attempt), and the fit ends as the undisturbed overlapped one."""
    env = {"TEST_MASTER": "local-cluster[3,1,1024]", "TEST_OVERLAP": "1", "TEST_FAULT_ROUND": "4"}
    out = _run(EXECUTOR_KILL, tmp_path / "out.json", env, timeout_s=800)
    assert out["overlap"] is True and out["resets"] == 0 and out["warned"] == [], out
    assert 1 <= sum(out["rebuilt"]) <= 3 and out["rebuilt"][1] == 1, out  # the killed worker's at least
    assert _difference(out["hit"], out["base"]) < 1e-5
    assert out["attempts"]["1"] >= 2 and out["retrained"][1] == 1, out
    assert len(out["loss"]) == 2 and all(np.isfinite(out["loss"]))


DRIVER = HEAD + textwrap.dedent(
    """
    class Pause(keras.callbacks.Callback):  # time for the test to kill the driver after epoch 2's snapshot
        def on_epoch_end(self, epoch, logs=None):
            if sys.argv[2] == "killed":
                time.sleep(3)

    model = fit(workers=2, epochs=4, mode="bmuf", checkpointDir=sys.argv[3], callbacks=[Pause()])
    whole = fit(workers=2, epochs=4, mode="bmuf")  # the uninterrupted fit, in the resumed job's process (warm)
    json.dump({"weights": weights(model), "whole": weights(whole), "resumed": model.fitInfo.get("resumed_from_epoch"),
               "epochs_run": model.fitInfo["epochs_run"]}, open(sys.argv[1], "w"))
    spark.stop()
    """
)


def test_a_driver_killed_mid_fit_resumes_from_the_slices_its_owners_wrote_equal_to_an_uninterrupted_fit(tmp_path):
    """The driver process SIGKILLed (with its process group: its executors' Python workers and their
    slice servers) after epoch 2's snapshot; the job run again with the same ``checkpointDir``
    resumes from the slices the owners wrote and ends as an uninterrupted fit (bmuf, whose block
    momentum lives in the slices)."""
    env = {"TEST_MASTER": "local[2]"}
    folder = tmp_path / "checkpoints"
    full = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, **env)
    killed = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "killed.json"), "killed", str(folder)], env=full,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        # epoch 2's snapshot is complete: its marker written whole (64 hex digits; a marker killed half-written makes an
        # incomplete snapshot, which the run again rightly skips for epoch 1's)
        while time.monotonic() < deadline and not any(p.stat().st_size == 64 for p in folder.glob("snapshot-*-000002.done")):
            assert killed.poll() is None, killed.stderr.read()[-3000:]
            time.sleep(0.1)
        assert list(folder.glob("snapshot-*-000002.slice-*-of-2.arrow")), list(folder.iterdir())  # the owners wrote its slices
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(killed.pid, signal.SIGKILL)  # the driver, its executors' Python workers and their slice servers die mid-fit
        killed.wait(60)
    assert not (tmp_path / "killed.json").exists()
    again = _run(DRIVER, tmp_path / "again.json", env, args=("again", str(folder)))
    assert again["resumed"] >= 2 and again["epochs_run"] == 4 - again["resumed"], again
    assert _difference(again["weights"], again["whole"]) < 1e-5


# ---- a slice owner cut off: a standalone Worker in a network namespace whose link goes down ---------

NETCUT = HEAD + textwrap.dedent(
    """
    class Cut(faults.TaskHooks):
        \"\"\"Before round 4, the task that runs in the network namespace takes its own link down (once).\"\"\"
        def __init__(self, link, markers):
            self.link, self.markers = link, markers
        def __setstate__(self, state):  # unpickled in a Python worker: its sparkdl log into the executor's stderr
            self.__dict__.update(state)
            import logging
            log = logging.getLogger("sparkdl")
            if "pyspark.worker" in sys.modules and not any(getattr(h, "in_test", False) for h in log.handlers):
                handler = logging.StreamHandler()
                handler.in_test = True
                handler.setFormatter(logging.Formatter("%(asctime)s sparkdl worker pid %(process)d %(levelname)s %(message)s"))
                log.addHandler(handler)
                log.setLevel(logging.INFO)
        def before_steps(self, point):
            if point.index != 3 or not os.path.exists("/sys/class/net/" + self.link):
                return
            try:
                fd = os.open(os.path.join(self.markers, "partition"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.write(fd, str(point.partition).encode())
            os.close(fd)
            subprocess.run(["ip", "link", "set", self.link, "down"], check=True)

    base = fit()
    hit = fit(Cut(os.environ["TEST_NS_LINK"], sys.argv[2]), workerTimeout=240.0, roundTimeout=300.0)  # a stall fails, named
    json.dump({"base": weights(base), "hit": weights(hit), "attempts": hit.fitInfo["task_attempts"],
               "retrained": hit.fitInfo["worker_retrained"], "cut": int(open(os.path.join(sys.argv[2], "partition")).read())},
              open(sys.argv[1], "w"))
    spark.stop()
    """
)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def netns_cluster(tmp_path):
    """A standalone Spark cluster on this machine: a master and a 3-core Worker on a veth address of
    the root namespace, and a 1-core Worker in a network namespace of its own, reached through the
    veth pair; every process and the namespace removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None or _ip("netns", "list", check=False).returncode != 0:
        pytest.skip("needs root and iproute2's ip netns")
    tag = f"sd{os.getpid() % 100000}"
    ns, host_link, ns_link = f"{tag}ns", f"{tag}h", f"{tag}n"
    subnet = f"10.203.{os.getpid() % 250}"  # per run: two runs at once (a loaded machine's check beside CI) never share a route
    host_ip, ns_ip = f"{subnet}.1", f"{subnet}.2"
    spark_class = os.path.join(os.path.dirname(sys.executable), "spark-class")
    procs = []
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", host_link, "type", "veth", "peer", "name", ns_link)
        _ip("link", "set", ns_link, "netns", ns)
        _ip("addr", "add", f"{host_ip}/24", "dev", host_link)
        _ip("link", "set", host_link, "up")
        for args in (("addr", "add", f"{ns_ip}/24", "dev", ns_link), ("link", "set", ns_link, "up"), ("link", "set", "lo", "up")):
            _ip("netns", "exec", ns, "ip", *args)
        port = _free_port(host_ip)
        master = f"spark://{host_ip}:{port}"
        base_env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1",
                        SPARK_WORKER_DIR=str(tmp_path / "work"), SPARK_LOG_DIR=str(tmp_path / "logs"))
        log = open(tmp_path / "daemons.log", "w")

        def start(cmd, ip, **env):
            procs.append(subprocess.Popen(cmd, env=dict(base_env, SPARK_LOCAL_IP=ip, **env), stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))

        start([spark_class, "org.apache.spark.deploy.master.Master", "--host", host_ip, "--port", str(port),
               "--webui-port", str(_free_port(host_ip))], host_ip,
              SPARK_MASTER_OPTS="-Dspark.worker.timeout=15")  # the cut Worker's cores freed in 15 s, not 60
        time.sleep(3)
        start([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", host_ip, "--cores", "3", "--memory", "3g",
               "--webui-port", str(_free_port(host_ip)), master], host_ip)
        start(["ip", "netns", "exec", ns, spark_class, "org.apache.spark.deploy.worker.Worker", "--host", ns_ip, "--cores", "1",
               "--memory", "1g", "--webui-port", "8999", master], ns_ip)
        time.sleep(5)
        yield {"master": master, "host_ip": host_ip, "ns_link": ns_link, "log": tmp_path / "daemons.log"}
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in _ip("netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        for proc in procs:
            proc.wait(30)
        _ip("link", "del", host_link, check=False)
        _ip("netns", "del", ns, check=False)


def test_a_slice_owner_cut_off_from_the_network_mid_round_is_replaced_with_the_same_model(tmp_path, netns_cluster):
    """The task in the namespace takes its link down before round 4: its executor stops answering,
    Spark declares it lost (spark.network.timeout 20 s), the master starts a replacement executor, the
    task runs again there and serves its slice again from its backup holder; the other workers put
    their round-4 pieces to it, and the fit ends as the undisturbed one."""
    conf = {"spark.driver.host": netns_cluster["host_ip"], "spark.driver.bindAddress": netns_cluster["host_ip"],
            "spark.cores.max": "3", "spark.executor.cores": "1", "spark.network.timeout": "20s",
            "spark.network.timeoutInterval": "2s", "spark.executor.heartbeatInterval": "2s", "spark.task.maxFailures": "4"}
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {"TEST_MASTER": netns_cluster["master"], "TEST_CONF": json.dumps(conf), "TEST_NS_LINK": netns_cluster["ns_link"],
           "SPARK_LOCAL_IP": netns_cluster["host_ip"]}
    try:
        out = _run(NETCUT, tmp_path / "out.json", env, timeout_s=800, args=(str(markers),))
    except AssertionError:
        print(netns_cluster["log"].read_text()[-4000:])
        for path in sorted((tmp_path / "work").glob("*/*/stderr")):  # each executor's own log
            print(f"---- {path.relative_to(tmp_path)}\n{path.read_text()[-3000:]}")
        raise
    assert _difference(out["hit"], out["base"]) < 1e-5
    assert out["attempts"][str(out["cut"])] >= 2 and out["retrained"][out["cut"]] == 1, out


LOST = HEAD + textwrap.dedent(
    """
    from sparkdl.spark.partitions import spill_dir

    class LoseBoth(faults.TaskHooks):
        \"\"\"Before round 3 both workers die at once (SIGKILL), slice 1's disk copies deleted first: slice 1's
        owner, its backup holder (slice 0's owner) and the executor's copy are gone together.\"\"\"
        def __init__(self, fit_id_dir, markers):
            self.markers = markers
        def before_steps(self, point):
            if point.index != 2:
                return
            try:
                fd = os.open(os.path.join(self.markers, f"p{point.partition}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.close(fd)
            import glob, signal, time
            if point.partition == 1:
                for path in glob.glob(os.path.join(os.path.dirname(spill_dir("x")), "sparkdl-*", "slice-1-v*.arrow")):
                    os.remove(path)
            while len(os.listdir(self.markers)) < 2:  # both at once
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)

    started = time.perf_counter()
    try:
        fit(LoseBoth(None, sys.argv[2]), workers=2, workerTimeout=60.0)
        out = {"failed": False}
    except Exception as exc:
        out = {"failed": True, "type": type(exc).__name__, "message": str(exc)}
    out["seconds"] = time.perf_counter() - started
    json.dump(out, open(sys.argv[1], "w"))
    spark.stop()
    """
)


@pytest.mark.slow  # the default run's budget: a lost slice's retry path runs in the three tests above; make test-all
def test_a_slice_found_nowhere_fails_the_fit_naming_it_instead_of_hanging(tmp_path):
    """Slice 1's owner and its backup holder killed together, and slice 1's copies on the executor's
    disk gone: the retried task cannot serve it again, and the fit fails (no hang) naming the slice
    and where it was looked for."""
    markers = tmp_path / "markers"
    markers.mkdir()
    out = _run(LOST, tmp_path / "out.json", {"TEST_MASTER": "local[2,4]"}, timeout_s=800, args=(str(markers),))
    assert out["failed"] and out["type"] == "WorkerError", out
    assert "SliceLost: slice 1 (task attempt" in out["message"] and "found nowhere" in out["message"], out["message"][:2000]
    assert "owner: worker 1" in out["message"] and "backup holder: worker 0" in out["message"], out["message"][:2000]
    assert "no retry can mend this" in out["message"] and "maxFailures" not in out["message"]
