"""An emulated cluster on one machine: a driver host and N worker hosts, each in a network namespace
of its own, joined by a Linux bridge, every host's link shaped in both directions, with a Spark
standalone master on the driver host and one 1-core Worker per worker host.

Topology (``P`` = ``sdns<pid>-``, the creating process's id, so that concurrent runs and stale
leftovers are told apart)::

    namespace P d  (driver host, 10.207.0.1)   eth0 ─┐            ┌─ namespace P br: bridge br0
    namespace P w0 (worker host, 10.207.0.10)  eth0 ─┼── veth ────┤    ports d, w0, w1, ...
    namespace P w1 (worker host, 10.207.0.11)  eth0 ─┘            └─ (no address: a switch)

Every veth pair is created between two namespaces this module made (nothing is added to, or
routed through, the root namespace: every address is in ``10.207.0.0/24`` inside them). A host's
upload is shaped by a ``tbf`` qdisc on its own end (``eth0``), its download by one on the bridge's
end: a full-duplex link of ``rate`` Mbit/s each way (``netem`` is not available here: no added
delay; the bridge itself is not a bottleneck). Segmentation offload is turned off on both ends
(``gso_max_segs 1``) so the kernel hands the links frames of at most the MTU, as a real NIC puts
them on the wire, and the link counters (``/sys/class/net/eth0/statistics/{rx,tx}_bytes`` of each
host's namespace, read with ``ip -n NS -s -j link``) count every frame's Ethernet, IP and TCP
headers: at MTU 1500 a bulk transfer's counted bytes are its payload × 1514 / 1448 (+4.6 %).

:class:`EmulatedCluster` is a context manager: on exit, on an exception, at interpreter exit
(``atexit``) and on SIGTERM/SIGINT/SIGHUP it kills every process in its namespaces (the Spark
daemons, the executors they started, any command run with :meth:`EmulatedCluster.popen`) and
deletes the namespaces (with them every veth, the bridge and every qdisc). A run killed with SIGKILL
leaves its namespaces behind: ``python benchmarks/netsim/cluster.py --cleanup-stale`` removes those
whose creating process is gone (names ``sdns<pid>-*`` only).

Needs root, iproute2 (``ip netns``, ``tc``) and the ``tbf`` qdisc; :func:`unavailable` says why not,
for a caller to skip with (``python benchmarks/netsim/cluster.py --selftest`` checks the links).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUBNET = "10.207.0"  # a private test subnet, inside the namespaces only
DEV = "eth0"  # each host's end of its link, inside the host's namespace
PREFIX = "sdns"
_STALE = re.compile(rf"^{PREFIX}(\d+)-")


def _run(args: list[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def unavailable() -> str | None:
    """Why the emulated cluster cannot be built here (None: it can): root, ``ip netns``, ``tc``,
    the veth, bridge and tbf kernel support, checked by building a throwaway namespace."""
    if os.geteuid() != 0:
        return "the emulated cluster needs root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the emulated cluster needs iproute2's {tool}"
    ns = f"{PREFIX}{os.getpid()}-probe"
    try:
        if _run(["ip", "netns", "add", ns], check=False).returncode != 0:
            return "ip netns add failed (no network namespaces here)"
        for args in (["ip", "-n", ns, "link", "add", "name", "p0", "type", "veth", "peer", "name", "p1"],
                     ["ip", "-n", ns, "link", "add", "name", "b0", "type", "bridge"],
                     ["tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "tbf", "rate", "100mbit", "burst", "32kb", "latency", "50ms"]):
            proc = _run(args, check=False)
            if proc.returncode != 0:
                return f"{' '.join(args[3:])}: {proc.stderr.strip()}"
        return None
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"ip netns: {e}"
    finally:
        _run(["ip", "netns", "del", ns], check=False)


def cleanup_stale() -> list[str]:
    """Delete the namespaces ``sdns<pid>-*`` whose creating process no longer runs (a run killed
    with SIGKILL), after killing the processes still in them; returns their names."""
    removed = []
    for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _STALE.match(name)
        if not m or _alive(int(m.group(1))):
            continue
        _kill_namespace(name)
        _run(["ip", "netns", "del", name], check=False)
        removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(ns: str) -> None:
    """SIGKILL every process in namespace ``ns`` (each was started in it by this module, or by one
    of those: an executor under a Worker)."""
    for _ in range(5):
        pids = [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).stdout.split() if p.isdigit()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)


@dataclass
class Host:
    """One emulated host: its namespace, its address, its bridge port's name (in the bridge's
    namespace) and the processes started in it."""

    name: str
    ns: str
    ip: str
    port: str
    procs: list = field(default_factory=list)


class EmulatedCluster:
    """``workers`` worker hosts and a driver host on a bridge, each link ``rate_mbit`` each way.

    Args:
        workers: the number of worker hosts (one 1-core Spark Worker each with ``spark=True``).
        rate_mbit: each host's link rate, each way, in Mbit/s (10^6 bit/s).
        mtu: the links' MTU (1500: Ethernet's; frames carry 66 bytes of headers with TCP timestamps).
        latency_ms: ``tbf``'s latency (its queue: rate × latency bytes; packets beyond are dropped).
        burst_kb: ``tbf``'s bucket (None: 1 ms at the rate, at least 16 KB).
        spark: start the Spark standalone master (driver host) and Workers (one per worker host).
        worker_memory: each Worker's memory (``--memory``).
        workdir: where the daemons' logs and work dirs go (None: a temp dir, kept on failure).
    """

    def __init__(self, workers: int, rate_mbit: float, mtu: int = 1500, latency_ms: float = 100.0,
                 burst_kb: float | None = None, spark: bool = True, worker_memory: str = "2g", workdir: str | None = None,
                 spark_class: str | None = None, python: str | None = None) -> None:
        if workers < 1 or workers > 200:
            raise ValueError(f"workers must be 1..200, got {workers}")
        self.rate_mbit, self.mtu, self.latency_ms = float(rate_mbit), int(mtu), float(latency_ms)
        self.burst_kb = burst_kb if burst_kb is not None else max(16.0, self.rate_mbit * 1e6 / 8 / 1000 / 1024)
        self.spark, self.worker_memory = spark, worker_memory
        self.python = python or sys.executable
        self.spark_class = spark_class or os.path.join(os.path.dirname(self.python), "spark-class")
        self.prefix = f"{PREFIX}{os.getpid()}-"
        self.bridge_ns = self.prefix + "br"
        self.driver = Host("driver", self.prefix + "d", f"{SUBNET}.1", "p-d")
        self.workers = [Host(f"worker{i}", self.prefix + f"w{i}", f"{SUBNET}.{10 + i}", f"p-w{i}") for i in range(workers)]
        self.workdir = workdir or tempfile.mkdtemp(prefix="netsim-")
        self.master = f"spark://{self.driver.ip}:7077"
        self._namespaces: list[str] = []
        self._lock = threading.Lock()
        self._closed = False
        self._previous_handlers: dict = {}

    @property
    def hosts(self) -> list[Host]:
        return [self.driver, *self.workers]

    # ---- up ----------------------------------------------------------------------------------

    def __enter__(self) -> EmulatedCluster:
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self._network()
            if self.spark:
                self._start_spark()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _on_signal(self, signum, frame) -> None:
        self.close()
        raise SystemExit(128 + signum)

    def _ns(self, name: str) -> str:
        _run(["ip", "netns", "add", name])
        self._namespaces.append(name)
        _run(["ip", "-n", name, "link", "set", "dev", "lo", "up"])
        return name

    def _network(self) -> None:
        br = self._ns(self.bridge_ns)
        _run(["ip", "-n", br, "link", "add", "name", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        _run(["ip", "-n", br, "link", "set", "dev", "br0", "up"])
        for host in self.hosts:
            self._ns(host.ns)
            # the pair is born in the host's namespace with its other end in the bridge's: never in the root namespace
            _run(["ip", "-n", host.ns, "link", "add", "name", DEV, "mtu", str(self.mtu), "gso_max_segs", "1", "type", "veth",
                  "peer", "name", host.port, "mtu", str(self.mtu), "gso_max_segs", "1", "netns", br])
            _run(["ip", "-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", DEV])
            _run(["ip", "-n", host.ns, "link", "set", "dev", DEV, "up"])
            _run(["ip", "-n", br, "link", "set", "dev", host.port, "master", "br0"])
            _run(["ip", "-n", br, "link", "set", "dev", host.port, "up"])
            for ns, dev in ((host.ns, DEV), (br, host.port)):  # upload, download
                _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{self.rate_mbit}mbit",
                      "burst", f"{self.burst_kb:.0f}kb", "latency", f"{self.latency_ms}ms"])
        deadline = time.monotonic() + 30  # every port forwarding (no STP, no forward delay: at once)
        while True:
            ports = json.loads(_run(["ip", "-n", br, "-j", "link", "show", "master", "br0"]).stdout or "[]")
            if len(ports) == len(self.hosts) and all(p.get("operstate") in ("UP", "UNKNOWN") for p in ports):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the bridge's ports are not up within 30 s: {ports}")
            time.sleep(0.2)

    def daemon_env(self, host: Host, **extra) -> dict:
        """The environment of a process on ``host``: this interpreter for PySpark, the repository
        on PYTHONPATH, Spark on the host's address, the daemons in the foreground."""
        env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=self.python, PYSPARK_DRIVER_PYTHON=self.python,
                   SPARK_LOCAL_IP=host.ip, SPARK_NO_DAEMONIZE="1", SPARK_LOG_DIR=os.path.join(self.workdir, "logs"),
                   SPARK_WORKER_DIR=os.path.join(self.workdir, f"work-{host.name}"))
        env.update(extra)
        return env

    def popen(self, host: Host, cmd: list[str], log: str | None = None, env: dict | None = None, **kw) -> subprocess.Popen:
        """Start ``cmd`` in ``host``'s namespace (its own session); killed on :meth:`close`."""
        sink = open(log or os.devnull, "a")
        proc = subprocess.Popen(["ip", "netns", "exec", host.ns, *cmd], env=env or self.daemon_env(host), stdout=sink,
                                stderr=subprocess.STDOUT if log else sink, start_new_session=True, **kw)
        sink.close()
        host.procs.append(proc)
        return proc

    def _start_spark(self) -> None:
        logs = os.path.join(self.workdir, "daemons")
        os.makedirs(logs, exist_ok=True)
        self.popen(self.driver, [self.spark_class, "org.apache.spark.deploy.master.Master", "--host", self.driver.ip,
                                 "--port", "7077", "--webui-port", "8080"], log=os.path.join(logs, "master.log"))
        self._wait_port(self.driver, 7077, 180, "the Spark master")
        for host in self.workers:
            self.popen(host, [self.spark_class, "org.apache.spark.deploy.worker.Worker", "--host", host.ip, "--cores", "1",
                              "--memory", self.worker_memory, "--webui-port", "8081", self.master],
                       log=os.path.join(logs, f"{host.name}.log"))
        deadline = time.monotonic() + 240
        while self.alive_workers() < len(self.workers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.alive_workers()} of {len(self.workers)} Workers registered within 240 s; "
                                   f"logs in {logs}")
            for host in self.hosts:
                for proc in host.procs:
                    if proc.poll() is not None:
                        raise RuntimeError(f"a Spark daemon on {host.name} exited ({proc.returncode}); logs in {logs}")
            time.sleep(2)

    def _wait_port(self, host: Host, port: int, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while _run(["ip", "netns", "exec", host.ns, "ss", "-Hltn", f"sport = :{port}"], check=False).stdout.strip() == "":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on {host.ip}:{port} within {timeout_s:.0f} s; logs in {self.workdir}")
            if any(p.poll() is not None for p in host.procs):
                raise RuntimeError(f"{what} exited; logs in {self.workdir}")
            time.sleep(1)

    def alive_workers(self) -> int:
        """Workers the master shows ALIVE (its web UI's JSON, read from the driver's namespace)."""
        proc = _run(["ip", "netns", "exec", self.driver.ns, self.python, "-c",
                     "import json, urllib.request; print(json.dumps(json.loads(urllib.request.urlopen("
                     f"'http://{self.driver.ip}:8080/json/', timeout=5).read())['aliveworkers']))"], check=False, timeout=30)
        try:
            return int(proc.stdout.strip())
        except ValueError:
            return 0

    def spark_conf(self) -> dict[str, str]:
        """The settings a driver in the driver host's namespace needs: its address, one 1-core
        executor per Worker."""
        return {"spark.driver.host": self.driver.ip, "spark.driver.bindAddress": self.driver.ip,
                "spark.executor.cores": "1", "spark.cores.max": str(len(self.workers)), "spark.task.cpus": "1"}

    # ---- counters ----------------------------------------------------------------------------

    def counters(self) -> dict[str, dict[str, int]]:
        """Per host: ``rx``/``tx`` bytes of its link (``eth0`` in its namespace: what the host
        received / sent, every frame's headers included) and ``drops``: packets its two qdiscs
        (upload, download) dropped so far (a full queue: TCP sends those again)."""
        return read_counters(self.describe())

    def describe(self) -> dict:
        """What a process elsewhere (the driver, in its namespace) needs to read the counters
        (:func:`read_counters`), as JSON-able values."""
        return {"bridge_ns": self.bridge_ns, "rate_mbit": self.rate_mbit, "mtu": self.mtu, "master": self.master,
                "hosts": [{"name": h.name, "ns": h.ns, "ip": h.ip, "port": h.port} for h in self.hosts]}


    # ---- down --------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process in the cluster's namespaces and delete the namespaces (their veths,
        the bridge and the qdiscs go with them). Idempotent; safe from a signal handler."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for host in self.hosts:
            for proc in host.procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for ns in reversed(self._namespaces):
            _kill_namespace(ns)
        for host in self.hosts:
            for proc in host.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
        for ns in reversed(self._namespaces):
            _run(["ip", "netns", "del", ns], check=False)
        self._namespaces.clear()
        for sig, handler in self._previous_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


def read_counters(description: dict) -> dict[str, dict[str, int]]:
    """:meth:`EmulatedCluster.counters` from its :meth:`~EmulatedCluster.describe` (``ip -n``
    reaches a namespace by name from any namespace, as root)."""
    out = {}
    for host in description["hosts"]:
        stats = json.loads(_run(["ip", "-n", host["ns"], "-s", "-j", "link", "show", "dev", DEV]).stdout)[0]["stats64"]
        out[host["name"]] = {"rx": int(stats["rx"]["bytes"]), "tx": int(stats["tx"]["bytes"]),
                             "drops": _drops(host["ns"], DEV) + _drops(description["bridge_ns"], host["port"])}
    return out


def _drops(ns: str, dev: str) -> int:
    for q in json.loads(_run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev]).stdout or "[]"):
        if q.get("kind") == "tbf":
            return int(q.get("drops", 0))
    return 0


def wire_factor(mtu: int) -> float:
    """Counted bytes per TCP payload byte of a bulk transfer: a frame of ``mtu + 14`` bytes
    (Ethernet header) carries ``mtu - 52`` (IPv4 20, TCP 20 with its 12 bytes of timestamps)."""
    return (mtu + 14) / (mtu - 52)


# ---- a check of the links alone -----------------------------------------------------------------

_SINK = "import socket,sys;s=socket.socket();s.bind((sys.argv[1],5001));s.listen();c,_=s.accept()\nwhile c.recv(1<<20):pass"
_SOURCE = ("import socket,sys,time;c=socket.create_connection((sys.argv[1],5001),timeout=60);b=bytes(1<<20);t=time.perf_counter()\n"
           "for _ in range(int(sys.argv[2])):c.sendall(b)\nc.close();print(time.perf_counter()-t)")


def selftest(rate_mbit: float = 200, megabytes: int = 40) -> dict:
    """``megabytes`` MiB from worker 0 to the driver over TCP, without Spark: the seconds (against
    the rate), and each end's counted bytes per payload byte (headers: 1514 / 1448 at MTU 1500)."""
    with EmulatedCluster(workers=1, rate_mbit=rate_mbit, spark=False) as cluster:
        sink = cluster.popen(cluster.driver, [sys.executable, "-c", _SINK, cluster.driver.ip])
        time.sleep(1)
        before = cluster.counters()
        source = subprocess.run(["ip", "netns", "exec", cluster.workers[0].ns, sys.executable, "-c", _SOURCE, cluster.driver.ip,
                                 str(megabytes)], capture_output=True, text=True, timeout=300)
        sink.wait(60)
        after = cluster.counters()
        payload = megabytes * (1 << 20)
        seconds = float(source.stdout.strip())
        return {"rate_mbit": rate_mbit, "payload_mb": payload / 1e6, "seconds": round(seconds, 3),
                "achieved_mbit": round(payload * 8 / seconds / 1e6, 1),
                "sender_tx_per_payload": round((after["worker0"]["tx"] - before["worker0"]["tx"]) / payload, 4),
                "receiver_rx_per_payload": round((after["driver"]["rx"] - before["driver"]["rx"]) / payload, 4),
                "receiver_acks_per_payload": round((after["driver"]["tx"] - before["driver"]["tx"]) / payload, 4),
                "drops": after["worker0"]["drops"] + after["driver"]["drops"]}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--selftest", action="store_true", help="a TCP transfer between two hosts, without Spark")
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--cleanup-stale", action="store_true", help="remove the namespaces of runs that are gone")
    args = parser.parse_args()
    if args.cleanup_stale:
        print("removed:", " ".join(cleanup_stale()) or "nothing")
    else:
        reason = unavailable()
        if reason:
            print(f"SKIP: {reason}")
            sys.exit(0)
        print(json.dumps(selftest(args.rate)))
