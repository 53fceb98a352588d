"""Batched inference with a model cached per Python worker.

The Spark columns made from the outputs follow the loss family: :meth:`sparkdl.keras.losses.LossInfo.spark_outputs`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import numpy as np

from sparkdl.keras.replica import trim_padding
from sparkdl.keras.runtime import keras_module
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


def predict_array(model, x, batch_size: int, pads: tuple | None = None):
    """Model outputs for ``x`` in batches of ``batch_size`` rows (the last one partial).

    Args:
        model: a ``keras.Model``.
        x: inputs, shape ``(rows, *input_shape)``, or a list of such arrays, one per model input.
        batch_size: rows per ``predict_on_batch`` call.
        pads: per model input, the value that pads a (post-padded) sequence input's rows, None for
            other inputs; each batch of a sequence input is cut to its own longest row
            (:func:`sparkdl.keras.replica.trim_padding`). None: no input is cut.

    Returns:
        float32 array of shape ``(rows, *output_shape)``, rows in input order; for a model with
        several outputs, a list of such arrays, one per output.
    """
    xs = list(x) if isinstance(x, (list, tuple)) else [x]
    outputs = len(model.outputs)
    rows = len(xs[0])
    if rows == 0:
        empty = [np.zeros((0, *t.shape[1:]), np.float32) for t in model.outputs]
        return empty if outputs > 1 else empty[0]
    parts = []
    for i in range(0, rows, batch_size):
        batch = [a[i : i + batch_size] for a in xs]
        if pads is not None:
            batch = [trim_padding(a, pad) if pad is not None else a for a, pad in zip(batch, pads, strict=True)]
        out = model.predict_on_batch(batch[0] if len(batch) == 1 else batch)
        if isinstance(out, dict):  # a model built with a dict of outputs: flattened as model.outputs are (sorted keys)
            out = keras_module().tree.flatten(out)
        parts.append([np.asarray(o) for o in out] if outputs > 1 else [np.asarray(out[0] if isinstance(out, (list, tuple)) else out)])
    joined = [np.concatenate([p[k] for p in parts]).astype(np.float32, copy=False) for k in range(outputs)]
    return joined if outputs > 1 else joined[0]
