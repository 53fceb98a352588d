"""Worker-side model replicas, built and compiled once per Python worker per fit.

Spark reuses Python workers between tasks (``spark.python.worker.reuse``, on by default),
so a replica cached here serves every round of a fit that lands on this process. Each
round starts by loading the master state into the replica, so which worker process runs
which partition never changes the result: :meth:`Replica.seed_round` then sets the random
layers' seed state from the round's position, not from the process's history.
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING

import numpy as np

from sparkdl.param_specs import BY_NAME
from sparkdl.core.state import ModelState
from sparkdl.errors import ConfigError, InvariantError, SchemaError
from sparkdl.keras.runtime import keras_module
from sparkdl.keras.memory import variables_nbytes

if TYPE_CHECKING:  # annotations only: this module imports with numpy and Keras alone (benchmarks/gpu_check.py)
    from sparkdl.keras.spec import CompileSpec, ModelSpec

_SEED_STATE = "seed_generator_state"  # name of a keras.random.SeedGenerator's state variable


class Replica:
    """A compiled Keras model whose optimizer is built, plus its initial optimizer state.

    Args:
        spec: architecture and initial weights.
        compile_spec: optimizer, loss and metrics.
        seed: seeds Keras' random layers (dropout) through ``keras.utils.set_random_seed``; any
            integer (Spark seeds are 64-bit and may be negative), reduced modulo 2**32. Rounds
            reseed them with :meth:`seed_round`.
        mixed_precision: ``None`` (the model's own dtypes), ``"mixed_float16"`` or ``"mixed_bfloat16"``:
            the Keras dtype policy of the replica's layers (:func:`mixed_architecture`): variables
            stay float32, layers compute in 16 bits. With ``"mixed_float16"`` Keras' ``compile`` wraps
            the optimizer in a ``LossScaleOptimizer`` (dynamic loss scaling); its loss scale stays in
            this replica, and the optimizer state that travels is the wrapped optimizer's own, the
            same arrays as a float32 replica's. Weights and optimizer state leave the replica in
            the master's dtypes (float32), checked by :meth:`get_state`.

    Raises:
        ConfigError: ``mixed_precision`` not one of :data:`MIXED_PRECISION` or None.
    """

    def __init__(self, spec: ModelSpec, compile_spec: CompileSpec, seed: int, mixed_precision: str | None = None) -> None:
        keras = keras_module()
        check_mixed_precision(mixed_precision)
        self.mixed_precision = mixed_precision
        # Sequence inputs, (None,) or (None, k): their rows come padded to the longest row of the
        # data; each batch is cut to its own longest row (see trim_padding).
        self.sequence_inputs = {i for i, (_, shape, _) in enumerate(spec.input_specs) if shape and shape[0] is None}
        keras.utils.set_random_seed(seed & 0xFFFFFFFF)
        with global_dtype_policy(mixed_precision):  # the model's own policy: compile wraps the optimizer for mixed_float16
            self.model = compile_spec.compile(build_mixed(spec, mixed_precision) if mixed_precision else spec.build())
        self.model.optimizer.build(self.model.trainable_variables)
        # The optimizer whose state travels: a LossScaleOptimizer's inner optimizer (same variables as without it).
        self.optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
        self.initial_optimizer = [np.asarray(v.numpy()) for v in self.optimizer.variables]
        self.weight_dtypes = [np.dtype(v.dtype) for v in self.model.weights]  # replaced by the master's in set_state
        trainable = {id(v) for v in self.model.trainable_weights}
        self.trainable = [id(v) in trainable for v in self.model.weights]  # per weight array, in ModelState order
        # Seed generators' states are in ``variables`` (Keras documents "including random seeds") but
        # not in ``weights``, so set_state never touches them.
        weights = {id(v) for v in self.model.weights}
        self.seed_states = [
            v
            for v in [*self.model.variables, *self.model.optimizer.variables]
            if id(v) not in weights and v.name == _SEED_STATE
        ]
        # Every other variable's value at build time: the optimizers' (a LossScaleOptimizer's dynamic loss
        # scale, step counter and iterations, the travelling inner optimizer's), seed states and any other
        # non-weight state. reset() restores them when a later fit reuses this replica.
        self._build_values = [(v, np.array(v.numpy())) for v in _unique([*self.model.variables, *self.model.optimizer.variables])
                              if id(v) not in weights]

    def reset(self) -> None:
        """Every variable of the model and its optimizer back to its value when this replica was built,
        except the weights, which :meth:`set_state` overwrites before every round (keeping a second copy
        of them would double the replica's memory): optimizer variables (a ``LossScaleOptimizer``'s
        dynamic loss scale and step counter included, which no state that travels holds), seed-generator
        states and any other non-weight variable. Metric variables are reset before every step anyway.
        A replica reused by a later fit (same architecture and compile arguments) then trains exactly as
        a new one would."""
        for variable, value in self._build_values:
            variable.assign(value)

    def warm_step(self, row_specs: tuple, batch_size: int) -> None:
        """One training step on ``batch_size`` rows of zeros, then :meth:`reset`: the train step is traced
        (compiled) before a fit's first step needs it (about 1 s for a small CNN on one core). The weights
        it changed are overwritten by every round's :meth:`set_state`, the optimizer's and every other
        variable are put back by :meth:`reset`, and the metrics are reset before every step. Nothing
        when a shape has a length that varies (``None``: sequence inputs, whose batches each have their own).

        Args:
            row_specs: ``(inputs, outputs, weighted)``: per model input and per output its per-row
                ``(shape, dtype)`` as the fit's tasks feed them
                (:attr:`sparkdl.keras.metrics.MetricReader.row_specs`), and whether a sample weight is fed.
            batch_size: rows of the batch (the fit's ``batchSize``).
        """
        inputs, outputs, weighted = row_specs
        if self.sequence_inputs or any(d is None for shape, _ in [*inputs, *outputs] for d in shape):
            return
        x = [np.zeros((batch_size, *shape), dtype=dtype) for shape, dtype in inputs]
        y = [np.zeros((batch_size, *shape), dtype=dtype) for shape, dtype in outputs]
        try:
            self.train(x, y, batch_size, sample_weight=np.ones(batch_size, np.float32) if weighted else None)
        finally:
            self.reset()

    def set_state(self, state: ModelState) -> None:
        """Load master weights, and optimizer state (its initial values when ``state.optimizer`` is None).
        The weights' dtypes are the ones :meth:`get_state` must return."""
        for variable, array in zip(self.model.weights, state.weights, strict=True):
            variable.assign(array)
        self.weight_dtypes = [np.asarray(a).dtype for a in state.weights]
        optimizer = state.optimizer if state.optimizer is not None else self.initial_optimizer
        for variable, array in zip(self.optimizer.variables, optimizer, strict=True):
            variable.assign(array)

    def set_learning_rate(self, value: float) -> None:
        """Assign the optimizer's learning rate (a callback on the driver changed it); a
        ``LossScaleOptimizer``'s inner optimizer's. The value travels on in the optimizer state."""
        self.optimizer.learning_rate = float(value)

    def get_state(self) -> ModelState:
        """The replica's weights (``model.weights`` order) and optimizer state (``optimizer.variables``
        order, a ``LossScaleOptimizer``'s inner optimizer's), as numpy arrays.

        Raises:
            InvariantError: a weight whose dtype is not the master's (float32 under mixed precision):
                16-bit weights must never reach the averaging.
        """
        weights = [np.asarray(v.numpy()) for v in self.model.weights]
        check_state_dtypes(self.weight_dtypes, weights, f"the weights a replica returns (mixedPrecision={self.mixed_precision!r})")
        return ModelState(weights=weights, optimizer=[np.asarray(v.numpy()) for v in self.optimizer.variables])

    def seed_round(self, seed: int, epoch: int, round_in_epoch: int, partition: int) -> None:
        """Set every seed generator's state (Dropout, GaussianNoise, random augmentation layers, and
        any the optimizer holds) from the round's position, so that masks differ across workers,
        epochs and rounds, and a retried task or a partition that moves to another Python worker
        draws the same masks. Call it after :meth:`set_state`, before :meth:`train`.

        Generator ``i`` (model order) gets the state ``(a, b)``: the words ``2i`` and ``2i + 1`` of
        ``numpy.random.SeedSequence([seed mod 2**64, epoch, round_in_epoch, partition])``, each
        reduced to 31 bits so it fits any backend's seed dtype (TensorFlow: int64). Keras then
        draws from ``(a, b)``, ``(a, b + 1)``, ... step after step. Random ops outside a layer's
        ``SeedGenerator`` (``keras.random.*`` without ``seed``) are not covered.

        Args:
            seed: the fit's seed, any integer (64-bit, may be negative).
            epoch: 0-based epoch.
            round_in_epoch: 0-based round within the epoch.
            partition: the partition (worker) id.

        Raises:
            ConfigError: when ``epoch``, ``round_in_epoch`` or ``partition`` is negative.
        """
        position = {"epoch": epoch, "round_in_epoch": round_in_epoch, "partition": partition}
        negative = {name: value for name, value in position.items() if int(value) < 0}
        if negative:
            raise ConfigError(f"seed_round needs non-negative epoch, round and partition. Received: {negative}")
        if not self.seed_states:
            return
        entropy = [int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch), int(round_in_epoch), int(partition)]
        words = np.random.SeedSequence(entropy).generate_state(2 * len(self.seed_states), dtype=np.uint32)
        words = (words & 0x7FFFFFFF).reshape(-1, 2)
        for variable, value in zip(self.seed_states, words, strict=True):
            variable.assign(value.astype(variable.dtype))

    def train(self, x, y, batch_size: int, sample_weight: np.ndarray | None = None, rows: np.ndarray | None = None,
              pads: tuple | None = None) -> list[np.ndarray]:
        """Run ceil(n / batch_size) local steps over the rows in order, as ``fit(shuffle=False)`` does,
        and return the metric state these steps alone produce.

        Steps go through ``train_on_batch`` (the same compiled train step as ``fit``): measured on
        2 cores with two workers, ``fit`` per round sometimes took 5.2 s where this loop takes 3.2 s,
        as ``fit`` builds a ``tf.data`` pipeline whose threads compete with the other worker.

        ``train_on_batch`` resets the metrics before each step from Keras 3.15 but accumulates
        across calls before it, so the state after the loop means different things across the
        supported range. Resetting before every step and summing each step's state gives the
        same answer on every version: the state Keras' ``fit`` holds after these steps from one
        reset. That holds for every built-in metric (their state is sums and counts: a Mean's
        ``total``/``count``, AUC's confusion buckets, Precision's true/false positives). A custom
        metric must keep the same rule: state after updates A then B (from a reset) equals
        state(A) + state(B), with ``result()`` computed from the state; a running maximum or a
        stored mean is combined wrongly.

        Args:
            x: features, shape ``(rows, *input_shape)``, or a list of such arrays, one per model
                input in input order.
            y: labels, shape ``(rows,)`` or ``(rows, k)``, or a list, one per model output.
            batch_size: rows per step; the last batch may be partial.
            sample_weight: per-row loss weights ``(rows,)`` float32 (Keras' ``sample_weight``), or None.
            rows: the row indices to train on, in order (n = ``len(rows)``); None: every row in
                order. Each batch is gathered on its own, so on-disk arrays are read a batch
                at a time.
            pads: per model input, the value that pads a sequence input's rows (None for other
                inputs), e.g. :attr:`sparkdl.serialization.columns.ModelColumns.input_pads`; each
                batch of a sequence input is cut to its own longest row (:func:`trim_padding`).
                None: :data:`~sparkdl.serialization.columns.PAD_VALUE` for every sequence input.

        Returns:
            The values of ``model.metrics_variables`` in model order summed over the steps, as
            float64 arrays: e.g. ``loss/total`` ``()`` (Σ batch loss × batch rows), ``loss/count``
            ``()`` (rows), then each compiled metric's variables. Sum them across workers and
            rounds with :class:`sparkdl.core.metrics.MetricSums`; read values with
            :class:`sparkdl.keras.metrics.MetricReader`.

        Raises:
            SchemaError: when there is no row to train on.
        """
        return self._steps(self.model.train_on_batch, x, y, batch_size, sample_weight, rows, pads)

    def evaluate(self, x, y, batch_size: int, sample_weight: np.ndarray | None = None, rows: np.ndarray | None = None,
                 pads: tuple | None = None) -> list[np.ndarray]:
        """The metric state of ``test_on_batch`` over the rows in batches (weights unchanged): the
        loss and metrics ``keras.Model.evaluate`` computes, as summed metric variables (see :meth:`train`).
        ``rows``: the row indices in order (None: every row in order), ``pads`` the sequence inputs'
        pad values, as in :meth:`train`.

        Raises:
            SchemaError: when there is no row.
        """
        return self._steps(self.model.test_on_batch, x, y, batch_size, sample_weight, rows, pads)

    def _steps(self, step, x, y, batch_size, sample_weight, rows, pads) -> list[np.ndarray]:
        xs, ys = (list(x) if isinstance(x, (list, tuple)) else [x]), (list(y) if isinstance(y, (list, tuple)) else [y])
        n = len(rows) if rows is not None else len(xs[0])
        if n == 0:
            raise SchemaError(f"Replica needs at least one row. Received: x of shape {np.shape(xs[0])}")

        def pick(arrays, start):
            part = [a[rows[start : start + batch_size]] if rows is not None else a[start : start + batch_size] for a in arrays]
            return part

        if pads is None:
            from sparkdl.serialization.columns import PAD_VALUE

            pads = tuple(PAD_VALUE if i in self.sequence_inputs else None for i in range(len(xs)))
        sums: list[np.ndarray] | None = None
        for start in range(0, n, batch_size):
            xb, yb = pick(xs, start), pick(ys, start)
            xb = [trim_padding(a, pads[i]) if pads[i] is not None else a for i, a in enumerate(xb)]
            wb = pick([sample_weight], start)[0] if sample_weight is not None else None
            self.model.reset_metrics()
            step(xb[0] if len(xb) == 1 else xb, yb[0] if len(yb) == 1 else yb, sample_weight=wb)
            # Read after the step: compiled metrics build their variables on the first one.
            values = [np.asarray(v.numpy(), dtype=np.float64) for v in self.model.metrics_variables]
            sums = values if sums is None else [a + b for a, b in zip(sums, values, strict=True)]
        return sums


def _unique(variables) -> list:
    """``variables`` without repeats (by identity), in order: a wrapper optimizer lists its inner one's too."""
    seen, unique = set(), []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            unique.append(v)
    return unique


def trim_padding(batch: np.ndarray, pad: float = 0.0) -> np.ndarray:
    """A batch of post-padded sequences, ``(rows, steps)`` token ids or ``(rows, steps, k)``, cut
    to its longest row: trailing steps that are padding (all ``pad``) in every row are dropped, so
    each batch is padded to its own longest row, as ``keras.utils.pad_sequences(padding="post")``
    per batch would (at least one step is kept). Steps equal to ``pad`` at the end of every row are
    dropped too, which ``Embedding(mask_zero=True)`` or ``Masking`` would have masked anyway."""
    batch = np.asarray(batch)
    used = np.flatnonzero((batch != pad).any(axis=(0, *range(2, batch.ndim))))
    steps = int(used[-1]) + 1 if used.size else 1
    return batch[:, :steps]


def state_nbytes(model) -> int:
    """Bytes of a compiled model's weights plus its optimizer state (building the optimizer if
    needed): what one worker returns per round, before Arrow's few hundred bytes of headers."""
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return variables_nbytes(list(model.weights) + list(model.optimizer.variables))


def initial_optimizer(model) -> list[np.ndarray]:
    """The fresh optimizer state of a compiled ``model`` (its optimizer built here when needed): a
    ``LossScaleOptimizer``'s inner optimizer's, as replicas send it."""
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return [np.asarray(v.numpy()) for v in optimizer.variables]


def trainable_mask(model) -> list[bool]:
    """Per array of ``model.weights``, whether it is trainable (the others: BatchNorm statistics, counters)."""
    trainable = {id(v) for v in model.trainable_weights}
    return [id(v) in trainable for v in model.weights]


def check_mixed_precision(value) -> None:
    """Raises ConfigError unless ``value`` is one of the ``mixedPrecision`` Param's declared choices
    (None or one of :data:`~sparkdl.param_specs.MIXED_PRECISION`)."""
    BY_NAME["mixedPrecision"].check(value)


def check_state_dtypes(expected, arrays, what: str) -> None:
    """Fail loudly when ``arrays`` (weights) do not have the ``expected`` dtypes, in order.

    Args:
        expected: one numpy dtype (or array, whose dtype is taken) per weight, e.g. the master's float32.
        arrays: the weights received, numpy arrays in the same order.
        what: names the arrays in the message.

    Raises:
        InvariantError: a count or a dtype differs, naming the first few weights that differ.
    """
    want = [np.dtype(getattr(e, "dtype", e)) for e in expected]
    got = [np.asarray(a).dtype for a in arrays]
    if len(want) != len(got):
        raise InvariantError(f"{what} must be {len(want)} arrays, one per weight of the master. Received: {len(got)}")
    wrong = [(i, str(w), str(g)) for i, (w, g) in enumerate(zip(want, got, strict=True)) if w != g]
    if wrong:
        raise InvariantError(
            f"{what} must keep the master weights' dtypes (float32 under mixed precision: weights are averaged and sent "
            f"in float32). Received (index, expected, got): {wrong[:5]}{' ...' if len(wrong) > 5 else ''}"
        )


@contextlib.contextmanager
def global_dtype_policy(name: str | None):
    """Keras' global dtype policy set to ``name`` inside the block and restored after it (nothing for None):
    layers and models created inside without a dtype of their own take it."""
    if name is None:
        yield
        return
    keras = keras_module()
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def _is_float32_policy(dtype) -> bool:
    """A layer's serialized float32 ``DTypePolicy``. A plain string is not one: it is an input's dtype or, in
    the ``Cast`` layers Keras inserts between dtypes, the cast's target dtype."""
    return isinstance(dtype, dict) and dtype.get("class_name") == "DTypePolicy" and (dtype.get("config") or {}).get("name") == "float32"


def _output_layer_names(config: dict) -> set:
    layers = [layer for layer in config.get("layers", []) if layer.get("class_name") != "InputLayer"]
    if "output_layers" in config:  # Functional: [[name, node, tensor], ...] or one [name, node, tensor]
        outputs = config["output_layers"]
        outputs = [outputs] if outputs and isinstance(outputs[0], str) else outputs
        return {entry[0] for entry in outputs}
    return {layers[-1]["config"].get("name", layers[-1].get("name"))} if layers else set()  # Sequential: the last layer


def mixed_architecture(architecture: str, policy: str) -> str:
    """A model's architecture JSON with its float32 layers under the dtype policy ``policy``.

    Every layer whose dtype policy is float32 (nested models' layers and wrapped layers too) gets ``policy``,
    except input layers (their dtype is the input's) and the model's output layers, which stay float32
    as the Keras mixed precision guide advises (a softmax or a loss computed in 16 bits loses
    precision); layers with another dtype (float64, int, quantized) keep it. A layer under a mixed
    policy keeps float32 variables: the weights are the same arrays in the same order.

    Args:
        architecture: ``model.to_json()`` of a Sequential or Functional model.
        policy: ``"mixed_float16"`` or ``"mixed_bfloat16"``.

    Returns:
        The rewritten JSON, for ``keras.models.model_from_json``.
    """
    config = json.loads(architecture)

    def policy_like(dtype):
        return {**dtype, "config": {**(dtype.get("config") or {}), "name": policy}}

    def walk(layer: dict, keep: bool) -> None:
        if not isinstance(layer, dict) or layer.get("class_name") == "InputLayer":
            return
        inner = layer.get("config") or {}
        if not keep and _is_float32_policy(inner.get("dtype")):
            inner["dtype"] = policy_like(inner["dtype"])
        for child in inner.get("layers") or []:
            walk(child, False)
        if isinstance(inner.get("layer"), dict):  # wrappers: TimeDistributed, Bidirectional
            walk(inner["layer"], keep)

    top = config.get("config") or {}
    outputs = _output_layer_names(top)
    if _is_float32_policy(top.get("dtype")):
        top["dtype"] = policy_like(top["dtype"])
    for layer in top.get("layers") or []:
        walk(layer, (layer.get("config") or {}).get("name", layer.get("name")) in outputs)
    return json.dumps(config)


def build_mixed(spec: ModelSpec, policy: str):
    """``spec.build()`` with :func:`mixed_architecture`'s dtype policies: a new, uncompiled ``keras.Model``
    with ``spec``'s weights (float32 variables). Call it inside :func:`global_dtype_policy` so the model
    itself has the policy (``compile`` then adds loss scaling for ``"mixed_float16"``)."""
    keras = keras_module()
    model = keras.models.model_from_json(mixed_architecture(spec.architecture, policy))
    if spec.weights:
        for variable, array in zip(model.weights, spec.weight_arrays(), strict=True):
            variable.assign(array)
    return model
