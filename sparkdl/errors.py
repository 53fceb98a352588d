"""One exception tree for sparkdl.

Every message states the rule that was broken, then what was received
(``Received: ...``), in the style of Keras' own errors.
"""


import difflib
from collections.abc import Iterable


# Other libraries' words for a sparkdl choice that difflib does not find close enough (Elephas'
# SparkModel(mode="synchronous"|"asynchronous")): did_you_mean names the sparkdl one when it is valid.
ALIASES = {"synchronous": "sync", "asynchronous": "async"}


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` naming the entry of ``valid`` closest to ``name`` (as
    ``difflib.get_close_matches`` finds it, case-insensitively for a close enough one; or, for a
    word of :data:`ALIASES` such as ``"synchronous"``, its sparkdl name ``"sync"`` when valid), or ``""``
    when none is close: the hint of every "unknown name" message (Params, job config keys, columns)
    and of every "must be one of" message (``mode``, ``backend``, ``task``)."""
    valid = [str(v) for v in valid]
    alias = ALIASES.get(str(name).lower())
    if alias in valid:
        return f" Did you mean {alias!r}?"
    close = difflib.get_close_matches(str(name), valid, n=1)
    if not close:  # 'Label' for 'label': a case slip is a typo too
        by_lower = {v.lower(): v for v in valid}
        close = [by_lower[c] for c in difflib.get_close_matches(str(name).lower(), list(by_lower), n=1)]
    return f" Did you mean {close[0]!r}?" if close else ""


class SparkDLError(Exception):
    """Base class of every error sparkdl raises on purpose."""


class SchemaError(SparkDLError, ValueError):
    """The DataFrame does not fit the model: a missing column, a wrong type or length, nulls, no rows."""


class ConfigError(SparkDLError, ValueError):
    """A Param or setting is out of its allowed range or of the wrong kind."""


class KeywordArgumentsError(ConfigError, TypeError):
    """A call that takes keyword arguments only (``KerasEstimator(...)``, ``setParams``) was given
    positional ones (a ``TypeError`` too, as pyspark's ``keyword_only`` raised)."""


class CodecError(SparkDLError, ValueError):
    """A weights payload is not a valid sparkdl Arrow IPC payload (wrong version, corrupt, mismatched)."""


class WorkerError(SparkDLError, RuntimeError):
    """A training or inference task failed on an executor; the message names the partition and cause."""


class RoundTimeoutError(SparkDLError, TimeoutError):
    """A round did not finish within its time limit (seconds); its Spark jobs were cancelled."""


class FitCancelledError(WorkerError, KeyboardInterrupt):
    """The fit's Spark jobs were cancelled (job group, job tag or the Spark UI), or the fit was
    interrupted on the driver (Ctrl-C, a notebook's stop), which cancels its jobs; the master
    weights are untouched. A ``KeyboardInterrupt`` too, so that a notebook or a script treats it as
    an interrupt (``except KeyboardInterrupt`` catches it). Uncaught in a script, Python prints the
    traceback and exits with status 1 (it ends by SIGINT, status 130, for ``KeyboardInterrupt`` itself only)."""


class NodeLostError(WorkerError):
    """A stage of long-lived tasks (backends ``ps``, ``sharded``) lost task slots for good: an
    executor was removed and no replacement came within a minute (half of ``workerTimeout`` when
    shorter), so its workers cannot all run at once. The message names the executor, Spark's
    reason and what to do; :attr:`loss` holds the :class:`~sparkdl.spark.training.nodes.NodeLoss`."""

    def __init__(self, message: str, loss=None) -> None:
        super().__init__(message)
        self.loss = loss


class InvariantError(SparkDLError, RuntimeError):
    """A check that guards against silent wrong results failed on the driver: rows trained differ
    from rows counted, a partition changed between rounds, or the master weights became non-finite."""


class SavePathExistsError(SparkDLError, FileExistsError):
    """``save(path)`` was called on an existing path without ``write().overwrite()``."""


class IncompleteSaveError(SparkDLError, FileNotFoundError):
    """A saved stage lacks a file it needs (its metadata, ``model.keras``, ``optimizer.arrow``)."""


class StageClassError(SparkDLError, TypeError):
    """The path holds a saved stage of another class than the one whose ``load`` was called."""


class ServerError(SparkDLError, RuntimeError):
    """The parameter server could not be started (its host:port is taken), refused a call
    (authentication, an update that does not fit the model, a body over the size limit), or
    could not be reached within the client's timeout; the message names the server address."""
