"""Epoch metric values from summed Keras metric variables, computed as Keras computes them.

Workers return the state of ``keras.Model.metrics_variables`` for their steps
(:meth:`sparkdl.keras.replica.Replica.train`); the driver sums it across workers and rounds
(:class:`sparkdl.core.metrics.MetricSums`) and a :class:`MetricReader` loads the sum into the
same metric objects Keras uses and reads ``model.get_metrics_result()``, so a history entry
equals what ``keras.Model.fit`` reports for the same batches (streaming metrics such as AUC
included), not an average of per-worker values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sparkdl.errors import CodecError, ConfigError
from sparkdl.keras.runtime import keras_module
from sparkdl.keras.spec import CompileSpec, ModelSpec


class MetricReader:
    """The fit's compiled metrics on the driver, built once per fit.

    Args:
        spec: the model's architecture (weights are not needed).
        compile_spec: optimizer, loss and metrics, as the replicas compile them.
        x_shape: per-row feature shape without the batch axis, e.g. ``(784,)``.
        x_dtype: the features' numpy dtype name, e.g. ``"float32"``.
        y_shape: per-row label shape, ``()`` for a class index or value, ``(k,)`` for one-hot.
        y_dtype: the labels' numpy dtype name, e.g. ``"int64"``.

    The compiled metrics build their variables on one eager ``compute_metrics`` (the train
    step's own metric update) over a one-row batch of zeros, shapes ``(1, *x_shape)`` and
    ``(1, *y_shape)``, as the replicas' build on their first step; then they are reset.
    (``test_on_batch`` fails with StopIteration on Keras 3.5 with TensorFlow 2.18.) The loss is
    computed too, so compile arguments that do not fit the model (``loss_weights`` for outputs it
    does not have, a metric that cannot read the labels) fail here, on the driver.

    Raises:
        ConfigError: when the loss or a metric fails on a one-row batch of these shapes.
    """

    def __init__(self, spec: ModelSpec, compile_spec: CompileSpec, x_shape: tuple, x_dtype: str, y_shape: tuple, y_dtype: str) -> None:
        keras_module()
        self.model = compile_spec.compile(spec.architecture_only().build())
        x = np.zeros((1, *x_shape), dtype=x_dtype)
        y = np.zeros((1, *y_shape), dtype=y_dtype)
        y_pred = self.model(x, training=False)
        try:  # the loss and metrics on one row, as a replica's first step computes them
            self.model.compute_loss(x, y, y_pred)
            self.model.compute_metrics(x, y, y_pred, sample_weight=None)
        except Exception as exc:
            raise ConfigError(
                f"the loss, metrics and compile arguments must fit the model's outputs of per-row shape {tuple(y_pred.shape[1:])} "
                f"and labels of per-row shape {tuple(y_shape)} ({y_dtype}). Received: {type(exc).__name__}: {str(exc).splitlines()[0][:400]}"
            ) from exc
        self.model.reset_metrics()
        self._variables = list(self.model.metrics_variables)
        self.names = [v.path for v in self._variables]

    def results(self, variables: Sequence[np.ndarray]) -> dict[str, float]:
        """Metric values for summed metric variables, with the keys and values of ``fit``'s History.

        Args:
            variables: ``model.metrics_variables`` values in model order, summed over the
                workers and rounds of an epoch (:meth:`MetricSums.total`).

        Returns:
            e.g. ``{"accuracy": 0.5, "auc": 0.4975, "loss": 0.6931}`` (python floats, keys sorted as
            in History).

        Raises:
            CodecError: when the count or a shape of ``variables`` differs from this model's
                metric variables (listed by path in the message).
        """
        if len(variables) != len(self._variables):
            raise CodecError(
                f"metric variables must match the model's {len(self._variables)} ({', '.join(self.names)}). "
                f"Received: {len(variables)} arrays"
            )
        for variable, array in zip(self._variables, variables, strict=True):
            if tuple(np.shape(array)) != tuple(variable.shape):
                raise CodecError(
                    f"metric variable {variable.path} must have shape {tuple(variable.shape)}. "
                    f"Received: shape {tuple(np.shape(array))}"
                )
        for variable, array in zip(self._variables, variables, strict=True):
            variable.assign(np.asarray(array).astype(variable.dtype))
        values = {name: float(np.asarray(value)) for name, value in self.model.get_metrics_result().items()}
        self.model.reset_metrics()
        return {name: values[name] for name in sorted(values)}  # History's order: Keras sorts pythonified logs
