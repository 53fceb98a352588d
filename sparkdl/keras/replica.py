"""Worker-side model replicas, built and compiled once per Python worker per fit.

Spark reuses Python workers between tasks (``spark.python.worker.reuse``, on by default),
so a replica cached here serves every round of a fit that lands on this process. Each
round starts by loading the master state into the replica, so which worker process runs
which partition never changes the result.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from sparkdl.core.metrics import MetricMeans
from sparkdl.core.state import ModelState
from sparkdl.keras.runtime import keras_module
from sparkdl.keras.spec import CompileSpec, ModelSpec

_MAX_CACHED = 2
_replicas: OrderedDict[str, Replica] = OrderedDict()


class Replica:
    """A compiled Keras model whose optimizer is built, plus its initial optimizer state.

    Args:
        spec: architecture and initial weights.
        compile_spec: optimizer, loss and metrics.
        seed: seeds Keras' random layers (dropout) through ``keras.utils.set_random_seed``; any
            integer (Spark seeds are 64-bit and may be negative), reduced modulo 2**32.
    """

    def __init__(self, spec: ModelSpec, compile_spec: CompileSpec, seed: int) -> None:
        keras = keras_module()
        keras.utils.set_random_seed(seed & 0xFFFFFFFF)
        self.model = compile_spec.compile(spec.build())
        self.model.optimizer.build(self.model.trainable_variables)
        self.initial_optimizer = [np.asarray(v.numpy()) for v in self.model.optimizer.variables]

    def set_state(self, state: ModelState) -> None:
        """Load master weights, and optimizer state (its initial values when ``state.optimizer`` is None)."""
        for variable, array in zip(self.model.weights, state.weights, strict=True):
            variable.assign(array)
        optimizer = state.optimizer if state.optimizer is not None else self.initial_optimizer
        for variable, array in zip(self.model.optimizer.variables, optimizer, strict=True):
            variable.assign(array)

    def get_state(self) -> ModelState:
        return ModelState(
            weights=[np.asarray(v.numpy()) for v in self.model.weights],
            optimizer=[np.asarray(v.numpy()) for v in self.model.optimizer.variables],
        )

    def train(self, x: np.ndarray, y: np.ndarray, batch_size: int) -> dict[str, float]:
        """Run ceil(len(x) / batch_size) local steps over ``x`` in order, as ``fit(shuffle=False)`` does.

        Steps go through ``train_on_batch`` (the same compiled train step as ``fit``): measured on
        2 cores with two workers, ``fit`` per round sometimes took 5.2 s where this loop takes 3.2 s,
        as ``fit`` builds a ``tf.data`` pipeline whose threads compete with the other worker.

        Args:
            x: features, shape ``(rows, *input_shape)``.
            y: labels, shape ``(rows,)`` or ``(rows, k)``.
            batch_size: rows per step; the last batch may be partial.

        Returns:
            Keras metric means over these steps, e.g. ``{"loss": 0.31, "accuracy": 0.91}``.
        """
        means = MetricMeans()  # train_on_batch reports each batch alone; fit reports the row-weighted mean
        for start in range(0, len(x), batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            logs = self.model.train_on_batch(xb, yb, return_dict=True)
            means.add({name: float(value) for name, value in logs.items()}, len(xb))
        return means.means()


def get_replica(key: str, spec: ModelSpec, compile_spec: CompileSpec, seed: int) -> Replica:
    """The cached replica of fit ``key`` in this process, built on first use (LRU of 2 fits)."""
    replica = _replicas.get(key)
    if replica is None:
        replica = Replica(spec, compile_spec, seed)
        _replicas[key] = replica
        while len(_replicas) > _MAX_CACHED:
            _replicas.popitem(last=False)
    _replicas.move_to_end(key)
    return replica
