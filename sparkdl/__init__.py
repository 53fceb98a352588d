"""sparkdl: train Keras 3 models on Apache Spark DataFrames.

Public API::

    from sparkdl import KerasEstimator, KerasModel

Importing ``sparkdl`` loads neither TensorFlow nor Spark: the two classes are
resolved on first attribute access (PEP 562), so pure-numpy parts stay cheap to import.
"""

import logging

__version__ = "0.2.0"

# The library logs under "sparkdl" (fit start and end at INFO, each epoch's line at DEBUG) and never
# configures logging itself: logging.basicConfig(level=logging.INFO) or a handler shows it.
logging.getLogger("sparkdl").addHandler(logging.NullHandler())

__all__ = ["KerasEstimator", "KerasModel", "__version__"]


def __getattr__(name):
    if name == "KerasEstimator":
        from sparkdl.spark.estimator import KerasEstimator

        return KerasEstimator
    if name == "KerasModel":
        from sparkdl.spark.model import KerasModel

        return KerasModel
    raise AttributeError(f"module 'sparkdl' has no attribute {name!r}")
