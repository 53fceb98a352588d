"""sparkdl: train Keras 3 models on Apache Spark DataFrames.

Public API::

    from sparkdl import KerasEstimator, KerasModel

Importing ``sparkdl`` loads neither TensorFlow nor Spark: the two classes are
resolved on first attribute access (PEP 562), so pure-numpy parts stay cheap to import.
"""

import logging
import os
import sys

__version__ = "0.2.0"

#: the environment variable that has a process log sparkdl's lines to its stderr (see below)
LOG_LEVEL_ENV = "SPARKDL_LOG_LEVEL"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# The library logs under "sparkdl" (fit start and end at INFO, each epoch's line at DEBUG) and does
# not configure logging itself: logging.basicConfig(level=logging.INFO) or a handler shows it. The one
# exception is SPARKDL_LOG_LEVEL (DEBUG, INFO, WARNING or ERROR), for the processes no user code
# configures: set on the executors (spark.executorEnv.SPARKDL_LOG_LEVEL=INFO), every Python worker
# writes the "sparkdl" logger's lines at that level to its stderr, which Spark keeps in the
# executor's log (a local master's: the driver's stderr), each line naming its process.
logging.getLogger("sparkdl").addHandler(logging.NullHandler())
_level = os.environ.get(LOG_LEVEL_ENV, "").strip().upper()
if _level:
    if _level not in _LEVELS:
        from sparkdl.errors import ConfigError

        raise ConfigError(f"{LOG_LEVEL_ENV} must be one of {', '.join(_LEVELS)}. Received: {LOG_LEVEL_ENV}={os.environ[LOG_LEVEL_ENV]!r}")
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("%(asctime)s %(name)s[%(process)d] %(levelname)s: %(message)s"))
    logging.getLogger("sparkdl").addHandler(_handler)
    logging.getLogger("sparkdl").setLevel(_level)

__all__ = ["KerasEstimator", "KerasModel", "__version__"]


def __getattr__(name):
    if name == "KerasEstimator":
        from sparkdl.spark.estimator import KerasEstimator

        return KerasEstimator
    if name == "KerasModel":
        from sparkdl.spark.model import KerasModel

        return KerasModel
    raise AttributeError(f"module 'sparkdl' has no attribute {name!r}")
