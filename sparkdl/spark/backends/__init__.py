"""Round transports. A backend runs the rounds of a fit and applies the mode policy between them.

Each backend takes a :class:`~sparkdl.spark.backends.base.TrainJob` (plain values only) and
returns a :class:`~sparkdl.spark.backends.base.FitResult`; the estimator does not know which
one ran. ``rounds`` is the SparkNet-style backend: one Spark job per round.
"""

from sparkdl.errors import ConfigError
from sparkdl.spark.backends.base import Backend, FitResult, TrainJob


def get_backend(name: str) -> Backend:
    """The backend object for ``name``.

    Raises:
        ConfigError: for an unknown backend name.
    """
    if name == "rounds":
        from sparkdl.spark.backends.rounds import RoundsBackend

        return RoundsBackend()
    raise ConfigError(f"backend must be one of ['rounds']. Received: {name!r}")


__all__ = ["Backend", "FitResult", "TrainJob", "get_backend"]
