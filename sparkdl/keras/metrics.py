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
from sparkdl.keras.memory import held_nbytes, release_cycles
from sparkdl.keras.spec import CompileSpec, ModelSpec


class MetricReader:
    """The fit's compiled metrics on the driver, built once per fit.

    Args:
        spec: the model's architecture (weights are not needed).
        compile_spec: optimizer, loss and metrics, as the replicas compile them.
        x_shape: per-row feature shape without the batch axis, e.g. ``(784,)`` (a list of them, one
            per model input, with ``x_dtype`` a list too; a ``None`` axis counts as 1).
        x_dtype: the features' numpy dtype name, e.g. ``"float32"``.
        y_shape: per-row label shape, ``()`` for a class index or value, ``(k,)`` for one-hot (a
            list, one per model output, with ``y_dtype`` a list too).
        y_dtype: the labels' numpy dtype name, e.g. ``"int64"``.
        weighted: rows carry sample weights (the dry run passes one).

    The compiled metrics build their variables on one eager ``compute_metrics`` (the train
    step's own metric update) over a one-row batch of zeros, shapes ``(1, *x_shape)`` and
    ``(1, *y_shape)``, as the replicas' build on their first step; then they are reset.
    (``test_on_batch`` fails with StopIteration on Keras 3.5 with TensorFlow 2.18.) The loss is
    computed too, so compile arguments that do not fit the model (``loss_weights`` for outputs it
    does not have, a metric that cannot read the labels) fail here, on the driver.

    Raises:
        ConfigError: when the loss or a metric fails on a one-row batch of these shapes.
    """

    def __init__(self, spec: ModelSpec, compile_spec: CompileSpec, x_shape, x_dtype, y_shape, y_dtype, weighted: bool = False) -> None:
        keras_module()
        self.model = compile_spec.compile(spec.architecture_only().build())
        # One shape and dtype per model input (output), or a single one for a one-input (one-output) model.
        x_specs = list(zip(x_shape, x_dtype, strict=True)) if isinstance(x_dtype, (list, tuple)) else [(x_shape, x_dtype)]
        y_specs = list(zip(y_shape, y_dtype, strict=True)) if isinstance(y_dtype, (list, tuple)) else [(y_shape, y_dtype)]
        # Per input and output its per-row shape (None: a length that varies) and dtype: a replica's warm-up step
        self.row_specs = ([(tuple(s), str(np.dtype(t))) for s, t in x_specs], [(tuple(s), str(np.dtype(t))) for s, t in y_specs],
                          bool(weighted))
        xs = [np.zeros((1, *[1 if d is None else d for d in s]), dtype=t) for s, t in x_specs]
        ys = [np.zeros((1, *s), dtype=t) for s, t in y_specs]
        x = xs[0] if len(xs) == 1 else xs
        y = ys[0] if len(ys) == 1 else ys
        y_shape = tuple(ys[0].shape[1:]) if len(ys) == 1 else [tuple(a.shape[1:]) for a in ys]
        y_dtype = str(ys[0].dtype) if len(ys) == 1 else [str(a.dtype) for a in ys]
        sample_weight = np.ones(1, np.float32) if weighted else None
        y_pred = self.model(x, training=False)
        pred_shape = tuple(y_pred.shape[1:]) if not isinstance(y_pred, (list, tuple, dict)) else [tuple(p.shape[1:]) for p in (y_pred.values() if isinstance(y_pred, dict) else y_pred)]
        try:  # the loss and metrics on one row, as a replica's first step computes them
            self.model.compute_loss(x, y, y_pred, sample_weight=sample_weight)
            self.model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        except Exception as exc:
            raise ConfigError(
                f"the loss, metrics and compile arguments must fit the model's outputs of per-row shape {pred_shape} "
                f"and labels of per-row shape {y_shape} ({y_dtype}). Received: {type(exc).__name__}: {str(exc).splitlines()[0][:400]}"
            ) from exc
        self.model.reset_metrics()
        self._metrics = self.model  # the model whose compiled metrics read the sums
        self._variables = list(self.model.metrics_variables)
        self.names = [v.path for v in self._variables]
        self.probe = self._probe(compile_spec, y_pred, x, y, sample_weight)
        if self.probe is not None:
            self._metrics, self._variables = self.probe, list(self.probe.metrics_variables)

    def _probe(self, compile_spec: CompileSpec, y_pred, x, y, sample_weight):
        """A model without weights whose outputs are its inputs, named and shaped as this model's
        outputs and compiled alike: its metrics read the workers' sums as the model's would, so the
        driver need not keep the model (its weights: a third of an Adam state) for the metrics. None
        when its metric variables would differ from the model's (then the model itself serves)."""
        keras = keras_module()
        try:
            outputs = y_pred if isinstance(y_pred, (list, tuple)) else [y_pred]
            names = list(getattr(self.model, "output_names", None) or [self.model.layers[-1].name])  # Sequential: its last layer
            if isinstance(y_pred, dict) or len(names) != len(outputs):
                return None
            inputs = [keras.Input(tuple(o.shape[1:]), dtype=o.dtype, name=f"{n}_probe") for n, o in zip(names, outputs, strict=True)]
            ends = [keras.layers.Identity(name=n)(i) for n, i in zip(names, inputs, strict=True)]
            single = len(ends) == 1
            probe = compile_spec.compile(keras.Model(inputs[0] if single else inputs, ends[0] if single else ends,
                                                     name=f"{self.model.name}_metrics"))
            pred = probe([np.asarray(o) for o in outputs] if len(outputs) > 1 else np.asarray(outputs[0]), training=False)
            probe.compute_loss(x, y, pred, sample_weight=sample_weight)
            probe.compute_metrics(x, y, pred, sample_weight=sample_weight)
            probe.reset_metrics()
        except Exception:  # noqa: BLE001 - e.g. a metric that reads the model itself: the model serves
            return None
        ours = [(tuple(v.shape), str(v.dtype)) for v in self.model.metrics_variables]
        theirs = [(tuple(v.shape), str(v.dtype)) for v in probe.metrics_variables]
        return probe if ours == theirs else None

    def release_model(self) -> None:
        """Drop the model (and its weights) when the metrics no longer need it (a probe reads them),
        collected at once when the models dropped since the last collection hold
        :data:`~sparkdl.keras.memory.COLLECT_BYTES` or more (:func:`~sparkdl.keras.memory.release_cycles`)."""
        if self.probe is not None:
            nbytes = held_nbytes(self.model)  # its weights and the optimizer state built on it
            self.model = None
            release_cycles(nbytes)  # a Keras model is a cycle of layers and model: its variables go only with a collection

    @classmethod
    def for_columns(cls, spec: ModelSpec, compile_spec: CompileSpec, columns) -> MetricReader:
        """The reader for the tensors a fit's tasks read (:class:`~sparkdl.serialization.columns.ModelColumns`)."""
        return cls(spec, compile_spec, [t.shape for t in columns.inputs], [t.dtype for t in columns.inputs],
                   [t.shape for t in columns.outputs], [t.dtype for t in columns.outputs],
                   weighted=columns.weight is not None or bool(columns.class_weight))

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
        values = {name: float(np.asarray(value)) for name, value in self._metrics.get_metrics_result().items()}
        self._metrics.reset_metrics()
        return {name: values[name] for name in sorted(values)}  # History's order: Keras sorts pythonified logs
