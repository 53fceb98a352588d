"""Process-wide Keras/TensorFlow set-up for executor Python workers.

TensorFlow creates its intra-op and inter-op thread pools once per process. Two workers
on two cores that each start a pool as large as the machine fight over the cores, so each
worker sizes its pools to the CPUs its Spark task was given (``spark.task.cpus``) before
TensorFlow starts. GPUs, when present, get memory growth so several tasks can share one.
"""

from __future__ import annotations

import os

_configured_threads: int | None = None


def configure(num_threads: int | None = None) -> None:
    """Select the TensorFlow backend and size its thread pools, once per process.

    Args:
        num_threads: intra-op threads (the task's CPUs); ``None`` keeps TensorFlow's default.
            Inter-op threads are set to 1 in that case: a training step is a chain of ops.
            Later calls with another value are ignored, as TensorFlow allows one setting.
    """
    global _configured_threads
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if _configured_threads is not None or num_threads is None:
        return
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(int(num_threads))
        tf.config.threading.set_inter_op_parallelism_threads(1)
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:
        pass  # TensorFlow already started in this process; keep its pools.
    _configured_threads = int(num_threads)


def keras_module():
    """Import and return ``keras`` after :func:`configure` has selected the backend."""
    configure()
    import keras

    return keras
