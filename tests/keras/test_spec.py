"""The keras layer without Spark: compile specs, model specs and replicas against plain Keras."""

import gc
import weakref

import numpy as np
import pytest

from sparkdl.core.state import ModelState
from sparkdl.errors import ConfigError
from sparkdl.keras.replica import Replica
from sparkdl.keras.memory import COLLECT_BYTES, release_cycles, weights_nbytes
from sparkdl.keras.spec import CompileSpec, ModelSpec, infer_task

import keras  # noqa: E402


def _model():
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.BatchNormalization(),
                             keras.layers.Dense(2, activation="softmax")])


def test_compile_spec_accepts_name_object_and_config_alike():
    by_name = CompileSpec.create("sgd", "sparse_categorical_crossentropy", ["accuracy"])
    by_object = CompileSpec.create(keras.optimizers.SGD(learning_rate=0.05), keras.losses.SparseCategoricalCrossentropy(), None)
    by_config = CompileSpec.create({"class_name": "SGD", "config": {"learning_rate": 0.05}}, "mse", "mae")
    assert by_name.optimizer == "sgd" and by_name.metrics == ("accuracy",)
    assert by_object.optimizer["class_name"] == "SGD"
    assert by_object.optimizer["config"]["learning_rate"] == pytest.approx(0.05)
    assert by_config.metrics == ("mae",)
    model = by_config.compile(_model())
    assert type(model.optimizer).__name__ == "SGD"
    assert float(model.optimizer.learning_rate) == pytest.approx(0.05)
    assert infer_task("auto", by_object) == "classification" and infer_task("auto", by_config) == "regression"


def test_compile_spec_errors_name_what_was_received():
    with pytest.raises(ConfigError, match="Received: optimizer='not-an-optimizer'$"):
        CompileSpec.create("not-an-optimizer", "mse", None)
    with pytest.raises(ConfigError, match="loss must be given"):
        CompileSpec.create("adam", None, None)
    with pytest.raises(ConfigError, match="optimizer must be a name"):
        CompileSpec.create(42, "mse", None)


def test_model_spec_round_trips_architecture_weights_and_keras_file():
    model = _model()
    spec = ModelSpec.from_model(model)
    assert spec.input_shape == (3,) and spec.output_shape == (2,) and spec.input_dtype == "float32"
    for a, b in zip(spec.build().get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    again = ModelSpec.from_keras_bytes(spec.to_keras_bytes())
    assert (again.input_shape, again.output_shape) == (spec.input_shape, spec.output_shape)
    for a, b in zip(again.weight_arrays(), spec.weight_arrays(), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_model_spec_keeps_every_input_and_output_by_name():
    a, b = keras.Input((2,), name="a", dtype="int32"), keras.Input((3,), name="b")
    joined = keras.layers.Concatenate()([keras.layers.Flatten()(keras.layers.Embedding(4, 1)(a)), b])
    model = keras.Model([a, b], [keras.layers.Dense(1, name="y1")(joined), keras.layers.Dense(2, name="y2")(joined)])
    spec = ModelSpec.from_model(model)
    assert spec.input_specs == (("a", (2,), "int32"), ("b", (3,), "float32"))
    assert spec.output_specs == (("y1", (1,)), ("y2", (2,)))
    assert ModelSpec.from_keras_bytes(spec.to_keras_bytes()).input_specs == spec.input_specs


def test_replica_rounds_equal_plain_keras_fit():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)).astype(np.float32), rng.integers(0, 2, 40)
    spec, compile_spec = ModelSpec.from_model(_model()), CompileSpec.create("adam", "sparse_categorical_crossentropy", None)
    replica = Replica(spec, compile_spec, seed=0)
    state = ModelState(spec.weight_arrays(), None)
    for rows in (slice(0, 16), slice(16, 40), slice(0, 16), slice(16, 40)):  # two epochs cut into two rounds each
        replica.set_state(state)
        replica.train(x[rows], y[rows], batch_size=8)
        state = replica.get_state()
    plain = _model()
    plain.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    plain.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(state.weights, plain.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert int(state.optimizer[0]) == 10  # Adam's iteration counter: 2 epochs × 5 steps


@pytest.mark.parametrize(
    "loss, task",
    [("bce", "classification"), ("kld", "classification"), (keras.losses.KLDivergence(), "classification"),
     (keras.losses.BinaryCrossentropy(from_logits=True), "classification"), ("mse", "regression"), ("mae", "regression")],
)
def test_task_is_inferred_from_loss_aliases_and_objects(loss, task):
    assert infer_task("auto", CompileSpec.create("adam", loss, None)) == task


def test_undefined_axes_other_than_sequence_steps_and_subclassed_models_are_config_errors():
    sequence = keras.Sequential([keras.Input((None, 2)), keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    assert ModelSpec.from_model(sequence).input_specs[0][1] == (None, 2)  # a sequence input: padded per fit
    image = keras.Sequential([keras.Input((None, None, 1)), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1)])
    with pytest.raises(ConfigError, match=r"fully defined .*Received: \(None, None, 1\)"):
        ModelSpec.from_model(image)

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

    model = Sub()
    model(np.zeros((1, 3), np.float32))
    with pytest.raises(ConfigError, match="subclassed models are not supported yet"):
        ModelSpec.from_model(model)


def test_unregistered_custom_objects_fail_on_the_driver():
    """C13 kind: a custom activation or loss the executors could not rebuild fails before any job, naming it."""

    def swishy(x):
        return x * keras.activations.sigmoid(x)

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation=swishy)])
    with pytest.raises(ConfigError, match="register_keras_serializable.*swishy"):
        ModelSpec.from_model(model)

    def myloss(y_true, y_pred):
        return keras.ops.mean(keras.ops.abs(y_true - y_pred)) * 2

    with pytest.raises(ConfigError, match="loss must be rebuildable.*myloss"):
        CompileSpec.create("adam", myloss, None)


def test_registered_custom_objects_are_accepted():
    @keras.saving.register_keras_serializable(package="sparkdl_tests")
    def swish2(x):
        return x * keras.activations.sigmoid(x)

    spec = ModelSpec.from_model(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation=swish2)]))
    assert "swish2" in spec.architecture
    assert CompileSpec.create("adam", swish2, None).loss["config"] == "sparkdl_tests>swish2"


def test_a_dict_of_inputs_is_refused_naming_the_fix():
    a, b = keras.Input((2,), name="a"), keras.Input((3,), name="b")
    model = keras.Model({"zeta": a, "alpha": b}, keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))
    with pytest.raises(ConfigError, match=r"a dict of inputs is not supported yet.*Received: inputs \['alpha', 'zeta'\]"):
        ModelSpec.from_model(model)


def test_a_dropped_model_is_collected_at_once_only_when_its_weights_are_large():
    model = _model()
    assert weights_nbytes(model) == (3 * 4 + 4 + 4 * 4 + 4 * 2 + 2) * 4  # Dense, BatchNormalization (4 of 4), Dense: float32
    gc.disable()  # the collector's own pace, held still
    try:
        dropped = weakref.ref(model)
        del model
        assert dropped() is not None  # a cycle of layers and model: only a collection frees it
        assert release_cycles(COLLECT_BYTES) is True and dropped() is None  # a large one: at once
        kept = _model()
        dropped = weakref.ref(kept)
        del kept
        assert release_cycles(COLLECT_BYTES - 1) is False and dropped() is not None  # a small one waits
        assert release_cycles(1) is True and dropped() is None  # until the dropped ones add up
    finally:
        gc.enable()


def test_the_largest_per_row_tensor_sizes_a_predict_call():
    from sparkdl.keras.predict import ACTIVATION_BATCH_BYTES, inference_rows, largest_row_bytes
    from sparkdl.keras.zoo import mnist_cnn, mnist_mlp

    cnn = mnist_cnn()
    assert largest_row_bytes(cnn) == 26 * 26 * 32 * 4  # the first convolution's float32 output
    assert inference_rows(cnn, 32) == ACTIVATION_BATCH_BYTES // (26 * 26 * 32 * 4) == 193
    assert inference_rows(cnn, 256) == 256  # never below batchSize
    assert inference_rows(mnist_mlp(), 32) == 2048  # 784 pixels the largest: capped
    assert inference_rows(cnn, 32, gpu=True) == 2048  # a GPU: up to 1 GiB of it, capped
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1000), keras.layers.Dense(2)])
    x = keras.Input((4,))
    assert largest_row_bytes(keras.Model(x, inner(x))) == 1000 * 4  # a nested model's layers count
    shared = keras.layers.Dense(100)
    a, b = keras.Input((50,)), keras.Input((500, 50))
    assert largest_row_bytes(keras.Model([a, b], [shared(a), shared(b)])) == 500 * 100 * 4  # every call of a shared layer
