"""The Params of ``KerasEstimator`` and ``KerasModel``, declared once, as plain data.

Each :class:`ParamSpec` gives a Param's name, the kind of value it takes (its converter), its
default, its meaning, which stage sets it and where the job config holds it. Everything else is
generated from :data:`PARAMS`:

- :mod:`sparkdl.spark.params`: the ``pyspark.ml.param.Param`` class attributes, the ``getX`` and
  ``setX`` methods, the defaults and the converters (pyspark's ``TypeConverters``, with errors
  raised as :class:`~sparkdl.errors.ConfigError` naming the Param);
- ``KerasEstimator``: its keywords (an unknown one is refused naming the closest) and the Args of
  its docstring (:func:`args_docstring`);
- the docs' Params table, docs/reference/params.md (:func:`params_markdown`, with each Param's rule;
  ``python -m sparkdl.param_specs`` prints it, a test keeps the page equal to it);
- the ``fit`` and ``data`` keys of the job config (:mod:`sparkdl.cli.config`, snake_case);
- each Param's range (a :class:`Rule`, as pyspark's ``ParamValidators``): checked when the Param is
  set, by the job config and by :class:`sparkdl.config.FitConfig` (whose fields and defaults come
  from here too), and stated in the errors and in both docs tables.

Pure Python: importing this module loads neither Spark nor Keras.
"""

from __future__ import annotations

import inspect
import math
import numbers as _numbers
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkdl.core.modes import MODE_NAMES as MODES
from sparkdl.errors import ConfigError, did_you_mean

BACKENDS = ("rounds", "ps", "sharded", "auto")  # the backend Param's choices: the registry's names (sparkdl.spark.backends) and auto
MIXED_PRECISION = ("mixed_float16", "mixed_bfloat16")  # besides None: Keras dtype policies of the replicas
# Liveness: a worker's heartbeat thread beats every HEARTBEAT_FRACTION of workerTimeout (at most
# HEARTBEAT_MAX_S), so a timeout holds many beats and one late beat on a loaded machine is no alarm;
# a workerTimeout under MIN_WORKER_TIMEOUT_S cannot be honoured that way and is refused.
HEARTBEAT_FRACTION = 0.1
HEARTBEAT_MAX_S = 2.0
MIN_WORKER_TIMEOUT_S = 5.0

#: the stage that sets a Param: both (``fit`` copies the estimator's value into the model) ...
SHARED = "shared"
#: ... or the estimator only; the fitted model carries the value it was fitted with (a getter, saved with it)
TRAINING = "training"


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


#: the default of a Param that is undefined until set (``loss``)
NO_DEFAULT = _NoDefault()


@dataclass(frozen=True)
class Rule:
    """The values a Param takes beyond its kind, as pyspark's ``ParamValidators``: a test and its words.

    Declared once, on the Param's :class:`ParamSpec`: the Param's converter checks it when the Param
    is set (:mod:`sparkdl.spark.params`), the job config when it is read (:mod:`sparkdl.cli.config`),
    :class:`sparkdl.config.FitConfig` and the mode classes when they are built, and the errors and
    both docs tables state its ``text``.

    Attributes:
        text: the rule in words, e.g. ``"a positive integer"``.
        test: value -> whether it keeps the rule (a value of the Param's kind; never raises).
        reason: why the rule holds, appended to the error (``workerTimeout``'s heartbeats), or ``""``.
    """

    text: str
    test: Callable[[Any], bool]
    reason: str = ""


def _is_int(value) -> bool:
    return isinstance(value, _numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, _numbers.Real) and not isinstance(value, bool) and not math.isnan(value)


def integers(text: str, low: int | None = None, high: int | None = None) -> Rule:
    """Integers (not bools) in ``[low, high]`` (either bound may be None)."""
    return Rule(text, lambda v: _is_int(v) and (low is None or v >= low) and (high is None or v <= high))


def numbers(text: str, low: float | None = None, high: float | None = None, *, low_open: bool = False,
            high_open: bool = False, finite: bool = False, reason: str = "") -> Rule:
    """Numbers (int or float, not bool, not NaN) from ``low`` to ``high``, each bound closed unless
    ``*_open``; ``finite``: not ±inf either."""
    def test(v) -> bool:
        if not _is_number(v) or (finite and math.isinf(v)):
            return False
        if low is not None and (v <= low if low_open else v < low):
            return False
        return high is None or (v < high if high_open else v <= high)

    return Rule(text, test, reason)


def optional(rule: Rule) -> Rule:
    """``rule``, or None."""
    return Rule(f"None or {rule.text}", lambda v: v is None or rule.test(v), rule.reason)


POSITIVE_INT = integers("a positive integer", low=1)
POSITIVE_SECONDS = numbers("a positive number of seconds", low=0, low_open=True)
POSITIVE_NUMBER = numbers("a number > 0", low=0, low_open=True)
MOMENTUM = numbers("a number in [0, 1)", low=0, high=1, high_open=True)
FOLDER = Rule("None or a folder path or URI", lambda v: v is None or (isinstance(v, str) and bool(v.strip())))
WORKERS_PER_ROUND = Rule(
    "None, a count >= 1 (int) or a fraction in (0, 1] (float)",
    lambda v: v is None or (_is_int(v) and v >= 1) or (isinstance(v, float) and 0.0 < v <= 1.0))


@dataclass(frozen=True)
class Kind:
    """A kind of Param value: what its converter accepts.

    Attributes:
        rule: the rule error messages state, e.g. ``"an integer"``.
        types: the job config's type names of such a value (of ``str int float bool list dict null``).
        pytype: the Python type the docstring shows, e.g. ``"int | None"``.
    """

    rule: str
    types: tuple[str, ...]
    pytype: str


#: kind name -> :class:`Kind`; :mod:`sparkdl.spark.params` has one converter per kind
KINDS: dict[str, Kind] = {
    "int": Kind("an integer", ("int",), "int"),
    "int?": Kind("None or an integer", ("int", "null"), "int | None"),
    "float": Kind("a number", ("float",), "float"),
    "float?": Kind("None or a number", ("float", "null"), "float | None"),
    "bool": Kind("True or False", ("bool",), "bool"),
    "bool?": Kind("True, False or None", ("bool", "null"), "bool | None"),
    "str": Kind("a string", ("str",), "str"),
    "str?": Kind("None or a string", ("str", "null"), "str | None"),
    "choice": Kind("one of the choices", ("str",), "str"),  # the choices are checked when the Param is set
    "workers?": Kind("None, an int or a float", ("int", "float", "null"), "int | float | None"),
    "features_cols": Kind("None, a list of column names or a dict model input name -> column(s)", ("list", "dict", "null"),
                          "list | dict | None"),
    "label_cols": Kind("None, a list of column names or a dict output name -> column", ("list", "dict", "null"),
                       "list | dict | None"),
    "output_cols": Kind("None, a list of column names or a dict output name -> column", ("list", "dict", "null"),
                        "list | dict | None"),
    "decoders": Kind("None or a dict column -> a function or 'module:function'", ("dict", "null"), "dict | None"),
    "class_weight": Kind("None or a dict class index -> weight", ("dict", "null"), "dict | None"),
    "optimizer": Kind("a Keras optimizer name, object or config", ("str", "dict"), "str | dict | keras.optimizers.Optimizer"),
    "loss": Kind("a Keras loss name, object, function or config, or one per output (a dict output name -> loss or a "
                 "list in output order)", ("str", "dict", "list"), "str | dict | list | keras.losses.Loss"),
    "metrics": Kind("a list of Keras metric names, objects or configs, or per output a dict output name -> metrics or "
                    "a list of one entry per output", ("list", "dict"), "list | dict"),
    "loss_weights": Kind("None, a float, a list of floats or a dict output name -> float", ("float", "list", "dict", "null"),
                         "float | list | dict | None"),
    "jit_compile": Kind("True, False or 'auto'", ("bool", "str"), "bool | str"),
}


@dataclass(frozen=True)
class ParamSpec:
    """One Param of ``KerasEstimator`` (and of the ``KerasModel`` it fits).

    Attributes:
        name: the camelCase Param name, also the estimator's keyword, e.g. ``"numWorkers"``.
        kind: a key of :data:`KINDS`: which converter checks a value when it is set.
        default: the default value, or :data:`NO_DEFAULT`.
        doc: what the Param means, in Markdown (inline code in backticks): the Param's doc, the
            estimator's docstring, README.md and the job config docs all show this text.
        stage: :data:`SHARED` (set on the estimator or the model) or :data:`TRAINING` (set on the
            estimator; the fitted model carries the value, read-only).
        choices: the values it takes, where they are few (the job config checks them; kind
            ``"choice"`` also checks them when the Param is set; the others at ``fit``).
        rule: the values it takes beyond its kind (a :class:`Rule`: ``"a positive integer"``),
            checked wherever the value enters (set, job config, ``FitConfig``), or None.
        config: the job config section that holds it as a snake_case key (``"fit"``, ``"data"``), or None.
        example: an example value for the job config docs.
        fit_choices: the values ``fit`` accepts, when fewer than ``choices`` (the others are for
            ``transform``); the job config offers these.
    """

    name: str
    kind: str
    default: Any
    doc: str
    stage: str = TRAINING
    choices: tuple | None = None
    rule: Rule | None = None
    config: str | None = None
    example: Any = None
    fit_choices: tuple | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"ParamSpec.kind must be one of {sorted(KINDS)}. Received: {self.name}: {self.kind!r}")
        if self.stage not in (SHARED, TRAINING):
            raise ValueError(f"ParamSpec.stage must be {SHARED!r} or {TRAINING!r}. Received: {self.name}: {self.stage!r}")

    @property
    def key(self) -> str:
        """The job config key: the name in snake_case (``maxTaskMemoryMB`` -> ``max_task_memory_mb``)."""
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", self.name).lower()

    @property
    def type_rule(self) -> str:
        """The rule a converter's error states, e.g. ``"a positive integer"``, ``"one of ['vector', 'array']"``."""
        if self.rule is not None:
            return self.rule.text
        if self.choices is not None:
            return f"one of {list(self.choices)}"
        return KINDS[self.kind].rule

    def check(self, value) -> None:
        """Refuse a value outside this Param's :attr:`rule` or :attr:`choices` (its kind already
        converted it: ``2`` for ``2.0`` is the converter's business).

        Raises:
            ConfigError: ``"<name> must be <rule>[: <reason>]. Received: <name>=<value>"``, with the
                closest choice for a misspelt one.
        """
        if self.rule is not None and not self.rule.test(value):
            reason = f": {self.rule.reason}" if self.rule.reason else ""
            raise ConfigError(f"{self.name} must be {self.rule.text}{reason}. Received: {self.name}={value!r}")
        if self.choices is not None and not any(value == c and type(value) is type(c) for c in self.choices):
            hint = did_you_mean(value, [c for c in self.choices if isinstance(c, str)]) if isinstance(value, str) else ""
            raise ConfigError(f"{self.name} must be one of {list(self.choices)}.{hint} Received: {self.name}={value!r}")

    @property
    def suffix(self) -> str:
        """The getter and setter suffix: ``getNumWorkers``, ``setNumWorkers``."""
        return self.name[0].upper() + self.name[1:]


@dataclass(frozen=True)
class Keyword:
    """A ``KerasEstimator`` keyword that is not a Param (an object that is neither JSON nor saved as a Param)."""

    name: str
    pytype: str
    default: Any
    doc: str


TASKS = ("auto", "classification", "regression")
SCORE_COLUMN_TYPES = ("vector", "array")
HANDLE_INVALID = ("error", "skip", "keep")
COMPRESSIONS = ("fp16", "1bit", "threshold", "int8", "int4")  # sparkdl.core.compression.COMPRESSIONS, checked equal by a test

#: the estimator's keywords that are not Params, in the order its docstring lists them
KEYWORDS: tuple[Keyword, ...] = (
    Keyword("model", "keras.Model | str", None,
            "a built Functional or Sequential `keras.Model` (one or several inputs and outputs), or the path of a "
            "`.keras` file (local or any Hadoop URI, read once, as `KerasModel.fromKeras` reads it), kept as architecture "
            "JSON plus weights (Arrow IPC), never pickled; a compiled model supplies each compile Param not given "
            "(`optimizer`, `loss`, `metrics`, `weightedMetrics`, `lossWeights`), see `setModel`"),
    Keyword("initialModel", "KerasModel", None,
            "a fitted or loaded `KerasModel` to continue from, with its weights and optimizer state (Adam's moments and "
            "iteration counter), see `setInitialModel`"),
    Keyword("customObjects", "dict", None,
            "a dict name -> class or function, as Keras' `custom_objects`, registered with Keras here and on the executors"),
    Keyword("callbacks", "list", [],
            "Keras callbacks run on the driver during `fit` (either backend), never pickled nor saved, see `setCallbacks`"),
)

_P = ParamSpec

#: every Param, in the order the docs list them
PARAMS: tuple[ParamSpec, ...] = (
    # --- the model's columns (read by fit, transform and evaluate) ---
    _P("featuresCol", "str", "features", stage=SHARED, config="data", example="pixels", doc=(
        "input column: numeric, `array<numeric>` or a Spark ML (or mllib) vector holding `prod(input_shape)` values per "
        "row (784 for an input of shape `(28, 28, 1)`), cast to the model input's dtype (float32 by default)")),
    _P("labelCol", "str", "label", stage=SHARED, config="data", example="label", doc=(
        "label column: numeric (a class index or a value) or `array<numeric>`/vector (one-hot, or one value per output "
        "unit); read by `fit` and `KerasModel.evaluate`")),
    _P("featuresCols", "features_cols", None, stage=SHARED, config="data", example=["x1", "x2"], doc=(
        "instead of `featuresCol`: a list of columns (scalars, arrays, vectors) whose values are concatenated per row, in "
        "order, into the one model input; or a dict model input name -> column (or list of columns) for multi-input "
        "models. Each input is cast to its Keras input's dtype (int32/int64 ids stay integers); a sequence input "
        "`(None,)` (token ids) takes one `array<numeric>` column of any lengths, a sequence input `(None, k)` one "
        "`array<array<numeric>>` column, each padded with `padValue` to the longest row")),
    _P("labelCols", "label_cols", None, stage=SHARED, config="data", example={"digit": "label"}, doc=(
        "labels of a multi-output model, instead of `labelCol`: a list of columns in output order or a dict output "
        "name -> column")),
    _P("decoders", "decoders", None, stage=SHARED, config="data", example={"image": "mypkg.decode:png"}, doc=(
        "binary columns' decoders: a dict column -> a function that turns one row's bytes into a numeric array of "
        "exactly the input's shape, given itself (defined anywhere: a function of `__main__`, a script's or a "
        "notebook's, travels to the executors by value, as custom objects do) or by name, `\"module:function\"` or "
        "`\"module.function\"` of a module the executors import. A save keeps the name; a function of `__main__` "
        "must be passed again after `load` (`setDecoders`; `load` warns, naming the column). A binary column without "
        "one is refused before any job")),
    _P("padValue", "float", 0.0, stage=SHARED, config="fit", example=0, doc=(
        "the value that pads a sequence input's shorter rows (inputs `(None,)`: an `array<numeric>` column of "
        "token ids; `(None, k)`: an `array<array<numeric>>` column), after each row (post-padding, as "
        "`keras.utils.pad_sequences(padding=\"post\")`): each training, validation, `evaluate` and `transform` batch "
        "is padded to its own longest row. 0 is what `Embedding(mask_zero=True)` and `Masking()` mask; a whole number "
        "for an integer input (checked before any job)")),
    _P("sampleWeightCol", "str?", None, stage=SHARED, config="fit", example="weight", doc=(
        "column of per-row loss weights (numeric, finite, >= 0), Keras' `sample_weight`, in training, validation and "
        "`evaluate` (a batch's loss is Σ w·l / rows, as in Keras; not with `classWeight`)")),
    # --- transform's output ---
    _P("predictionCol", "str", "prediction", stage=SHARED, doc=(
        "`transform`'s prediction column (double): a classifier's class index, a regressor's output value "
        "(`array<double>` for several output values or a multi-label classifier's 0/1 decisions)")),
    _P("rawPredictionCol", "str", "rawPrediction", stage=SHARED, doc=(
        "classifiers' raw class scores, as Spark's classifiers write them (`\"\"` leaves the column out)")),
    _P("probabilityCol", "str", "probability", stage=SHARED, doc=(
        "classifiers' class probabilities in [0, 1] (`\"\"` leaves the column out); each classifier output of a "
        "multi-output model gets `<column>_<probabilityCol>`")),
    _P("scoreColumnType", "choice", "vector", stage=SHARED, choices=SCORE_COLUMN_TYPES, doc=(
        "type of the `rawPrediction` and `probability` columns: `vector` (a `pyspark.ml.linalg` DenseVector, as "
        "Spark's classifiers write them and its evaluators read them) or `array` (`array<double>`)")),
    _P("outputCols", "output_cols", None, stage=SHARED, doc=(
        "`transform` of a multi-output model: each output's column, a list in output order or a dict output name -> "
        "column (default: each output's name; checked before any job)")),
    _P("task", "choice", "auto", stage=SHARED, choices=TASKS, config="fit", example="classification", doc=(
        "how `transform` reads the outputs: `classification` (prediction = class index, with rawPrediction and "
        "probability), `regression` (prediction = the output values) or `auto` (classification for cross-entropy, "
        "hinge and KL-divergence losses)")),
    _P("checkFeatures", "bool", False, stage=SHARED, doc=(
        "True: `transform` counts null, NaN, ±inf and wrongly sized feature rows over the whole input in one Spark-SQL "
        "pass when it is called and, with `handleInvalid=\"error\"`, raises `SchemaError` with the counts before any "
        "row is scored. False (default; no pass before scoring): `transform` stays lazy and the scoring pass "
        "checks every row; a bad row fails its task, and so the action (a `PythonException` naming `SchemaError`, "
        "the column, the counts, the partition and the batch; a sink that is not transactional may hold rows "
        "written before it). A stage saved while True was the default (before 2026-12-03) loads with True, the default it "
        "was saved with: `setCheckFeatures(False)` gives it the lazy check")),
    _P("handleInvalid", "choice", "error", stage=SHARED, choices=HANDLE_INVALID, fit_choices=("error", "skip"),
       config="fit", example="skip", doc=(
           "rows with a null, NaN or ±inf value (or a wrongly sized one) in a model column: `error` fails (`fit` before "
           "training, naming each column and its counts; `transform` in the task that meets it, or before scoring "
           "with `checkFeatures=True`); `skip` drops them (`fit` warns with the count, also in `fitInfo[\"rows_skipped\"]`; "
           "`transform` leaves them out of its output); `keep`, for `transform` only, keeps them with NaN in every "
           "prediction, rawPrediction and probability column (`fit` refuses it before any job: set it on the fitted "
           "model). The fitted model gets the estimator's value")),
    # --- batches and compile arguments ---
    _P("batchSize", "int", 32, stage=SHARED, rule=POSITIVE_INT, config="fit", example=64, doc=(
        "rows per local training step; the smallest `transform` batch when `inferenceBatchSize` is None, and "
        "`evaluate`'s default")),
    _P("inferenceBatchSize", "int?", None, rule=optional(integers("a positive number of rows", low=1)), stage=SHARED, doc=(
        "rows per predict call in `transform` (> 0); None: as many rows as make about 16 MiB of the model's largest "
        "per-row tensor (an input or a layer's output), between `batchSize` and 2,048: activations that stay in the CPU's "
        "caches (193 rows for the mnist CNN's 26x26x32 convolution output, 2,048 for an MLP on mnist's 784 pixels); on a "
        "GPU up to 1 GiB of it")),
    _P("optimizer", "optimizer", "adam", stage=SHARED, config="fit",
       example={"class_name": "Adam", "config": {"learning_rate": 0.002}}, doc=(
           "Keras optimizer: a name (`\"adam\"`), an object (`Adam(1e-3)`) or a config dict `{class_name, config}`; "
           "a compiled `model` supplies it when it is not given")),
    _P("learningRate", "float?", None, rule=optional(numbers("a finite number > 0", low=0, low_open=True, finite=True)), config="fit", example=0.002, doc=(
        "the optimizer's learning rate for the fit (> 0): it replaces the rate (or schedule) of `optimizer`, of the "
        "compiled `model`'s optimizer when `optimizer` is not given, or of Keras' `adam` default; every replica trains "
        "with it and the fitted model's `optimizer` and optimizer state record it. None keeps the optimizer's own. "
        "A Param, so `ParamGridBuilder().addGrid(est.learningRate, [1e-3, 1e-2])` tunes it; not BMUF's "
        "`blockLearningRate`")),
    _P("loss", "loss", NO_DEFAULT, stage=SHARED, config="fit", example="sparse_categorical_crossentropy", doc=(
        "Keras loss: a name, an object, a function or a config dict; needed unless `model` is compiled (then it "
        "supplies it). A multi-output model takes one loss per output as `keras.Model.compile` does: a dict output "
        "name -> loss naming every output, or a list in output order. Each output's loss family decides its label "
        "rule and whether `transform` writes its probability column")),
    _P("metrics", "metrics", [], stage=SHARED, config="fit", example=["accuracy"], doc=(
        "Keras metrics: a list of names, objects or configs (a compiled `model` supplies them when not given); for "
        "a multi-output model a dict output name -> metric(s) (`{\"high\": [\"accuracy\"]}`, logged as "
        "`high_accuracy`) or a list of one entry per output, as `keras.Model.compile` takes them")),
    _P("weightedMetrics", "metrics", [], stage=SHARED, doc=(
        "`keras.Model.compile`'s `weighted_metrics`: a list of names, objects or configs, weighted by `sampleWeightCol`; "
        "per output as `metrics`")),
    _P("lossWeights", "loss_weights", None, stage=SHARED, doc=(
        "`keras.Model.compile`'s `loss_weights`: None, a float, a list of floats (output order) or a dict output name "
        "-> float (per output with per-output losses, as Keras requires)")),
    _P("jitCompile", "jit_compile", "auto", stage=SHARED, doc=(
        "`keras.Model.compile`'s `jit_compile`: True, False or `\"auto\"` (XLA compilation of the train step); a "
        "compiled model does not supply it (Keras keeps only the value it resolved on the driver's devices)")),
    # --- the training loop ---
    _P("numWorkers", "int", 2, rule=POSITIVE_INT, config="fit", example=4, doc=(
        "model replicas, one Spark task and one partition each (a warning when larger than the row count)")),
    _P("epochs", "int", 1, rule=POSITIVE_INT, config="fit", example=8, doc="passes over the data"),
    _P("localSteps", "int?", None, rule=optional(POSITIVE_INT), config="fit", example=16, doc=(
        "τ: local steps of each worker between averaging rounds (round modes) or between a push and the next pull "
        "(asynchronous modes); None: one pass over each partition per round, i.e. one round per epoch, in the round "
        "modes, and 4 steps in the asynchronous ones (`sparkdl.config.ASYNC_DEFAULT_LOCAL_STEPS`)")),
    _P("mode", "str", "sync", choices=MODES, config="fit", example="bmuf", doc=(
        "training mode (the user guide's Training modes page has each rule): the round modes, on either backend, `sync` (model "
        "averaging weighted by rows; SparkNet, Moritz et al. 2016), `bmuf` (block momentum: `blockMomentum`, "
        "`blockLearningRate`, `nesterov`; Chen & Huo 2016), `easgd` (elastic averaging with force `elasticForce`, the "
        "fitted model is the centre; Zhang, Choromanska, LeCun 2015), `gossip` (each round every worker averages with "
        "one peer of a seeded random matching, the fitted model is the workers' average; Jin et al. 2016); or an "
        "asynchronous mode on backend `ps`: `async` (Downpour; Dean et al. 2012), `hogwild` (no lock; Recht et al. "
        "2011), `staleness_aware` (each update scaled by 1/staleness; Zhang, Gupta, Lian, Liu 2016), `ssp` (bounded "
        "staleness, see `staleness`; Ho et al. 2013); or `diloco` on backend `sharded` (each worker keeps its own "
        "optimizer, the slice owners take an outer Nesterov step on the averaged delta: `outerLearningRate`, "
        "`outerMomentum`; Douillard et al. 2023)")),
    _P("backend", "str", "auto", choices=BACKENDS, config="fit", example="ps", doc=(
        "`rounds` (one Spark job per round: the round modes; works with dynamic allocation), `ps` (a parameter server "
        "on the driver and one long-lived task per worker: every mode, a round mode giving what `rounds` gives on the "
        "same seed; needs a task slot per worker and dynamic allocation off, both checked before any job) or `auto` "
        "(`ps` for the asynchronous modes; for the round modes `ps`, the faster, when allocation is static, the cluster "
        "has a task slot per worker, `keepPartitioning` is off and the executors reach the driver, else `rounds`; "
        "`fitInfo['backend_reason']` says why), or `sharded` (the state in one slice per worker, owned and served by the "
        "workers' own tasks, the driver coordinating: `sync`, `bmuf` and `diloco`; for models whose state the driver "
        "should not hold, and many workers; needs a task slot per worker, no validation data)")),
    _P("seed", "int", 0, rule=integers("an integer"), config="fit", example=1, doc=(
        "seed of the shuffles, of `validationSplit` and of the replicas' random layers")),
    _P("shuffle", "bool", True, config="fit", example=False, doc=(
        "reshuffle each partition's rows every epoch with a seeded permutation, as `keras.Model.fit(shuffle=True)`")),
    _P("verbose", "int", 1, choices=(0, 1, 2), rule=Rule("0, 1 or 2", lambda v: _is_int(v) and v in (0, 1, 2)), config="fit", example=0, doc=(
        "as Keras: 0 silent; 1 a live progress bar on the driver (epoch, round, running loss and metrics, samples/s, "
        "time left) in a terminal or notebook, else one line per epoch (`Epoch 3/8 - 2.4s - 3,266 samples/s - loss: "
        "0.1151 - accuracy: 0.9653`); 2 one such line per epoch. Each line also goes to the `sparkdl` logger (DEBUG)")),
    _P("roundTimeout", "float", 3600.0, rule=POSITIVE_SECONDS, config="fit", example=1800, doc=(
        "seconds a round may run before its Spark jobs are cancelled (`RoundTimeoutError`)")),
    _P("dataTimeout", "float", 86400.0, rule=POSITIVE_SECONDS, config="fit", example=7200, doc=(
        "seconds a data job may run before it is cancelled: the check and caching passes over the whole input, and each "
        "validation pass (they read all the rows, so `roundTimeout` does not bound them)")),
    # --- checkpoints ---
    _P("checkpointDir", "str?", None, rule=FOLDER, config="fit", example="hdfs://nn/ckpt/mnist", doc=(
        "a folder (local, or any Hadoop URI the session reaches) for snapshots of the fit's whole state, written at "
        "every epoch's end (data first, then a marker; the last 2 kept). A fit of the same model, mode, schedule and "
        "data with the same folder (the same job run again after its driver was lost) continues from the newest one; "
        "a snapshot of another fit is refused, naming the difference; a finished fit's folder makes a new fit return "
        "at once")),
    _P("checkpointEvery", "int?", None, rule=optional(POSITIVE_INT), config="fit", example=50, doc=(
        "with `checkpointDir`: also a snapshot after every this many rounds (None: at epoch ends only; the "
        "asynchronous modes snapshot at epoch ends only, where every worker stands at the same place)")),
    _P("keepPartitioning", "bool", False, config="fit", example=True, doc=(
        "train on the input's own partitions, one worker each (as many as the cached plan has: AQE does not coalesce "
        "cached plans, so after a shuffle that is `spark.sql.shuffle.partitions`, not the count "
        "`df.rdd.getNumPartitions()` shows; a warning names it), instead of spreading the rows round-robin over "
        "`numWorkers` partitions (so that label-sorted files do not give workers label-sorted shards)")),
    # --- backends ps and sharded ---
    _P("staleness", "int", 2, rule=integers("an integer >= 0", low=0), config="fit", example=3, doc=(
        "`ssp`: a worker more than this many clocks (pushes) ahead of the slowest waits")),
    _P("serverPort", "int", 0, rule=integers("an integer in [0, 65535]", low=0, high=65535), config="fit", example=7078, doc=(
        "`ps`: the parameter server's TCP port on the driver; `sharded`: the coordinator's (its workers' slice servers "
        "take free ports on their executors). 0: a free port; a taken port fails with `ServerError` naming it")),
    _P("workerTimeout", "float", 600.0, rule=numbers(f"a number of seconds >= {MIN_WORKER_TIMEOUT_S:g}", low=MIN_WORKER_TIMEOUT_S, reason=(
       f"each worker sends a heartbeat every {HEARTBEAT_FRACTION:g} of it (at most every {HEARTBEAT_MAX_S:g} s), and a "
       "shorter timeout would take a late beat on a busy machine for a dead worker")), config="fit", example=900, doc=(
        "`ps`, `sharded`: seconds a worker may go without a heartbeat (each task sends one every tenth of it, at most every "
        "2 s, from a thread of its own, whatever its step is doing) before its task attempt is killed and Spark runs "
        "it again (at most twice a worker: silent a third time, the fit fails with `WorkerError` naming its partition): a dead or stopped worker, not a slow one. A "
        "worker not heard from since its task was started gets at least 180 s (a Python worker's start and TensorFlow's "
        "import). A stage short of task slots (a node lost) waits at most 60 s (180 s on YARN and Kubernetes, whose "
        "replacement executors start a container or a pod), or half of this when shorter, for a replacement")),
    _P("serverTls", "bool", True, config="fit", example=False, doc=(
        "`ps`, `sharded`: the driver's server (`ps`' parameter server, `sharded`'s coordinator) speaks TLS with a "
        "certificate made for the fit, which the workers pin (nobody on the network sees the token or the weights; "
        "`sharded`'s slice servers speak TLS always, each with its own certificate); False: plain gRPC, e.g. to look at the traffic (a warning when "
        "the server listens on an address other than loopback: the token travels in clear)")),
    _P("serverCertFile", "str?", None, config="fit", example="/etc/sparkdl/ps.pem", doc=(
        "`ps`, `sharded`: your own PEM certificate for the driver's server (with `serverKeyFile`), instead of the fit's own; the workers "
        "pin it")),
    _P("serverKeyFile", "str?", None, config="fit", example="/etc/sparkdl/ps.key", doc=(
        "`ps`, `sharded`: the unencrypted PEM private key of `serverCertFile` (read on the driver only)")),
    # --- the modes' settings ---
    _P("blockMomentum", "float?", None, rule=optional(MOMENTUM), config="fit", example=0.5, doc=(
        "`bmuf`: the block momentum η in [0, 1); None: 1 − 1/numWorkers (η = 0 with `blockLearningRate` 1 is `sync`)")),
    _P("blockLearningRate", "float", 1.0, rule=POSITIVE_NUMBER, config="fit", example=1.0, doc=(
        "`bmuf`: the block learning rate ζ (> 0)")),
    _P("nesterov", "bool", True, config="fit", example=False, doc=(
        "`bmuf`: workers start each block from the Nesterov look-ahead W + η·Δ")),
    _P("outerLearningRate", "float", 0.7, rule=POSITIVE_NUMBER, config="fit", example=1.0, doc=(
        "`diloco`: the outer learning rate η of the Nesterov step on the averaged delta (the paper's 0.7; 1 with "
        "`outerMomentum` 0 is `sync` with `keepLocalOptimizer`)")),
    _P("outerMomentum", "float", 0.9, rule=MOMENTUM, config="fit", example=0.0, doc=(
        "`diloco`: the outer Nesterov momentum μ in [0, 1) (the paper's 0.9)")),
    _P("keepLocalOptimizer", "bool", False, config="fit", example=True, doc=(
        "`sharded`: each worker keeps its own optimizer state between rounds (on its Python worker and its executor's "
        "disk) and sends its weights alone: 4 bytes a parameter a round instead of 12 with Adam (2 with `fp16`); the "
        "fitted model's optimizer state is a fresh one. Always on with `diloco`")),
    _P("overlap", "bool", False, config="fit", example=True, doc=(
        "`sharded`: rounds that never block training: a worker hands each round's contribution to a background "
        "sender and trains the next τ steps at once, from that contribution carried onto its round's start (its own "
        "progress standing in for the mean still on the wire: the eager update of Kale et al. 2025). The round "
        "after each snapshot (`checkpointDir`, `BackupAndRestore`) waits for the exchange, so a resumed fit equals "
        "an uninterrupted one. A round trains with the learning rate set for the round before it")),
    _P("elasticForce", "float?", None, rule=optional(POSITIVE_NUMBER), config="fit", example=0.3, doc=(
        "`easgd`: the elastic force α (> 0, numWorkers·α < 1); None: 0.9/numWorkers")),
    _P("compression", "str?", None, choices=(None, *COMPRESSIONS), config="fit", example="fp16", doc=(
        "how workers send their updates: None (their full state), `fp16` (the update "
        "relative to the round's start as float16, half the bytes, summed in float64 and averaged in float32), `1bit` "
        "(one bit per value plus two float32 values per column, the quantization error kept by the worker and added "
        "to its next update; Seide et al. 2014) or `threshold` (±`compressionThreshold` at sparse uint32 indices, "
        "error feedback; Strom 2015), on every backend (on `sharded` each worker's piece of each slice on its own, one pair of values per piece of an array); or, on backend `sharded`, `int8` / `int4` (the "
        "update relative to the round's start in blocks of 256 values, one float32 scale a block and a byte or half a "
        "byte a value, the rounding error kept by the worker and added to its next update; 1.02 and 0.52 bytes a "
        "value; the weights' update alone travels: each worker keeps its optimizer state, as with `keepLocalOptimizer`). The asynchronous modes compress every push but each worker's last. With "
        "`1bit`/`threshold` the optimizer state stays on each worker (the fitted "
        "model keeps the initial one); `fitInfo[\"update_bytes\"]` counts the bytes the driver received (on `sharded`, "
        "the bytes the workers put)")),
    _P("compressionThreshold", "float", 0.01, rule=numbers(
       "a positive finite number within float32's range", low=1.1754943508222875e-38, high=3.4028234663852886e38), config="fit", example=0.001, doc=(
        "`threshold`'s t, in weight units: each entry moves by ±t at most per round, so t must be near a round's "
        "typical weight change (about learning rate × τ for Adam); a t far below it sends nearly every entry and "
        "learns slowly (a digits MLP: t = 0.001 stayed at chance, 0.05 reached 0.92); 0.01 sends about 1/20 of a full "
        "update's bytes on the mnist10k CNN with Adam(0.002) and τ = 16 (`benchmarks/compare_modes.py`)")),
    _P("minWorkersPerRound", "workers?", None, rule=WORKERS_PER_ROUND, config="fit", example=3, doc=(
        "straggler-tolerant rounds of the round modes (either backend): a round closes with the updates that arrived "
        "once this many workers (int) or this fraction of them (float) sent theirs and `roundDeadline` seconds "
        "passed (workers with no rows in a round do not count); later updates are dropped and counted "
        "(`fitInfo[\"updates_dropped\"]`, `[\"rows_dropped\"]`, `[\"dropped_per_round\"]`). On `rounds` a late "
        "worker's job goes on in the background and its partition sits out the rounds that close meanwhile; on `ps` "
        "the server closes the round and a late worker skips to the open one. None waits for every worker")),
    _P("roundDeadline", "float", 0.0, rule=numbers("a number of seconds >= 0", low=0, finite=True), config="fit", example=30, doc=(
        "with `minWorkersPerRound`: seconds a round waits for every worker before it closes with the minimum. With 0 a "
        "round closes as soon as the minimum arrived, so with `minWorkersPerRound=1` the slower half of equal workers "
        "is dropped every round: give a deadline a little above a normal round's time")),
    _P("mixedPrecision", "str?", None, choices=(None, *MIXED_PRECISION), config="fit", example="mixed_bfloat16", doc=(
        "the replicas' Keras dtype policy: None (the model's own dtypes), `mixed_float16` or `mixed_bfloat16` "
        "(16-bit compute, float32 variables, the output layers float32; `mixed_float16` adds dynamic loss scaling); "
        "the master weights, their averaging and the Arrow wire stay float32, and the fitted model is float32; "
        "checked before any job (docs/gpu.md)")),
    # --- the training data ---
    _P("classWeight", "class_weight", None, config="fit", example={0: 1.0, 1: 5.0}, doc=(
        "Keras `class_weight`: a dict class index -> weight; each row's loss is weighted by its class's weight (the "
        "argmax of one-hot labels, else the rounded label), as Keras does (not with `sampleWeightCol`)")),
    _P("validationCol", "str?", None, config="fit", example="is_val", doc=(
        "boolean column: rows where it is true are validated on after each epoch, the others trained on (a null is a "
        "training row); the history gets `val_*` keys, exact over all validation rows. The epoch's master is validated "
        "before the next epoch starts: on backend `ps` in a round mode by the workers in their tasks (no job), else by a "
        "job (on `ps` in an asynchronous mode the workers' tasks end at each epoch's end for it)")),
    _P("validationSplit", "float", 0.0, rule=numbers("a fraction in [0, 1)", low=0, high=1, high_open=True), config="fit", example=0.1, doc=(
        "fraction of the rows held out for validation after each epoch, chosen by a seeded hash of each row's model "
        "columns (the same rows every run, whatever the partitioning); or pass `fit(df, validationData=val_df)`")),
    _P("maxTaskMemoryMB", "float?", None, rule=optional(numbers("a number of MB > 0", low=0, low_open=True, finite=True)), config="fit", example=2048, doc=(
        "a task's memory budget for its partition (MB): a larger partition is written once to local `.npy` files and "
        "read a batch at a time (never memory-mapped); None: `spark.executor.pyspark.memory` (else `spark.executor.memory`, or the driver's "
        "in local mode) divided by the executor's task slots")),
    # --- tracking ---
    _P("logDir", "str?", None, config="fit", example="runs/mnist_cnn/tb", doc=(
        "a folder for TensorBoard event files (`train/`, `validation/`: `epoch_*` scalars per epoch and `round_*` per "
        "round); needs TensorFlow on the driver")),
    _P("mlflow", "bool?", None, config="fit", example=True, doc=(
        "log the Params, per-epoch metrics and the fitted model (an artifact folder `model` that `KerasModel.load` "
        "reads) to MLflow (the `mlflow` extra): True; None: when mlflow is installed and a run is active; False: "
        "never")),
)

#: name -> :class:`ParamSpec`
BY_NAME: dict[str, ParamSpec] = {spec.name: spec for spec in PARAMS}


def _inline(value) -> str:
    """A default as the docs show it: ``2``, ``None``, `` `sync` ``."""
    if value is NO_DEFAULT:
        return "none"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if isinstance(value, (list, dict)):
        return f"`{value!r}`"
    return repr(value)


def params_markdown() -> str:
    """The docs' Params table (docs/reference/params.md): every keyword of ``KerasEstimator``, Params and the others."""
    lines = [
        "Every Param is a keyword of `KerasEstimator`, has a `getX` and is declared once in `sparkdl/param_specs.py`. "
        "*both*: set on the estimator or the fitted model (`fit` copies the estimator's value); *estimator*: set on the "
        "estimator, and the fitted `KerasModel` carries the value it was fitted with (a getter, saved with it).",
        "",
        "| Param | default | set on | takes | meaning |",
        "|---|---|---|---|---|",
    ]
    for spec in PARAMS:
        stage = "both" if spec.stage == SHARED else "estimator"
        lines.append(f"| `{spec.name}` | {_inline(spec.default)} | {stage} | {_cell(_takes(spec))} | {_cell(spec.doc)} |")
    for keyword in KEYWORDS:
        lines.append(f"| `{keyword.name}` (not a Param) | {_inline(keyword.default)} | estimator | `{keyword.pytype}` | "
                     f"{_cell(keyword.doc)} |")
    return "\n".join(lines) + "\n"


def _takes(spec: ParamSpec) -> str:
    """The docs' "takes" cell: the Param's declared rule (the words its errors use), its choices, or its type."""
    if spec.rule is not None:
        return spec.rule.text
    if spec.choices is not None:
        return ", ".join(_inline(c) for c in spec.choices)
    return f"`{KINDS[spec.kind].pytype}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _rst(text: str) -> str:
    """Markdown inline code as reStructuredText's (``x``)."""
    return re.sub(r"`([^`]+)`", r"``\1``", text)


def args_docstring(indent: int = 8, width: int = 112) -> str:
    """The ``Args:`` entries of ``KerasEstimator``'s docstring: the keywords that are not Params,
    then every Param with its type and default, each wrapped to ``width`` columns."""
    pad = " " * indent
    out = []
    entries = [(k.name, k.pytype, k.default, k.doc) for k in KEYWORDS]
    entries += [(s.name, KINDS[s.kind].pytype, s.default, s.doc) for s in PARAMS]
    for name, pytype, default, doc in entries:
        shown = "no default" if default is NO_DEFAULT else f"default {default!r}"
        text = f"{name} ({pytype}; {shown}): {_rst(doc)}."
        out.append(textwrap.fill(text, width=width, initial_indent=pad, subsequent_indent=pad + "    ",
                                 break_long_words=False, break_on_hyphens=False))
    return "\n".join(out)


#: ``keras.Model.compile`` argument -> the Param that holds it; such a keyword given as None leaves
#: its Param unset (a compiled ``model`` supplies it)
COMPILE_PARAMS = {
    "optimizer": "optimizer",
    "loss": "loss",
    "metrics": "metrics",
    "weighted_metrics": "weightedMetrics",
    "loss_weights": "lossWeights",
    "jit_compile": "jitCompile",
}


def keyword_names() -> list[str]:
    """Every keyword of ``KerasEstimator``: the non-Param keywords, then the Params, in doc order."""
    return [k.name for k in KEYWORDS] + [spec.name for spec in PARAMS]


def check_keywords(owner: str, kwargs: dict) -> None:
    """Refuse a keyword that is neither a declared Param nor a :data:`KEYWORDS` entry.

    Args:
        owner: the class whose keywords these are, for the message (``"KerasEstimator"``).
        kwargs: the keywords given.

    Raises:
        ConfigError: naming the first unknown keyword, the closest valid one
            (:func:`~sparkdl.errors.did_you_mean`) and the value received.
    """
    valid = keyword_names()
    for name, value in kwargs.items():
        if name in BY_NAME or any(k.name == name for k in KEYWORDS):
            continue
        raise ConfigError(
            f"{owner} keywords must be its Params or {', '.join(k.name for k in KEYWORDS)}; {name!r} is none of them."
            f"{did_you_mean(name, valid)} Received: {name}={value!r}"
        )


def keyword_signature() -> inspect.Signature:
    """``KerasEstimator.__init__``'s and ``setParams``'s signature: ``self`` and keyword-only arguments,
    each defaulting to its Param's default (None for the compile Params, which a compiled model
    supplies, and for Params without a default)."""
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += [inspect.Parameter(k.name, inspect.Parameter.KEYWORD_ONLY, default=None) for k in KEYWORDS]
    for spec in PARAMS:
        default = None if spec.name in COMPILE_PARAMS.values() or spec.default is NO_DEFAULT else spec.default
        parameters.append(inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=default))
    return inspect.Signature(parameters)


def plain_doc(spec: ParamSpec) -> str:
    """The Param's doc as ``explainParams`` shows it (no Markdown backticks)."""
    return spec.doc.replace("`", "")


if __name__ == "__main__":  # python -m sparkdl.param_specs: docs/reference/params.md's Params table
    print(params_markdown(), end="")
