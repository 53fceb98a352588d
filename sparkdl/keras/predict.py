"""Batched inference with a model cached per Python worker, and Spark-ML-style outputs."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from sparkdl.keras.spec import ModelSpec

_MAX_CACHED = 2
_models: OrderedDict = OrderedDict()


def cached_model(spec: ModelSpec):
    """The built ``keras.Model`` for ``spec`` in this process, keyed by ``spec.digest`` (LRU of 2)."""
    key = spec.digest
    model = _models.get(key)
    if model is None:
        model = spec.build()
        _models[key] = model
        while len(_models) > _MAX_CACHED:
            _models.popitem(last=False)
    _models.move_to_end(key)
    return model


def predict_array(model, x: np.ndarray, batch_size: int) -> np.ndarray:
    """Model outputs for ``x`` in batches of ``batch_size`` rows (the last one partial).

    Args:
        model: a ``keras.Model``.
        x: inputs, shape ``(rows, *input_shape)``.
        batch_size: rows per ``predict_on_batch`` call.

    Returns:
        float32 array of shape ``(rows, *output_shape)``; rows in input order.
    """
    if len(x) == 0:
        return np.zeros((0, *model.outputs[0].shape[1:]), np.float32)
    parts = [np.asarray(model.predict_on_batch(x[i : i + batch_size])) for i in range(0, len(x), batch_size)]
    return np.concatenate(parts).astype(np.float32, copy=False)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def to_spark_outputs(outputs: np.ndarray, task: str, from_logits: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """Spark ML ``prediction`` and ``probability`` values from raw model outputs.

    Args:
        outputs: shape ``(rows, k)`` or ``(rows,)``.
        task: ``"classification"``: k > 1 gives prediction = argmax (a class index) and
            probability = the k outputs; k == 1 (a sigmoid) gives probability = [1 - p, p]
            and prediction = 1.0 when p >= 0.5. ``"regression"``: prediction = the output,
            shape ``(rows,)`` when k == 1 else ``(rows, k)``; no probability.
        from_logits: the outputs are raw scores (the loss had ``from_logits=True``): probabilities
            are their softmax (k > 1) or sigmoid (k == 1).

    Returns:
        ``(prediction, probability)``: float64 prediction and float32 ``(rows, classes)`` or None.
    """
    outputs = outputs.reshape(len(outputs), -1)
    if task == "regression":
        values = outputs[:, 0] if outputs.shape[1] == 1 else outputs
        return values.astype(np.float64), None
    scores = outputs.astype(np.float64)
    if outputs.shape[1] == 1:
        p = 1.0 / (1.0 + np.exp(-scores[:, 0])) if from_logits else scores[:, 0]
        return (p >= 0.5).astype(np.float64), np.stack([1.0 - p, p], axis=1).astype(np.float32)
    probability = _softmax(scores) if from_logits else scores
    return probability.argmax(axis=1).astype(np.float64), probability.astype(np.float32)
