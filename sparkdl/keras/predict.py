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

#: ``inferenceBatchSize=None``: rows per predict call such that the model's largest per-row tensor (an
#: input or a layer's output) takes about this many bytes a batch, between ``batchSize`` and
#: :data:`INFERENCE_BATCH_MAX` rows: a batch whose activations stay in the CPU's caches. The mnist CNN
#: (a 26x26x32 float32 convolution output, 86.5 kB a row: 193 rows) scored on one core with about a
#: third less CPU time a row at 128-256 rows than at 1,337 (``benchmarks/transform_throughput.py``).
ACTIVATION_BATCH_BYTES = 16 * 2**20
#: the same on a GPU, which wants large batches: the largest tensor at most this many bytes of device memory a batch
GPU_ACTIVATION_BATCH_BYTES = 2**30
INFERENCE_BATCH_MAX = 2048
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


def largest_row_bytes(model) -> int:
    """Bytes of ``model``'s largest per-row tensor (int): each input and the output of each call of
    each layer, the layers of a nested model included; an axis of unknown length (a sequence's steps)
    counts as 1. Tensors made inside a layer's own ``call`` (a custom block's sub-layers, attention
    scores) are not seen."""
    keras = keras_module()
    tensors = list(model.inputs)
    layers = list(model.layers)
    while layers:
        layer = layers.pop()
        inner = getattr(layer, "layers", None)
        if isinstance(inner, (list, tuple)):
            layers.extend(inner)
        # every call of a shared layer (Keras' own record of its calls; .output is the first call's alone)
        nodes = getattr(layer, "_inbound_nodes", None) or []
        try:
            found = [t for node in nodes for t in keras.tree.flatten(node.output_tensors)] or keras.tree.flatten(layer.output)
        except Exception:  # noqa: BLE001 - a layer never called symbolically: nothing to measure
            continue
        tensors.extend(t for t in found if hasattr(t, "shape") and hasattr(t, "dtype"))
    largest = 0
    for tensor in tensors:
        try:
            itemsize = np.dtype(str(tensor.dtype)).itemsize
        except TypeError:  # bfloat16 and the like
            itemsize = 2
        largest = max(largest, int(np.prod([d or 1 for d in tuple(tensor.shape)[1:]], dtype=np.int64)) * itemsize)
    return largest


def inference_rows(model, low: int, gpu: bool = False) -> int:
    """Rows per predict call for ``inferenceBatchSize=None``: about :data:`ACTIVATION_BATCH_BYTES`
    (:data:`GPU_ACTIVATION_BATCH_BYTES` when ``gpu``: the backend sees a GPU) of
    :func:`largest_row_bytes`, at least ``low`` (``batchSize``) and at most :data:`INFERENCE_BATCH_MAX`."""
    budget = GPU_ACTIVATION_BATCH_BYTES if gpu else ACTIVATION_BATCH_BYTES
    return max(low, min(INFERENCE_BATCH_MAX, budget // max(1, largest_row_bytes(model))))


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
