"""Replica.reset: a replica reused by a later fit gets back every non-weight variable's build-time value
(a LossScaleOptimizer's dynamic loss scale and step counter, the optimizers' iterations, a custom
layer's seed state), so it trains exactly as a newly built replica."""

import numpy as np

from sparkdl.core.state import ModelState
from sparkdl.keras.replica import Replica
from sparkdl.keras.spec import CompileSpec, ModelSpec

import keras  # noqa: E402


@keras.saving.register_keras_serializable(package="sparkdl_tests")
class Jitter(keras.layers.Layer):
    """Adds N(0, 0.01) noise in training from a SeedGenerator: its state is a non-trainable variable
    that is not a weight, and it moves on every training step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.generator = keras.random.SeedGenerator(5)

    def call(self, x, training=None):
        if training:
            return x + 0.01 * keras.random.normal(keras.ops.shape(x), seed=self.generator, dtype=x.dtype)
        return x


def _replica():
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((3,)), Jitter(), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    spec = ModelSpec.from_model(model)
    return spec, Replica(spec, CompileSpec.create(keras.optimizers.SGD(0.05), "mse", []), seed=1, mixed_precision="mixed_float16")


def _non_weights(replica):
    weights = {id(v) for v in replica.model.weights}
    variables = {id(v): v for v in [*replica.model.variables, *replica.model.optimizer.variables] if id(v) not in weights}
    return {v.path: np.array(v.numpy()) for v in variables.values()}


def test_reset_restores_the_loss_scale_counters_and_seed_state_a_fit_changed():
    spec, replica = _replica()
    optimizer = replica.model.optimizer
    assert type(optimizer).__name__ == "LossScaleOptimizer"
    built = _non_weights(replica)
    assert any(path.endswith("seed_generator_state") for path in built)
    assert built["loss_scale_optimizer/dynamic_scale"] == 32768.0

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 3)).astype(np.float32), rng.normal(size=(16,)).astype(np.float32)
    replica.set_state(ModelState(spec.weight_arrays(), None))
    replica.train(x, y, 8)
    x[0, 0] = 1e30  # inf in float16: a non-finite gradient halves the loss scale and skips the step
    replica.train(x, y, 8)
    changed = _non_weights(replica)
    assert changed["loss_scale_optimizer/dynamic_scale"] == 16384.0
    assert changed["loss_scale_optimizer/step_counter"] == 1  # good steps since the scale last changed
    inner = replica.optimizer.iterations.path  # "sgd/iteration", or "sgd_3/iteration" after other SGDs in this process
    assert changed[inner] == 3  # 4 steps, one skipped
    differ = sorted(path for path in built if not np.array_equal(built[path], changed[path]))
    assert any(path.endswith("seed_generator_state") for path in differ)

    replica.reset()
    after = _non_weights(replica)
    assert sorted(after) == sorted(built)
    for path, value in built.items():
        np.testing.assert_array_equal(after[path], value, err_msg=path)
    assert float(optimizer.dynamic_scale.numpy()) == 32768.0


def test_a_reset_replica_trains_as_a_new_one():
    spec, reused = _replica()
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(16, 3)).astype(np.float32), rng.normal(size=(16,)).astype(np.float32)
    bad = x.copy()
    bad[0, 0] = 1e30
    reused.set_state(ModelState(spec.weight_arrays(), None))
    reused.train(bad, y, 8)  # an earlier fit: its loss scale halved
    start = ModelState(spec.weight_arrays(), None)
    results = []
    for replica in (reused, _replica()[1]):
        if replica is reused:
            replica.reset()
        replica.set_state(start)
        replica.seed_round(7, 0, 0, 0)
        metrics = replica.train(bad, y, 8)  # the same first batch: skipped again only from the same scale
        results.append((replica.get_state(), metrics, float(replica.model.optimizer.dynamic_scale.numpy())))
    (state, metrics, scale), (fresh_state, fresh_metrics, fresh_scale) = results
    assert scale == fresh_scale == 16384.0
    for got, want in zip(state.weights + state.optimizer, fresh_state.weights + fresh_state.optimizer, strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(metrics, fresh_metrics, strict=True):
        np.testing.assert_array_equal(got, want)
