"""A cost model of a round on each backend, fitted to ``benchmarks/scaling.py``'s measurements and
projected to clusters of 8 to 256 workers, models of 1M to 1B parameters and 10/25/100 Gb/s
networks.

Symbols (units): N workers (one per executor), P parameters, τ local steps per round, b rows per
step and worker, S = P·4·(1 + k) bytes of a worker's state (float32 weights and k optimizer slots:
Adam k = 2, so 12 bytes per parameter), S_up the bytes of its update (S; S/2 with ``fp16``), B the
network bandwidth of each machine's NIC (bytes/s of frames, full duplex), B' = B / h the TCP
payload it carries (h = 1514/1448 = 1.0456, :data:`HEADER_FACTOR`: a frame's headers at MTU 1500, as
the emulated cluster's link counters measure them), t_step the compute of one step (s), D the rows
of an epoch. Every byte count below is payload and travels at B'.

**rounds** (one Spark job per round; SparkNet's cost model, Moritz et al. 2016, with Spark's
scheduling made explicit)::

    t_round = L_job + n_tasks·L_task + t_bcast + τ·t_step + t_reduce
    t_bcast = max(1, u)·S / B'                   torrent broadcast: the driver uploads u·S, each executor downloads S
    t_reduce (driver combines)   = N·S_up / B' + N·S_up / R        (n_tasks = N)
    t_reduce (executors combine) = L_stage + S_up / B' + S / B' + S / R (n_tasks = 2N: a reduce-scatter of
                                   the pieces across executors, then one combined state to the driver)

u, the states the driver uploads (:func:`broadcast_factor`): where the driver's link bounds the
broadcast (a large state on a real network, the emulated cluster), c·u_sync(N, K), K = ⌈S / 4 MiB⌉
blocks, u_sync the expected uploads when the N executors fetch in step, each block from a random
holder (:func:`torrent_sync`: N for one block, 0.83·N at N = 2 and 0.66·N at N = 4 for K = 3,
H_N ≈ ln N + 0.58 for many blocks), c fitted to the emulated cluster's driver link (about 1.1:
measured 0.70–0.88·N·S for 1M and 5M states); on loopback (the fitted points) the fitted u(N).

sparkdl combines on the executors when N > 2 and N·S > 64 MiB (``reduce.EXECUTOR_REDUCE_MIN_BYTES``).
Bytes through the driver per round: out u·S (plus task closures), in N·S_up or S.

**ps** (a parameter server in the driver's process; round mode ``sync``: every worker pulls the
start state, trains τ steps, pushes its update; every push comes after every pull, so the two
directions of the driver's link are not busy together: measured on the emulated cluster, 2·N·S/B'
to 7 %)::

    t_round = τ·t_step + L_ps + max(N·(S + S_up) / B', N·(S + S_up) / R_server) + [fp16] N·S / R_codec

(the server decodes each fp16 push into a state on the driver, one after another; on rounds the
driver decodes only the mean: + [fp16] S / R_codec.)

Bytes through the driver per round: out N·S, in N·S_up: linear in N by design.

**sharded** (the backend being built: the state cut into N contiguous slices, one per executor,
each served by a Flight server in that executor's Python worker; a round is a reduce-scatter, each
worker pushing slice j of its update to slice j's owner, which sums the N row-weighted
contributions and applies the elementwise rule to its slice, then an all-gather, each worker
pulling every slice; the driver only coordinates)::

    t_round = τ·t_step + L_sharded + ((N − 1)/N·S_up + S_f/N + (N − 1)/N·S_f) / B_eff + t_owner + t_pack
    L_sharded = 2·L_rpc + 2·(N − 1)·L_rpc / k     two small calls to the driver, and each worker's N − 1
                                                   puts and N − 1 gets, k at a time (k = the streams of B_flight)
    B_eff = min(B', B_flight)                      the network's payload rate, or what one executor's Flight moves
    t_owner = S_f/N / R_rule + S_f / R_sum          the owner applies the rule to its slice and sums N
                                                   contributions of S_f/N each: S_f bytes, whatever N is
    t_pack = 2·S_f / R_pack [+ fp16: 2·S_f / R_codec]   each worker packs its update into the N slices and
                                                   unpacks the gathered state (fp16: encodes and decodes them)

A worker sends and receives per round its pieces of its update ((N − 1)/N·S_up), its own slice's
new state to its backup holder (S_f/N: before the owner reports the slice ready, on the round's
critical path) and the other N − 1 slices of the start ((N − 1)/N·S_f, float32 even with fp16):
(2N − 1)/N·S_f without compression, as the emulated cluster's links measure (to 1 %).

S_f is the float32 bytes that travel: the whole state (12 bytes a parameter with Adam), or the
weights alone (4 bytes) with ``keepLocalOptimizer`` (backend ``sharded_local``: each worker keeps
its own optimizer state); S_up = S_f, or S_f/2 with fp16. In the brief's form t_owner = S_f/N /
R_apply with R_apply(N) = 1 / (1/R_rule + N/R_sum) (slice bytes per second, falling with N: the
sum reads N contributions), and the pack/unpack copies are per worker, not per slice (0 where a
worker keeps its state in one flat buffer). No term overlaps another (as on the other backends).
Bytes through the driver per round: control and metrics, about :data:`CONTROL_BYTES` a worker
each way.

**ring** (not a sparkdl backend: the bandwidth-optimal allreduce of Horovod, Sergeev & Del Balso
2018; Patarasuk & Yuan 2009), the design reference that removes the driver from the data path::

    t_round = τ·t_step + 2·(N − 1)·α + 2·(N − 1)/N·G / B'      (α = 50 µs a message; G = P·4 bytes of
                                                                  gradients, P·2 with fp16: no optimizer state travels)

**Efficiency and epoch time**: a worker computes τ·t_step per round whatever N is (weak
scaling, as Horovod's benchmarks), so the scaling efficiency is E = τ·t_step / t_round (1 when
communication and scheduling cost nothing; Horovod's 90 % is the reference line), and an epoch of
D rows takes D / (N·τ·b) rounds: t_epoch = D / (N·τ·b) · t_round.

**Compute per step**: t_step = 6·P·b·T / F: about 6 FLOPs per parameter for each use of a
parameter in a forward and backward pass (Kaplan et al. 2020, C ≈ 6·N per token), each parameter
used T times per row (``--reuse``; default T = 160: ResNet-50's 4.1 GFLOP forward pass over 25.6M
parameters on a 224×224 image, He et al. 2016; a transformer's T is its tokens per row; the MLP
measured here has T = 1), and F the device's sustained FLOP/s: ``cpu`` = the measured step of
``scaling.py`` (6·P·b / t_step on one core) × ``--cpu-cores`` (8), ``gpu`` = ``--gpu-tflops`` (100
TFLOP/s: an A100/H100 at a third to a tenth of its bf16 peak). The compute-to-communication
ratio, hence E, depends on F·(1/T): a faster device makes communication relatively dearer.

**Fitted constants** (:func:`fit`, from the measured N = 2, 4, 8 points of ``local-cluster``):
u(N) = u0 + u1·log2 N (least squares of the measured ``driver_out_mb / state_mb`` of backend
rounds; Spark's TorrentBroadcast has each executor fetch each block from a random one of the
executors that already hold it or the driver, so the k-th fetcher picks the driver with
probability about 1/k and the driver uploads about H_N ≈ ln N copies, more when fetches overlap), and, by non-negative least squares of the measured overhead seconds
(``round_s − compute_s``), L_job, L_task and the effective byte rate R of backend rounds
(regressors: jobs, tasks, driver bytes per round) and L_ps and R_server of backend ps (regressors:
1, driver bytes per round, N·S of fp16 pushes decoded). The measured N are oversubscribed (N executors on 2 cores shared
with other work), so these latencies are upper bounds for a dedicated cluster. The projection
uses :data:`DEDICATED`'s constants, R_server = ``--server-mb-s`` (the loopback server throughput
of ``benchmarks/ps_throughput.py``), B = the network's line rate, and the fitted u(N).

**Measured data plane** (:func:`load_plane`, from the latest run in ``benchmarks/data_plane.jsonl``
of ``benchmarks/data_plane.py``, ``local-cluster[N,1,1024]``, N = 2, 3, 4, on 2 shared cores):
B_flight = per N the best stream count's min(put, get) GB/s of 256 MB over TLS between two
executors' Python workers, median over N (unscaled: on loopback the two ends shared 2 cores, one
core a direction, as a host with a core or more per Flight direction has; a 1-core executor that
sends and receives at once moved about half of it, the ``shift`` rows; ``--flight-gb-s`` overrides);
L_rpc = the median TLS ``DoAction`` round trip at N = 2; R_pack, R_rule = the slice GB/s of the
``pack`` and ``apply`` rows, R_sum = the contributions' GB/s of ``sum32`` (float32 sums; ``sum64``
with ``--sharded-sum float64``, the exact float64 mean of today's WeightedMean), R_codec = that of
``sum16`` (fp16 contributions decoded and summed into float32), each the best of numpy, a 1-thread
and a 2-thread pool, median over N. R_codec replaces the assumed fp16 decoding rate of the ``ps``
and ``rounds`` projection (:data:`DEDICATED`'s 1,000 MB/s) when the file is there.

**Horovod's line** (:func:`tau_for`): the smallest τ at which each design reaches 90 % for 100M
parameters on 64 and 256 GPU workers (``--gpu-tflops``) and 10 and 100 Gb/s: rounds, ps, sharded
with the full Adam state, sharded with keepLocalOptimizer and fp16, ring; every t_round here is
τ·t_step + C, so τ_90 = ⌈9·C / t_step⌉.

The fitted model is checked against the measured points it was fitted to
(:func:`check`: the relative error of round seconds and of driver bytes, %).

**The emulated cluster** (:func:`check_netsim`, from ``benchmarks/netsim.jsonl`` of
``benchmarks/netsim/run.py``: a host per namespace, every link shaped to 100 or 200 Mbit/s each way,
``sync``, τ = 1, Adam): each row's round is predicted as compute (its measured t_step) plus the wire
terms above at B = the link rate (every latency 0, every CPU rate infinite: :func:`wire_costs`),
plus a residual per backend for what the machine's 2 shared cores add, made of the backend's own
latency and CPU terms (:data:`RESIDUAL_TERMS`: rounds N·L_task + N·S/R; ps L_ps + 2·N·S/R_server;
sharded L + every host's data-plane bytes at a CPU rate stretched by the load, the hosts sharing
the cores), their constants fitted by non-negative least squares at 200 Mbit/s
(``--netsim-fit-rate``) and checked at 100, where the wire terms double and the residual does not
move; c of u likewise.

Usage::

    python benchmarks/scaling_model.py [--measured benchmarks/scaling_measured.jsonl] [--plot docs/images/scaling_model.png]
        [--device gpu|cpu] [--server-mb-s 400] [--data-plane benchmarks/data_plane.jsonl] [--flight-gb-s X]
        [--sharded-sum float32|float64] [--netsim benchmarks/netsim.jsonl] [--netsim-fit-rate 200] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
from dataclasses import asdict, dataclass, replace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MB = 1e6
GBIT = 1e9 / 8  # bytes/s of 1 Gb/s
BYTES_PER_PARAM = 12  # float32 weights + Adam's two moments
RING_ALPHA_S = 50e-6
IMAGENET_ROWS = 1_281_167
REDUCE_MIN_BYTES = 64 * 2**20  # sparkdl.spark.backends.rounds.reduce.EXECUTOR_REDUCE_MIN_BYTES
HOROVOD_EFFICIENCY = 0.90  # Sergeev & Del Balso 2018, Inception V3 and ResNet-101 on 512 GPUs
CONTROL_BYTES = 1e3  # sharded: bytes a worker exchanges with the driver per round each way (control, metrics)
# the full state travels / the weights alone (keepLocalOptimizer); "_overlap": rounds that never block (overlap=True)
SHARDED = ("sharded", "sharded_local", "sharded_overlap", "sharded_local_overlap")
HEADER_FACTOR = 1514 / 1448  # link bytes per TCP payload byte at MTU 1500: a 1514-byte frame (Ethernet 14) carries 1448 (IPv4 20, TCP 32)
TORRENT_BLOCK = 4 * 2**20  # spark.broadcast.blockSize: a torrent broadcast's block


@dataclass(frozen=True)
class Costs:
    """The model's constants (seconds, bytes/s, dimensionless)."""

    l_job: float  # s per Spark job (rounds)
    l_task: float  # s per task (rounds)
    l_stage: float  # s for the reduction's second stage (rounds, executors combine)
    rate: float  # bytes/s the driver decodes and combines (rounds)
    l_ps: float  # s per ps round besides the bytes
    server_rate: float  # bytes/s the ps server moves (pushed + pulled)
    u0: float  # torrent broadcast: the driver uploads (u0 + u1·log2 N)·S
    u1: float
    codec_rate: float = math.inf  # bytes/s of state the driver decodes from fp16 (ps: each push; rounds: the mean)
    flight_rate: float = math.inf  # sharded: bytes/s one executor's Flight moves (B_flight)
    flight_streams: float = 1.0  # sharded: the concurrent streams (calls) of B_flight (k)
    rpc_s: float = 0.0  # sharded: a small call's round trip (L_rpc)
    pack_rate: float = math.inf  # sharded: bytes/s a worker packs (unpacks) into (from) slices
    sum_rate: float = math.inf  # sharded: contribution bytes/s an owner sums (float32, row-weighted)
    rule_rate: float = math.inf  # sharded: slice bytes/s an owner applies the elementwise rule to
    torrent_scale: float = 0.0  # rounds: 0: the fitted u(N) (loopback); > 0: u = torrent_scale · u_sync(N, K) (bandwidth-bound)


def torrent(n: int, costs: "Costs") -> float:
    """u(N): states the driver uploads for one torrent broadcast to N executors."""
    return costs.u0 + costs.u1 * math.log2(n)


def torrent_sync(n: int, blocks: int) -> float:
    """u_sync(N, K): states the driver uploads for a torrent broadcast of K blocks to N executors
    that fetch in step, each its blocks in its own random order, each block from a random one of
    the driver and the executors that already hold it (Spark's TorrentBroadcast). At step t another
    executor holds the block with probability q = t/K, so J ~ Binomial(N − 1, q) of them do and the
    driver serves it with probability E[1/(1 + J)] = (1 − (1 − q)^N) / (N·q) (1 at q = 0):
    u_sync = N/K · Σ_t (1 − (1 − q_t)^N) / (N·q_t), which tends to H_N (about ln N + 0.58) as K
    grows and to N for K = 1 (every block from the driver). 1M parameters with Adam (12 MB, K = 3):
    u_sync/N = 0.83 at N = 2, 0.73 at 3, 0.66 at 4; 100M (1.2 GB, K = 287): 4.86 at N = 64, 6.60 at 256
    (H_N = 4.74, 6.12)."""
    total = 0.0
    for t in range(blocks):
        q = t / blocks
        total += 1.0 if t == 0 else (1 - (1 - q) ** n) / (n * q)
    return n * total / blocks


def broadcast_factor(n: int, state: float, costs: "Costs") -> float:
    """u: states the driver uploads per round's broadcast: the fitted u(N) of the loopback points, or,
    where the driver's link bounds the broadcast (``costs.torrent_scale`` > 0: the emulated
    cluster and the projection), torrent_scale · u_sync(N, ⌈S / 4 MiB⌉)."""
    if costs.torrent_scale > 0:
        return costs.torrent_scale * torrent_sync(n, max(1, math.ceil(state / TORRENT_BLOCK)))
    return torrent(n, costs)


def payload_rate(bandwidth: float) -> float:
    """TCP payload bytes/s through a link of ``bandwidth`` bytes/s of frames (the headers at MTU 1500)."""
    return bandwidth / HEADER_FACTOR


def sharded_worker_bytes(n: int, synced: float, up: float) -> float:
    """Bytes a sharded worker sends (and receives) per round: its N − 1 pieces of its update
    ((N − 1)/N·S_up), its own slice's new state to its backup holder (S_f/N) and the other N − 1
    slices of the start it pulls ((N − 1)/N·S_f, float32 even with fp16): (2N − 1)/N·S_f without
    compression, the emulated cluster's measurement (``benchmarks/netsim.jsonl``)."""
    return (n - 1) / n * up + synced / n + (n - 1) / n * synced


def update_bytes(state: float, compression: str | None) -> float:
    """S_up: bytes of a worker's update (int8 / int4: a byte or half a byte a value and a float32 scale per 256)."""
    per_value = {"fp16": 2.0, "int8": 1 + 4 / 256, "int4": 0.5 + 4 / 256}.get(compression, 4.0)
    return state * per_value / 4


def sharded_terms(backend: str, n: int, state: float, compression: str | None, bandwidth: float, costs: Costs) -> dict:
    """The communication terms of a sharded round (seconds, module docstring): ``scheduling``
    (L_sharded), ``network`` (the reduce-scatter and the all-gather at B_eff), ``server`` (the
    owner's sum and rule, the workers' packing and fp16 coding) and ``flight``: whether B_flight,
    not the line rate, bounds the bytes."""
    synced = state / 3 if backend.startswith("sharded_local") else state  # S_f: the weights alone (4 bytes a parameter) or the state
    up = update_bytes(synced, compression)
    sum_rate = costs.codec_rate if compression else costs.sum_rate
    coding = 2 * synced / costs.codec_rate if compression else 0.0
    return {
        "scheduling": 2 * costs.rpc_s + 2 * (n - 1) * costs.rpc_s / costs.flight_streams,
        # overlap without compression: a worker's own piece goes to its backup holder too (the exact recovery's copy)
        "network": (sharded_worker_bytes(n, synced, up) + (up / n if backend == "sharded_overlap" and not compression else 0.0))
        / min(payload_rate(bandwidth), costs.flight_rate),
        "server": synced / n / costs.rule_rate + synced / sum_rate + 2 * synced / costs.pack_rate + coding,
        "flight": costs.flight_rate < payload_rate(bandwidth),
    }


def ring_bytes(state: float, compression: str | None) -> float:
    """Bytes a ring allreduce reduces: the gradients, a third of an Adam state (halved with fp16)."""
    return update_bytes(state / 3, compression)


def on_executors(n: int, state: float) -> bool:
    """Where sparkdl combines a round's updates (``reduce.plan_reduction`` without a result-size limit)."""
    return n > 2 and n * state > REDUCE_MIN_BYTES


def round_seconds(backend: str, n: int, state: float, compression: str | None, tau: int, step_s: float, bandwidth: float,
                  costs: Costs, reduce: str = "auto") -> float:
    """t_round of the module docstring (seconds); ``bandwidth`` in bytes/s; ``reduce``: "auto",
    "driver" or "executors" (backend rounds)."""
    up = update_bytes(state, compression)
    compute = tau * step_s
    payload = payload_rate(bandwidth)
    if backend == "rounds":
        executors = on_executors(n, state) if reduce == "auto" else reduce == "executors"
        bcast = max(1.0, broadcast_factor(n, state, costs)) * state / payload
        if executors:
            tasks, red = 2 * n, costs.l_stage + up / payload + state / payload + state / costs.rate
        else:
            tasks, red = n, n * up / payload + n * up / costs.rate
        decode = state / costs.codec_rate if compression else 0.0
        return costs.l_job + tasks * costs.l_task + bcast + compute + red + decode
    if backend == "ps":  # sync: every pull before the steps, every push after them: the driver's link one way, then the other
        decode = n * state / costs.codec_rate if compression else 0.0
        return compute + costs.l_ps + max(n * (state + up) / payload, n * (state + up) / costs.server_rate) + decode
    if backend == "ring":  # gradients only (4 bytes a parameter, 2 with fp16): the optimizer state stays on each worker
        return compute + 2 * (n - 1) * RING_ALPHA_S + 2 * (n - 1) / n * ring_bytes(state, compression) / payload
    if backend in SHARDED:
        terms = sharded_terms(backend, n, state, compression, bandwidth, costs)
        exchange = terms["scheduling"] + terms["network"] + terms["server"]
        if backend.endswith("_overlap"):  # the exchange runs during the next round's steps: the longer of the two
            return max(compute, exchange)
        return compute + exchange
    raise ValueError(f"backend must be rounds, ps, sharded, sharded_local or ring. Received: {backend!r}")


def efficiency(backend: str, n: int, params: float, compression: str | None, tau: int, step_s: float, bandwidth: float,
               costs: Costs) -> float:
    """E = τ·t_step / t_round (weak scaling; 1 is perfect)."""
    t = round_seconds(backend, n, params * BYTES_PER_PARAM, compression, tau, step_s, bandwidth, costs)
    return tau * step_s / t


def driver_bytes(backend: str, n: int, state: float, compression: str | None, costs: Costs, reduce: str = "auto") -> tuple[float, float]:
    """(bytes out of, bytes into) the driver per round."""
    up = update_bytes(state, compression)
    if backend == "rounds":
        executors = on_executors(n, state) if reduce == "auto" else reduce == "executors"
        return broadcast_factor(n, state, costs) * state, (state if executors else n * up)
    if backend in SHARDED:
        return n * CONTROL_BYTES, n * CONTROL_BYTES
    return n * state, n * up


def project(grid: dict, costs: Costs, flops: float, batch: int, rows: int = IMAGENET_ROWS, reuse: float = 160.0) -> list[dict]:
    """One row per point of ``grid`` (keys ``workers``, ``params``, ``gbps``, ``backend``, ``tau``,
    ``compression``: lists): efficiency, seconds per round and per epoch of ``rows`` rows, and
    which term bounds the round (``bound``: compute, network, server, scheduling; sharded: flight
    when B_flight < B carries the bytes)."""
    out = []
    keys = ("workers", "params", "gbps", "backend", "tau", "compression")
    for n, params, gbps, backend, tau, compression in itertools.product(*(grid[k] for k in keys)):
        step_s = 6 * params * batch * reuse / flops
        bandwidth = gbps * GBIT
        state = params * BYTES_PER_PARAM
        t = round_seconds(backend, n, state, compression, tau, step_s, bandwidth, costs)
        up = update_bytes(state, compression)
        terms = {"compute": tau * step_s}
        payload = payload_rate(bandwidth)
        if backend == "ps":
            terms["network"] = n * (state + up) / payload
            terms["server"] = n * (state + up) / costs.server_rate + (n * state / costs.codec_rate if compression else 0.0)
            terms["scheduling"] = costs.l_ps
        elif backend == "rounds":
            ex = on_executors(n, state)
            terms["scheduling"] = costs.l_job + (2 * n if ex else n) * costs.l_task + (costs.l_stage if ex else 0.0)
            terms["network"] = (max(1.0, broadcast_factor(n, state, costs)) * state + ((up + state) if ex else n * up)) / payload
            terms["server"] = (state if ex else n * up) / costs.rate + (state / costs.codec_rate if compression else 0.0)  # the driver's combine
        elif backend in SHARDED:
            sharded = sharded_terms(backend, n, state, compression, bandwidth, costs)
            terms.update({k: sharded[k] for k in ("scheduling", "server")})
            terms["flight" if sharded["flight"] else "network"] = sharded["network"]  # B_flight, not the line, bounds it
        else:
            terms["network"] = 2 * (n - 1) / n * ring_bytes(state, compression) / payload
            terms["scheduling"] = 2 * (n - 1) * RING_ALPHA_S
        comm = {k: v for k, v in terms.items() if k != "compute"}
        out.append({
            "workers": n, "params": params, "gbps": gbps, "backend": backend, "tau": tau, "compression": compression,
            "step_s": step_s, "round_s": t, "epoch_s": rows / (n * tau * batch) * t, "efficiency": tau * step_s / t,
            "bound": "compute" if terms["compute"] >= sum(comm.values()) else max(comm, key=comm.get),
        })
    return out


# ---- fitting to the measured points --------------------------------------------------------------

def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a negative one is fixed at 0 and the rest refitted)."""
    free = np.ones(a.shape[1], bool)
    x = np.zeros(a.shape[1])
    while free.any():
        sol, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
        if (sol >= 0).all():
            x[free] = sol
            return x
        idx = np.flatnonzero(free)
        free[idx[np.argmin(sol)]] = False
    return x


def load(path: str) -> list[dict]:
    """The JSON lines of ``benchmarks/scaling.py --out``."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def fit(points: list[dict]) -> Costs:
    """The model's constants from measured points (see the module docstring)."""
    rounds = [p for p in points if p["backend"] == "rounds"]
    ps = [p for p in points if p["backend"] == "ps"]
    n = np.array([p["executors"] for p in rounds], float)
    ratio = np.array([p["driver_out_mb"] / p["state_mb"] for p in rounds])
    u1, u0 = np.polyfit(np.log2(n), ratio, 1) if len(set(n)) > 1 else (0.0, float(ratio.mean()))
    a = np.array([[p["jobs"], p["tasks"], (p["driver_in_mb"] + p["driver_out_mb"]) * MB] for p in rounds], float)
    y = np.array([p["overhead_s"] for p in rounds])
    l_job, l_task, inv_rate = _nnls(a, y)
    b = np.array([[1.0, (p["driver_in_mb"] + p["driver_out_mb"]) * MB, p["executors"] * p["state_mb"] * MB * bool(p["compression"])]
                  for p in ps], float)
    z = np.array([p["overhead_s"] for p in ps])
    l_ps, inv_server, inv_codec = _nnls(b, z) if len(ps) else (0.0, 0.0, 0.0)
    inv = lambda v: 1 / v if v > 0 else math.inf  # noqa: E731
    return Costs(l_job=float(l_job), l_task=float(l_task), l_stage=float(l_job), rate=float(inv(inv_rate)), l_ps=float(l_ps),
                 server_rate=float(inv(inv_server)), u0=float(u0), u1=float(u1), codec_rate=float(inv(inv_codec)))


# A dedicated cluster's scheduling constants (the fitted ones come from N executors oversubscribed on
# 2 shared cores): an empty mapInArrow job 0.13 s and a second stage 0.1 s (README, measured on an
# idle local[2]); Spark's central scheduler launches about 1,000 tasks/s (Ousterhout et al. 2013,
# Sparrow; Venkataraman et al. 2017, Drizzle); a ps round's fixed cost 0.011 s (one push+pull of
# 1M parameters on loopback, README); the driver decodes and combines results at 100 MB/s (README:
# 12 MB per task adds 0.12 s a round); fp16 decoding (numpy's float16 → float32 and add, memory bound)
# 1,000 MB/s of state: 89 MB/s measured on 2 cores at load average 44, about 1/20 of a core each.
DEDICATED = {"l_job": 0.13, "l_task": 0.001, "l_stage": 0.1, "l_ps": 0.011, "rate": 100 * MB, "codec_rate": 1000 * MB}


def dedicated(costs: Costs, server_mb_s: float, plane: dict | None = None, torrent_scale: float = 1.0) -> Costs:
    """The projection's constants: :data:`DEDICATED`'s latencies and rates, the fitted torrent
    factor u(N), the server rate of ``ps_throughput.py`` (``server_mb_s``, MB/s) and, with
    ``plane`` (:func:`load_plane`), the measured data plane: the sharded backend's constants and
    the fp16 decoding rate in place of the assumed one; the broadcast bandwidth-bound
    (``torrent_scale`` · u_sync, :func:`broadcast_factor`: a dedicated cluster's driver link bounds a
    large state's broadcast, as the emulated cluster's does). (On the loaded 2-core machine the fitted
    rates are not identifiable: the seconds barely follow the bytes, and the fit returns them as
    infinite.)"""
    measured = {"codec_rate": DEDICATED["codec_rate"], **(plane or {})}
    return Costs(l_job=DEDICATED["l_job"], l_task=DEDICATED["l_task"], l_stage=DEDICATED["l_stage"],
                 rate=DEDICATED["rate"], l_ps=DEDICATED["l_ps"], server_rate=server_mb_s * MB, u0=costs.u0, u1=costs.u1,
                 torrent_scale=torrent_scale, **measured)


# ---- the measured data plane (benchmarks/data_plane.py) -------------------------------------------

def load_plane(path: str, flight_gb_s: float | None = None, sum_dtype: str = "float32") -> tuple[dict, dict]:
    """The sharded backend's constants from the latest run in ``path`` (``benchmarks/data_plane.py``'s
    JSON lines), as :class:`Costs` fields (bytes/s, seconds), and what they came from (``source``:
    per N the values behind each median). See the module docstring for the choices."""
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    run = lines[-1]["run"]
    lines = [r for r in lines if r["run"] == run]
    ns = sorted({r["executors"] for r in lines})
    source: dict = {"run": run, "executors": ns}
    flight = {}
    for n in ns:
        rows = [r for r in lines if (r["executors"], r["section"], r.get("transport")) == (n, "flight", "tls") and r["op"] in ("put", "get")]
        size = max(r["size_mb"] for r in rows)
        per_streams = {}
        for k in sorted({r["streams"] for r in rows}):
            per_streams[k] = min(r["gb_s"] for r in rows if r["streams"] == k and r["size_mb"] == size)
        best = max(per_streams, key=per_streams.get)
        flight[n] = (per_streams[best], best)
    source["flight_gb_s_streams"] = flight
    shift = {r["executors"]: r["gb_s"] for r in lines if r["section"] == "shift" and r.get("transport") == "tls" and r["op"] == "put"}
    source["shift_put_gb_s"] = shift
    rates = {}
    for op, key in (("pack", "gb_s"), ("apply", "gb_s"), ("sum32", "contrib_gb_s"), ("sum64", "contrib_gb_s"), ("sum16", "contrib_gb_s")):
        rates[op] = {n: max(r[key] for r in lines if (r["executors"], r["section"], r["op"]) == (n, "compute", op)) for n in ns}
    source["compute_gb_s"] = rates
    rpc = {r["executors"]: r["rpc_ms"] for r in lines if r["section"] == "flight" and r["op"] == "rpc" and r["transport"] == "tls"}
    source["rpc_ms"] = rpc
    median = lambda d: float(np.median(list(d.values())))  # noqa: E731
    plane = {
        "flight_rate": (flight_gb_s if flight_gb_s else median({n: v[0] for n, v in flight.items()})) * 1e9,
        "flight_streams": float(np.median([v[1] for v in flight.values()])),
        "rpc_s": rpc[min(rpc)] / 1e3,
        "pack_rate": median(rates["pack"]) * 1e9,
        "sum_rate": median(rates["sum64" if sum_dtype == "float64" else "sum32"]) * 1e9,
        "rule_rate": median(rates["apply"]) * 1e9,
        "codec_rate": median(rates["sum16"]) * 1e9,
    }
    return plane, source


def tau_for(backend: str, compression: str | None, n: int, params: float, gbps: float, flops: float, batch: int, reuse: float,
            costs: Costs, target: float = HOROVOD_EFFICIENCY, most: int = 2**24) -> int | None:
    """The smallest τ (local steps per round) at which ``backend`` reaches ``target`` efficiency
    (None: not below ``most``): doubling, then bisection, on :func:`efficiency`."""
    step_s = 6 * params * batch * reuse / flops
    ok = lambda tau: efficiency(backend, n, params, compression, tau, step_s, gbps * GBIT, costs) >= target  # noqa: E731
    hi = 1
    while not ok(hi):
        hi *= 2
        if hi > most:
            return None
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


# (label, backend, compression) of the 90 % table
TAU_DESIGNS = [("rounds (Adam state)", "rounds", None), ("ps (Adam state)", "ps", None),
               ("sharded, full Adam state", "sharded", None), ("sharded, keepLocalOptimizer", "sharded_local", None),
               ("sharded, keepLocalOptimizer + fp16", "sharded_local", "fp16"),
               ("sharded, overlap, full Adam state", "sharded_overlap", None),
               ("sharded, overlap + int8 (the workers keep their optimizer state)", "sharded_local_overlap", "int8"),
               ("ring (fp32 gradients)", "ring", None)]


# τ_90 of the model before the emulated cluster corrected it (issue 43: ps's pulls and pushes
# overlapping, sharded's 2·(N − 1)/N·S, the loopback torrent factor, no frame headers), same columns
TAU_BEFORE = {"rounds (Adam state)": (2758, 3014, 1905, 1982), "ps (Adam state)": (56252, 225002, 56252, 225002),
              "sharded, full Adam state": (656, 669, 656, 669), "sharded, keepLocalOptimizer": (221, 229, 221, 229),
              "sharded, keepLocalOptimizer + fp16": (210, 217, 210, 217), "ring (fp32 gradients)": (94, 98, 11, 14)}


def predicted_overhead(p: dict, costs: Costs) -> float:
    """The fitted model's overhead seconds of a measured point (from its own jobs, tasks and bytes)."""
    nbytes = (p["driver_in_mb"] + p["driver_out_mb"]) * MB
    if p["backend"] == "rounds":
        return costs.l_job * p["jobs"] + costs.l_task * p["tasks"] + nbytes / costs.rate
    decode = p["executors"] * p["state_mb"] * MB / costs.codec_rate if p["compression"] else 0.0
    return costs.l_ps + nbytes / costs.server_rate + decode


def check(points: list[dict], costs: Costs) -> list[dict]:
    """Per measured point: measured and modelled round seconds and driver bytes, and their errors (%)."""
    out = []
    for p in points:
        state = p["state_mb"] * MB
        reduce = "executors" if p.get("reduced_on_executors") else "driver"
        bytes_out, bytes_in = driver_bytes(p["backend"], p["executors"], state, p["compression"], costs, reduce)
        round_s = p["compute_s"] + predicted_overhead(p, costs)
        out.append({
            "executors": p["executors"], "backend": p["backend"], "compression": p["compression"], "reduce": p.get("reduce"),
            "round_s": p["round_s"], "model_round_s": round(round_s, 3), "round_err_pct": round(100 * (round_s / p["round_s"] - 1), 1),
            "driver_in_mb": p["driver_in_mb"], "model_in_mb": round(bytes_in / MB, 3),
            "in_err_pct": round(100 * (bytes_in / MB / p["driver_in_mb"] - 1), 1),
            "driver_out_mb": p["driver_out_mb"], "model_out_mb": round(bytes_out / MB, 3),
            "out_err_pct": round(100 * (bytes_out / MB / p["driver_out_mb"] - 1), 1),
        })
    return out


# ---- the emulated cluster (benchmarks/netsim/run.py) -----------------------------------------------

def load_netsim(path: str) -> list[dict]:
    """The JSON lines of ``benchmarks/netsim/run.py --out`` (``"benchmark": "netsim"``): the wire-bound
    rounds the model is fitted to and checked against (τ = 1, blocking, full precision)."""
    with open(path) as f:
        return [r for r in map(json.loads, filter(str.strip, f)) if r.get("benchmark") == "netsim" and r.get("local_steps", 1) == 1
                and not r.get("overlap") and r.get("compression") is None]


# The emulated cluster's CPU and latency terms (the machine's 2 cores, shared by every host and by
# other work): per backend, the residual of a round over compute + wire is c0·r0 + c1·r1, with the
# regressors (r0, r1) the backend's own terms of the module docstring: rounds, the tasks and the
# results the driver decodes (N: n_tasks·L_task, N·S: N·S/R); ps, the round and the server's bytes
# (1: L_ps, 2·N·S: N·(S + S_up)/R_server); sharded, the round and every host's data-plane bytes
# (Flight and TLS, packing, the owners' sums and rule: N·(2N − 1)/N·S) on cores that each host
# shares with the others, a process getting about cores/load of a core (1, N·(2N − 1)/N·S·load/2,
# the row's 1-minute load average at its fit's end).
MACHINE_CORES = 2
RESIDUAL_TERMS = {"rounds": ("N·L_task", "N·S/R"), "ps": ("L_ps", "2·N·S/R_server"), "sharded": ("L", "N·(2N−1)/N·S·load/2 / R_cpu")}


def _residual_regressors(r: dict) -> tuple[float, float]:
    """(r0, r1) of an emulated-cluster row (bytes in r1): see :data:`RESIDUAL_TERMS`."""
    n, state = r["workers"], r["state_mb"] * MB
    if r["backend"] == "rounds":
        return float(n), n * state
    if r["backend"] == "ps":
        return 1.0, 2 * n * state
    load = max(1.0, (r.get("load_average") or MACHINE_CORES) / MACHINE_CORES)
    return 1.0, n * sharded_worker_bytes(n, state, state) * load


def fit_torrent_scale(lines: list[dict]) -> float:
    """torrent_scale: the mean over the emulated cluster's ``rounds`` rows of the driver's measured
    link bytes out per round, less its ACKs of the N·S it receives (1.3 % of a payload) and over
    the header factor, divided by u_sync(N, K)·S (1.0 without rows)."""
    ratios = []
    for r in lines:
        if r["backend"] == "rounds":
            state = r["state_mb"] * MB
            sent = r["hosts"]["driver"]["out_mb"] * MB - 0.013 * r["hosts"]["driver"]["in_mb"] * MB
            blocks = max(1, math.ceil(state / TORRENT_BLOCK))
            ratios.append(sent / r["header_factor"] / state / torrent_sync(r["workers"], blocks))
    return float(np.mean(ratios)) if ratios else 1.0


def wire_costs(torrent_scale: float) -> Costs:
    """Constants with every latency 0 and every CPU rate infinite: :func:`round_seconds` gives the
    compute and the wire time alone (the links' bytes at the link rate, headers counted)."""
    return Costs(l_job=0.0, l_task=0.0, l_stage=0.0, rate=math.inf, l_ps=0.0, server_rate=math.inf, u0=0.0, u1=0.0,
                 torrent_scale=torrent_scale)


def fit_emulated(lines: list[dict], rate_mbit: float | None = 200.0) -> dict:
    """The emulated cluster's constants, from its rows at ``rate_mbit`` (None: all): torrent_scale
    and, per backend, the residual ``c0·r0 + c1·r1`` (seconds) of measured round over compute plus
    wire (:func:`_residual_regressors`), by non-negative least squares: what the 2 shared cores add
    (Spark's tasks and the driver's decoding on rounds, the server on ps, Flight/TLS, packing, the
    sum and the rule on sharded). Fitted at one rate and checked at the other, the wire terms are
    what is tested: they double from 200 to 100 Mbit/s, the residual does not move."""
    used = [r for r in lines if rate_mbit is None or r["rate_mbit"] == rate_mbit]
    scale = fit_torrent_scale(used)
    costs = wire_costs(scale)
    residual = {}
    for backend in ("rounds", "ps", "sharded"):
        rows = [r for r in used if r["backend"] == backend]
        if not rows:
            residual[backend] = (0.0, 0.0)
            continue
        y = np.array([r["round_s"] - wire_round(r, costs) for r in rows])
        a = np.array([_residual_regressors(r) for r in rows])
        a0, a1 = _nnls(a, y) if len(rows) > 1 else (max(0.0, float(y[0] / a[0, 0])), 0.0)
        residual[backend] = (float(a0), float(a1))
    return {"torrent_scale": scale, "residual": residual, "fit_rate_mbit": rate_mbit, "fit_rows": len(used)}


def wire_round(r: dict, costs: Costs) -> float:
    """Compute plus wire seconds of an emulated-cluster row's round (τ = 1, no compression)."""
    return round_seconds(r["backend"], r["workers"], r["state_mb"] * MB, None, r["local_steps"], r["step_s"],
                         r["rate_mbit"] * 1e6 / 8, costs)


def check_netsim(lines: list[dict], emulated: dict) -> list[dict]:
    """Per emulated-cluster row: the model's round (compute + wire + the fitted residual) beside the
    measured median round, their ratio, and whether the row was in the fit."""
    costs = wire_costs(emulated["torrent_scale"])
    out = []
    for r in lines:
        wire = wire_round(r, costs)
        c0, c1 = emulated["residual"][r["backend"]]
        r0, r1 = _residual_regressors(r)
        predicted = wire + c0 * r0 + c1 * r1
        out.append({"backend": r["backend"], "workers": r["workers"], "rate_mbit": r["rate_mbit"], "params": r["params"],
                    "state_mb": r["state_mb"], "measured_s": r["round_s"], "wire_s": round(wire, 3), "predicted_s": round(predicted, 3),
                    "ratio": round(predicted / r["round_s"], 3), "wire_ratio": round(wire / r["round_s"], 3),
                    "fitted": emulated["fit_rate_mbit"] is None or r["rate_mbit"] == emulated["fit_rate_mbit"],
                    "load_average": r.get("load_average")})
    return out


def print_netsim(path: str, fit_rate: float | None) -> list[dict]:
    """The predicted-vs-measured table of ``path``'s rows (Markdown) and the fitted constants."""
    lines = load_netsim(path)
    emulated = fit_emulated(lines, fit_rate)
    checked = check_netsim(lines, emulated)
    print(f"emulated cluster ({os.path.relpath(path)}, {len(lines)} rows): torrent_scale c = {emulated['torrent_scale']:.3f}; "
          f"residual fitted at {fit_rate or 'every'} Mbit/s (s; s per MB): " + json.dumps(
              {b: {RESIDUAL_TERMS[b][0]: round(c0, 3), RESIDUAL_TERMS[b][1]: round(c1 * MB, 4)}
               for b, (c0, c1) in emulated["residual"].items()}, ensure_ascii=False))
    print("\n| backend | N | Mbit/s | params | load | measured round s | wire + compute s | model s | model / measured | in the fit |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in sorted(checked, key=lambda c: (c["params"], c["backend"], c["workers"], c["rate_mbit"])):
        print(f"| `{c['backend']}` | {c['workers']} | {c['rate_mbit']:g} | {c['params'] / 1e6:g}M | {c['load_average']} | {c['measured_s']:.3f} "
              f"| {c['wire_s']:.3f} "
              f"| {c['predicted_s']:.3f} | {c['ratio']:.3f} | {'yes' if c['fitted'] else 'no'} |")
    worst = max(checked, key=lambda c: abs(c["ratio"] - 1))
    print(f"largest |model / measured − 1|: {100 * abs(worst['ratio'] - 1):.1f} % ({worst['backend']}, N = {worst['workers']}, "
          f"{worst['rate_mbit']:g} Mbit/s)")
    return checked


# ---- output ---------------------------------------------------------------------------------------

GRID = {"workers": [8, 16, 32, 64, 128, 256], "params": [1e6, 1e7, 1e8, 1e9], "gbps": [10, 25, 100],
        "backend": ["rounds", "ps", "sharded", "sharded_local", "ring"], "tau": [1, 16, 128], "compression": [None, "fp16"]}


def plot(panels: list[tuple[str, list[dict]]], path: str, title: str) -> None:
    """One row of panels per (label, projected rows), one column per bandwidth: efficiency against N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gbps_values = sorted({r["gbps"] for _, rows in panels for r in rows})
    figure, axes = plt.subplots(len(panels), len(gbps_values), figsize=(4.6 * len(gbps_values), 3.8 * len(panels)),
                                sharey=True, squeeze=False)
    styles = {"rounds": "-", "ps": "--", "sharded": "-.", "sharded_local": (0, (5, 1, 1, 1, 1, 1)), "ring": ":"}
    colours = {1e6: "tab:blue", 1e7: "tab:orange", 1e8: "tab:green", 1e9: "tab:red"}
    for row_axes, (label, rows) in zip(axes, panels):
        for ax, gbps in zip(row_axes, gbps_values):
            for backend, params in itertools.product(styles, colours):
                sel = sorted((r for r in rows if r["gbps"] == gbps and r["backend"] == backend and r["params"] == params),
                             key=lambda r: r["workers"])
                if sel:
                    ax.plot([r["workers"] for r in sel], [r["efficiency"] for r in sel], linestyle=styles[backend], color=colours[params],
                            marker="o", markersize=3, label=f"{backend} {params:.0e}")
            ax.axhline(HOROVOD_EFFICIENCY, color="black", linewidth=0.8, label="Horovod 90 %")
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{label}, {gbps} Gb/s", fontsize=9)
            ax.set_xlabel("workers N")
        row_axes[0].set_ylabel("efficiency τ·t_step / t_round")
    for i, row_axes in enumerate(axes):  # a legend per set of lines: the first row's, and each later row's that differs
        labels = row_axes[-1].get_legend_handles_labels()[1]
        if i == 0 or labels != axes[i - 1][-1].get_legend_handles_labels()[1]:
            row_axes[-1].legend(fontsize=6, ncol=1, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", default=os.path.join(HERE, "scaling_measured.jsonl"))
    parser.add_argument("--plot", default=os.path.join(HERE, os.pardir, "docs", "images", "scaling_model.png"))
    parser.add_argument("--device", choices=["gpu", "cpu"], default="cpu")
    parser.add_argument("--gpu-tflops", type=float, default=100.0)
    parser.add_argument("--cpu-cores", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="rows per step and worker in the projection")
    parser.add_argument("--reuse", type=float, default=160.0, help="T: uses of each parameter per row (ResNet-50: 160)")
    parser.add_argument("--server-mb-s", type=float, default=400.0, help="ps_throughput.py's loopback server MB/s")
    parser.add_argument("--profile", choices=["dedicated", "fitted"], default="dedicated",
                        help="project with a dedicated cluster's latencies (default) or the fitted ones")
    parser.add_argument("--data-plane", default=os.path.join(HERE, "data_plane.jsonl"),
                        help="benchmarks/data_plane.py's JSON lines: the sharded backend's constants ('' for none: sharded left out)")
    parser.add_argument("--flight-gb-s", type=float, help="B_flight, GB/s, in place of the measured one")
    parser.add_argument("--sharded-sum", choices=["float32", "float64"], default="float32", help="the owner's sums (R_sum)")
    parser.add_argument("--netsim", default=os.path.join(HERE, "netsim.jsonl"),
                        help="benchmarks/netsim/run.py's JSON lines: the model checked against the emulated cluster ('' for none)")
    parser.add_argument("--netsim-fit-rate", type=float, default=200.0,
                        help="fit the emulated cluster's residual at this rate (Mbit/s; 0: every row) and check the others")
    parser.add_argument("--plot-tau", type=int, default=16)
    parser.add_argument("--json", action="store_true", help="print the whole grid as JSON lines")
    args = parser.parse_args()

    points = load(args.measured)
    fitted = fit(points)
    grid = dict(GRID)
    plane = None
    if args.data_plane and os.path.exists(args.data_plane):
        plane, source = load_plane(args.data_plane, args.flight_gb_s, args.sharded_sum)
    else:
        grid["backend"] = [b for b in GRID["backend"] if b not in SHARDED]
    netsim = load_netsim(args.netsim) if args.netsim and os.path.exists(args.netsim) else []
    torrent_scale = fit_torrent_scale(netsim)
    costs = replace(fitted, **plane) if args.profile == "fitted" and plane else (
        fitted if args.profile == "fitted" else dedicated(fitted, args.server_mb_s, plane, torrent_scale))
    print("fitted:", json.dumps({k: round(v, 6) for k, v in asdict(fitted).items()}))
    if plane:
        print(f"measured data plane ({os.path.relpath(args.data_plane)}, run {source['run']}, local-cluster N = {source['executors']}; "
              f"rates GB/s, L_rpc ms):", json.dumps({k: v for k, v in source.items() if k not in ("run", "executors")}))
        print("data plane constants:", json.dumps({
            "B_flight_gb_s": round(plane["flight_rate"] / 1e9, 4), "k_streams": plane["flight_streams"], "L_rpc_ms": round(plane["rpc_s"] * 1e3, 4),
            "R_pack_gb_s": round(plane["pack_rate"] / 1e9, 4), f"R_sum_{args.sharded_sum}_gb_s": round(plane["sum_rate"] / 1e9, 4),
            "R_rule_gb_s": round(plane["rule_rate"] / 1e9, 4), "R_codec_gb_s": round(plane["codec_rate"] / 1e9, 4)}))
    print(f"projected with ({args.profile}):", json.dumps({k: round(v, 6) for k, v in asdict(costs).items()}))
    checked = check(points, fitted)
    print("\n| N | backend | compression | combined on | round s | model | err % | driver in MB | model | err % | driver out MB | model | err % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c, p in zip(checked, points):
        where = "" if p["backend"] == "ps" else ("executors" if p.get("reduced_on_executors") else "driver")
        print(f"| {c['executors']} | {c['backend']} | {c['compression'] or '-'} | {where} | {c['round_s']} | {c['model_round_s']} "
              f"| {c['round_err_pct']} | {c['driver_in_mb']} | {c['model_in_mb']} | {c['in_err_pct']} | {c['driver_out_mb']} "
              f"| {c['model_out_mb']} | {c['out_err_pct']} |")
    for key in ("round_err_pct", "in_err_pct", "out_err_pct"):
        print(f"max |{key}|: {max(abs(c[key]) for c in checked)}")

    if netsim:
        print()
        print_netsim(args.netsim, args.netsim_fit_rate or None)

    measured_flops = 6 * points[0]["params"] * points[0]["batch_size"] / points[0]["step_s"]
    cpu_flops, gpu_flops = measured_flops * args.cpu_cores, args.gpu_tflops * 1e12
    flops = gpu_flops if args.device == "gpu" else cpu_flops
    print(f"\ndevice {args.device}: {flops / 1e12:.3g} TFLOP/s sustained per worker (measured one core: {measured_flops / 1e9:.3g} GFLOP/s), "
          f"batch {args.batch} per worker, T = {args.reuse:g} uses of a parameter per row, epoch of {IMAGENET_ROWS:,} rows")
    rows = project(grid, costs, flops, args.batch, reuse=args.reuse)
    if args.json:
        for r in rows:
            print(json.dumps(r))
    ns = grid["workers"]
    print("\nefficiency by N at 10 Gb/s, no compression (epoch minutes at N = 32; what bounds the round at N = 256)")
    print("| backend | τ | params | " + " | ".join(f"N={n}" for n in ns) + " | epoch min @32 | bound @256 |")
    print("|---|---|---|" + "---|" * (len(ns) + 2))
    for backend, tau, params in itertools.product(grid["backend"], grid["tau"], grid["params"]):
        sel = {r["workers"]: r for r in rows if (r["backend"], r["compression"], r["tau"], r["params"], r["gbps"]) == (backend, None, tau, params, 10)}
        print(f"| {backend} | {tau} | {params:.0e} | " + " | ".join(f"{sel[n]['efficiency']:.2f}" for n in ns)
              + f" | {sel[32]['epoch_s'] / 60:.3g} | {sel[256]['bound']} |")
    print("\nlargest N (of 8..256) at >= 90 % efficiency ('-': none)")
    cols = list(itertools.product(grid["params"], grid["gbps"]))
    print("| backend | compression | τ | " + " | ".join(f"{p:.0e} @{g}" for p, g in cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for backend, compression, tau in itertools.product(grid["backend"], grid["compression"], grid["tau"]):
        cells = []
        for params, gbps in cols:
            ok = [r["workers"] for r in rows if (r["backend"], r["compression"], r["tau"], r["params"], r["gbps"]) == (backend, compression, tau, params, gbps)
                  and r["efficiency"] >= HOROVOD_EFFICIENCY]
            cells.append(str(max(ok)) if ok else "-")
        print(f"| {backend} | {compression or '-'} | {tau} | " + " | ".join(cells) + " |")
    server_bound = [r for r in rows if r["backend"] == "ps" and r["bound"] == "server"]
    if server_bound:
        first = min(server_bound, key=lambda r: (r["gbps"], r["params"], r["workers"]))
        print(f"\nps: the driver-side server bounds the round first at {first['gbps']} Gb/s from N = {first['workers']} "
              f"(params {first['params']:.0e}, τ = {first['tau']}); server rate {costs.server_rate / MB:.0f} MB/s vs line rate "
              f"{first['gbps'] * GBIT / MB:.0f} MB/s")
    designs = [d for d in TAU_DESIGNS if plane or d[1] not in SHARDED]
    tau_cols = [(n, gbps) for gbps in (10, 100) for n in (64, 256)]
    print(f"\nτ for 90 % efficiency, 1e+08 parameters, gpu {gpu_flops / 1e12:.3g} TFLOP/s workers (t_step "
          f"{6 * 1e8 * args.batch * args.reuse / gpu_flops * 1e3:.1f} ms; '-': none up to 2^24)")
    before = (args.gpu_tflops, args.batch, args.reuse, args.profile, args.flight_gb_s, args.sharded_sum, args.server_mb_s) == (
        100, 64, 160, "dedicated", None, "float32", 400)  # the defaults TAU_BEFORE was printed with
    print("| design | " + " | ".join(f"N={n} @{g} Gb/s" for n, g in tau_cols) + (" | before (issue 43) |" if before else " |"))
    print("|---|" + "---|" * (len(tau_cols) + before))
    for label, backend, compression in designs:
        taus = [tau_for(backend, compression, n, 1e8, g, gpu_flops, args.batch, args.reuse, costs) for n, g in tau_cols]
        print(f"| {label} | " + " | ".join(str(t) if t else "-" for t in taus) + " |"
              + (" " + " / ".join(map(str, TAU_BEFORE.get(label, ("-",)))) + " |" if before else ""))
        if args.json:
            for (n, g), t in zip(tau_cols, taus):
                print(json.dumps({"tau90": t, "design": label, "backend": backend, "compression": compression, "workers": n, "gbps": g,
                                  "params": 1e8, "gpu_tflops": args.gpu_tflops, "batch": args.batch, "reuse": args.reuse}))
    if args.plot:
        plot_grid = {**grid, "tau": [args.plot_tau], "compression": [None], "backend": [b for b in grid["backend"] if b != "sharded_local"]}
        local = {**plot_grid, "backend": ["sharded_local", "ring"], "compression": ["fp16"]}
        panels = [(f"cpu {cpu_flops / 1e12:.2g} TFLOP/s", project(plot_grid, costs, cpu_flops, args.batch, reuse=args.reuse)),
                  (f"gpu {gpu_flops / 1e12:.3g} TFLOP/s", project(plot_grid, costs, gpu_flops, args.batch, reuse=args.reuse))]
        if plane:
            panels.append(("gpu, fp16, keepLocalOptimizer", project(local, costs, gpu_flops, args.batch, reuse=args.reuse)))
        plot(panels, args.plot, f"projected scaling efficiency, τ = {args.plot_tau}, batch {args.batch}, T = {args.reuse:g}; model fitted "
                                f"to local-cluster N = 2, 4, 8, data_plane.py's N = 2, 3, 4 "
                                f"and the emulated cluster's links;\nrows 1-2 no compression (rounds solid, ps "
                                f"dashed, sharded dash-dot, ring dotted), row 3 fp16 (sharded_local dash-dot-dot, ring dotted)")
        print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
