"""Driver-side parameter server for asynchronous training, on Arrow Flight.

Public API::

    from sparkdl.server import ParameterServer, ParameterServerClient

Nothing under ``sparkdl.server`` imports Spark, TensorFlow or Keras.
"""

from sparkdl.server.auth import new_token
from sparkdl.server.client import ParameterServerClient
from sparkdl.server.flight import ArraySpec, ParameterServer, UpdateRule

__all__ = ["ArraySpec", "ParameterServer", "ParameterServerClient", "UpdateRule", "new_token"]
