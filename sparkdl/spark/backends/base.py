"""The backend interface and the plain-value records it exchanges with the estimator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sparkdl.config import FitConfig
from sparkdl.core.modes import ModePolicy
from sparkdl.core.schedule import RoundPlan
from sparkdl.core.state import ModelState
from sparkdl.keras.spec import CompileSpec, ModelSpec
from sparkdl.spark.data import PreparedData


@dataclass(frozen=True)
class TrainJob:
    """Everything a training task needs, as plain values resolved on the driver.

    Never holds a SparkSession, a live Keras model or the estimator itself.

    Attributes:
        fit_id: unique id of this fit (cache key for replicas and partitions on workers).
        spec: architecture and initial weights.
        compile_spec: optimizer, loss, metrics.
        data: the prepared, cached training data.
        plan: which rows each worker trains on in each round.
        config: the fit's settings.
        reader: the driver's :class:`~sparkdl.keras.metrics.MetricReader`, when the estimator built
            one already (it stays on the driver; tasks get a :class:`TaskSpec`-like value instead).
        validation: the prepared, cached validation data, or None.
        budget_bytes: a task's memory budget for its partition (bytes); larger ones stay on disk.
    """

    fit_id: str
    spec: ModelSpec
    compile_spec: CompileSpec
    data: PreparedData
    plan: RoundPlan
    config: FitConfig
    reader: object = None
    validation: PreparedData | None = None
    budget_bytes: int = 2**62


@dataclass
class FitResult:
    """Outcome of a backend run.

    Attributes:
        state: final master weights and optimizer state.
        history: per-epoch metric means, ``{"loss": [...], "accuracy": [...]}``.
        rounds: rounds run.
        epoch_seconds: wall-clock seconds of each epoch.
        info: backend facts for ``fitInfo`` (e.g. ``reduced_on_executors``, ``rounds_reading_data``).
    """

    state: ModelState
    history: dict[str, list[float]] = field(default_factory=dict)
    rounds: int = 0
    epoch_seconds: list[float] = field(default_factory=list)
    info: dict = field(default_factory=dict)


class Backend(Protocol):
    """Runs the rounds of one fit."""

    name: str

    def run(self, job: TrainJob, policy: ModePolicy, state: ModelState, callbacks=None) -> FitResult:
        """Train from ``state`` and return the final state and history, running ``callbacks`` (a
        :class:`~sparkdl.keras.callbacks.DriverCallbacks`, or None) on the driver: ``rounds`` at every
        round and epoch (they may stop the fit and change the learning rate), ``ps`` at each epoch's end.

        Raises:
            WorkerError: when a task fails for good (after Spark's own retries).
            RoundTimeoutError: when a round exceeds ``job.config.round_timeout_s``.
        """
