"""Decoders for binary feature columns in the Spark tests, importable on the executors as
``tests.decoders:<name>`` (the Python workers start in the repository root)."""

import numpy as np


def decode_png(data: bytes) -> np.ndarray:
    """A PNG's bytes -> float32 ``(height, width, 3)`` in [0, 1]."""
    import tensorflow as tf

    return tf.io.decode_png(data, channels=3).numpy().astype(np.float32) / 255.0


def decode_png_small(data: bytes) -> np.ndarray:
    """Wrong on purpose: the top-left 2x2 corner only, ``(2, 2, 3)``."""
    return decode_png(data)[:2, :2]


def decode_png_channels_first(data: bytes) -> np.ndarray:
    """Wrong on purpose: channels first, ``(3, 4, 4)``: as many values as ``(4, 4, 3)``, in another layout."""
    return np.transpose(decode_png(data), (2, 0, 1))


def decode_raw(data: bytes) -> np.ndarray:
    """48 raw bytes -> float32 ``(4, 4, 3)`` in [0, 1]."""
    return np.frombuffer(data, np.uint8).reshape(4, 4, 3).astype(np.float32) / 255.0
