"""What every mode declares beside its update rule: one class per mode is the whole of a mode.

A mode class says which estimator Params it reads (:attr:`Mode.PARAMS`), builds itself from their
values (:meth:`Mode.build`), gives the settings an executor rebuilds it from
(:meth:`Mode.settings`, JSON) and the identity a snapshot must match to be resumed
(:meth:`Mode.identity`), and declares the facts the backends' registry and the loop read instead
of lists of mode names: :attr:`~Mode.asynchronous`, :attr:`~Mode.per_worker`,
:attr:`~Mode.elementwise`, :attr:`~Mode.local_optimizer`. Pure Python: no Spark, no Keras.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def check_param(name: str, value) -> None:
    """Refuse a value of estimator Param ``name`` outside its declared range
    (:meth:`sparkdl.param_specs.ParamSpec.check`): a mode built from plain values, not from a fit's
    Params, is held to the same rule.

    Raises:
        ConfigError: naming the Param, its rule and the value.
    """
    from sparkdl.param_specs import BY_NAME  # not at the top: param_specs reads the mode names from this package

    BY_NAME[name].check(value)


class Mode:
    """The declarations every mode class makes (see the module docstring).

    Class attributes:
        name: the mode's name (``mode=`` of the estimator).
        per_worker: the rule needs each worker's own state and starts each worker from its own.
        asynchronous: the parameter server applies the rule push by push (no rounds).
        elementwise: the rule is elementwise, so slice owners can apply it slice by slice.
        local_optimizer: the workers always keep their own optimizer state.
        uses_trainable: the constructor takes ``trainable`` (a bool per weight array).
        PARAMS: the estimator Params whose values :meth:`build` reads.
        IDENTITY: the Params a snapshot must match to be resumed (default: :attr:`PARAMS`).
    """

    name = ""
    per_worker = False
    asynchronous = False
    elementwise = False
    local_optimizer = False
    uses_trainable = False
    PARAMS: tuple[str, ...] = ()
    IDENTITY: tuple[str, ...] | None = None

    @classmethod
    def build(cls, name: str, params: Mapping, *, trainable: Sequence[bool], workers: int) -> Mode:
        """The mode ``name`` for a fit: ``params`` maps each of :attr:`PARAMS` to its value (None
        where unset), ``trainable`` is a bool per weight array, ``workers`` the fit's workers.

        Raises:
            ConfigError: a setting out of its range.
        """
        mode = cls._from_params(name, params, list(trainable), int(workers))
        mode.params = {key: params.get(key) for key in cls.PARAMS}
        return mode

    @classmethod
    def _from_params(cls, name: str, params: Mapping, trainable: list[bool], workers: int) -> Mode:
        return cls()

    def settings(self) -> dict:
        """The constructor's keyword arguments (JSON values, ``trainable`` left out) that rebuild this
        mode elsewhere (a slice owner on an executor): ``get_policy(name, **settings)``."""
        return {}

    def identity(self) -> dict:
        """What a snapshot of a fit in this mode must match (JSON): the name and the values of
        :attr:`IDENTITY` as the user set them."""
        params = getattr(self, "params", {})
        keys = self.PARAMS if self.IDENTITY is None else self.IDENTITY
        return {"name": self.name, **{key: params.get(key) for key in keys}}
