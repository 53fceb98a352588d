"""Loss families: what a Keras loss says about the labels and the model outputs, decided by class.

One :class:`LossInfo` per loss decides three things for the whole package: the label rule
checked before training (:meth:`LossInfo.check_label_shape`), whether ``task="auto"`` means a
classifier (:attr:`LossInfo.is_classifier`), and how ``transform`` turns raw model outputs into
Spark ML columns (:meth:`LossInfo.layout`, :meth:`LossInfo.spark_outputs`).

The family is read from the loss's Keras class or function after Keras resolves it
(``keras.losses.get`` / ``keras.losses.deserialize``), never from the instance's ``name``:
``SparseCategoricalCrossentropy(name="scce")``, ``"SparseCategoricalCrossentropy"`` and
``"sparse_categorical_crossentropy"`` are the same loss. Subclasses of a built-in loss class
belong to its family; any other custom (registered) loss is ``"regression"`` (pass
``task="classification"`` to read its outputs as class scores).

Families, their losses, and what ``transform`` writes with ``task="classification"``
(k = output values per row; z = outputs when the loss has ``from_logits=True``):

- ``sparse_categorical`` (sparse categorical cross-entropy, categorical generalized
  cross-entropy; labels: one class index per row), ``categorical`` (categorical and
  categorical focal cross-entropy; one-hot labels), ``kl_divergence`` (label distributions):
  with k >= 2, prediction = argmax, rawPrediction = the outputs, probability = softmax(z), or
  the outputs as Keras' cross-entropy reads them (negatives clipped to 0, each row scaled to
  sum 1).
- ``binary`` (binary and binary focal cross-entropy): k = 1: p = sigmoid(z) or the output,
  probability = [1 - p, p], prediction = 1.0 where p >= 0.5, rawPrediction = [-z, z] (as
  Spark's LogisticRegression) or [1 - p, p]. k > 1 is multi-label: per label p = sigmoid(z)
  or the output, probability = the k values of p (each in [0, 1], not summing to 1),
  rawPrediction = the outputs, prediction = an ``array<double>`` of k 0/1 decisions (p >= 0.5).
- ``hinge`` (hinge, squared hinge; labels -1/1 or 0/1): the outputs are margins m:
  prediction = 1.0 where m > 0 else 0.0 (class 0 stands for label -1 or 0), rawPrediction =
  [-m, m] for k = 1 (else m, and prediction a 0/1 array of k), no probability: margins are
  not probabilities.
- ``categorical_hinge`` (one-hot labels): prediction = argmax, rawPrediction = the scores,
  no probability.
- ``regression`` (every other loss: mse, mae, huber, custom losses): with
  ``task="classification"`` the outputs o are read as estimates of the class probabilities,
  as a least-squares fit to 0/1 or one-hot labels estimates P(y | x): k = 1: p = o clipped to
  [0, 1], probability = [1 - p, p], prediction = 1.0 where o >= 0.5, rawPrediction =
  [1 - o, o]; k >= 2: probability = o with negatives clipped to 0 and rows scaled to sum 1,
  prediction = argmax, rawPrediction = o. Sigmoid and softmax outputs pass unchanged.
- A single output (k = 1) under a categorical family is read as the binary rule.

With ``task="regression"`` every family writes the outputs as ``prediction`` (a double, or
``array<double>`` of k) and nothing else. Probabilities are always in [0, 1], or NaN: an output
that holds a NaN gives a NaN prediction (a NaN decision, a NaN argmax) and NaN probabilities in
its row, never a class or a fill value.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass

import numpy as np

from sparkdl.errors import ConfigError, SchemaError
from sparkdl.keras.runtime import keras_module

SPARSE_CATEGORICAL = "sparse_categorical"
CATEGORICAL = "categorical"
BINARY = "binary"
HINGE = "hinge"
CATEGORICAL_HINGE = "categorical_hinge"
KL_DIVERGENCE = "kl_divergence"
REGRESSION = "regression"

FAMILIES = (SPARSE_CATEGORICAL, CATEGORICAL, BINARY, HINGE, CATEGORICAL_HINGE, KL_DIVERGENCE, REGRESSION)

# (Keras class name, Keras function name, family); names missing from an older Keras are skipped.
_BUILT_INS = (
    ("SparseCategoricalCrossentropy", "sparse_categorical_crossentropy", SPARSE_CATEGORICAL),
    ("CategoricalGeneralizedCrossEntropy", "categorical_generalized_cross_entropy", SPARSE_CATEGORICAL),
    ("CategoricalCrossentropy", "categorical_crossentropy", CATEGORICAL),
    ("CategoricalFocalCrossentropy", "categorical_focal_crossentropy", CATEGORICAL),
    ("BinaryCrossentropy", "binary_crossentropy", BINARY),
    ("BinaryFocalCrossentropy", "binary_focal_crossentropy", BINARY),
    ("Hinge", "hinge", HINGE),
    ("SquaredHinge", "squared_hinge", HINGE),
    ("CategoricalHinge", "categorical_hinge", CATEGORICAL_HINGE),
    ("KLDivergence", "kl_divergence", KL_DIVERGENCE),
)


@dataclass(frozen=True)
class OutputLayout:
    """The Spark columns ``transform`` writes for one loss, task and output width.

    Attributes:
        prediction_width: 0 for a ``double`` prediction per row, else the length of an
            ``array<double>`` prediction (multi-label 0/1 vectors, multi-output regressors).
        raw_width: values per row of ``rawPrediction``; 0 when there is none (regressors).
        probability_width: values per row of ``probability``; 0 when there is none
            (regressors, hinge families).
    """

    prediction_width: int
    raw_width: int
    probability_width: int


@dataclass(frozen=True)
class SparkOutputs:
    """Per-row values of the output columns, float64, rows in input order.

    Attributes:
        prediction: shape ``(rows,)``, or ``(rows, k)`` when ``prediction_width`` is k.
        raw: shape ``(rows, raw_width)`` or None.
        probability: shape ``(rows, probability_width)`` with values in [0, 1], or None.
    """

    prediction: np.ndarray
    raw: np.ndarray | None
    probability: np.ndarray | None


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -z))


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _as_distribution(o: np.ndarray) -> np.ndarray:
    """Rows of non-negative scores scaled to sum 1 (negatives clipped to 0; an all-zero row is
    uniform; a row holding a NaN, or whose sum is infinite, is all NaN: no fill may hide it)."""
    q = np.clip(o, 0.0, None)
    total = q.sum(axis=1, keepdims=True)
    out = np.divide(q, total, out=np.full_like(q, 1.0 / q.shape[1]), where=total > 0)
    out[~np.isfinite(total[:, 0])] = np.nan
    return out


def _decide(condition: np.ndarray, z: np.ndarray) -> np.ndarray:
    """A 0/1 decision per value as float64, NaN where the output ``z`` is NaN (a comparison with
    NaN is False, which would read as class 0)."""
    return np.where(np.isnan(z), np.nan, condition.astype(np.float64))


def _argmax(z: np.ndarray) -> np.ndarray:
    """The argmax of each row as float64, NaN for a row holding a NaN (``np.argmax`` would give an index)."""
    if z.shape[0] == 0:
        return np.zeros(0, np.float64)
    return np.where(np.isnan(z).any(axis=1), np.nan, z.argmax(axis=1).astype(np.float64))


@dataclass(frozen=True)
class LossInfo:
    """What a loss implies for labels and outputs; see the module docstring for the families.

    Attributes:
        family: one of :data:`FAMILIES`, e.g. ``"sparse_categorical"``.
        from_logits: the loss reads raw scores (``from_logits=True``): probabilities are the
            softmax (one label among k) or the sigmoid (binary, per label) of the outputs.
        name: the canonical Keras function name (``"sparse_categorical_crossentropy"`` for
            ``SparseCategoricalCrossentropy(name="scce")``), or a custom loss's registered name.
        ignore_class: a class index the loss skips (``SparseCategoricalCrossentropy(ignore_class=-1)``,
            e.g. 255 for unlabelled pixels), allowed as a label outside ``[0, classes)``; else None.
    """

    family: str = REGRESSION
    from_logits: bool = False
    name: str = "mean_squared_error"
    ignore_class: int | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(f"loss family must be one of {list(FAMILIES)}. Received: {self.family!r}")

    @property
    def is_classifier(self) -> bool:
        """Whether ``task="auto"`` makes a classifier (every family but ``"regression"``)."""
        return self.family != REGRESSION

    @property
    def expects_class_index(self) -> bool:
        """Whether labels are one class index per row (sparse categorical losses)."""
        return self.family == SPARSE_CATEGORICAL

    def infer_task(self, task: str) -> str:
        """``task`` itself unless it is ``"auto"``; then ``"classification"`` for classifier families."""
        if task != "auto":
            return task
        return "classification" if self.is_classifier else "regression"

    def check_label_shape(self, label_col: str, label_shape: tuple, output_shape: tuple) -> None:
        """Labels must fit the model output under this loss, checked before training.

        Sparse categorical losses take one class index per row (label shape ``()`` or ``(1,)``);
        every other family takes ``prod(output_shape)`` values per row (a scalar when the model
        has one output): one-hot rows for categorical losses, 0/1 (or −1/1 for hinge) per output
        for binary and hinge losses, the target values for regression.

        Args:
            label_col: the label column's name, for the message.
            label_shape: per-row label shape, e.g. ``()`` for a scalar or ``(10,)``.
            output_shape: per-row model output shape, e.g. ``(10,)``.

        Raises:
            SchemaError: naming the column, the rule and the lengths found.
        """
        outputs = int(np.prod(output_shape, dtype=np.int64))
        values = int(np.prod(label_shape, dtype=np.int64))
        if self.expects_class_index:
            if tuple(label_shape) not in ((), (1,)):
                raise SchemaError(
                    f"label column {label_col!r} must hold one class index per row for {self.name} "
                    f"(use categorical_crossentropy for one-hot labels). Received: {values} values per row"
                )
            return
        if values == outputs:
            return
        hint = ""
        if values == 1 and self.family in (CATEGORICAL, KL_DIVERGENCE, CATEGORICAL_HINGE):
            hint = "; for class indices use sparse_categorical_crossentropy"
        elif values == outputs - 1 and self.family in (CATEGORICAL, KL_DIVERGENCE, CATEGORICAL_HINGE):
            hint = (
                f"; a OneHotEncoder with its default dropLast=True writes {values} values for {outputs} classes: "
                "use OneHotEncoder(dropLast=False)"
            )
        elif outputs == 1 and self.family in (BINARY, HINGE):
            hint = "; a single output takes one label per row, for one-hot labels use k softmax outputs and categorical_crossentropy"
        raise SchemaError(
            f"label column {label_col!r} must hold {outputs} value(s) per row to match the model output shape "
            f"{tuple(output_shape)} under loss {self.name!r} (family {self.family}){hint}. Received: {values} per row"
        )

    def layout(self, task: str, outputs: int) -> OutputLayout:
        """The columns ``transform`` writes for ``task`` (``"classification"``/``"regression"``) and k outputs.

        Raises:
            ConfigError: for a task other than ``"classification"`` or ``"regression"``.
        """
        k = int(outputs)
        if task == "regression":
            return OutputLayout(0 if k == 1 else k, 0, 0)
        if task != "classification":
            raise ConfigError(f"task must be 'classification' or 'regression' once inferred. Received: {task!r}")
        if self.family in (HINGE, CATEGORICAL_HINGE):
            if k == 1:
                return OutputLayout(0, 2, 0)
            return OutputLayout(k if self.family == HINGE else 0, k, 0)
        if k == 1:
            return OutputLayout(0, 2, 2)
        if self.family == BINARY:  # multi-label: one independent 0/1 decision per output
            return OutputLayout(k, k, k)
        return OutputLayout(0, k, k)

    def num_classes(self, outputs: int) -> int:
        """Classes of a classifier with k outputs: 2 for a single output, else k (labels, for multi-label)."""
        return 2 if int(outputs) == 1 else int(outputs)

    def spark_outputs(self, raw: np.ndarray, task: str) -> SparkOutputs:
        """Prediction, rawPrediction and probability values from raw model outputs.

        Args:
            raw: model outputs, shape ``(rows, *output_shape)``; any float dtype.
            task: ``"classification"`` or ``"regression"`` (already inferred).

        Returns:
            :class:`SparkOutputs` with the widths of :meth:`layout` (float64). A row whose outputs
            hold a NaN gets a NaN prediction and NaN probabilities (per label for multi-label and
            hinge decisions); its raw scores are its outputs.

        Raises:
            ConfigError: for a task other than ``"classification"`` or ``"regression"``.
        """
        z = np.asarray(raw, np.float64)
        z = z.reshape(len(z), int(np.prod(z.shape[1:], dtype=np.int64)))  # (rows, k), zero rows included
        with np.errstate(invalid="ignore", divide="ignore"):  # NaN and ±inf outputs are expected here: they stay NaN
            return self._spark_outputs(z, task)

    def _spark_outputs(self, z: np.ndarray, task: str) -> SparkOutputs:
        k = z.shape[1]
        layout = self.layout(task, k)
        if task == "regression":
            return SparkOutputs(z[:, 0] if layout.prediction_width == 0 else z, None, None)
        # A NaN output stays NaN in every column: NaN decisions, NaN argmax, NaN probabilities.
        if self.family == HINGE or (self.family == CATEGORICAL_HINGE and k == 1):
            m = z[:, 0] if k == 1 else z
            return SparkOutputs(_decide(m > 0, m), np.stack([-m, m], axis=1) if k == 1 else z, None)
        if self.family == CATEGORICAL_HINGE:
            return SparkOutputs(_argmax(z), z, None)
        if k == 1 or self.family == BINARY:  # per output: the probability of class 1
            p, decision = (_sigmoid(z), z >= 0.0) if self.from_logits else (np.clip(z, 0.0, 1.0), z >= 0.5)
            if k > 1:  # multi-label
                return SparkOutputs(_decide(decision, z), z, p)
            s, p = z[:, 0], p[:, 0]
            raw_pair = np.stack([-s, s], axis=1) if self.from_logits else np.stack([1.0 - s, s], axis=1)
            return SparkOutputs(_decide(decision[:, 0], s), raw_pair, np.stack([1.0 - p, p], axis=1))
        probability = _softmax(z) if self.from_logits else _as_distribution(z)
        return SparkOutputs(_argmax(z), z, probability)


def _family_tables(keras):
    classes, functions = {}, {}
    for class_name, function_name, family in _BUILT_INS:
        cls, fn = getattr(keras.losses, class_name, None), getattr(keras.losses, function_name, None)
        if cls is not None:
            classes[cls] = (function_name, family)
        if fn is not None:
            functions[fn] = (function_name, family)
    return classes, functions


def _custom_name(keras, obj) -> str:
    """A custom loss's registered name (``"package>name"``), or its function or class name."""
    target = obj if inspect.isfunction(obj) else type(obj)
    return keras.saving.get_registered_name(target)


def describe_loss(loss) -> LossInfo:
    """The :class:`LossInfo` of a loss, canonicalised by its Keras class or function.

    Args:
        loss: a name or alias (``"bce"``, ``"sparse_categorical_crossentropy"``), a class name
            (``"SparseCategoricalCrossentropy"``), a Keras serialization config dict, a
            ``keras.losses.Loss`` instance or a loss function.

    Returns:
        The family (built-in classes by class, their subclasses by nearest built-in base,
        built-in functions by identity, anything else ``"regression"``), ``from_logits`` from
        the loss's config, and the canonical name.

    Raises:
        ConfigError: when Keras cannot resolve ``loss``.
    """
    keras = keras_module()
    try:
        if isinstance(loss, dict):
            resolved = keras.losses.deserialize(copy.deepcopy(loss))
        elif isinstance(loss, str):
            resolved = keras.losses.get(loss)
        else:
            resolved = loss
    except Exception as exc:
        raise ConfigError(f"loss must be a Keras loss name, object or config. Received: {loss!r} ({exc})") from exc
    if not callable(resolved):
        raise ConfigError(f"loss must resolve to a Keras loss or a function. Received: {loss!r}")
    classes, functions = _family_tables(keras)
    if isinstance(resolved, keras.losses.Loss):
        config = resolved.get_config() or {}
        from_logits = bool(config.get("from_logits", False))
        ignore_class = config.get("ignore_class")
        for base in type(resolved).__mro__:
            if base in classes:
                name, family = classes[base]
                return LossInfo(family, from_logits, name, ignore_class if family == SPARSE_CATEGORICAL else None)
        fn = getattr(resolved, "fn", None)  # a LossFunctionWrapper: named by its function
        if fn in functions:
            name, family = functions[fn]
            return LossInfo(family, from_logits, name)
        return LossInfo(REGRESSION, from_logits, _custom_name(keras, fn if inspect.isfunction(fn) else resolved))
    if resolved in functions:
        name, family = functions[resolved]
        return LossInfo(family, False, name)
    return LossInfo(REGRESSION, False, _custom_name(keras, resolved))


def losses_for_outputs(loss, names) -> list[LossInfo]:
    """The :class:`LossInfo` of each model output, in output order.

    Args:
        loss: one :class:`LossInfo` for every output; a list of them in output order; or a dict
            output name -> :class:`LossInfo` naming every output.
        names: the model's output names in output order, e.g. ``["progression", "high"]``.

    Returns:
        ``len(names)`` :class:`LossInfo`, one per output.

    Raises:
        SchemaError: a list or dict that does not give one loss per output (naming the outputs
            and what was received).
    """
    names = list(names)
    if isinstance(loss, LossInfo):
        return [loss] * len(names)
    if isinstance(loss, dict):
        if sorted(loss) != sorted(names):
            raise SchemaError(f"per-output losses must map every model output by name: the outputs are {names}. Received: {sorted(loss)}")
        return [loss[name] for name in names]
    if len(loss) != len(names):
        raise SchemaError(f"per-output losses must give one loss per model output {names}. Received: {len(loss)}")
    return list(loss)
