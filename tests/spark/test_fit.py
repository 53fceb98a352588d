"""KerasEstimator.fit on real Spark (local[2]) against plain Keras and closed forms."""

import numpy as np
import pytest
from pyspark.sql import types as T

from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError, SchemaError
from tests.conftest import partitioned_df

import keras  # noqa: E402  (conftest selected the backend)

XY = T.StructType([T.StructField("x", T.ArrayType(T.FloatType())), T.StructField("y", T.DoubleType())])


def _mlp(seed=3, inputs=4, outputs=3):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(outputs, activation="softmax")])


def _linear():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    model.set_weights([np.zeros((1, 1), np.float32)])
    return model


def _toy(n=48, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1).astype(np.int64)
    return x, y


def _rows(x, y):
    return [([float(v) for v in xi], float(yi)) for xi, yi in zip(x, y)]


def _plain_keras(model_fn, x, y, optimizer, epochs, batch_size, loss="sparse_categorical_crossentropy", history=None):
    model = model_fn()
    model.compile(optimizer=optimizer, loss=loss)
    fitted = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    if history is not None:
        history.update(fitted.history)
    return model.get_weights()


@pytest.mark.backends  # also run under KERAS_BACKEND=jax and torch (make test, make test-all)
@pytest.mark.parametrize("local_steps", [None, pytest.param(2, marks=pytest.mark.slow)])
def test_one_worker_equals_plain_keras_fit(spark, local_steps):
    x, y = _toy()
    df = partitioned_df(spark, [_rows(x, y)], XY)
    est = KerasEstimator(
        model=_mlp(), optimizer="adam", loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y",
        numWorkers=1, epochs=3, batchSize=10, localSteps=local_steps, shuffle=False, keepPartitioning=True, verbose=0,
    )
    fitted = est.fit(df)
    history = {}
    expected = _plain_keras(_mlp, x, y, "adam", epochs=3, batch_size=10, history=history)
    for got, want in zip(fitted.getKerasModel().get_weights(), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(fitted.history["loss"], history["loss"], rtol=1e-5)  # per-epoch means, as Keras reports
    assert fitted.fitInfo["rounds"] == 3 * (1 if local_steps is None else 3)  # 5 steps per epoch, τ=2 -> 3 rounds
    assert len(fitted.history["loss"]) == 3


@pytest.mark.slow  # the default run's 25-minute budget: test_c10_averaging_does_not_sum_deltas and tests/spark/test_sharded.py's equality run its kind
@pytest.mark.backends  # also run under KERAS_BACKEND=jax and torch (make test, make test-all)
def test_two_workers_on_identical_partitions_equal_one_replica(spark):
    x, y = _toy(seed=1)
    df = partitioned_df(spark, [_rows(x, y), _rows(x, y)], XY)
    est = KerasEstimator(
        model=_mlp(), optimizer="adam", loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y",
        numWorkers=2, epochs=2, batchSize=16, shuffle=False, keepPartitioning=True, verbose=0,
    )
    fitted = est.fit(df)
    expected = _plain_keras(_mlp, x, y, "adam", epochs=2, batch_size=16)
    for got, want in zip(fitted.getKerasModel().get_weights(), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert fitted.fitInfo["partition_rows"] == [48, 48]


def test_c10_averaging_does_not_sum_deltas(spark):
    """C10: y = 2x, x in {1,2,3,4}, 4 identical partitions, SGD lr 0.1, one round of one epoch."""
    rows = [([float(v)], 2.0 * v) for v in (1, 2, 3, 4)]
    df = partitioned_df(spark, [rows] * 4, XY)
    est = KerasEstimator(
        model=_linear(), optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse", featuresCol="x", labelCol="y",
        numWorkers=4, epochs=1, batchSize=4, shuffle=False, keepPartitioning=True, verbose=0,
    )
    w = float(est.fit(df).getKerasModel().get_weights()[0][0, 0])
    # One full-batch step from w=0: grad = mean(2 (0·x - 2x) x) = -4·mean(x²) = -30, so w = 0.1·30 = 3.0
    assert w == pytest.approx(3.0, abs=1e-6)
    single = _plain_keras(_linear, np.array([[1.0], [2.0], [3.0], [4.0]], np.float32), np.array([2.0, 4.0, 6.0, 8.0]),
                          keras.optimizers.SGD(learning_rate=0.1), epochs=1, batch_size=4, loss="mse")
    assert w == pytest.approx(float(single[0][0, 0]), abs=1e-6)


def test_c10_unequal_partitions_are_weighted_by_rows(spark):
    # Partition A (4 rows) alone reaches w = 3.0; partition B (x = 1, one row) reaches 0.1·4 = 0.4.
    a = [([float(v)], 2.0 * v) for v in (1, 2, 3, 4)]
    b = [([1.0], 2.0)]
    df = partitioned_df(spark, [a, b], XY)
    est = KerasEstimator(
        model=_linear(), optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse", featuresCol="x", labelCol="y",
        numWorkers=2, epochs=1, batchSize=4, shuffle=False, keepPartitioning=True, verbose=0,
    )
    w = float(est.fit(df).getKerasModel().get_weights()[0][0, 0])
    assert w == pytest.approx((4 * 3.0 + 1 * 0.4) / 5, abs=1e-6)  # 2.48, not (3.0 + 0.4) / 2


def _bn_model():
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(4), keras.layers.BatchNormalization(), keras.layers.Dense(1)])


@pytest.mark.backends  # also run under KERAS_BACKEND=jax and torch (make test, make test-all)
def test_c12_batchnorm_moving_statistics_are_row_weighted_averages(spark):
    rng = np.random.default_rng(0)
    xa = rng.normal(0.0, 1.0, size=(32, 2)).astype(np.float32)
    xb = rng.normal(10.0, 1.0, size=(32, 2)).astype(np.float32)
    ya, yb = xa.sum(axis=1), xb.sum(axis=1)
    df = partitioned_df(spark, [_rows(xa, ya), _rows(xb, yb)], XY)
    # lr = 0 keeps Dense weights fixed, so each replica's moving statistics have a closed reference:
    # plain Keras on that partition alone. The master must hold their row-weighted mean.
    est = KerasEstimator(
        model=_bn_model(), optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse", featuresCol="x", labelCol="y",
        numWorkers=2, epochs=1, batchSize=8, shuffle=False, keepPartitioning=True, verbose=0,
    )
    fitted = est.fit(df).getKerasModel()
    bn = fitted.layers[1]
    refs = []
    for x, y in ((xa, ya), (xb, yb)):
        ref = _bn_model()
        ref.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse")
        ref.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        refs.append(ref.layers[1])
    for attr in ("moving_mean", "moving_variance"):
        got = np.asarray(getattr(bn, attr).numpy())
        a, b = (np.asarray(getattr(r, attr).numpy()) for r in refs)
        np.testing.assert_allclose(got, (a + b) / 2, rtol=1e-5, atol=1e-6)
        assert np.all(np.isfinite(got))
        assert np.all(got >= np.minimum(a, b) - 1e-6) and np.all(got <= np.maximum(a, b) + 1e-6)
    assert not np.allclose(refs[0].moving_mean.numpy(), refs[1].moving_mean.numpy())  # the partitions did differ
    out = keras.ops.convert_to_numpy(fitted(np.concatenate([xa, xb]), training=False))
    assert np.all(np.isfinite(out))


def test_c14_optimizer_as_string_object_or_config_gives_same_result(spark):
    x, y = _toy(seed=2)
    df = partitioned_df(spark, [_rows(x[:24], y[:24]), _rows(x[24:], y[24:])], XY)
    results = []
    for optimizer in ("adam", keras.optimizers.Adam(learning_rate=1e-3), {"class_name": "Adam", "config": {"learning_rate": 1e-3}}):
        est = KerasEstimator(model=_mlp(), optimizer=optimizer, loss="sparse_categorical_crossentropy", featuresCol="x",
                             labelCol="y", numWorkers=2, epochs=2, batchSize=8, verbose=0)
        results.append(est.fit(df).getKerasModel().get_weights())
    for other in results[1:]:
        for got, want in zip(other, results[0], strict=True):
            np.testing.assert_allclose(got, want, atol=1e-6)


def test_c14_custom_learning_rate_survives_to_the_executors(spark):
    x, y = _toy(seed=3)
    df = partitioned_df(spark, [_rows(x, y)], XY)
    est = KerasEstimator(model=_mlp(), optimizer={"class_name": "SGD", "config": {"learning_rate": 0.05}},
                         loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y",
                         numWorkers=1, epochs=2, batchSize=8, shuffle=False, keepPartitioning=True, verbose=0)
    fitted = est.fit(df)
    expected = _plain_keras(_mlp, x, y, keras.optimizers.SGD(learning_rate=0.05), epochs=2, batch_size=8)
    for got, want in zip(fitted.getKerasModel().get_weights(), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    optimizer = fitted.getKerasModel().optimizer
    assert type(optimizer).__name__ == "SGD"
    assert float(optimizer.learning_rate) == pytest.approx(0.05)


def test_compiled_model_supplies_compile_arguments_and_history_has_metrics(spark):
    x, y = _toy(seed=4)
    model = _mlp()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    df = partitioned_df(spark, [_rows(x[:24], y[:24]), _rows(x[24:], y[24:])], XY)
    fitted = KerasEstimator(model=model, featuresCol="x", labelCol="y", numWorkers=2, epochs=3, batchSize=8, verbose=0).fit(df)
    assert sorted(fitted.history) == ["accuracy", "loss"]
    assert len(fitted.history["loss"]) == 3
    assert fitted.history["loss"][-1] < fitted.history["loss"][0]
    assert 0.0 <= fitted.history["accuracy"][-1] <= 1.0
    assert fitted.getOptimizer()["config"]["learning_rate"] == pytest.approx(0.01)


def test_empty_partitions_carry_no_weight(spark):
    """C05 kind: 3 rows on 4 workers leave empty partitions; the result equals the same rows without them."""
    rows = [([float(v)], 2.0 * v) for v in (1, 2, 3)]
    with_empty = partitioned_df(spark, [rows, [], [], []], XY)
    est = KerasEstimator(model=_linear(), optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse", featuresCol="x",
                         labelCol="y", numWorkers=4, epochs=2, batchSize=3, shuffle=False, verbose=0)
    w = float(est.fit(with_empty).getKerasModel().get_weights()[0][0, 0])
    alone = _plain_keras(_linear, np.array([[1.0], [2.0], [3.0]], np.float32), np.array([2.0, 4.0, 6.0]),
                         keras.optimizers.SGD(learning_rate=0.1), epochs=2, batch_size=3, loss="mse")
    assert w == pytest.approx(float(alone[0][0, 0]), abs=1e-6)


class TestValidationBeforeTraining:
    def _no_jobs(self, spark, fn, exc, match):
        sc = spark.sparkContext
        group = f"validation-{match[:10]}"
        sc.setJobGroup(group, "validation test")
        try:
            with pytest.raises(exc, match=match):
                fn()
            assert list(sc.statusTracker().getJobIdsForGroup(group)) == []
        finally:
            sc.setJobGroup("", "")

    def _est(self, **kw):
        params = dict(model=_mlp(), loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y", numWorkers=2, verbose=0)
        params.update(kw)
        return KerasEstimator(**params)

    def test_missing_feature_column(self, spark):
        df = spark.createDataFrame([([1.0, 2.0, 3.0, 4.0], 0.0)], XY)
        self._no_jobs(spark, lambda: self._est(featuresCol="pixels").fit(df), SchemaError,
                      r"features column 'pixels' must exist in the DataFrame. Received columns: \['x', 'y'\]")

    def test_string_label_says_index_it_first(self, spark):
        df = spark.createDataFrame([([1.0, 2.0, 3.0, 4.0], "cat")], "x array<float>, y string")
        self._no_jobs(spark, lambda: self._est().fit(df), SchemaError, "StringIndexer")

    def test_non_numeric_features(self, spark):
        df = spark.createDataFrame([("a", 0.0)], "x string, y double")
        self._no_jobs(spark, lambda: self._est().fit(df), SchemaError, "must be numeric, array<numeric> or a Spark ML vector. Received: string")

    def test_missing_model_and_loss(self, spark):
        df = spark.createDataFrame([([1.0, 2.0, 3.0, 4.0], 0.0)], XY)
        self._no_jobs(spark, lambda: KerasEstimator(loss="mse", featuresCol="x", labelCol="y").fit(df), ConfigError, "needs a model")
        self._no_jobs(spark, lambda: KerasEstimator(model=_mlp(), featuresCol="x", labelCol="y").fit(df), ConfigError, "needs a loss")
        self._no_jobs(spark, lambda: self._est(numWorkers=0).fit(df), ConfigError, "numWorkers must be a positive integer")

    def test_feature_length_must_match_model_input(self, spark):
        df = spark.createDataFrame([([1.0, 2.0, 3.0], 0.0)] * 4, XY)
        with pytest.raises(SchemaError, match=r"features column 'x' must hold 4 values per row .*: when no row does, the column or "
                                              r"the model input is not the one meant; when the data is right, change the model's input to 3 "
                                              r"values per row, e.g\. keras\.Input\(shape=\(3,\)\)\. Received: all 4 rows hold 3 values$"):
            self._est().fit(df)

    def test_empty_dataframe(self, spark):
        df = spark.createDataFrame([], XY)
        with pytest.raises(SchemaError, match="at least one row"):
            self._est().fit(df)

    def test_null_features(self, spark):
        df = spark.createDataFrame([([1.0, 2.0, 3.0, 4.0], 0.0), (None, 1.0)], XY)
        with pytest.raises(SchemaError, match="column 'x' must have no null values. Received: 1 null rows of 2"):
            self._est().fit(df)


def test_dotted_column_names_and_any_spark_seed_train(spark):
    x, y = _toy(seed=5)
    df = spark.createDataFrame(_rows(x, y), "`in.x` array<float>, `the label` double")
    for seed in (-7, 2**40):
        fitted = KerasEstimator(model=_mlp(), loss="sparse_categorical_crossentropy", featuresCol="in.x", labelCol="the label",
                                numWorkers=2, epochs=1, batchSize=16, seed=seed, verbose=0).fit(df)
        assert len(fitted.history["loss"]) == 1 and np.isfinite(fitted.history["loss"][0])


class TestLabelsMustFitTheModelOutput:
    def _fit(self, spark, model, loss, label_type, label):
        df = spark.createDataFrame([([1.0, 2.0, 3.0, 4.0], label)] * 4, f"x array<float>, y {label_type}")
        est = KerasEstimator(model=model, loss=loss, featuresCol="x", labelCol="y", numWorkers=2, verbose=0)
        with pytest.raises(SchemaError) as info:
            est.fit(df)
        return str(info.value)

    def test_one_hot_labels_for_a_single_sigmoid(self, spark):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
        msg = self._fit(spark, model, "binary_crossentropy", "array<double>", [1.0, 0.0])
        assert "must hold 1 value(s) per row to match the model output shape (1,)" in msg and "Received: 2" in msg

    def test_one_hot_labels_for_sparse_crossentropy(self, spark):
        msg = self._fit(spark, _mlp(), "sparse_categorical_crossentropy", "array<double>", [1.0, 0.0, 0.0])
        assert "one class index per row" in msg and "categorical_crossentropy" in msg

    def test_scalar_label_for_three_outputs(self, spark):
        msg = self._fit(spark, _mlp(), "categorical_crossentropy", "double", 1.0)
        assert "must hold 3 value(s)" in msg and "use sparse_categorical_crossentropy" in msg

    def test_null_inside_a_feature_array(self, spark):
        df = spark.createDataFrame([([1.0, None, 3.0, 4.0], 0.0), ([1.0, 2.0, 3.0, 4.0], 1.0)], XY)
        est = KerasEstimator(model=_mlp(), loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y", numWorkers=2, verbose=0)
        with pytest.raises(SchemaError, match="column 'x' must have no null elements. Received: 1 null elements in 2 rows"):
            est.fit(df)


def test_classifier_with_a_two_dimensional_output_is_rejected(spark):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Reshape((3, 2)), keras.layers.Softmax()])
    df = spark.createDataFrame([([1.0, 2.0, 3.0, 4.0], [1.0] * 6)], XY.fieldNames()[0] + " array<float>, y array<float>")
    est = KerasEstimator(model=model, loss="categorical_crossentropy", featuresCol="x", labelCol="y", verbose=0)
    with pytest.raises(ConfigError, match=r"a classifier must output shape \(classes,\) per row. Received: \(3, 2\)"):
        est.fit(df)
