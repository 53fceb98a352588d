"""Validated, frozen settings of one fit. Units are in the names (``round_timeout_s``)."""

from __future__ import annotations

from dataclasses import dataclass

from sparkdl.errors import ConfigError

MODES = ("sync", "bmuf", "async", "hogwild", "staleness_aware", "ssp")
ROUNDS_ONLY_MODES = ("bmuf",)
ASYNC_MODES = ("async", "hogwild", "staleness_aware", "ssp")
BACKENDS = ("rounds", "ps", "auto")
# τ (local steps between a worker's push and its next pull) when ``localSteps`` is None in an
# asynchronous mode; measured on the MNIST CNN of conf/mnist_cnn.yaml with 2 workers (README).
ASYNC_DEFAULT_LOCAL_STEPS = {"async": 4, "hogwild": 4, "staleness_aware": 4, "ssp": 4}
DEFAULT_STALENESS = 2


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
        verbose: 0 silent, 1 one line per epoch on the driver.
        round_timeout_s: seconds one round may take before its Spark jobs are cancelled.
        keep_partitioning: train on the input's own partitions (one worker each) instead of
            spreading rows round-robin over ``num_workers`` partitions.
        staleness: SSP's bound s (clocks, >= 0): a worker more than s clocks ahead of the slowest waits.
        server_port: TCP port of the ``ps`` backend's parameter server (0: a free port).
        worker_timeout_s: seconds a ``ps`` worker may stay silent (no push, pull or heartbeat)
            before the fit fails naming its partition.
        compression: how updates travel: None (full state) or ``"fp16"`` (float16 updates;
            :mod:`sparkdl.core.compression`), backend ``rounds``.

    ``backend="auto"`` resolves to ``rounds`` for ``sync`` and ``ps`` for the asynchronous modes
    (see :attr:`resolved_backend`); ``rounds`` refuses the asynchronous modes.

    Raises:
        ConfigError: when a value is outside its range.
    """

    num_workers: int = 2
    epochs: int = 1
    batch_size: int = 32
    local_steps: int | None = None
    mode: str = "sync"
    backend: str = "rounds"
    seed: int = 0
    shuffle: bool = True
    verbose: int = 1
    round_timeout_s: float = 3600.0
    keep_partitioning: bool = False
    staleness: int = DEFAULT_STALENESS
    server_port: int = 0
    worker_timeout_s: float = 600.0
    compression: str | None = None

    @property
    def resolved_backend(self) -> str:
        """``rounds`` or ``ps``: ``auto`` picks ``ps`` for the asynchronous modes."""
        if self.backend == "auto":
            return "ps" if self.mode in ASYNC_MODES else "rounds"
        return self.backend

    def __post_init__(self) -> None:
        _positive_int("numWorkers", self.num_workers)
        _positive_int("epochs", self.epochs)
        _positive_int("batchSize", self.batch_size)
        _positive_int("localSteps", self.local_steps, allow_none=True)
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}. Received: mode={self.mode!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {BACKENDS}. Received: backend={self.backend!r}")
        from sparkdl.core.compression import check_compression

        check_compression(self.compression)
        if self.compression is not None and self.resolved_backend == "ps":
            raise ConfigError(
                f"compression runs on backend 'rounds' for now. Received: compression={self.compression!r} with backend "
                f"'ps' (mode {self.mode!r})"
            )
        if self.mode in ROUNDS_ONLY_MODES and self.backend == "ps":
            raise ConfigError(f"mode {self.mode!r} runs on backend 'rounds' for now. Received: mode={self.mode!r}, backend='ps' (use 'rounds' or 'auto')")
        if self.mode in ASYNC_MODES and self.backend == "rounds":
            raise ConfigError(
                f"mode {self.mode!r} is asynchronous and runs on backend 'ps' (a parameter server); backend 'rounds' "
                f"runs modes 'sync' and 'bmuf'. Received: mode={self.mode!r}, backend='rounds' (use backend='ps' or 'auto')"
            )
        if isinstance(self.staleness, bool) or not isinstance(self.staleness, int) or self.staleness < 0:
            raise ConfigError(f"staleness must be an integer >= 0 (clocks). Received: staleness={self.staleness!r}")
        if isinstance(self.server_port, bool) or not isinstance(self.server_port, int) or not 0 <= self.server_port <= 65535:
            raise ConfigError(f"serverPort must be an integer in [0, 65535] (0 picks a free port). Received: serverPort={self.server_port!r}")
        if not self.worker_timeout_s > 0:
            raise ConfigError(f"workerTimeout must be a positive number of seconds. Received: {self.worker_timeout_s!r}")
        if not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer. Received: seed={self.seed!r}")
        if self.verbose not in (0, 1):
            raise ConfigError(f"verbose must be 0 or 1. Received: verbose={self.verbose!r}")
        if not self.round_timeout_s > 0:
            raise ConfigError(
                f"roundTimeout must be a positive number of seconds. Received: {self.round_timeout_s!r}"
            )
