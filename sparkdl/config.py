"""Validated, frozen settings of one fit. Units are in the names (``round_timeout_s``).

Each field is a Param of :mod:`sparkdl.param_specs`, which declares its default and its range once:
``FitConfig`` checks every field against its Param's :meth:`~sparkdl.param_specs.ParamSpec.check`
(the rule the Param's setter, the job config and the docs use), then the relations between them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from sparkdl.core.modes import ASYNC_MODES, ROUND_MODES
from sparkdl.errors import ConfigError
from sparkdl.param_specs import BY_NAME, HEARTBEAT_FRACTION, HEARTBEAT_MAX_S

# τ (local steps between a worker's push and its next pull) when ``localSteps`` is None in an
# asynchronous mode; measured on the MNIST CNN of conf/mnist_cnn.yaml with 2 workers (README).
ASYNC_DEFAULT_LOCAL_STEPS = {"async": 4, "hogwild": 4, "staleness_aware": 4, "ssp": 4}
DEFAULT_STALENESS = BY_NAME["staleness"].default


def _param(name: str):
    """A field holding Param ``name``: its declared default, and the Param's name for the checks."""
    return field(default=BY_NAME[name].default, metadata={"param": name})


@dataclass(frozen=True)
class FitConfig:
    """Settings of one ``KerasEstimator.fit``.

    Args:
        num_workers: number of model replicas, one Spark task each (>= 1).
        epochs: passes over the data (>= 1).
        batch_size: rows per local step (>= 1).
        local_steps: τ, local steps between two averaging rounds; ``None`` means one pass
            over each worker's partition, i.e. one round per epoch.
        mode: training mode, one of ``sparkdl.core.modes.MODES``.
        backend: round transport, one of ``param_specs.BACKENDS``.
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
            heartbeat) before its task attempt is killed and retried (>= ``param_specs.MIN_WORKER_TIMEOUT_S``);
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

    num_workers: int = _param('numWorkers')
    epochs: int = _param('epochs')
    batch_size: int = _param('batchSize')
    local_steps: int | None = _param('localSteps')
    mode: str = _param('mode')
    backend: str = _param('backend')
    seed: int = _param('seed')
    shuffle: bool = _param('shuffle')
    verbose: int = _param('verbose')
    round_timeout_s: float = _param('roundTimeout')
    keep_partitioning: bool = _param('keepPartitioning')
    staleness: int = _param('staleness')
    server_port: int = _param('serverPort')
    worker_timeout_s: float = _param('workerTimeout')
    compression: str | None = _param('compression')
    compression_threshold: float = _param('compressionThreshold')
    min_workers_per_round: int | float | None = _param('minWorkersPerRound')
    round_deadline_s: float = _param('roundDeadline')
    mixed_precision: str | None = _param('mixedPrecision')
    data_timeout_s: float = _param('dataTimeout')
    checkpoint_dir: str | None = _param('checkpointDir')
    checkpoint_every: int | None = _param('checkpointEvery')
    server_tls: bool = _param('serverTls')
    server_cert_file: str | None = _param('serverCertFile')
    server_key_file: str | None = _param('serverKeyFile')
    keep_local_optimizer: bool = _param('keepLocalOptimizer')
    overlap: bool = _param('overlap')

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
        for f in fields(self):  # each field against its Param's declared range and choices
            BY_NAME[f.metadata["param"]].check(getattr(self, f.name))
        value = self.min_workers_per_round
        if value is not None and self.mode in ASYNC_MODES:
            raise ConfigError(
                f"minWorkersPerRound closes the rounds of the round modes {list(ROUND_MODES)}; the asynchronous modes have no "
                f"rounds to wait for. Received: minWorkersPerRound={value!r} with mode {self.mode!r}"
            )
        if (self.server_cert_file is None) != (self.server_key_file is None):
            raise ConfigError("serverCertFile and serverKeyFile must be given together. Received: "
                              f"serverCertFile={self.server_cert_file!r}, serverKeyFile={self.server_key_file!r}")
