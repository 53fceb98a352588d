"""Batched inference with a model cached per Python worker.

The Spark columns made from the outputs follow the loss family: :meth:`sparkdl.keras.losses.LossInfo.spark_outputs`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import numpy as np

from sparkdl.keras.spec import ModelSpec

_MAX_CACHED = 2
_models: OrderedDict = OrderedDict()


def cached_model(spec: ModelSpec, weights: bytes | None = None, key: str | None = None):
    """The built ``keras.Model`` of ``spec`` in this process (LRU of 2 models).

    Args:
        spec: the model; with ``weights`` given, its architecture only.
        weights: Arrow IPC weights (:func:`sparkdl.serialization.arrow_codec.encode_arrays`) that
            replace ``spec.weights``, e.g. read from a Spark broadcast.
        key: cache key computed on the driver (``spec.digest`` of the full spec); defaults to
            ``spec.digest``.
    """
    key = key or spec.digest
    model = _models.get(key)
    if model is None:
        model = (spec if weights is None else replace(spec, weights=weights)).build()
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
