"""The emulated cluster (``benchmarks/netsim``: a network namespace per host, a bridge, every link
shaped both ways with ``tbf``, a Spark standalone master and one 1-core Worker per worker host) with
N = 2 at 200 Mbit/s: the bytes each host's link carries per sync round (τ = 1, Adam) match the
formulas for ``ps`` and ``sharded``. Needs root and ``ip netns``; skipped without. In ``make test-all``.

The formulas are payload bytes; the links count frames. At MTU 1500 a bulk TCP transfer's frames
carry 1514 bytes for 1448 of payload (× 1.0456, ``cluster.wire_factor``), which the test applies.
What is left over, measured (200k parameters, S = 2.40 MB): ``ps`` 1.018–1.024 × the formula on
every host, ``sharded``'s workers 1.015–1.016: the ACKs of the other direction's data (1.3 % of
a bulk transfer's payload, ``python benchmarks/netsim/cluster.py --selftest``; both directions
carry about as much here) and Flight's gRPC/TLS framing (the remaining 0.5–1 %). The tolerance stays the 5 %
the issue asks for, of the formula × the header factor; against the bare payload formula the
measured ratio is about 1.065, outside it, which is why the header factor is applied, not hidden.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

NETSIM = os.path.join(ROOT, "benchmarks", "netsim")


def _cluster_module():
    spec = importlib.util.spec_from_file_location("netsim_cluster", os.path.join(NETSIM, "cluster.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    reason = _cluster_module().unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("netsim") / "netsim.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, os.path.join(NETSIM, "run.py"), "--workers", "2", "--rate", "200", "--params", "2e5",
                           "--rounds", "4", "--backends", "ps", "sharded", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "SKIP" not in proc.stdout, proc.stdout
    return {r["backend"]: r for r in map(json.loads, out.read_text().splitlines())}


TOLERANCE = 0.05  # of the formula × the frames' header factor; the ACKs and gRPC/TLS framing take 1.5–2.5 % more


def test_ps_moves_n_times_the_state_each_way_on_the_drivers_link_and_the_state_on_each_workers(measured):
    r = measured["ps"]
    n, s = r["workers"], r["state_mb"]
    for host, stats in r["hosts"].items():
        expected = (n * s if host == "driver" else s) * r["header_factor"]
        for way in ("in_mb", "out_mb"):
            assert abs(stats[way] / expected - 1) < TOLERANCE, (host, way, stats, expected)


def test_sharded_workers_move_2n_minus_1_over_n_times_the_state_each_way_and_the_driver_a_few_kb(measured):
    r = measured["sharded"]
    n, s = r["workers"], r["state_mb"]
    for host, stats in r["hosts"].items():
        if host == "driver":  # the coordination alone: the workers' reports and the round's orders
            assert stats["in_mb"] < 0.05 and stats["out_mb"] < 0.05, stats
            continue
        # (N−1)/N·S pulled, (N−1)/N·S of pieces put, 1/N·S (its own slice's new state) to its backup holder
        expected = (2 * n - 1) / n * s * r["header_factor"]
        for way in ("in_mb", "out_mb"):
            assert abs(stats[way] / expected - 1) < TOLERANCE, (host, way, stats, expected)
