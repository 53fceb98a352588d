"""A Keras model and its compile arguments as plain, picklable-free values.

A :class:`ModelSpec` holds the architecture JSON and the weights as Arrow IPC bytes
(:mod:`sparkdl.serialization.arrow_codec`); a :class:`CompileSpec` holds the optimizer,
loss and metrics as Keras serialization configs (JSON-able dicts) or built-in names.
Executors rebuild the model from these values; no Keras object is ever pickled.
Keras is imported on first use, so unpickling a spec inside a Spark task does not start
TensorFlow before :func:`sparkdl.keras.runtime.configure` has sized its thread pools.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sparkdl.errors import ConfigError, did_you_mean
from sparkdl.keras.losses import LossInfo, describe_loss
from sparkdl.keras.memory import release_cycles, weights_nbytes
from sparkdl.keras.runtime import keras_module
from sparkdl.serialization.arrow_codec import decode_arrays, encode_arrays

def _root_cause(exc: BaseException) -> str:
    """The most specific line of a Keras deserialization error ("Could not locate function 'f'")."""
    found = re.search(r"Could not (?:locate|interpret)[^\n.]*", str(exc))
    return found.group(0) if found else str(exc).splitlines()[0][:300]


def missing_custom_objects(config) -> list[str]:
    """The registered names (``"package>Name"``) in a Keras serialization config that this
    process's Keras registry does not hold, sorted; ``config`` is a dict/list tree (config.json)."""
    import importlib.util

    keras = keras_module()
    found, stack = set(), [config]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            name, module = node.get("registered_name"), node.get("module")
            if node.get("class_name") == "function" and name == "function" and isinstance(node.get("config"), str):
                name = node["config"]  # a function: its registered name is the config ("package>name")
            if isinstance(name, str) and keras.saving.get_registered_object(name) is None:
                if ">" in name:
                    found.add(name)
                elif isinstance(module, str) and module not in ("builtins",) and not module.startswith("keras"):
                    root = module.split(".")[0]  # an unregistered class: Keras imports its module to find it
                    if module == "__main__" or importlib.util.find_spec(root) is None:
                        found.add(name)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return sorted(found)


def load_keras_bytes(data: bytes, compile: bool = True):
    """A ``keras.Model`` from the bytes of a ``.keras`` archive (Keras' zip of config JSON and HDF5
    weights; no pickle), compiled as saved when ``compile`` and the archive holds compile arguments.

    Raises:
        ConfigError: the archive names custom objects that are not registered in this process: the
            message lists each by its registered name (``"package>Name"``) and says how to register it;
            or the bytes are not a ``.keras`` archive.
    """
    import io
    import zipfile

    keras = keras_module()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            config = json.loads(archive.read("config.json"))
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise ConfigError(f"a .keras archive (a zip holding config.json) is needed. Received: {len(data)} bytes that are not one ({exc})") from None
    missing = missing_custom_objects(config)
    if missing:
        raise ConfigError(
            f"the saved model uses custom objects that are not registered here: {missing}. Import the module that defines "
            "them with @keras.saving.register_keras_serializable (same package and name) before loading, or pass "
            "customObjects={name: class_or_function} (KerasModel.load, KerasModel.fromKeras, KerasEstimator). "
            "Received: a model whose config names " + ", ".join(repr(m) for m in missing)
        )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        try:
            return keras.saving.load_model(path, compile=compile)
        except Exception as exc:
            raise ConfigError(
                "a .keras archive must load with keras.saving.load_model; a custom layer or function it cannot locate must be "
                "registered (@keras.saving.register_keras_serializable, in an imported module) or given as "
                f"customObjects={{name: class_or_function}}. Received: {_root_cause(exc)}"
            ) from exc


def is_sequence_shape(shape) -> bool:
    """Whether a per-row input shape is a sequence's: ``(None,)`` (token ids) or ``(None, k)``
    (``k`` values per step), the only shapes with an undefined axis that a fit takes."""
    shape = tuple(shape)
    return len(shape) in (1, 2) and shape[0] is None and all(d is not None for d in shape[1:])


def _tensor_name(tensor) -> str:
    """A symbolic tensor's layer name ("user" for ``keras.Input(name="user")``)."""
    history = getattr(tensor, "_keras_history", None)
    return history[0].name if history is not None else tensor.name


def _output_names(model, outputs) -> list[str]:
    """The model's output names (a Functional model's ``output_names``, else each tensor's layer name)."""
    names = getattr(model, "output_names", None)
    return list(names) if names and len(names) == len(outputs) else [_tensor_name(t) for t in outputs]


def _module(kind: str):
    keras = keras_module()
    return {"optimizer": keras.optimizers, "loss": keras.losses, "metric": keras.metrics}[kind]


@functools.cache
def known_names(kind: str) -> tuple[str, ...]:
    """Every name ``keras.<kind>s.get`` resolves for ``kind`` ``"optimizer"``, ``"loss"`` or
    ``"metric"`` (``'adam'``, ``'mse'``, ``'MeanSquaredError'``, ...; ``'accuracy'`` and ``'acc'``
    for metrics, as ``keras.Model.compile`` special-cases them), sorted: the candidates of an
    unknown name's "did you mean". Keras' registry of names where this Keras has one, else the
    module's public names; either way only those ``get`` resolves without arguments."""
    module = _module(kind)
    try:
        from keras.src import losses, metrics, optimizers

        candidates = list({"optimizer": optimizers, "loss": losses, "metric": metrics}[kind].ALL_OBJECTS_DICT)
    except (ImportError, AttributeError):
        candidates = [name for name in vars(module) if not name.startswith("_")]
    names = {"accuracy", "acc"} if kind == "metric" else set()
    for name in candidates:
        if name.lower() in ("optimizer", "loss", "metric"):  # the base classes resolve, but train nothing
            continue
        try:
            if module.get(name) is not None:
                names.add(name)
        except Exception:  # noqa: BLE001 - a base class or one that needs arguments: not a name to suggest
            pass
    return tuple(sorted(names))


def unknown_name_error(kind: str, name: str, param: str, rule: str) -> ConfigError:
    """The error of a ``kind`` name Keras does not know, given to Param ``param``: ``rule``, the
    closest known name (:func:`~sparkdl.errors.did_you_mean`), the lower-case names (the string
    form Keras' examples use; class names such as ``'MeanSquaredError'`` resolve too), then
    ``Received: param='name'``."""
    names = known_names(kind)
    if kind == "optimizer":  # Keras looks optimizer names up in lower case
        names = tuple(sorted({n.lower() for n in names}))
    shown = ", ".join(n for n in names if n == n.lower())
    return ConfigError(f"{param} {rule}.{did_you_mean(name, names)} The {kind} names: {shown}. Received: {param}={name!r}")


def _normalize(value, kind: str, param: str | None = None):
    """A compile argument as a JSON-able value: a built-in name, or a Keras serialization config.

    Configs are deserialized once here, as the executors will, so an unknown name or an
    unregistered custom object fails on the driver, before any Spark job; an unknown name's
    error names ``param`` (the Param, by default ``kind``) and the closest known name.
    """
    keras = keras_module()
    module = _module(kind)
    if isinstance(value, str):
        if kind == "loss" and value.lower() in ("crossentropy", "ce"):
            raise ConfigError(
                f"loss must name its cross-entropy: Keras picks one for {value!r} from the data's shapes at compile "
                "time, which the executors and the label checks cannot see. Use 'sparse_categorical_crossentropy' "
                "(class indices), 'categorical_crossentropy' (one-hot) or 'binary_crossentropy' (0/1). "
                f"Received: {value!r}"
            )
        if kind in ("optimizer", "loss"):
            try:
                module.get(value)
            except ValueError as exc:
                rule = ("must be a Keras optimizer name, a keras.optimizers.Optimizer or its config" if kind == "optimizer"
                        else "must be a Keras loss name, a keras.losses.Loss, a function or a config")
                raise unknown_name_error(kind, value, param or kind, rule) from exc
        return value
    if kind == "optimizer" and not isinstance(value, (dict, keras.optimizers.Optimizer)):
        raise ConfigError(f"optimizer must be a name, a keras.optimizers.Optimizer or its config. Received: {value!r}")
    try:
        config = json.loads(json.dumps(value if isinstance(value, dict) else keras.saving.serialize_keras_object(value)))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{kind} must be a name, a Keras object or a Keras config. Received: {value!r} ({exc})") from exc
    try:
        revived = module.deserialize(json.loads(json.dumps(config)))
        if not callable(revived) and kind != "optimizer":
            raise ValueError(f"Could not locate {kind} {revived!r}")
    except Exception as exc:
        raise ConfigError(
            f"{kind} must be rebuildable from its Keras config on the executors; register custom objects with "
            f"@keras.saving.register_keras_serializable in a module the executors can import, or pass "
            f"customObjects={{name: class_or_function}} (KerasEstimator, KerasModel.load, KerasModel.fromKeras). "
            f"Received: {value!r} ({_root_cause(exc)})"
        ) from exc
    return config


def normalize_optimizer(value) -> str | dict:
    """An optimizer name, ``keras.optimizers.Optimizer`` or config as a name or config dict.

    Raises:
        ConfigError: when Keras cannot resolve the value.
    """
    return _normalize(value if value is not None else "adam", "optimizer")


def is_config(value) -> bool:
    """Whether ``value`` is one Keras serialization config (a dict with ``class_name``), not a dict by output name."""
    return isinstance(value, dict) and "class_name" in value


def _per_output(value) -> bool:
    """Whether a compile argument is given per output: a dict by output name or a list (not one config)."""
    return isinstance(value, (list, tuple)) or (isinstance(value, dict) and not is_config(value))


#: the forms of a per-output ``loss`` and ``metrics``, for error messages
LOSS_FORMS = ("one loss for every output (a name, a keras.losses.Loss, a function or a config dict), a dict output "
              "name -> loss naming every output, or a list of one loss per output in output order")
METRICS_FORMS = ("a list of metrics for a single-output model; for several outputs a dict output name -> metric or list of "
                 "metrics (any subset of the outputs), or a list of one entry per output in output order, each a metric, "
                 "a list of metrics or None")


def _one_loss(value, where: str):
    if value is None:
        return None
    if _per_output(value):
        raise ConfigError(f"loss {where} must be one loss (a name, a keras.losses.Loss, a function or a config dict), not "
                          f"nested: the forms are {LOSS_FORMS}. Received: {value!r}")
    return _normalize(value, "loss")


def with_learning_rate(optimizer, learning_rate: float) -> dict:
    """The Keras config of ``optimizer`` with its learning rate set to ``learning_rate``.

    Args:
        optimizer: a name (``"adam"``), a ``keras.optimizers.Optimizer`` (e.g. a compiled model's
            ``model.optimizer``) or a config dict (``{"class_name": "SGD", "config": {...}}``);
            None means Keras' ``"adam"``, the estimator's default.
        learning_rate: the new rate, a number > 0; it replaces a number or a schedule.

    Returns:
        ``keras.optimizers.serialize`` of the optimizer, with ``config["learning_rate"]`` set.

    Raises:
        ConfigError: a rate that is not a number > 0; an optimizer Keras cannot resolve.
    """
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) or not learning_rate > 0:
        raise ConfigError(f"learning_rate must be a number > 0. Received: {learning_rate!r}")
    keras = keras_module()
    try:
        built = keras.optimizers.get(optimizer if optimizer is not None else "adam")
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"optimizer must be a Keras optimizer name, object or config. Received: {optimizer!r} ({exc})") from exc
    config = json.loads(json.dumps(keras.optimizers.serialize(built), default=float))
    config["config"]["learning_rate"] = float(learning_rate)
    return config


def normalize_loss(value) -> str | dict | list:
    """A loss as JSON: a name or config dict for every output, or per output (a dict output name ->
    loss, or a list in output order, as ``keras.Model.compile`` takes them; an entry may be None: that
    output is trained without a loss, as in Keras). Each loss is checked as Keras resolves it; the
    output names and count are checked at ``fit`` (:meth:`CompileSpec.check_outputs`).

    Raises:
        ConfigError: when the value is None, an empty or nested dict or list, all None, or Keras
            cannot resolve a loss (named).
    """
    if value is None:
        raise ConfigError(f"loss must be given: {LOSS_FORMS}. Received: None")
    if isinstance(value, dict) and not is_config(value):
        losses = {str(name): _one_loss(v, f"of output {name!r}") for name, v in value.items()}
    elif isinstance(value, (list, tuple)):
        losses = [_one_loss(v, f"at position {i}") for i, v in enumerate(value)]
    else:
        return _normalize(value, "loss")
    if not value or all(v is None for v in (losses.values() if isinstance(losses, dict) else losses)):
        raise ConfigError(f"loss must give at least one output a loss: {LOSS_FORMS}. Received: {value!r}")
    return losses


def _check_metric_name(name: str, param: str = "metrics") -> None:
    """A metric string must resolve as ``keras.Model.compile`` resolves it: ``"accuracy"`` and
    ``"acc"`` (any case) are special-cased there, every other name goes to ``keras.metrics.get``."""
    if name.lower() in ("accuracy", "acc"):
        return
    try:
        _module("metric").get(name)
    except (ValueError, TypeError) as exc:
        raise unknown_name_error("metric", name, param, "must be Keras metric names ('accuracy', 'mae', 'auc', ...), "
                                                       "objects or configs") from exc


def _one_metric(metric, values, param: str = "metrics"):
    if metric is None:
        raise ConfigError(f"metrics must be Keras metric names, objects or configs. Received: None in {values!r}")
    if _per_output(metric):
        raise ConfigError(f"metrics must not nest deeper than one list per output: the forms are {METRICS_FORMS}. Received: {values!r}")
    if isinstance(metric, str):
        _check_metric_name(metric, param)
    return _normalize(metric, "metric")


def _metric_list(value, values, param: str = "metrics") -> list:
    """One output's metrics (a metric or a list of them) as a list of names and configs."""
    return [_one_metric(m, values, param) for m in (value if isinstance(value, (list, tuple)) else [value])]


def normalize_metrics(values, param: str = "metrics") -> list | dict:
    """Metrics (or weighted metrics) as JSON in any form ``keras.Model.compile`` takes, checked on the driver.

    Forms: a metric or a list of metrics (names, objects or configs); a dict output name -> a metric
    or a list of them (``{"high": ["accuracy"]}``, values kept as lists, None values dropped); or a
    list with lists or None among its entries (one entry per output, output order). A flat list on a
    model with several outputs is Keras' list of one entry per output; its length is checked at
    ``fit`` (:meth:`CompileSpec.check_outputs`). Each name resolves as ``keras.Model.compile`` would
    (``"accuracy"``/``"acc"``, then ``keras.metrics.get``: ``"mae"``, ``"AUC"``, ...), and each object
    or config is rebuilt from its config, so a misspelled or unregistered metric fails before any job;
    an unknown name's error names ``param`` (the Param: ``metrics``, ``weightedMetrics``) and the closest name.

    Returns:
        a list of names and config dicts; a list whose entries are such lists or None; or a dict
        output name -> list.

    Raises:
        ConfigError: naming the metric that Keras cannot resolve or rebuild, or a form nested deeper.
    """
    if values is None:
        return []
    if isinstance(values, dict) and not is_config(values):
        return {str(name): _metric_list(v, values, param) for name, v in values.items() if v is not None}
    if not isinstance(values, (list, tuple)):
        return [_one_metric(values, values, param)]
    if values and all(m is None for m in values):
        raise ConfigError("metrics must be Keras metric names, objects or configs (None only for an output without metrics, "
                          f"beside others with some). Received: None in {values!r}")
    if any(m is None or isinstance(m, (list, tuple)) for m in values):  # one entry per output
        return [None if m is None else _metric_list(m, values, param) for m in values]
    return [_one_metric(m, values, param) for m in values]


def frozen_metrics(metrics):
    """A normalized metrics value as a :class:`CompileSpec` field: a dict as it is, a list as a tuple."""
    return metrics if isinstance(metrics, dict) else tuple(metrics)


# ``keras.Model.compile`` arguments that sparkdl keeps (keys of :func:`compile_args_of`, fields of
# :class:`CompileSpec`). ``run_eagerly`` and ``steps_per_execution`` do not apply to replica steps.
# ``jit_compile`` is left out: Keras keeps the value it resolved on the driver's devices ("auto" is
# False on a CPU driver, True on a GPU one), which would switch XLA off on GPU executors or force it
# on CPU ones. Executors resolve "auto" themselves unless ``jitCompile`` is set explicitly.
COMPILE_ARGS = ("optimizer", "loss", "metrics", "weighted_metrics", "loss_weights")


def compile_args_of(model) -> dict:
    """The compile arguments a compiled ``keras.Model`` was given, as JSON-able values.

    ``jit_compile`` is not returned: Keras keeps only the value it resolved on this machine's devices,
    which would be wrong on executors with other devices (set ``jitCompile`` explicitly instead).

    Returns:
        ``{}`` for an uncompiled model, else a dict with keys among :data:`COMPILE_ARGS`
        (``optimizer``, ``loss``, ``metrics``, ``weighted_metrics``, ``loss_weights``).
    """
    if not getattr(model, "compiled", False):
        return {}
    config = model.get_compile_config() or {}
    args = {}
    for key in COMPILE_ARGS:
        if config.get(key) is not None:
            args[key] = json.loads(json.dumps(config[key]))
    return args


def infer_task(task: str, compile_spec: CompileSpec) -> str:
    """``"classification"`` or ``"regression"``: ``task`` itself unless it is ``"auto"``, then by loss family.

    Cross-entropy, focal, hinge and KL-divergence losses make a classifier, read from the loss's
    Keras class (:func:`sparkdl.keras.losses.describe_loss`); any other loss a regressor. With a
    loss per output (a dict or list of several), ``"auto"`` stays ``"auto"``: each output's own loss
    decides how ``transform`` reads it.
    """
    if compile_spec.per_output_loss and len(compile_spec.loss) > 1:
        return task
    return compile_spec.loss_info.infer_task(task)


def _revive_loss(loss):
    if isinstance(loss, dict) and not is_config(loss):
        return {name: None if v is None else _revive(v, "loss") for name, v in loss.items()}
    if isinstance(loss, (list, tuple)):
        return [None if v is None else _revive(v, "loss") for v in loss]
    return _revive(loss, "loss")


def _revive_metrics(metrics):
    if isinstance(metrics, dict):
        return {name: _revive_metrics(v) for name, v in metrics.items()}
    return [None if m is None else _revive_metrics(m) if isinstance(m, (list, tuple)) else _revive(m, "metric") for m in metrics]


#: ``keras.Model.compile`` argument -> the sparkdl Param that holds it, for error messages
_PARAM_NAMES = {"loss_weights": "lossWeights", "weighted_metrics": "weightedMetrics"}


def _named(argument: str, received, names: list[str], rule: str) -> ConfigError:
    param = _PARAM_NAMES.get(argument, argument)
    shown = param if param == argument else f"{param} (Keras' {argument})"
    return ConfigError(f"{shown} {rule}; the model's outputs are {names}. Received: {param}={received!r}")


def _revive(value, kind: str):
    if isinstance(value, str):
        return _module(kind).get(value) if kind == "optimizer" else value
    return _module(kind).deserialize(value)


@dataclass(frozen=True)
class CompileSpec:
    """Arguments of ``keras.Model.compile`` as JSON-able values.

    Attributes:
        optimizer: a name (``"adam"``) or a Keras optimizer config dict.
        loss: a name (``"sparse_categorical_crossentropy"``) or a Keras loss config dict; or per
            output a dict output name -> loss (None: no loss) or a list in output order.
        metrics: names or Keras metric config dicts (a tuple); per output a dict output name ->
            list of them, or a tuple of one entry per output (a list of them, or None).
        weighted_metrics: as ``metrics``, weighted by sample weights.
        loss_weights: ``None``, a float, a list of floats or a dict output name -> float
            (``keras.Model.compile``'s ``loss_weights``).
        jit_compile: ``True``, ``False`` or ``"auto"`` (XLA compilation of the train step).
    """

    optimizer: str | dict = "adam"
    loss: str | dict | list = "mse"
    metrics: tuple | dict = field(default_factory=tuple)
    weighted_metrics: tuple | dict = field(default_factory=tuple)
    loss_weights: float | list | dict | None = None
    jit_compile: bool | str = "auto"

    def optimizer_kind(self) -> str:
        """The optimizer's class, lower-case (``"adam"``): a name, or a config's ``class_name``."""
        optimizer = self.optimizer
        if isinstance(optimizer, dict):
            return str(optimizer.get("class_name", optimizer.get("config", {}).get("name", "optimizer"))).lower()
        return str(optimizer).lower()

    def reuse_key(self) -> str:
        """What a compiled replica depends on (JSON): these arguments, without the optimizer's name
        (Keras numbers it per instance: ``adam_3``) nor a numeric learning rate (an optimizer
        variable, which every round's state sets). Two fits with equal keys can share a replica."""
        optimizer = self.optimizer
        if isinstance(optimizer, dict) and isinstance(optimizer.get("config"), dict):
            config = {k: v for k, v in optimizer["config"].items() if k != "name"
                      and not (k == "learning_rate" and isinstance(v, (int, float)))}
            optimizer = {**optimizer, "config": config}
        return json.dumps({**dataclasses.asdict(self), "optimizer": optimizer}, sort_keys=True, default=repr)

    @classmethod
    def create(cls, optimizer, loss, metrics: Sequence | None, weighted_metrics: Sequence | None = None,
               loss_weights=None, jit_compile="auto") -> CompileSpec:
        """Normalize a string, a Keras object or a config for each argument.

        Raises:
            ConfigError: for a value Keras cannot (de)serialize, a missing loss, loss weights that
                are not numbers, or a ``jit_compile`` other than ``True``/``False``/``"auto"``.
        """
        return cls(
            normalize_optimizer(optimizer), normalize_loss(loss), frozen_metrics(normalize_metrics(metrics)),
            frozen_metrics(normalize_metrics(weighted_metrics, "weighted_metrics")), cls.normalize_loss_weights(loss_weights),
            cls.normalize_jit_compile(jit_compile),
        )

    @property
    def per_output_loss(self) -> bool:
        """Whether ``loss`` is given per output (a dict by output name or a list in output order)."""
        return _per_output(self.loss)

    def output_losses(self, names: Sequence[str]) -> list[LossInfo]:
        """The :class:`~sparkdl.keras.losses.LossInfo` of each output, in output order: the one loss
        for every output, or each output's own (an output without a loss reads as a regressor).

        Raises:
            ConfigError: a per-output loss that does not fit these outputs (:meth:`check_outputs`).
        """
        names = list(names)
        self.check_outputs(names, loss_only=True)
        if isinstance(self.loss, dict) and not is_config(self.loss):
            return [describe_loss(self.loss[n]) if self.loss[n] is not None else LossInfo() for n in names]
        if isinstance(self.loss, (list, tuple)):
            return [describe_loss(v) if v is not None else LossInfo() for v in self.loss]
        return [self.loss_info] * len(names)

    def check_outputs(self, names: Sequence[str], loss_only: bool = False) -> None:
        """Check the per-output forms against the model's output names, before any Spark job, as
        ``keras.Model.compile`` reads them: a loss dict names every output, a loss list has one
        entry per output, ``loss_weights`` per output need a loss per output (or a single-output
        model), metrics dicts name outputs only, and a metrics list on a model with several outputs
        has one entry per output (Keras refuses ``metrics=["mae"]`` on two outputs).

        Args:
            names: the model's output names in output order, e.g. ``["progression", "high"]``.
            loss_only: check the loss alone.

        Raises:
            ConfigError: naming the argument, the output names and what was received.
        """
        names, count = list(names), len(names)
        if isinstance(self.loss, dict) and not is_config(self.loss):
            if sorted(self.loss) != sorted(names):
                raise _named("loss", self.loss, names, "as a dict must name every model output (None for an output trained without a loss)")
        elif isinstance(self.loss, (list, tuple)) and len(self.loss) != count:
            raise _named("loss", self.loss, names, f"as a list must give one loss per output ({count}), in output order")
        if loss_only:
            return
        weights = self.loss_weights
        if isinstance(weights, (dict, list)):
            if count > 1 and not self.per_output_loss:
                raise _named("loss_weights", weights, names, "per output weigh per-output losses: give loss as a dict output "
                             "name -> loss or a list in output order (Keras refuses one loss with several weights), or one number")
            if isinstance(weights, dict) and sorted(weights) != sorted(names):
                raise _named("loss_weights", weights, names, "as a dict must name every model output")
            if isinstance(weights, list) and len(weights) != count:
                raise _named("loss_weights", weights, names, f"as a list must give one weight per output ({count}), in output order")
        elif weights is not None and count > 1 and self.per_output_loss:
            raise _named("loss_weights", weights, names, "with per-output losses must be per output too (a dict by output name "
                         "or a list in output order), as Keras requires")
        for argument, metrics in (("metrics", self.metrics), ("weighted_metrics", self.weighted_metrics)):
            if isinstance(metrics, dict):
                unknown = sorted(set(metrics) - set(names))
                if unknown:
                    raise _named(argument, metrics, names, f"as a dict must name model outputs; {unknown} are not outputs")
            elif metrics and count > 1 and len(metrics) != count:
                raise _named(argument, list(metrics), names, f"must be {METRICS_FORMS} (Keras reads a list on a model with "
                             f"{count} outputs as one entry per output; e.g. {{{names[0]!r}: ['mae']}} or {[['mae']] * count!r})")
            elif metrics and count == 1 and any(m is None for m in metrics):
                raise _named(argument, list(metrics), names, "of a single-output model must be metrics, not None")
            elif metrics and count == 1 and any(isinstance(m, list) for m in metrics) and len(metrics) != 1:
                raise _named(argument, list(metrics), names, "as a list of lists must give one entry per output (1)")

    @staticmethod
    def normalize_loss_weights(value) -> float | list | dict | None:
        """``loss_weights`` as JSON: ``None``, a float, a list of floats or a dict str -> float.

        Raises:
            ConfigError: for anything else, or a weight that is not a finite number.
        """
        def number(w) -> float:
            if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) or not np.isfinite(w):
                raise ConfigError(f"loss_weights must hold finite numbers. Received: {value!r}")
            return float(w)

        if value is None:
            return None
        if isinstance(value, dict):
            return {str(k): number(w) for k, w in value.items()}
        if isinstance(value, (list, tuple)):
            return [number(w) for w in value]
        return number(value)

    @staticmethod
    def normalize_jit_compile(value) -> bool | str:
        """``jit_compile`` as ``True``, ``False`` or ``"auto"``.

        Raises:
            ConfigError: for any other value.
        """
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if value == "auto":
            return "auto"
        raise ConfigError(f"jit_compile must be True, False or 'auto'. Received: {value!r}")

    def compile(self, model, optimizer_state: Sequence[np.ndarray] | None = None, state_optimizer=None):
        """Compile ``model`` in place; returns it.

        Args:
            model: a ``keras.Model``.
            optimizer_state: ``None`` for fresh optimizer state, else the values of
                ``optimizer.variables`` in order (iteration counter, moments, ...), e.g. a previous
                fit's: the optimizer is built on ``model.trainable_variables`` and takes them,
                except its ``learning_rate`` variable, which keeps this spec's value.
            state_optimizer: the optimizer (name or config) that produced ``optimizer_state``;
                its class must be this spec's optimizer class.

        Raises:
            ConfigError: when the state comes from another optimizer class, or its arrays do not
                match the optimizer's variables in count, shape or dtype (another architecture).
        """
        loss_weights = self.loss_weights
        if isinstance(loss_weights, dict) and not (isinstance(self.loss, dict) and not is_config(self.loss)):
            # Keras pairs a weights dict with a non-dict loss by sorted key, not by output: pass them in output order
            names = _output_names(model, model.outputs)
            loss_weights = [loss_weights[n] for n in names] if sorted(loss_weights) == sorted(names) else loss_weights
        model.compile(
            optimizer=_revive(self.optimizer, "optimizer"),
            loss=_revive_loss(self.loss),
            metrics=_revive_metrics(self.metrics),
            weighted_metrics=_revive_metrics(self.weighted_metrics) or None,
            loss_weights=loss_weights,
            jit_compile=self.jit_compile,
        )
        if optimizer_state is not None:
            self._load_optimizer_state(model, optimizer_state, state_optimizer)
        return model

    def _load_optimizer_state(self, model, state: Sequence[np.ndarray], state_optimizer) -> None:
        keras = keras_module()
        optimizer = model.optimizer
        name = keras.saving.get_registered_name(type(optimizer))
        if state_optimizer is not None:
            source = keras.saving.get_registered_name(type(_revive(state_optimizer, "optimizer")))
            if source != name:
                raise ConfigError(
                    f"optimizer state must come from the same optimizer class as the optimizer it is loaded into "
                    f"({name}). Received: the state of a {source}"
                )
        optimizer.build(model.trainable_variables)
        variables = list(optimizer.variables)
        if len(state) != len(variables):
            raise ConfigError(
                f"optimizer state must hold one array per variable of the {name} optimizer on this model "
                f"({len(variables)}; a learning-rate schedule instead of a constant changes the count). "
                f"Received: {len(state)} arrays"
            )
        arrays = [np.asarray(a) for a in state]
        for variable, array in zip(variables, arrays, strict=True):
            if tuple(array.shape) != tuple(variable.shape) or str(array.dtype) != str(np.dtype(variable.dtype)):
                raise ConfigError(
                    f"optimizer state must match the optimizer's variables of this architecture: "
                    f"{variable.path} is {tuple(variable.shape)} {np.dtype(variable.dtype)}. Received: "
                    f"{tuple(array.shape)} {array.dtype}"
                )
        for variable, array in zip(variables, arrays, strict=True):
            if variable.name != "learning_rate":
                variable.assign(array)

    @property
    def loss_info(self) -> LossInfo:
        """The loss's family, ``from_logits`` and canonical name, decided by its Keras class
        (:func:`sparkdl.keras.losses.describe_loss`): the one source of the label rule, the
        inferred task and ``transform``'s outputs. A loss per output of one entry gives that entry.

        Raises:
            ConfigError: for losses of several outputs (read them with :meth:`output_losses`).
        """
        if self.per_output_loss:
            entries = list(self.loss.values()) if isinstance(self.loss, dict) else list(self.loss)
            if len(entries) != 1:
                raise ConfigError(f"one loss was asked for, and the loss is per output: {self.loss!r}; read each output's "
                                  "with output_losses(names)")
            return describe_loss(entries[0]) if entries[0] is not None else LossInfo()
        return describe_loss(self.loss)


@dataclass(frozen=True)
class ModelSpec:
    """A Keras model as values: architecture JSON plus weights as Arrow IPC bytes.

    Attributes:
        architecture: ``model.to_json()``.
        weights: ``model.weights`` values in model order, encoded by
            :func:`~sparkdl.serialization.arrow_codec.encode_arrays`.
        input_shape: per-row input shape without the batch axis, e.g. ``(28, 28, 1)``.
        input_dtype: the input's numpy dtype name, e.g. ``"float32"``.
        output_shape: per-row output shape, e.g. ``(10,)``.
    """

    architecture: str
    weights: bytes
    input_shape: tuple
    input_dtype: str
    output_shape: tuple
    inputs: tuple = ()
    outputs: tuple = ()

    @property
    def input_specs(self) -> tuple:
        """``((name, per-row shape, dtype), ...)`` of every model input, in input order."""
        return self.inputs or (("input", self.input_shape, self.input_dtype),)

    @property
    def output_specs(self) -> tuple:
        """``((name, per-row shape), ...)`` of every model output, in output order."""
        return self.outputs or (("output", self.output_shape),)

    @classmethod
    def from_model(cls, model) -> ModelSpec:
        """Capture a built Functional or Sequential Keras model (one or several inputs and outputs).

        Input shapes must be fully defined beyond the batch axis, except a sequence input ``(None,)``
        (token ids, e.g. before ``Embedding(mask_zero=True)``) or ``(None, k)`` (its rows are padded
        with the ``padValue`` Param, each batch to its own longest row).

        Raises:
            ConfigError: when the model is not a built Functional or Sequential ``keras.Model``, an
                input shape has an undefined axis other than a sequence's steps, or it cannot be
                rebuilt from its JSON.
        """
        keras = keras_module()
        if not isinstance(model, keras.Model):
            raise ConfigError(f"model must be a keras.Model. Received: {type(model).__name__}")
        if not model.built:
            raise ConfigError("model must be built (give it an Input or call build()) before fit. Received: an unbuilt model")
        inputs, outputs = getattr(model, "inputs", None), getattr(model, "outputs", None)
        if not inputs or not outputs:
            raise ConfigError(
                "model must be a Functional or Sequential keras.Model with a known Input (subclassed models "
                f"are not supported yet). Received: {type(model).__name__} without symbolic inputs"
            )
        if isinstance(getattr(model, "_inputs_struct", None), dict):
            raise ConfigError(
                "model inputs must be a keras.Input or a list of them; a dict of inputs is not supported yet: build the model "
                f"with a list (featuresCols maps columns to inputs by their names). Received: inputs {sorted(model._inputs_struct)}"
            )
        architecture = model.to_json()
        try:  # executors rebuild the model from this JSON: unregistered custom objects must fail here
            keras.models.model_from_json(architecture)
        except Exception as exc:
            raise ConfigError(
                "model must be rebuildable from its architecture JSON on the executors; register custom layers and "
                "functions with @keras.saving.register_keras_serializable in a module the executors can import, or pass "
                "customObjects={name: class_or_function} (KerasEstimator, KerasModel.load, KerasModel.fromKeras). "
                f"Received: {_root_cause(exc)}"
            ) from exc
        release_cycles(weights_nbytes(model))  # the rebuilt model is a cycle of layers and model: its variables go with a collection
        input_specs = []
        for tensor in inputs:
            shape = tuple(tensor.shape[1:])
            # One variable axis is allowed: the steps of a sequence input, (None,) token ids or (None, k)
            # vectors, padded per batch.
            if any(d is None for d in shape) and not is_sequence_shape(shape):
                raise ConfigError(
                    f"model input {_tensor_name(tensor)!r} must have a fully defined shape beyond the batch axis, or be a "
                    f"sequence (None,) or (None, k). Received: {shape}"
                )
            input_specs.append((_tensor_name(tensor), shape, str(np.dtype(tensor.dtype))))
        output_specs = tuple((name, tuple(tensor.shape[1:])) for name, tensor in zip(_output_names(model, outputs), outputs, strict=True))
        return cls(
            architecture=architecture,
            weights=encode_arrays([np.asarray(v.numpy()) for v in model.weights], [v.path for v in model.weights]),
            input_shape=input_specs[0][1],
            input_dtype=input_specs[0][2],
            output_shape=output_specs[0][1],
            inputs=tuple(input_specs),
            outputs=output_specs,
        )

    def with_weights(self, arrays: Sequence[np.ndarray]) -> ModelSpec:
        """The same architecture with other weights (same count, shapes and order); weights that are
        views of an encoded payload of the same names (:func:`~sparkdl.serialization.arrow_codec.encoded_views`)
        keep that payload (no second encoding)."""
        names = decode_arrays(self.weights, copy=False).names  # views: no copy of the old weights
        if getattr(arrays, "payload", None) is not None and list(getattr(arrays, "names", [])) == list(names):
            return dataclasses.replace(self, weights=arrays.payload)
        return dataclasses.replace(self, weights=encode_arrays(list(arrays), names))

    def weight_arrays(self) -> list[np.ndarray]:
        return decode_arrays(self.weights).arrays

    def architecture_only(self) -> ModelSpec:
        """This spec without weights (``build()`` keeps Keras' initial values): for replicas whose
        weights arrive with every round, so tasks are not sent a second copy."""
        return dataclasses.replace(self, weights=b"")

    @functools.cached_property
    def reuse_key(self) -> str:
        """What a built replica depends on: the architecture, with a ``Sequential`` model's and its
        layers' names (numbered by Keras per instance: ``dense_12``) replaced by their positions,
        since nothing of a Sequential model is looked up by name; a Functional model's names stay
        (its outputs and inputs may be keyed by them)."""
        config = json.loads(self.architecture)
        if config.get("class_name") == "Sequential" and isinstance(config.get("config"), dict):
            inner = dict(config["config"], name="model")
            inner["layers"] = [{**layer, "config": {**layer.get("config", {}), "name": f"layer{i}"}}
                               for i, layer in enumerate(inner.get("layers", []))]
            config = {**config, "config": inner}
        return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()

    @functools.cached_property
    def digest(self) -> str:
        """sha256 of architecture and weights: a cache key for executors' built models (computed once)."""
        return hashlib.sha256(self.architecture.encode() + self.weights).hexdigest()

    def build(self):
        """A new, uncompiled ``keras.Model`` with these weights."""
        keras = keras_module()
        model = keras.models.model_from_json(self.architecture)
        if self.weights:
            for variable, array in zip(model.weights, self.weight_arrays(), strict=True):
                variable.assign(array)
        return model

    def to_keras_file(self, path: str) -> None:
        """Write a ``.keras`` archive (Keras' own format: config JSON + HDF5 weights, no pickle)."""
        self.build().save(path)

    @classmethod
    def from_keras_bytes(cls, data: bytes) -> ModelSpec:
        """Read a ``.keras`` archive's bytes (weights restored, compile state ignored).

        Raises:
            ConfigError: the archive names custom objects this process has not registered (named).
        """
        return cls.from_model(load_keras_bytes(data, compile=False))

    def to_keras_bytes(self) -> bytes:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.keras")
            self.to_keras_file(path)
            with open(path, "rb") as f:
                return f.read()
