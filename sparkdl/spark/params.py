"""Spark ML Params of the Keras estimator and model, built from their declarations.

Every Param is declared once in :mod:`sparkdl.param_specs` (plain data: name, kind, default, doc,
stage). This module turns the declarations into pyspark's own machinery: each Param a
``pyspark.ml.param.Param`` class attribute (so ``copy``, ``extractParamMap``, ML persistence,
``ParamGridBuilder`` and ``CrossValidator`` work as for Spark's stages), a ``getX`` per Param, a
``setX`` where the stage sets it, the defaults, and a converter per kind built on pyspark's
``TypeConverters`` whose every error is a :class:`~sparkdl.errors.ConfigError` naming the Param,
its rule and the value received (``numWorkers must be a positive integer. Received:
numWorkers='2x'``), then the Param's declared range and choices (``ParamSpec.check``, the same check
:class:`sparkdl.config.FitConfig` makes). One Param against another is checked at ``fit``, before any job.

Classes:

- :class:`KerasSharedParams`: the Params of :data:`~sparkdl.param_specs.SHARED` stage, with getters
  and setters (columns, batch sizes, compile arguments, transform settings);
- :class:`HasTrainingParams`: the :data:`~sparkdl.param_specs.TRAINING` Params with getters only:
  a fitted model carries the values its estimator fitted with;
- :class:`KerasEstimatorParams`: both, with the training Params' setters;
- :class:`KerasModelParams`: both, the training Params read-only.

Compile Params hold Keras serialization configs (JSON-able), so ``DefaultParamsWriter`` can store
them in the stage's metadata.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasHandleInvalid,
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasRawPredictionCol,
    HasSeed,
)

from sparkdl.errors import ConfigError, did_you_mean
from sparkdl.param_specs import COMPILE_PARAMS, NO_DEFAULT, PARAMS, SCORE_COLUMN_TYPES, SHARED, TASKS, TRAINING, ParamSpec, plain_doc

__all__ = ["COMPILE_PARAMS", "HasTrainingParams", "KerasEstimatorParams", "KerasModelParams", "KerasSharedParams",
           "SCORE_COLUMN_TYPES", "TASKS", "converter"]

# --- converters, one per kind of sparkdl.param_specs.KINDS --------------------------------------
# Each takes (spec, value) and returns the value to store, or raises TypeError/ValueError (turned
# into ConfigError naming the Param and its rule by ``converter``) or ConfigError (its own words).


def _integer(spec: ParamSpec, value):
    if isinstance(value, bool):  # pyspark's toInt takes True as 1
        raise TypeError("a bool is not an integer")
    return TypeConverters.toInt(value)


def _number(spec: ParamSpec, value):
    if isinstance(value, bool):
        raise TypeError("a bool is not a number")
    return TypeConverters.toFloat(value)


def _optional(convert: Callable) -> Callable:
    return lambda spec, value: None if value is None else convert(spec, value)


def _choice(spec: ParamSpec, value):
    value = TypeConverters.toString(value)
    if value not in spec.choices:
        raise ConfigError(f"{spec.name} must be one of {list(spec.choices)}.{did_you_mean(value, spec.choices)} "
                          f"Received: {spec.name}={value!r}")
    return value


def _workers(spec: ParamSpec, value):
    """An int count (kept an int) or a float fraction (kept a float): the type carries the meaning."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{type(value).__name__} is neither an int count nor a float fraction")
    return value


def _columns(spec: ParamSpec, value):
    """``featuresCols``: a list of column names (assembled into the one model input, in order) or a
    dict model input name -> a column name or a list of them; a single name is a list of one."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        out = {}
        for name, cols in value.items():
            cols = [cols] if isinstance(cols, str) else cols
            if not isinstance(cols, (list, tuple)) or not cols or not all(isinstance(c, str) for c in cols):
                raise ConfigError(f"{spec.name} must map each model input name to a column name or a list of them. "
                                  f"Received: {spec.name}={value!r}")
            out[str(name)] = list(cols)
        if not out:
            raise ConfigError(f"{spec.name} must name at least one column. Received: {spec.name}={{}}")
        return out
    if isinstance(value, (list, tuple)) and value and all(isinstance(c, str) for c in value):
        return list(value)
    raise TypeError("not a list of names nor a dict")


def _named_columns(spec: ParamSpec, value):
    """``labelCols``, ``outputCols``: a list of columns (in output order) or a dict output name -> column."""
    if isinstance(value, dict) and value and all(isinstance(k, str) and isinstance(c, str) for k, c in value.items()):
        return dict(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(c, str) for c in value):
        return list(value)
    raise TypeError("not a list of names nor a dict of names")


def _decoders(spec: ParamSpec, value):
    """``decoders``: a dict column -> a function, or its name ``"module:function"`` / ``"module.function"``
    (kept as given; a function is saved by its name ``"module:qualname"``)."""
    from sparkdl.serialization.columns import split_decoder_name

    def valid(decoder) -> bool:
        return bool(split_decoder_name(decoder)[0]) if isinstance(decoder, str) else callable(decoder)

    if not isinstance(value, dict) or not all(isinstance(k, str) and valid(v) for k, v in value.items()):
        raise TypeError("not a dict column -> a function or 'module:function'")
    return dict(value)


def _class_weight(spec: ParamSpec, value):
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"{spec.name} must be a dict class index -> weight, as Keras' class_weight. Received: {spec.name}={value!r}")
    out = {}
    for k, v in value.items():
        try:
            index, weight = int(k), float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"{spec.name} must map integer class indices to numbers. Received: {spec.name}={value!r}") from None
        if index < 0 or not weight >= 0 or weight == float("inf"):
            raise ConfigError(f"{spec.name} must map class indices >= 0 to finite weights >= 0. Received: {k!r}: {v!r}")
        out[index] = weight
    return out


def _compile(kind: str) -> Callable:
    def convert(spec: ParamSpec, value):
        from sparkdl.keras import spec as keras_spec

        normalize = getattr(keras_spec, f"normalize_{kind}")
        return normalize(value, spec.name) if kind == "metrics" else normalize(value)  # weightedMetrics names itself

    return convert


def _compile_option(name: str) -> Callable:
    def convert(spec: ParamSpec, value):
        from sparkdl.keras.spec import CompileSpec

        return getattr(CompileSpec, f"normalize_{name}")(value)

    return convert


#: kind -> converter(spec, value); every kind of sparkdl.param_specs.KINDS has one (a test checks it)
CONVERTERS: dict[str, Callable] = {
    "int": _integer,
    "int?": _optional(_integer),
    "float": _number,
    "float?": _optional(_number),
    "bool": lambda spec, value: TypeConverters.toBoolean(value),
    "bool?": _optional(lambda spec, value: TypeConverters.toBoolean(value)),
    "str": lambda spec, value: TypeConverters.toString(value),
    "str?": _optional(lambda spec, value: TypeConverters.toString(value)),
    "choice": _choice,
    "workers?": _optional(_workers),
    "features_cols": _optional(_columns),
    "label_cols": _optional(_named_columns),
    "output_cols": _optional(_named_columns),
    "decoders": _optional(_decoders),
    "class_weight": _optional(_class_weight),
    "optimizer": _compile("optimizer"),
    "loss": _compile("loss"),
    "metrics": _compile("metrics"),
    "loss_weights": _compile_option("loss_weights"),
    "jit_compile": _compile_option("jit_compile"),
}


def converter(spec: ParamSpec) -> Callable:
    """The ``typeConverter`` of ``spec``'s Param: its kind's converter, with every error raised as
    :class:`~sparkdl.errors.ConfigError` naming the Param.

    Raises (from the returned function):
        ConfigError: ``"<name> must be <rule>. Received: <name>=<value>"`` for a value of the wrong
            type; a converter's own ``ConfigError`` (prefixed with ``"<name>: "`` when it does not
            name the Param, e.g. Keras' ``loss_weights`` rules for ``lossWeights``).
    """
    convert = CONVERTERS[spec.kind]
    named = re.compile(rf"\b{re.escape(spec.name)}\b")

    def to_param(value):
        try:
            value = convert(spec, value)
            spec.check(value)  # its declared range and choices
            return value
        except ConfigError as exc:
            if named.search(str(exc)):
                raise
            raise ConfigError(f"{spec.name}: {exc}") from exc
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{spec.name} must be {spec.type_rule}. Received: {spec.name}={value!r}") from exc

    to_param.__name__ = to_param.__qualname__ = f"to_{spec.name}"
    return to_param


# --- classes built from the declarations --------------------------------------------------------


def _getter(spec: ParamSpec) -> Callable:
    def get(self):
        return self.getOrDefault(spec.name)

    get.__name__ = get.__qualname__ = f"get{spec.suffix}"
    get.__doc__ = f"The value of ``{spec.name}`` (or its default): {plain_doc(spec)}."
    return get


def _setter(spec: ParamSpec) -> Callable:
    def set_(self, value):
        return self._set(**{spec.name: value})

    set_.__name__ = set_.__qualname__ = f"set{spec.suffix}"
    set_.__doc__ = (f"Set ``{spec.name}``: {plain_doc(spec)}. Returns ``self``.\n\n"
                    f"Raises:\n    ConfigError: a value that is not {spec.type_rule}, naming ``{spec.name}``.")
    return set_


# pyspark's shared mixins of Params that sparkdl declares too: each is a base of the class that
# defines its Param (so ``isinstance(stage, HasSeed)`` holds, and that class's Param shadows pyspark's).
_PYSPARK_MIXINS = {
    "featuresCol": HasFeaturesCol,
    "labelCol": HasLabelCol,
    "predictionCol": HasPredictionCol,
    "rawPredictionCol": HasRawPredictionCol,
    "probabilityCol": HasProbabilityCol,
    "handleInvalid": HasHandleInvalid,
    "seed": HasSeed,
}


def _params_class(name: str, specs: list[ParamSpec], doc: str) -> type:
    """A ``Params`` mixin: a ``Param`` class attribute and a getter per spec, and ``__init__``
    setting the specs' defaults (after its bases', so these win over pyspark's shared mixins').
    Its bases are the pyspark mixins of its specs (:data:`_PYSPARK_MIXINS`), else ``Params``."""
    bases = tuple(_PYSPARK_MIXINS[spec.name] for spec in specs if spec.name in _PYSPARK_MIXINS) or (Params,)
    attrs = {"__module__": __name__, "__doc__": doc}
    defaults = {}
    for spec in specs:
        attrs[spec.name] = Param(Params._dummy(), spec.name, plain_doc(spec), converter(spec))
        attrs[f"get{spec.suffix}"] = _getter(spec)
        if spec.default is not NO_DEFAULT:
            defaults[spec.name] = spec.default

    def __init__(self) -> None:
        super(cls, self).__init__()
        self._setDefault(**copy.deepcopy(defaults))

    attrs["__init__"] = __init__
    cls = type(name, bases, attrs)
    return cls


def _setters_class(name: str, specs: list[ParamSpec], doc: str) -> type:
    attrs = {"__module__": __name__, "__doc__": doc}
    attrs.update({f"set{spec.suffix}": _setter(spec) for spec in specs})
    return type(name, (), attrs)


_SHARED = [spec for spec in PARAMS if spec.stage == SHARED]
_TRAINING = [spec for spec in PARAMS if spec.stage == TRAINING]

_SharedBase = _params_class("_SharedBase", _SHARED, "The shared Params (sparkdl.param_specs.SHARED): a Param, a getter and a default each.")
_SharedSetters = _setters_class("_SharedSetters", _SHARED, "Setters of the shared Params.")

HasTrainingParams = _params_class(
    "HasTrainingParams", _TRAINING,
    """The training Params (:data:`sparkdl.param_specs.TRAINING`): a Param, a getter and a default each.

    The estimator sets them; a fitted ``KerasModel`` has them too, read-only, holding the values it
    was fitted with (copied at ``fit`` by ``_copyValues``, saved and loaded with it), as Spark's own
    models carry their estimator's Params (``LogisticRegressionModel.getMaxIter()``).
    """,
)
_TrainingSetters = _setters_class("_TrainingSetters", _TRAINING, "Setters of the training Params (the estimator's).")


class KerasSharedParams(_SharedBase, _SharedSetters):
    """Params that the estimator and its fitted model share and both set (``fit`` copies the
    estimator's values to the model): columns, batch sizes, compile arguments, transform settings."""

    def set(self, param: Param, value) -> None:
        """``Params.set``: set ``param`` (owned by this stage) to ``value`` through its converter,
        whose :class:`~sparkdl.errors.ConfigError` propagates as it is (pyspark's ``set`` re-raises
        it as a bare ``ValueError``).

        Raises:
            ConfigError: a value of the wrong kind, naming the Param.
            ValueError: a ``param`` of another stage.
        """
        self._shouldOwn(param)
        self._paramMap[param] = param.typeConverter(value)

    def _compile_spec(self):
        """The :class:`~sparkdl.keras.spec.CompileSpec` of every kept compile Param (``loss`` must be
        defined), its optimizer's learning rate set to ``learningRate`` when that is not None
        (:func:`~sparkdl.keras.spec.with_learning_rate`, as the job config's ``fit.learning_rate``).

        Raises:
            ConfigError: an optimizer Keras cannot resolve, with ``learningRate`` set.
        """
        from sparkdl.keras.spec import CompileSpec, frozen_metrics, with_learning_rate

        optimizer = self.getOrDefault("optimizer")
        learning_rate = self.getOrDefault("learningRate") if self.hasParam("learningRate") else None
        if learning_rate is not None:
            optimizer = with_learning_rate(optimizer, learning_rate)
        return CompileSpec(
            optimizer, self.getOrDefault("loss"), frozen_metrics(self.getOrDefault("metrics")),
            frozen_metrics(self.getWeightedMetrics()), self.getLossWeights(), self.getJitCompile(),
        )


class KerasEstimatorParams(KerasSharedParams, HasTrainingParams, _TrainingSetters):
    """Params of :class:`~sparkdl.spark.estimator.KerasEstimator`: every declared Param, each with a
    getter and a setter."""


class KerasModelParams(KerasSharedParams, HasTrainingParams):
    """Params of :class:`~sparkdl.spark.model.KerasModel`: the shared ones (getters and setters) and
    the training ones (getters: the values its estimator fitted with)."""
