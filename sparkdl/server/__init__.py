"""Driver-side parameter server of backend ``ps``, on Arrow Flight (TLS, a per-fit token).

Public API::

    from sparkdl.server import ParameterServer, ParameterServerClient

Nothing under ``sparkdl.server`` imports Spark, TensorFlow or Keras.
"""

from sparkdl.server.auth import new_token
from sparkdl.server.client import ParameterServerClient
from sparkdl.server.flight import ParameterServer, UpdateRule
from sparkdl.server.wire import ArraySpec

__all__ = ["ArraySpec", "ParameterServer", "ParameterServerClient", "UpdateRule", "new_token"]
