"""The job config of ``sparkdl-train`` / ``jobs/train.py``: its schema, validation and builders.

A config is a YAML mapping with the sections of :data:`SCHEMA`::

    name: mnist_cnn                      # optional: default the file's name without .yaml
    data:  {train: ..., test: ..., features_col: pixels, label_col: label}
    model: {factory: sparkdl.keras.zoo:mnist_cnn, kwargs: {seed: 1}}
    fit:   {loss: sparse_categorical_crossentropy, epochs: 8, ...}   # KerasEstimator Params, snake_case
    callbacks:                           # optional: Keras callbacks run on the driver during fit
      - {class: keras.callbacks.EarlyStopping, kwargs: {monitor: val_loss, patience: 2}}
    output: {dir: runs/mnist_cnn, plot: true}

Paths: a relative path in the file (``data.train``, ``output.dir``, ``model.json``, ``fit.log_dir``,
a callback's ``filepath``; :data:`PATH_KEYS`) is relative to the file's folder, so a config and its
data copied anywhere run from any working directory (``conf/mnist_cnn.yaml`` reads
``../data/mnist10k``); a path given with ``--set`` is relative to the working directory. The default
output folder, ``runs/<name>``, is in the working directory.

:func:`load_config` applies ``--set section.key=value`` overrides (values parsed as YAML), then
checks every key before anything starts: an unknown key (named with its section, the closest
valid key and every valid key), a value of the wrong type or outside its choices, a missing
required key all raise :class:`~sparkdl.errors.ConfigError`. ``conf/README.md`` documents every
key; its tables are :func:`schema_markdown`'s output (``python -m sparkdl.cli.config`` prints
them; a test checks they match). The ``fit`` keys and the ``data`` keys that are Params come from
the Params' declarations (:mod:`sparkdl.param_specs`, :func:`param_keys`): their names in
snake_case, types, defaults, meanings and choices.

Pure Python: importing this module loads neither Spark nor Keras.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml

from sparkdl.errors import ConfigError, did_you_mean
from sparkdl.param_specs import BY_NAME, KINDS, NO_DEFAULT, PARAMS

# type name -> check; "float" accepts integers, "int" and "float" refuse booleans
_TYPE_CHECKS = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


@dataclass(frozen=True)
class Key:
    """One config key: its type names (of ``str int float bool list dict null``), default, meaning,
    an example value, and where it goes (``param``: the ``KerasEstimator`` keyword)."""

    types: tuple[str, ...]
    doc: str
    default: Any = None
    example: Any = None
    required: bool = False
    param: str | None = None
    choices: tuple | None = None

    def type_name(self) -> str:
        return " or ".join(self.types)


@dataclass(frozen=True)
class Section:
    doc: str
    keys: dict[str, Key] = field(default_factory=dict)


_NULL = ("null",)
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+:")  # a scheme of 2+ characters (not a Windows drive letter)


def is_uri(path: str) -> bool:
    """Whether ``path`` has a URI scheme (``hdfs://``, ``s3a://``, ``dbfs:/``, ``file:``)."""
    return bool(_URI.match(path))


def param_keys(section: str) -> dict[str, Key]:
    """The job config keys of the ``KerasEstimator`` Params that :mod:`sparkdl.param_specs` declares
    in ``section`` (``"fit"`` or ``"data"``): each Param's name in snake_case, the config types of
    its kind, its default (None for ``loss``, which has none), its doc with the Param's name in
    brackets, its choices (for ``fit``, those ``fit`` accepts) and its example."""
    keys = {}
    for spec in PARAMS:
        if spec.config != section:
            continue
        choices = spec.fit_choices or spec.choices
        keys[spec.key] = Key(KINDS[spec.kind].types, f"{spec.doc} [{spec.name}]",
                             None if spec.default is NO_DEFAULT else spec.default, spec.example, param=spec.name,
                             choices=tuple(choices) if choices is not None else None)
    return keys


DATA = Section(
    "Where the rows come from. A relative path is relative to the config file's folder (see Paths); on a "
    "cluster give paths every executor reaches (`hdfs://`, `s3a://`, `/Volumes/...`, `dbfs:/`).",
    {
        "train": Key(("str",), "rows trained on (any path `spark.read` reads in `format`)", None,
                     "data/mnist10k/train.parquet", required=True),
        "test": Key(("str",), "rows evaluated after the fit: `test_metrics` (and `test_accuracy`) in metrics.json", None,
                    "data/mnist10k/test.parquet", required=True),
        "validation": Key(("str", "null"), "rows validated on after each epoch (`val_*` in the history)", None,
                          "data/mnist10k/test.parquet"),
        "format": Key(("str",), "`spark.read` format of train, test and validation (parquet, orc, json, delta, ...)",
                      "parquet", "orc"),
        **param_keys("data"),  # the column Params
    },
)

MODEL = Section(
    "The Keras model: `factory` or `json` (exactly one). The factories of the shipped configs come with the "
    "package (`sparkdl.keras.zoo`); your own modules import from the working directory, which is on `sys.path`.",
    {
        "factory": Key(("str", "null"), "`module:function` (or `module.function`) returning a built `keras.Model`",
                       None, "sparkdl.keras.zoo:mnist_cnn"),
        "kwargs": Key(("dict",), "keyword arguments of the factory", {}, {"seed": 1}),
        "json": Key(("str", "null"), "path of a Keras model JSON (`model.to_json()`), instead of factory; relative to "
                    "the config's folder", None,
                    "models/mlp.json"),
    },
)


FIT = Section(
    "`KerasEstimator` Params in snake_case (each key's Param in brackets); a key left "
    "out keeps the estimator's default, shown here. The Params' keys, types, defaults and meanings come from "
    "their declarations (`sparkdl/param_specs.py`), as README.md's Params table does.",
    param_keys("fit"),
)

CALLBACK = Section(
    "Each entry of the top-level `callbacks:` list: a Keras callback built on the driver and passed as "
    "`KerasEstimator(callbacks=[...])` (either backend).",
    {
        "class": Key(("str",), "an importable class: `module.Class` or `module:Class`", None,
                     "keras.callbacks.EarlyStopping", required=True),
        "kwargs": Key(("dict",), "its constructor's keyword arguments", {}, {"monitor": "val_loss", "patience": 2}),
    },
)

OUTPUT = Section(
    "What the job writes. `--output DIR` on the command line overrides `dir`.",
    {
        "dir": Key(("str", "null"), "folder of `model/`, `metrics.json`, `history.png`; a URI (hdfs://, s3a://, "
                   "dbfs:/) is written through Spark's Hadoop filesystem; relative to the config's folder; null = "
                   "`runs/<name>` in the working directory", None,
                   "/tmp/runs/mnist_cnn"),
        "plot": Key(("bool",), "write `history.png` (needs matplotlib: the `plot` extra)", True, False),
    },
)

TOP = Section(
    "The top-level keys.",
    {
        "name": Key(("str", "null"), "the run's name (Spark app name, default output folder); null = the config "
                    "file's name without `.yaml`", None, "mnist_cnn"),
        "data": Key(("dict",), "the `data` section", None,
                    {"train": "data/mnist10k/train.parquet", "test": "data/mnist10k/test.parquet"}, required=True),
        "model": Key(("dict",), "the `model` section", None, {"factory": "sparkdl.keras.zoo:mnist_mlp"}, required=True),
        "fit": Key(("dict", "null"), "the `fit` section", {}, {"loss": "sparse_categorical_crossentropy", "epochs": 2}),
        "callbacks": Key(("list", "null"), "Keras callbacks: a list of `callbacks[]` entries (below)", [],
                         [{"class": "keras.callbacks.EarlyStopping", "kwargs": {"patience": 2}}]),
        "output": Key(("dict", "null"), "the `output` section", {}, {"plot": False}),
    },
)

#: every section, in the order conf/README.md documents them ("" = the top level)
SCHEMA: dict[str, Section] = {"": TOP, "data": DATA, "model": MODEL, "fit": FIT, "callbacks[]": CALLBACK,
                              "output": OUTPUT}

#: ``fit`` key -> KerasEstimator Param, as jobs/train.py had it (plus the keys added since)
FIT_KEYS = {key: spec.param for key, spec in FIT.keys.items() if spec.param}
#: the config keys that hold a path (``section.key``): relative ones are made absolute by :func:`load_config`
PATH_KEYS = ("data.train", "data.test", "data.validation", "model.json", "output.dir", "fit.checkpoint_dir",
             "fit.log_dir", "fit.server_cert_file", "fit.server_key_file")
#: keyword arguments of Keras' callbacks that hold a path (ModelCheckpoint, CSVLogger, TensorBoard, BackupAndRestore)
CALLBACK_PATH_KWARGS = ("filepath", "filename", "log_dir", "backup_dir")
#: ``data`` keys that are KerasEstimator Params
DATA_KEYS = {key: spec.param for key, spec in DATA.keys.items() if spec.param}


# ---------------------------------------------------------------------------------------------
# loading and validation


def load_config(path: str, overrides: Iterable[str] = ()) -> dict:
    """The validated job config of the YAML file ``path``, with ``overrides`` (``section.key=value``
    strings, values parsed as YAML) applied first.

    The result has every section (``fit``, ``callbacks`` and ``output`` possibly empty), ``name``
    set (default: the file name without extension), ``data`` and ``output`` with their defaults
    filled in; ``fit`` holds only the keys given (the others keep the estimator's defaults).

    Paths (:data:`PATH_KEYS` and the :data:`CALLBACK_PATH_KWARGS` of each callback): a relative
    path in the file is made absolute against the file's folder, one given in ``overrides``
    against the working directory (as a path typed on a command line); absolute paths (``~``
    expanded) and URIs (``hdfs://``, ``s3a://``, ``dbfs:/``, ``file:``) are kept as they are.

    Raises:
        ConfigError: an unreadable file, an override without ``=``, an unknown key, a value of the
            wrong type or out of its choices, a missing required key; the message names the key.
    """
    try:
        with open(path) as f:
            config = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read the job config {path!r}: {e.strerror}. Received: {path!r}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"the job config {path!r} is not valid YAML: {e}") from None
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ConfigError(f"the job config {path!r} must be a YAML mapping of sections. Received: {type(config).__name__}")
    resolve_paths(config, os.path.dirname(os.path.abspath(path)))
    apply_overrides(config, overrides, base=os.getcwd())
    config = validate_config(config, source=path)
    if not config.get("name"):
        config["name"] = os.path.splitext(os.path.basename(path))[0]
    return config


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"fit.epochs=1"`` -> ``(["fit", "epochs"], 1)``: the dotted path and the YAML-parsed value."""
    key, sep, value = text.partition("=")
    path = [part.strip() for part in key.strip().split(".")]
    if not sep or not all(path):
        raise ConfigError(f"an override must be section.key=value (e.g. fit.epochs=1). Received: {text!r}")
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"the value of override {key!r} is not valid YAML: {e}. Received: {value!r}") from None
    return path, parsed


def resolve_path(value: Any, base: str) -> Any:
    """``value`` made absolute against the folder ``base`` when it is a relative path (``~``
    expanded); URIs (a scheme of 2+ letters: ``hdfs://``, ``dbfs:/``, ``file:``), absolute paths
    and anything but a non-empty string are returned as they are."""
    if not isinstance(value, str) or not value or is_uri(value):
        return value
    value = os.path.expanduser(value)
    return value if os.path.isabs(value) else os.path.normpath(os.path.join(base, value))


def resolve_paths(config: dict, base: str) -> dict:
    """Make the relative paths of a raw (unvalidated) config absolute against ``base``, in place:
    the :data:`PATH_KEYS` and, in each ``callbacks`` entry's ``kwargs``, the
    :data:`CALLBACK_PATH_KWARGS`. Values of other types are left for validation to name."""
    for dotted in PATH_KEYS:
        section, key = dotted.split(".")
        node = config.get(section)
        if isinstance(node, dict) and key in node:
            node[key] = resolve_path(node[key], base)
    callbacks = config.get("callbacks")
    for entry in callbacks if isinstance(callbacks, list) else ():
        kwargs = entry.get("kwargs") if isinstance(entry, dict) else None
        if isinstance(kwargs, dict):
            for key in CALLBACK_PATH_KWARGS:
                if key in kwargs:
                    kwargs[key] = resolve_path(kwargs[key], base)
    return config


def apply_overrides(config: dict, overrides: Iterable[str], base: str | None = None) -> dict:
    """Set each ``section.key=value`` of ``overrides`` in ``config`` (in place; nested mappings
    created as needed, e.g. ``model.kwargs.seed=2``) and return it. With ``base``, the value of a
    path key (:data:`PATH_KEYS`) is made absolute against it (:func:`resolve_path`)."""
    for text in overrides or ():
        path, value = parse_override(text)
        if base is not None and ".".join(path) in PATH_KEYS:
            value = resolve_path(value, base)
        node = config
        for depth, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                raise ConfigError(f"override {text!r}: {where!r} is not a mapping. Received: {child!r}")
            node = child
        node[path[-1]] = value
    return config


def _where(section: str) -> str:
    return "the top level" if not section else f"section {section!r}"


def _check_keys(given: dict, section: str, spec: Section, prefix: str, source: str) -> None:
    valid = list(spec.keys)
    for key in given:
        if key not in spec.keys:
            raise ConfigError(
                f"{source}: unknown key {prefix}{key!s} in {_where(section)} of the job config.{did_you_mean(key, valid)} "
                f"Valid keys of {_where(section)}: {', '.join(valid)}. Received: {key!r}"
            )
    for key, key_spec in spec.keys.items():
        if key_spec.required and given.get(key) is None:
            raise ConfigError(
                f"{source}: {_where(section)} of the job config is missing the required key {prefix}{key} "
                f"({key_spec.doc}; e.g. {key}: {_example(key_spec.example)}). Received keys: {sorted(map(str, given))}"
            )


def _check_value(value: Any, name: str, spec: Key, source: str) -> Any:
    if isinstance(value, str) and "float" in spec.types and "str" not in spec.types:
        try:  # PyYAML reads 1e-3 (no dot) as a string
            value = float(value)
        except ValueError:
            pass
    if not any(_TYPE_CHECKS[t](value) for t in spec.types):
        raise ConfigError(
            f"{source}: config key {name} must be {spec.type_name()} ({spec.doc}). "
            f"Received: {value!r} ({type(value).__name__})"
        )
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(
            f"{source}: config key {name} must be one of {', '.join(_example(c) for c in spec.choices)}."
            f"{did_you_mean(value, spec.choices)} Received: {value!r}"
        )
    if spec.param is not None:
        try:  # the Param's declared range, in the words its setter uses
            BY_NAME[spec.param].check(value)
        except ConfigError as exc:
            raise ConfigError(f"{source}: config key {name}: {exc}") from None
    return value


def _check_section(given: Any, section: str, spec: Section, source: str, fill_defaults: bool) -> dict:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise ConfigError(f"{source}: config section {section!r} must be a mapping of keys. Received: {given!r}")
    _check_keys(given, section, spec, f"{section}." if section else "", source)
    checked = {}
    for key, value in given.items():
        checked[key] = _check_value(value, f"{section}.{key}" if section else key, spec.keys[key], source)
    if fill_defaults:
        for key, key_spec in spec.keys.items():
            checked.setdefault(key, _copy(key_spec.default))
    return checked


def _copy(value):
    return dict(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value


def validate_config(config: dict, source: str = "config") -> dict:
    """``config`` checked against :data:`SCHEMA` (see :func:`load_config`); returns a new dict."""
    top = _check_section(config, "", TOP, source, fill_defaults=False)
    result = {"name": top.get("name")}
    result["data"] = _check_section(top["data"], "data", DATA, source, fill_defaults=True)
    model = _check_section(top["model"], "model", MODEL, source, fill_defaults=False)
    given = [k for k in ("factory", "json") if model.get(k) is not None]
    if len(given) != 1:
        raise ConfigError(
            f"{source}: section 'model' of the job config must give exactly one of model.factory "
            f"(module:function returning a keras.Model) or model.json (a model JSON path). Received: {sorted(model)}"
        )
    model.setdefault("kwargs", {})
    if model.get("json") is not None and model["kwargs"]:
        raise ConfigError(f"{source}: model.kwargs goes with model.factory, not model.json. Received: {model['kwargs']!r}")
    result["model"] = model
    result["fit"] = _check_section(top.get("fit"), "fit", FIT, source, fill_defaults=False)
    callbacks = top.get("callbacks") or []
    result["callbacks"] = []
    for i, entry in enumerate(callbacks):
        result["callbacks"].append(_check_section(entry, f"callbacks[{i}]", CALLBACK, source, fill_defaults=True))
    result["output"] = _check_section(top.get("output"), "output", OUTPUT, source, fill_defaults=True)
    return result


# ---------------------------------------------------------------------------------------------
# builders (these import Keras and the user's modules)


def import_object(spec: str, what: str):
    """The object named by ``module:attr`` or ``module.attr`` (the working directory on ``sys.path``).

    Raises:
        ConfigError: naming ``what`` (the config key) when the module or attribute is missing; for a
            module that cannot be imported, where it must be (the working directory or PYTHONPATH)
            and how to ship one's own (``--py-files``).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"{what} must be 'module:name' or 'module.name'. Received: {spec!r}")
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"{what} must be 'module:name' or 'module.name'. Received: {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"{what}: cannot import module {module_name!r} ({e}): it must be importable on the driver, from the working "
            f"directory ({os.getcwd()}) or PYTHONPATH; ship a module of your own with --py-files (of sparkdl-train or "
            f"spark-submit), which puts it on the driver's path and the executors'. Received: {spec!r}"
        ) from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what}: {module_name!r} has no attribute {attr!r}. Received: {spec!r}")
        obj = getattr(obj, part)
    return obj


def build_model(model_config: dict):
    """A ``keras.Model`` from ``factory: module:function`` (+ ``kwargs``) or ``json: path``."""
    if model_config.get("factory"):
        factory = import_object(model_config["factory"], "model.factory")
        return factory(**(model_config.get("kwargs") or {}))
    if model_config.get("json"):
        import keras

        with open(model_config["json"]) as f:
            return keras.models.model_from_json(f.read())
    raise ConfigError("section 'model' must give 'factory: module:function' or 'json: path'. Received: "
                      f"{sorted(model_config)}")


def build_callbacks(config: dict) -> list:
    """The callback objects of ``config["callbacks"]`` (``class`` instantiated with ``kwargs``).

    Raises:
        ConfigError: a class that cannot be imported, is not a class, or refuses its kwargs.
    """
    built = []
    for i, entry in enumerate(config.get("callbacks") or []):
        name = f"callbacks[{i}].class"
        cls = import_object(entry["class"], name)
        if not isinstance(cls, type):
            raise ConfigError(f"{name} must name a class. Received: {entry['class']!r} ({type(cls).__name__})")
        try:
            built.append(cls(**(entry.get("kwargs") or {})))
        except TypeError as e:
            raise ConfigError(f"callbacks[{i}]: {entry['class']}(**kwargs) failed: {e}. "
                              f"Received: kwargs={entry.get('kwargs')!r}") from e
    return built


def estimator_params(config: dict, accepted: Iterable[str] | None = None) -> dict:
    """``KerasEstimator`` keywords of ``config``: the ``fit`` keys given, ``featuresCol``,
    ``labelCol`` and the ``data`` keys that are Params (when not null). Keys not in the config are
    left out, so the estimator keeps its defaults.

    Args:
        accepted: the keywords the estimator takes (default: its constructor's); a config key
            whose Param is not among them is refused, naming it, rather than failing in the
            constructor.
    """
    params = {FIT_KEYS[key]: value for key, value in config["fit"].items() if key in FIT_KEYS}
    data = config["data"]
    params.update({param: data[key] for key, param in DATA_KEYS.items() if data.get(key) is not None})
    if data.get("features_cols") is not None:  # it replaces features_col (whose default is always filled in)
        params.pop("featuresCol", None)
    if accepted is None:
        accepted = estimator_keywords()
    accepted = set(accepted)
    by_param = {p: f"fit.{k}" for k, p in FIT_KEYS.items()} | {p: f"data.{k}" for k, p in DATA_KEYS.items()}
    for param in params:
        if param not in accepted:
            raise ConfigError(f"config key {by_param[param]} needs KerasEstimator({param}=...), which this version of "
                              f"sparkdl does not have. Received: {params[param]!r}")
    return params


def estimator_keywords() -> set[str]:
    """The keyword arguments of ``KerasEstimator(...)`` (imports pyspark)."""
    import inspect

    from sparkdl import KerasEstimator

    return {name for name, p in inspect.signature(KerasEstimator.__init__).parameters.items() if name != "self"}


# ---------------------------------------------------------------------------------------------
# documentation


def _example(value) -> str:
    """``value`` as YAML in flow style, on one line."""
    return yaml.safe_dump([value], default_flow_style=True, width=10**6, allow_unicode=True, sort_keys=False).strip()[1:-1]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def schema_markdown() -> str:
    """The key tables of ``conf/README.md``: one per section, every key with its type, default,
    meaning and an example."""
    lines = []
    for section, spec in SCHEMA.items():
        title = "Top level" if not section else f"`{section}`"
        lines += [f"### {title}", "", spec.doc, "", "| key | type | default | meaning | example |",
                  "|---|---|---|---|---|"]
        for key, k in spec.keys.items():
            default = "required" if k.required else f"`{_example(k.default)}`"
            rule = BY_NAME[k.param].rule if k.param is not None else None
            meaning = (k.doc + (f"; one of {', '.join(f'`{_example(c)}`' for c in k.choices)}" if k.choices else "")
                       + (f"; {rule.text}" if rule is not None else ""))
            example = "" if k.example is None else f"`{key}: {_example(k.example)}`"
            lines.append(f"| `{key}` | {k.type_name()} | {_cell(default)} | {_cell(meaning)} | {_cell(example)} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m sparkdl.cli.config: the tables of conf/README.md
    print(schema_markdown(), end="")
