"""Round transports. A backend runs the rounds of a fit and applies the mode policy between them.

Each backend takes a :class:`~sparkdl.spark.backends.base.TrainJob` (plain values only) and
returns a :class:`~sparkdl.spark.backends.base.FitResult`; the estimator does not know which
one ran. ``rounds`` is the SparkNet-style backend: one Spark job per round; ``ps`` runs one
barrier stage whose tasks talk to a parameter server on the driver (``sync`` and the
asynchronous modes).
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
    if name == "ps":
        from sparkdl.spark.backends.ps import PSBackend

        return PSBackend()
    raise ConfigError(f"backend must be one of ['rounds', 'ps']. Received: {name!r}")


__all__ = ["Backend", "FitResult", "TrainJob", "get_backend"]
