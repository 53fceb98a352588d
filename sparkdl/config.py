"""Validated, frozen settings of one fit. Units are in the names (``round_timeout_s``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparkdl.core.modes import ASYNC_MODES, MODES, ROUND_MODES
from sparkdl.errors import ConfigError, did_you_mean

BACKENDS = ("rounds", "ps", "sharded", "auto")  # the backend Param's choices: the registry's names (sparkdl.spark.backends) and auto
# τ (local steps between a worker's push and its next pull) when ``localSteps`` is None in an
# asynchronous mode; measured on the MNIST CNN of conf/mnist_cnn.yaml with 2 workers (README).
ASYNC_DEFAULT_LOCAL_STEPS = {"async": 4, "hogwild": 4, "staleness_aware": 4, "ssp": 4}
DEFAULT_STALENESS = 2
# Liveness: a worker's heartbeat thread beats every HEARTBEAT_FRACTION of workerTimeout (at most
# HEARTBEAT_MAX_S), so a timeout holds many beats and one late beat on a loaded machine is no alarm;
# a workerTimeout under MIN_WORKER_TIMEOUT_S cannot be honoured that way and is refused.
HEARTBEAT_FRACTION = 0.1
HEARTBEAT_MAX_S = 2.0
MIN_WORKER_TIMEOUT_S = 5.0
MIXED_PRECISION = ("mixed_float16", "mixed_bfloat16")  # besides None: Keras dtype policies of the replicas


def _positive_int(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer. Received: {name}={value!r}")


@dataclass(frozen=True)
class FitConfig:
    """Settings of one ``KerasEstimator.fit``.

    Args:
        num_workers: number of model replicas, one Spark task each (>= 1).
        epochs: passes over the data (>= 1).
        batch_size: rows per local step (>= 1).
        local_steps: τ, local steps between two averaging rounds; ``None`` means one pass
            over each worker's partition, i.e. one round per epoch.
        mode: training mode, one of ``MODES``.
        backend: round transport, one of ``BACKENDS``.
        seed: seed of the per-epoch shuffles and of the replicas' random layers.
        shuffle: shuffle each partition's rows at every epoch, as ``keras.Model.fit(shuffle=True)``.
        verbose: 0 silent, 1 a live progress bar on the driver (a line per epoch when stdout is not a
            terminal), 2 one line per epoch.
        round_timeout_s: seconds one round may take before its Spark jobs are cancelled.
        keep_partitioning: train on the input's own partitions (one worker each) instead of
            spreading rows round-robin over ``num_workers`` partitions.
        staleness: SSP's bound s (clocks, >= 0): a worker more than s clocks ahead of the slowest waits.
        server_port: TCP port of the driver's server: ``ps``' parameter server, ``sharded``'s coordinator (0: a free port).
        worker_timeout_s: seconds a ``ps`` or ``sharded`` worker may stay silent (no push, pull or
            heartbeat) before its task attempt is killed and retried (>= ``MIN_WORKER_TIMEOUT_S``);
            its heartbeat thread beats every :attr:`heartbeat_s`. A stage short of task slots waits
            :func:`~sparkdl.spark.training.nodes.node_wait_s` of it for a replacement.
        compression: how updates travel: None (full state), ``"fp16"`` (float16 updates), ``"1bit"``
            or ``"threshold"`` (error-feedback quantizers; :mod:`sparkdl.core.compression`), any mode.
        compression_threshold: ``"threshold"``'s t (> 0, in weight units): residual entries with
            |r| >= t are sent as ±t.
        min_workers_per_round: straggler-tolerant rounds: a round may close once this many workers
            (an int >= 1) or this fraction of them (a float in (0, 1], rounded up) sent their
            update; None waits for every worker.
        round_deadline_s: with ``min_workers_per_round``: seconds from a round's start during which
            it waits for every worker; after it, the round closes as soon as the minimum has
            arrived (0: at once). Updates that arrive later are dropped and counted.
        mixed_precision: None (the model's dtypes), ``"mixed_float16"`` or ``"mixed_bfloat16"``: the Keras
            dtype policy of the replicas' layers (16-bit compute, float32 variables; loss scaling for
            float16); master weights, averaging and the Arrow wire stay float32.
        data_timeout_s: seconds a data job (the check and caching passes over the input, a
            validation pass) may run before it is cancelled; rounds have ``round_timeout_s``.
        checkpoint_dir: a folder (local or any Hadoop URI) for snapshots of the fit's whole state;
            a fit with the same folder continues from its newest one (None: no checkpoints).
        checkpoint_every: with ``checkpoint_dir``: also a snapshot after every this many rounds
            (None: at epoch ends only; asynchronous modes: epoch ends only).
        server_tls: the driver's server (``ps``, ``sharded``) speaks TLS with a per-fit certificate its workers pin.
        server_cert_file, server_key_file: your own PEM certificate and key for the server instead.
        keep_local_optimizer: backend ``sharded``: workers keep their optimizer state and send their
            weights alone (always with ``diloco``).
        overlap: backend ``sharded``: rounds that never block training (the eager overlap rule,
            :mod:`sparkdl.core.modes.overlap`).

    ``backend="auto"`` is resolved against the session when the fit starts
    (:func:`sparkdl.spark.backends.choose_backend`); what each backend runs (modes, compressions,
    stragglers, validation) is checked against the backends' registry
    (:func:`sparkdl.spark.backends.check`), and ``min_workers_per_round`` needs a round mode.

    Raises:
        ConfigError: when a value is outside its range.
    """

    num_workers: int = 2
    epochs: int = 1
    batch_size: int = 32
    local_steps: int | None = None
    mode: str = "sync"
    backend: str = "auto"
    seed: int = 0
    shuffle: bool = True
    verbose: int = 1
    round_timeout_s: float = 3600.0
    keep_partitioning: bool = False
    staleness: int = DEFAULT_STALENESS
    server_port: int = 0
    worker_timeout_s: float = 600.0
    compression: str | None = None
    compression_threshold: float = 0.01
    min_workers_per_round: int | float | None = None
    round_deadline_s: float = 0.0
    mixed_precision: str | None = None
    data_timeout_s: float = 86400.0
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    server_tls: bool = True
    server_cert_file: str | None = None
    server_key_file: str | None = None
    keep_local_optimizer: bool = False
    overlap: bool = False

    @property
    def heartbeat_s(self) -> float:
        """Seconds between a worker's heartbeats: ``HEARTBEAT_FRACTION`` of ``workerTimeout``, at most
        ``HEARTBEAT_MAX_S`` (a 5 s timeout holds 10 beats, the default 600 s one 300)."""
        return min(HEARTBEAT_MAX_S, HEARTBEAT_FRACTION * self.worker_timeout_s)

    def min_workers(self, workers: int) -> int:
        """The updates that may close a round of ``workers`` workers (``workers`` when not set)."""
        value = self.min_workers_per_round
        if value is None:
            return workers
        if isinstance(value, float):
            return max(1, min(workers, math.ceil(value * workers - 1e-9)))
        return max(1, min(workers, value))

    def __post_init__(self) -> None:
        _positive_int("numWorkers", self.num_workers)
        _positive_int("epochs", self.epochs)
        _positive_int("batchSize", self.batch_size)
        _positive_int("localSteps", self.local_steps, allow_none=True)
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}.{did_you_mean(self.mode, MODES)} Received: mode={self.mode!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {BACKENDS}.{did_you_mean(self.backend, BACKENDS)} "
                              f"Received: backend={self.backend!r}")
        from sparkdl.core.compression import check_compression, check_threshold  # pyarrow: not for sparkdl.keras alone

        check_compression(self.compression)
        if self.compression == "threshold":
            check_threshold(self.compression_threshold)
        value = self.min_workers_per_round
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or (isinstance(value, int) and value < 1)
                                  or (isinstance(value, float) and not 0.0 < value <= 1.0)):
            raise ConfigError(
                "minWorkersPerRound must be None (wait for every worker), a count >= 1 (int) or a fraction in (0, 1] "
                f"(float). Received: minWorkersPerRound={value!r}"
            )
        if not (isinstance(self.round_deadline_s, (int, float)) and math.isfinite(self.round_deadline_s) and self.round_deadline_s >= 0):
            raise ConfigError(f"roundDeadline must be a number of seconds >= 0. Received: roundDeadline={self.round_deadline_s!r}")
        if value is not None and self.mode in ASYNC_MODES:
            raise ConfigError(
                f"minWorkersPerRound closes the rounds of the round modes {list(ROUND_MODES)}; the asynchronous modes have no "
                f"rounds to wait for. Received: minWorkersPerRound={value!r} with mode {self.mode!r}"
            )
        if isinstance(self.staleness, bool) or not isinstance(self.staleness, int) or self.staleness < 0:
            raise ConfigError(f"staleness must be an integer >= 0 (clocks). Received: staleness={self.staleness!r}")
        if isinstance(self.server_port, bool) or not isinstance(self.server_port, int) or not 0 <= self.server_port <= 65535:
            raise ConfigError(f"serverPort must be an integer in [0, 65535] (0 picks a free port). Received: serverPort={self.server_port!r}")
        if not (isinstance(self.worker_timeout_s, (int, float)) and self.worker_timeout_s >= MIN_WORKER_TIMEOUT_S):
            raise ConfigError(
                f"workerTimeout must be a number of seconds >= {MIN_WORKER_TIMEOUT_S:g}: each worker sends a heartbeat every "
                f"{HEARTBEAT_FRACTION:g} of it (at most every {HEARTBEAT_MAX_S:g} s), and a shorter timeout would take a late "
                f"beat on a busy machine for a dead worker. Received: workerTimeout={self.worker_timeout_s!r}"
            )
        if not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer. Received: seed={self.seed!r}")
        if isinstance(self.verbose, bool) or self.verbose not in (0, 1, 2):
            raise ConfigError(f"verbose must be 0, 1 or 2. Received: verbose={self.verbose!r}")
        if self.mixed_precision is not None and self.mixed_precision not in MIXED_PRECISION:
            raise ConfigError(
                f"mixedPrecision must be None, {MIXED_PRECISION[0]!r} or {MIXED_PRECISION[1]!r}. Received: mixedPrecision={self.mixed_precision!r}"
            )
        if not self.round_timeout_s > 0:
            raise ConfigError(
                f"roundTimeout must be a positive number of seconds. Received: {self.round_timeout_s!r}"
            )
        if not (isinstance(self.data_timeout_s, (int, float)) and self.data_timeout_s > 0):
            raise ConfigError(f"dataTimeout must be a positive number of seconds. Received: {self.data_timeout_s!r}")
        _positive_int("checkpointEvery", self.checkpoint_every, allow_none=True)
        if self.checkpoint_dir is not None and (not isinstance(self.checkpoint_dir, str) or not self.checkpoint_dir.strip()):
            raise ConfigError(f"checkpointDir must be a folder path or URI, or None. Received: {self.checkpoint_dir!r}")
        if (self.server_cert_file is None) != (self.server_key_file is None):
            raise ConfigError("serverCertFile and serverKeyFile must be given together. Received: "
                              f"serverCertFile={self.server_cert_file!r}, serverKeyFile={self.server_key_file!r}")
