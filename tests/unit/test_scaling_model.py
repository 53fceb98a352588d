"""``benchmarks/scaling_model.py`` (issue 24, item 5): the cost model fitted to the measured
``local-cluster`` points of ``benchmarks/scaling.py`` (kept in ``benchmarks/scaling_measured.jsonl``)
reproduces them, and its projection behaves as its equations say. No Spark, no Keras."""

import importlib.util
import math
import sys

import pytest

from tests.conftest import ROOT

SPEC = importlib.util.spec_from_file_location("scaling_model", f"{ROOT}/benchmarks/scaling_model.py")
model = importlib.util.module_from_spec(SPEC)
sys.modules.setdefault("scaling_model", model)  # its dataclass looks its module up
SPEC.loader.exec_module(sys.modules["scaling_model"])
model = sys.modules["scaling_model"]

MEASURED = f"{ROOT}/benchmarks/scaling_measured.jsonl"
# the errors docs/scaling.md states for the fitted model against the measured points (%)
# bytes into the driver within 5 %, out of it (the torrent broadcast's random peers) within 15 %,
# round seconds (2 shared cores at load average 18-50) within 20 % at the median of the points
IN_ERROR_PCT, OUT_ERROR_PCT, SECONDS_MEDIAN_ERROR_PCT = 5.0, 15.0, 20.0


@pytest.fixture(scope="module")
def points():
    return model.load(MEASURED)


@pytest.fixture(scope="module")
def fitted(points):
    return model.fit(points)


def test_the_fitted_model_reproduces_the_measured_points(points, fitted):
    assert {p["executors"] for p in points} == {2, 4, 8} and {p["backend"] for p in points} == {"rounds", "ps"}
    checked = model.check(points, fitted)
    assert max(abs(c["in_err_pct"]) for c in checked) <= IN_ERROR_PCT
    assert max(abs(c["out_err_pct"]) for c in checked) <= OUT_ERROR_PCT
    errors = sorted(abs(c["round_err_pct"]) for c in checked)
    assert errors[len(errors) // 2] <= SECONDS_MEDIAN_ERROR_PCT


def test_ps_moves_bytes_linear_in_workers_rounds_flat_once_combined_on_the_executors(points, fitted):
    ps = {p["executors"]: p for p in points if p["backend"] == "ps" and p["compression"] is None}
    assert ps[8]["driver_in_mb"] / ps[2]["driver_in_mb"] == pytest.approx(4, rel=0.1)  # each worker pushes through the driver
    assert ps[8]["driver_out_mb"] / ps[2]["driver_out_mb"] == pytest.approx(4, rel=0.1)  # and pulls from it
    state = 12e6
    assert model.driver_bytes("rounds", 256, state, None, fitted, "executors")[1] == state  # one combined state in
    assert model.driver_bytes("ps", 256, state, "fp16", fitted) == (256 * state, 128 * state)


def test_projected_efficiency_falls_with_workers_on_ps_and_rises_with_local_steps(fitted):
    costs = model.dedicated(fitted, server_mb_s=400)
    grid = {"workers": [8, 16, 32, 64, 128, 256], "params": [1e8], "gbps": [10], "backend": ["ps"], "tau": [16],
            "compression": [None]}
    rows = sorted(model.project(grid, costs, flops=1e14, batch=64), key=lambda r: r["workers"])
    eff = [r["efficiency"] for r in rows]
    assert all(a > b for a, b in zip(eff, eff[1:])), eff
    assert rows[-1]["bound"] in ("server", "network")  # at 256 workers the driver, not the compute, bounds the round
    more_steps = model.project({**grid, "tau": [128]}, costs, flops=1e14, batch=64)
    assert min(r["efficiency"] for r in more_steps) > max(eff[-1], 0)
    # the ring allreduce's per-worker bytes do not grow with N: its efficiency at 256 stays near that at 8
    ring = sorted(model.project({**grid, "backend": ["ring"]}, costs, flops=1e14, batch=64), key=lambda r: r["workers"])
    assert ring[-1]["efficiency"] > 0.9 * ring[0]["efficiency"] > eff[-1]


@pytest.mark.slow  # local-cluster[2,1,512] and four fits: minutes
def test_the_measured_run_counts_each_workers_state_through_the_driver(tmp_path):
    """``benchmarks/scaling.py`` on 2 executors: both backends bring 2 workers' updates to the driver
    each round (ps: and send 2 start states; rounds: one broadcast, torrent-shared)."""
    import json
    import os
    import subprocess

    out = tmp_path / "points.jsonl"
    subprocess.run([sys.executable, f"{ROOT}/benchmarks/scaling.py", "--executors", "2", "--rounds", "3", "--epochs", "2",
                    "--compression", "--out", str(out)], check=True, timeout=1800, env=dict(os.environ, PYTHONPATH=ROOT),
                   capture_output=True)
    got = {p["backend"]: p for p in map(json.loads, out.read_text().splitlines())}
    for backend in ("rounds", "ps"):
        p = got[backend]
        assert p["driver_in_mb"] == pytest.approx(2 * p["state_mb"], rel=0.1)  # 12 MB a worker, 1M parameters with Adam
    assert got["ps"]["driver_out_mb"] == pytest.approx(2 * got["ps"]["state_mb"], rel=0.1)
    assert got["rounds"]["state_mb"] * 0.9 <= got["rounds"]["driver_out_mb"] <= 2.2 * got["rounds"]["state_mb"]
    assert got["rounds"]["jobs"] == 1 and got["rounds"]["tasks"] == 2 and got["ps"]["jobs"] == 0


# ---- issue 43 item 2: the model corrected against the emulated cluster (benchmarks/netsim.jsonl) ----

NETSIM = f"{ROOT}/benchmarks/netsim.jsonl"
NETSIM_ERROR_PCT = 15.0  # the goal: each predicted round within 15 % of the measured one


def test_the_wire_terms_are_the_links_measured_bytes():
    idle = model.wire_costs(torrent_scale=1.0)
    state, n, line = 60e6, 2, 200e6 / 8
    assert model.HEADER_FACTOR == pytest.approx(1.04558, abs=1e-5)  # benchmarks/netsim/cluster.py's wire_factor(1500)
    # ps in sync: every pull, then every push, on the driver's link: 2·N·S/B plus compute, not the larger direction
    assert model.round_seconds("ps", n, state, None, 1, 0.5, line, idle) == pytest.approx(0.5 + 2 * n * state * model.HEADER_FACTOR / line)
    # sharded: (2N − 1)/N·S each way per worker (the backup copy on the critical path)
    for n in (2, 3, 4, 64):
        assert model.sharded_worker_bytes(n, state, state) == pytest.approx((2 * n - 1) / n * state)
    costs = replace_costs(idle, flight_rate=math.inf)
    terms = model.sharded_terms("sharded", 4, state, None, line, costs)
    assert terms["network"] == pytest.approx(1.75 * state * model.HEADER_FACTOR / line)
    # fp16 halves the pieces put, not the float32 start pulled nor the backup
    assert model.sharded_worker_bytes(4, state, state / 2) == pytest.approx(0.75 * state / 2 + state / 4 + 0.75 * state)


def test_the_torrent_broadcast_uploads_harmonic_states_for_a_large_state_and_more_for_few_blocks():
    assert model.torrent_sync(5, 1) == pytest.approx(5)  # one block: every executor takes it from the driver
    for n in (2, 4, 64, 256):
        harmonic = sum(1 / k for k in range(1, n + 1))
        assert model.torrent_sync(n, 100_000) == pytest.approx(harmonic, rel=1e-3)
    assert model.torrent_sync(2, 3) / 2 == pytest.approx(0.833, abs=0.001)  # 1M with Adam: 3 blocks of 4 MiB
    assert model.torrent_sync(4, 3) / 4 == pytest.approx(0.657, abs=0.001)
    fitted = model.fit(model.load(MEASURED))
    assert model.broadcast_factor(4, 12e6, fitted) == model.torrent(4, fitted)  # loopback: the fitted u(N)
    assert model.broadcast_factor(64, 1.2e9, replace_costs(fitted, torrent_scale=1.0)) == pytest.approx(4.86, abs=0.01)  # H_64 = 4.74 and K = 287 blocks


def test_the_model_predicts_each_emulated_round_within_15_percent():
    lines = model.load_netsim(NETSIM)
    assert {r["backend"] for r in lines} == {"rounds", "ps", "sharded"}
    emulated = model.fit_emulated(lines, 200.0)  # fitted at 200 Mbit/s, checked at 100 too
    assert 0.9 <= emulated["torrent_scale"] <= 1.3  # the measured broadcast: about u_sync, a little more
    checked = model.check_netsim(lines, emulated)
    worst = max(checked, key=lambda c: abs(c["ratio"] - 1))
    assert abs(worst["ratio"] - 1) * 100 <= NETSIM_ERROR_PCT, worst
    # the wire alone (compute + link bytes at the link rate) explains most of every round
    assert min(c["wire_ratio"] for c in checked) >= 0.5


def replace_costs(costs, **changes):
    import dataclasses

    return dataclasses.replace(costs, **changes)
