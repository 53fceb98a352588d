"""Issue 8, the data layer: sample and class weights (C16), validation data, columns and splits (C09,
C36), multi-input and multi-output models (C15), label encodings (C03, C32), on real Spark against
plain Keras and closed forms; every error raised before any training job."""

import itertools
import warnings

import numpy as np
import pytest
from pyspark.sql import functions as F

import keras
from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError, SchemaError
from tests.conftest import partitioned_df

XYW = "x array<float>, y double, w double"


# ---- helpers -----------------------------------------------------------------------------------


def _job_descriptions(sc, group):
    """The descriptions of the jobs run under ``group`` (``run_job`` names each of a fit's jobs:
    "sparkdl: check and count training rows", "sparkdl fit ab12cd34: round 1/2 (epoch 1)", ...), read
    from Spark's status store once the listener bus has delivered every event. (Stage names do not
    tell: every action of a fit runs in a helper thread, so its stages are all named
    ``copy_local_properties at threading.py``.)"""
    jsc = sc._jsc.sc()
    jsc.listenerBus().waitUntilEmpty()
    store = jsc.statusStore()
    out = []
    for job in sorted(sc.statusTracker().getJobIdsForGroup(group)):
        description = store.job(job).description()
        out.append(description.get() if description.isDefined() else "")
    return out


def _is_training_job(description):
    return ": round " in description or "validation after epoch" in description


def _fails_early(spark, fit, error, group, no_job=False):
    """Run ``fit`` under a job group; it must raise ``error`` with no training (or validation) job ran;
    with ``no_job``, no Spark job at all (a schema or configuration check). Returns the message."""
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        with pytest.raises(error) as info:
            fit()
        descriptions = _job_descriptions(sc, group)
    finally:
        sc.setJobGroup("", "")
    assert not any(_is_training_job(d) for d in descriptions), descriptions
    if no_job:
        assert descriptions == [], descriptions
    return str(info.value)


def _allclose(got, want, atol):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=atol, rtol=0)


def _dense(inputs, units=1, seed=0, activation=None, hidden=0):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((inputs,))]
    if hidden:
        layers.append(keras.layers.Dense(hidden, activation="tanh"))
    layers.append(keras.layers.Dense(units, activation=activation))
    return keras.Sequential(layers)


def _rows(x, *columns):
    return [([float(v) for v in xi], *[float(c[i]) for c in columns]) for i, xi in enumerate(x)]


def _val_keys(history):
    return sorted(k for k in history if k.startswith("val_"))


def test_the_job_check_sees_training_jobs(spark):
    """The positive control of ``_fails_early``: a fit that trains and validates shows its check,
    round and validation jobs under the caller's job group."""
    sc = spark.sparkContext
    df = spark.createDataFrame([([0.0], 0.0)] * 4, "x array<float>, y double")
    sc.setJobGroup("labels-control", "control")
    try:
        KerasEstimator(model=_dense(1), optimizer="sgd", loss="mse", featuresCol="x", labelCol="y", verbose=0,
                       backend="rounds").fit(df, validationData=df)
        descriptions = _job_descriptions(sc, "labels-control")
    finally:
        sc.setJobGroup("", "")
    assert "sparkdl: check and count training and validation rows" in descriptions, descriptions
    assert any(": round 1/1" in d for d in descriptions), descriptions
    assert any("validation after epoch 1" in d for d in descriptions), descriptions


# ---- C16: sample weights and class weights --------------------------------------------------------


def _imbalanced(spark):
    """90 rows of class 0 and 10 of class 1 at x = 0, w = 1 / 9, in batches of 10 that each hold 9:1."""
    rows = [([0.0], 1.0 if i % 10 == 9 else 0.0, 9.0 if i % 10 == 9 else 1.0) for i in range(100)]
    return partitioned_df(spark, [rows], XYW)


def _bias_only():
    """p(class 1) = sigmoid(bias): the kernel multiplies x = 0, so it gets no gradient; bias starts at 2 (p = 0.88)."""
    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(
        1, activation="sigmoid", kernel_initializer="zeros", bias_initializer=keras.initializers.Constant(2.0))])


def _p_class_one(fitted):
    kernel, bias = fitted.getKerasModel().get_weights()
    assert float(kernel[0, 0]) == 0.0
    return float(1 / (1 + np.exp(-bias[0])))


def test_c16_sample_weights_move_the_decision_to_the_weighted_balance(spark):
    """Full-batch gradient descent (each batch of 10 has the data's 9:1 mix), 30 steps of lr 2: the
    unweighted optimum is p = 0.1; with w = 9 for class 1, sum(w (p - y)) = 0 at p = 0.5."""
    df = _imbalanced(spark)

    def fit(weight_col):
        est = KerasEstimator(model=_bias_only(), optimizer=keras.optimizers.SGD(learning_rate=2.0), loss="binary_crossentropy",
                             featuresCol="x", labelCol="y", sampleWeightCol=weight_col, numWorkers=1, keepPartitioning=True,
                             shuffle=False, epochs=3, batchSize=10, verbose=0)
        return est.fit(df)

    weighted, plain = fit("w"), fit(None)
    assert abs(_p_class_one(weighted) - 0.5) < 0.05
    assert abs(_p_class_one(plain) - 0.1) < 0.05
    assert weighted.fitInfo["rows"] == plain.fitInfo["rows"] == 100


@pytest.mark.slow  # the default run's 25-minute budget: test_c16_sample_weights_move_the_decision_to_the_weighted_balance runs its kind
def test_c16_zero_weights_train_as_if_the_rows_were_removed(spark):
    """Keras divides a batch's weighted loss sum by the batch's rows (zero-weight rows included), so
    one full batch with 8 of 20 rows at weight 0 and SGD lr equals the 12 rows alone at lr * 12 / 20."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(20, 2)).astype(np.float32)
    y = x @ np.array([1.5, -0.5], np.float32) + 0.3
    w = np.where(np.arange(20) % 5 < 3, 1.0, 0.0)
    kept = w > 0

    def fit(rows, lr, weight_col):
        est = KerasEstimator(model=_dense(2, seed=5, hidden=3), optimizer=keras.optimizers.SGD(learning_rate=lr), loss="mse",
                             featuresCol="x", labelCol="y", sampleWeightCol=weight_col, numWorkers=1, keepPartitioning=True,
                             shuffle=False, epochs=3, batchSize=len(rows), verbose=0)
        return est.fit(partitioned_df(spark, [rows], XYW)).getKerasModel().get_weights()

    zero_weighted = fit(_rows(x, y, w), 0.1, "w")
    removed = fit(_rows(x[kept], y[kept], w[kept]), 0.1 * kept.sum() / len(w), None)
    _allclose(zero_weighted, removed, atol=1e-6)
    unweighted = fit(_rows(x, y, w), 0.1, None)  # the zero weights did change the result
    assert max(float(np.abs(a - b).max()) for a, b in zip(zero_weighted, unweighted, strict=True)) > 1e-3


def _class_data(n=40):
    rng = np.random.default_rng(8)
    x = rng.normal(size=(n, 2)).astype(np.float32)
    y = (x[:, 0] + 0.2 * x[:, 1] > 0.9).astype(np.float64)  # about 1 in 6 rows of class 1
    return x, y, np.where(y == 1, 9.0, 1.0)


@pytest.mark.slow  # the default run's 25-minute budget: test_c16_class_weight_trains_as_keras_class_weight runs its kind
def test_c16_class_weight_equals_the_equivalent_sample_weights(spark):
    """Two workers on two fixed partitions (``keepPartitioning``: the default round-robin split
    depends on every model column's bytes, so adding a weight column moves rows between workers)."""
    x, y, w = _class_data()
    assert 3 <= y.sum() <= 12
    rows = _rows(x, y, w)
    df = partitioned_df(spark, [rows[:22], rows[22:]], XYW)

    def fit(**weights):
        est = KerasEstimator(model=_dense(2, seed=6, activation="sigmoid"), optimizer="adam", loss="binary_crossentropy",
                             metrics=["accuracy"], featuresCol="x", labelCol="y", numWorkers=2, keepPartitioning=True,
                             epochs=3, batchSize=8, seed=11, verbose=0, **weights)
        return est.fit(df)

    by_class, by_row, unweighted = fit(classWeight={0: 1.0, 1: 9.0}), fit(sampleWeightCol="w"), fit()
    _allclose(by_class.getKerasModel().get_weights(), by_row.getKerasModel().get_weights(), atol=1e-6)
    np.testing.assert_allclose(by_class.history["loss"], by_row.history["loss"], rtol=1e-6)
    assert by_class.fitInfo["partition_rows"] == by_row.fitInfo["partition_rows"] == [22, 18]
    gap = max(float(np.abs(a - b).max()) for a, b in zip(by_class.getKerasModel().get_weights(),
                                                          unweighted.getKerasModel().get_weights(), strict=True))
    assert gap > 1e-3  # the weights did something


def test_c16_class_weight_trains_as_keras_class_weight(spark):
    """One worker, the input's order: equals ``keras.Model.fit(class_weight=...)``, history included."""
    x, y, _ = _class_data(n=24)
    df = partitioned_df(spark, [_rows(x, y, np.ones(len(y)))], XYW)
    est = KerasEstimator(model=_dense(2, seed=6, activation="sigmoid"), optimizer="adam", loss="binary_crossentropy",
                         metrics=["accuracy"], featuresCol="x", labelCol="y", classWeight={0: 0.5, 1: 4.0}, numWorkers=1,
                         keepPartitioning=True, shuffle=False, epochs=2, batchSize=5, verbose=0)
    fitted = est.fit(df)
    model = _dense(2, seed=6, activation="sigmoid")
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, class_weight={0: 0.5, 1: 4.0}, batch_size=5, epochs=2, shuffle=False, verbose=0).history
    _allclose(fitted.getKerasModel().get_weights(), model.get_weights(), atol=1e-5)
    assert sorted(fitted.history) == sorted(history)
    for key in history:
        np.testing.assert_allclose(fitted.history[key], history[key], rtol=1e-5, atol=1e-7)


def test_c16_weight_errors_before_any_job(spark):
    df = spark.createDataFrame([([0.0], 0.0, 1.0), ([1.0], 1.0, 2.0)] * 2, XYW)

    def est(**kw):
        return KerasEstimator(model=_dense(1, activation="sigmoid"), loss="binary_crossentropy", featuresCol="x",
                              labelCol="y", verbose=0, **kw)

    msg = _fails_early(spark, lambda: est(sampleWeightCol="w", classWeight={0: 1, 1: 9}).fit(df), ConfigError, "w-both", no_job=True)
    assert "classWeight or sampleWeightCol, not both" in msg
    msg = _fails_early(spark, lambda: est(sampleWeightCol="weight").fit(df), SchemaError, "w-missing", no_job=True)
    assert "'weight'" in msg and "must exist" in msg
    text = df.withColumn("w", F.col("w").cast("string"))
    assert "must be a numeric column" in _fails_early(spark, lambda: est(sampleWeightCol="w").fit(text), SchemaError, "w-str", no_job=True)
    negative = df.withColumn("w", F.when(F.col("y") == 1, -0.5).otherwise(F.col("w")))
    msg = _fails_early(spark, lambda: est(sampleWeightCol="w").fit(negative), SchemaError, "w-neg")
    assert "weights >= 0" in msg and "-0.5" in msg
    nan = df.withColumn("w", F.when(F.col("y") == 1, float("nan")).otherwise(F.col("w")))
    msg = _fails_early(spark, lambda: est(sampleWeightCol="w").fit(nan), SchemaError, "w-nan")
    assert "'w' must hold finite values" in msg
    null = df.withColumn("w", F.when(F.col("y") == 1, F.lit(None)).otherwise(F.col("w")))
    assert "'w' must have no null values" in _fails_early(spark, lambda: est(sampleWeightCol="w").fit(null), SchemaError, "w-null")


def test_sample_weights_match_plain_keras(spark):
    """One worker, the input's order, batches of 8: weights and every history value equal
    ``keras.Model.fit(x, y, sample_weight=w, shuffle=False)``."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(30, 3)).astype(np.float32)
    y = x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.1 * rng.normal(size=30).astype(np.float32)
    w = rng.uniform(0.0, 2.0, size=30)
    w[[2, 11, 17]] = 0.0
    df = partitioned_df(spark, [_rows(x, y, w)], XYW)
    est = KerasEstimator(model=_dense(3, seed=2, hidden=4), optimizer="adam", loss="mse", metrics=["mae"], weightedMetrics=["mse"],
                         featuresCol="x", labelCol="y", sampleWeightCol="w", numWorkers=1, keepPartitioning=True, shuffle=False,
                         epochs=3, batchSize=8, verbose=0)
    fitted = est.fit(df)
    model = _dense(3, seed=2, hidden=4)
    model.compile(optimizer="adam", loss="mse", metrics=["mae"], weighted_metrics=["mse"])
    history = model.fit(x, y, sample_weight=w.astype(np.float32), batch_size=8, epochs=3, shuffle=False, verbose=0).history
    _allclose(fitted.getKerasModel().get_weights(), model.get_weights(), atol=1e-5)
    assert sorted(fitted.history) == sorted(history)
    for key in history:
        np.testing.assert_allclose(fitted.history[key], history[key], rtol=1e-5, atol=1e-7)


# ---- validation: C36, C09 ----------------------------------------------------------------------


def _zero_model():
    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, kernel_initializer="zeros", bias_initializer="zeros")])


def test_c36_validation_metrics_combine_every_partition(spark):
    """The prediction stays 0: val mse = val mae = (rows with y = 1) / rows. 0 or 1 would be one
    partition's value, a mean of per-partition (or per-batch) means another."""
    train = spark.createDataFrame([([0.0], 0.0)] * 8, "x array<float>, y double")

    def fit(labels, partitions, batch_size, workers):
        size = -(-len(labels) // partitions)
        rows = [([0.0], float(v)) for v in labels]
        val = partitioned_df(spark, [rows[i:i + size] for i in range(0, len(rows), size)], "x array<float>, y double")
        est = KerasEstimator(model=_zero_model(), optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse", metrics=["mae"],
                             featuresCol="x", labelCol="y", numWorkers=workers, epochs=2, batchSize=batch_size, verbose=0)
        return est.fit(train, validationData=val)

    fitted = fit([0, 0, 0, 1], 2, 32, 2)
    assert fitted.fitInfo["validation_rows"] == 4 and fitted.fitInfo["rows"] == 8
    assert _val_keys(fitted.history) == ["val_loss", "val_mae"]
    for key in ("val_loss", "val_mae"):
        assert len(fitted.history[key]) == 2
        for value in fitted.history[key]:
            assert value == pytest.approx(0.25, abs=1e-7), fitted.history
    assert fitted.history["loss"] == [0.0, 0.0]
    # 5 rows, 1 positive, 3 workers, batches of 2: every per-partition or per-batch mean differs from 1/5
    fitted = fit([0, 0, 1, 0, 0], 3, 2, 3)
    assert fitted.fitInfo["validation_rows"] == 5
    for key in ("val_loss", "val_mae"):
        for value in fitted.history[key]:
            assert value == pytest.approx(0.2, abs=1e-7), fitted.history


def _c09(spark):
    """10 rows in 4 partitions, a fixed linear model (lr 0) and each row's squared error."""
    x = np.array([[0.1 * i, 1.0 - 0.07 * i] for i in range(10)], np.float32)
    y = np.array([(i * 7) % 5 for i in range(10)], np.float64)
    is_val = np.array([i in (1, 4, 7) for i in range(10)])
    rows = [([float(v) for v in x[i]], float(y[i]), bool(is_val[i])) for i in range(10)]
    df = partitioned_df(spark, [rows[0:3], rows[3:6], rows[6:8], rows[8:10]], "x array<float>, y double, is_val boolean")
    model = _dense(2, seed=9)
    errors = (model.predict(x, verbose=0)[:, 0] - y) ** 2
    return df, errors, is_val


def _fixed_fit(df, seed=0, **kw):
    est = KerasEstimator(model=_dense(2, seed=9), optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse", featuresCol="x",
                         labelCol="y", numWorkers=2, epochs=1, batchSize=4, seed=seed, verbose=0, **kw)
    return est.fit(df)


@pytest.mark.slow  # the default run's 25-minute budget: test_c09_an_empty_split_warns_and_trains runs its kind
def test_c09_validation_split_column_and_zero(spark):
    df, errors, is_val = _c09(spark)
    split = [_fixed_fit(frame, validationSplit=0.2) for frame in (df, df, df.orderBy(F.rand(3)).repartition(3))]
    held = split[0].fitInfo["validation_rows"]
    assert 0 < held < 10 and split[0].fitInfo["rows"] == 10 - held
    for fitted in split:  # the same rows every run, whatever the partitioning and order
        assert fitted.fitInfo["validation_rows"] == held
        assert fitted.history["val_loss"][0] == pytest.approx(split[0].history["val_loss"][0], rel=1e-6)
        assert fitted.history["loss"][0] == pytest.approx(split[0].history["loss"][0], rel=1e-6)
    # lr 0: the two means are of a split of the 10 rows' errors, held rows on the validation side
    total = split[0].history["val_loss"][0] * held + split[0].history["loss"][0] * (10 - held)
    assert total == pytest.approx(errors.sum(), rel=1e-5)
    means = {round(float(np.mean(errors[list(c)])), 4) for c in itertools.combinations(range(10), held)}
    assert round(split[0].history["val_loss"][0], 4) in means

    by_col = _fixed_fit(df, validationCol="is_val")
    assert (by_col.fitInfo["validation_rows"], by_col.fitInfo["rows"]) == (3, 7)
    assert by_col.history["val_loss"][0] == pytest.approx(errors[is_val].mean(), rel=1e-5)
    assert by_col.history["loss"][0] == pytest.approx(errors[~is_val].mean(), rel=1e-5)

    none = _fixed_fit(df, validationSplit=0.0)
    assert _val_keys(none.history) == [] and none.fitInfo["validation_rows"] == 0 and none.fitInfo["rows"] == 10


def test_c09_an_empty_split_warns_and_trains(spark):
    """3 rows at 0.2: seed 1 happens to hold none out (the split is a seeded hash): one UserWarning,
    no val_ keys, all 3 rows trained."""
    df = spark.createDataFrame([([0.1, 0.2], 0.0), ([0.3, 0.4], 1.0), ([0.5, 0.6], 2.0)], "x array<float>, y double")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fitted = _fixed_fit(df, seed=1, validationSplit=0.2)
    empty = [w for w in caught if issubclass(w.category, UserWarning) and "validation set is empty" in str(w.message)]
    assert fitted.fitInfo["validation_rows"] == 0, "seed 1 no longer gives an empty split: pick a seed that does"
    assert len(empty) == 1, [str(w.message) for w in caught]
    assert _val_keys(fitted.history) == [] and fitted.fitInfo["rows"] == 3


@pytest.mark.slow  # the default run's 25-minute budget: test_c36_validation_metrics_combine_every_partition runs its kind
def test_validation_with_sample_weights_equals_keras_evaluate(spark):
    """After training, history's last val_loss (and weighted val metric) equal plain Keras
    ``evaluate(x_val, y_val, sample_weight=w_val)`` with the fitted weights (partitions memory-mapped)."""
    rng = np.random.default_rng(12)
    x = rng.normal(size=(24, 2)).astype(np.float32)
    y = x @ np.array([2.0, -1.0], np.float32)
    w = rng.uniform(0.0, 3.0, size=24)
    is_val = np.arange(24) % 4 == 0
    rows = [([float(v) for v in x[i]], float(y[i]), float(w[i]), bool(is_val[i])) for i in range(24)]
    df = spark.createDataFrame(rows, "x array<float>, y double, w double, v boolean")
    est = KerasEstimator(model=_dense(2, seed=1), optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"],
                         weightedMetrics=["mae"], featuresCol="x", labelCol="y", sampleWeightCol="w", validationCol="v",
                         numWorkers=2, epochs=3, batchSize=4, maxTaskMemoryMB=1e-4, verbose=0)  # every partition memory-mapped
    fitted = est.fit(df)
    assert fitted.fitInfo["validation_rows"] == 6 and fitted.fitInfo["partitions_on_disk"] == 2
    model = fitted.getKerasModel()
    want = model.evaluate(x[is_val], y[is_val], sample_weight=w[is_val].astype(np.float32), batch_size=4, verbose=0, return_dict=True)
    assert _val_keys(fitted.history) == sorted(f"val_{k}" for k in want)
    for key, value in want.items():
        assert fitted.history[f"val_{key}"][-1] == pytest.approx(value, rel=1e-5, abs=1e-7), (key, fitted.history)
    assert len(fitted.history["val_loss"]) == 3
    unweighted = model.evaluate(x[is_val], y[is_val], verbose=0, return_dict=True)
    assert abs(unweighted["loss"] - want["loss"]) > 1e-3  # the weights changed the value


@pytest.mark.slow  # the default run's 25-minute budget: test_c16_class_weight_trains_as_keras_class_weight runs its kind
def test_class_weight_is_not_applied_to_validation_as_in_keras(spark):
    """Keras weighs training rows by ``class_weight`` and validation rows only by their sample weights
    (none here): val_loss is the plain mean loss of the validation rows."""
    x, y, _ = _class_data(n=40)
    is_val = np.arange(40) % 5 == 0
    rows = [([float(v) for v in x[i]], float(y[i]), bool(is_val[i])) for i in range(40)]
    df = spark.createDataFrame(rows, "x array<float>, y double, v boolean")
    est = KerasEstimator(model=_dense(2, seed=6, activation="sigmoid"), optimizer="adam", loss="binary_crossentropy",
                         featuresCol="x", labelCol="y", classWeight={0: 1.0, 1: 9.0}, validationCol="v", numWorkers=2,
                         epochs=2, batchSize=8, verbose=0)
    assert y[is_val].sum() >= 1
    for backend in ("rounds", "ps"):
        fitted = est.setBackend(backend).fit(df)
        want = fitted.getKerasModel().evaluate(x[is_val], y[is_val], verbose=0)
        assert fitted.history["val_loss"][-1] == pytest.approx(want, rel=1e-5), backend


def test_set_validation_data_and_validation_errors_before_any_job(spark):
    train = spark.createDataFrame([([0.0], 0.0)] * 6 + [([1.0], 1.0)] * 2, "x array<float>, y double")
    val = spark.createDataFrame([([1.0], 1.0), ([0.0], 0.0)], "x array<float>, y double")
    est = KerasEstimator(model=_zero_model(), optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse", featuresCol="x",
                         labelCol="y", epochs=1, verbose=0)
    est.setValidationData(val)
    fitted = est.fit(train)
    assert fitted.history["val_loss"] == [pytest.approx(0.5, abs=1e-7)] and fitted.fitInfo["validation_rows"] == 2
    one = est.fit(train, validationData=val.limit(1).filter(F.col("y") > 0))  # one row for two workers: one partition empty
    assert one.history["val_loss"] == [pytest.approx(1.0, abs=1e-7)] and one.fitInfo["validation_rows"] == 1
    msg = _fails_early(spark, lambda: est.copy().setValidationSplit(0.3).fit(train), ConfigError, "val-two", no_job=True)
    assert "validationData" in msg and "validationSplit" in msg
    est.setValidationData(None)
    assert _val_keys(est.fit(train).history) == []
    flagged = train.withColumn("v", F.col("y") > 0)
    msg = _fails_early(spark, lambda: est.copy().setValidationCol("v").fit(flagged, validationData=val), ConfigError, "val-two-b", no_job=True)
    assert "validationCol" in msg
    msg = _fails_early(spark, lambda: est.copy().setValidationCol("missing").fit(flagged), SchemaError, "val-missing", no_job=True)
    assert "'missing'" in msg
    msg = _fails_early(spark, lambda: est.copy().setValidationCol("y").fit(flagged), SchemaError, "val-double", no_job=True)
    assert "must be boolean" in msg
    on_ps = est.copy().setBackend("ps").fit(train, validationData=val)  # validated after the barrier stage
    assert on_ps.history["val_loss"] == [pytest.approx(0.5, abs=1e-7)] and on_ps.fitInfo["backend"] == "ps"
    no_label = spark.createDataFrame([([1.0],)], "x array<float>")
    msg = _fails_early(spark, lambda: est.fit(train, validationData=no_label), SchemaError, "val-no-label", no_job=True)
    assert msg.startswith("validationData: ") and "label column 'y' must exist" in msg
    strings = spark.createDataFrame([([1.0], "a")], "x array<float>, y string")
    msg = _fails_early(spark, lambda: est.fit(train, validationData=strings), SchemaError, "val-str", no_job=True)
    assert "StringIndexer" in msg
    weighted = est.copy().setSampleWeightCol("w")
    msg = _fails_early(spark, lambda: weighted.fit(train.withColumn("w", F.lit(1.0)), validationData=val), SchemaError, "val-no-w", no_job=True)
    assert "validationData: sampleWeightCol column 'w' must exist" in msg
    from pyspark.ml.feature import VectorAssembler  # its vectors' metadata records their width: checked with no job

    three = VectorAssembler(inputCols=["a", "b", "c"], outputCol="y").transform(
        spark.createDataFrame([([1.0], 1.0, 0.0, 0.0)], "x array<float>, a double, b double, c double")).select("x", "y")
    msg = _fails_early(spark, lambda: est.fit(train, validationData=three), SchemaError, "val-label-width", no_job=True)
    assert msg.startswith("validationData: label column 'y'") and "Received: 3" in msg, msg
    bad = spark.createDataFrame([([1.0, 2.0], 1.0)], "x array<float>, y double")  # 2 values for a 1-value input
    msg = _fails_early(spark, lambda: est.fit(train, validationData=bad), SchemaError, "val-width")
    assert "must hold 1 values per row" in msg
    assert est._validation_data is None  # fit(validationData=...) does not stick to the estimator


# ---- C15: multi-input, multi-output ----------------------------------------------------------


def _recommender():
    keras.utils.set_random_seed(21)
    user = keras.Input((1,), dtype="int32", name="user")
    item = keras.Input((1,), dtype="int32", name="item")
    stats = keras.Input((3,), name="stats")
    u = keras.layers.Flatten()(keras.layers.Embedding(5, 2)(user))
    i = keras.layers.Flatten()(keras.layers.Embedding(4, 2)(item))
    h = keras.layers.Concatenate()([u, i, stats])
    rating = keras.layers.Dense(1, name="rating")(h)
    click = keras.layers.Dense(1, name="click")(h)
    return keras.Model([user, item, stats], [rating, click])


def _recommender_data(spark, n=12):
    rng = np.random.default_rng(15)
    users, items = np.arange(n) % 5, (np.arange(n) * 3) % 4
    stats = rng.normal(size=(n, 3)).astype(np.float32)
    rating = (users * 0.5 + stats[:, 0]).astype(np.float64)
    click = (items % 2).astype(np.float64)
    rows = [(int(users[k]), int(items[k]), [float(v) for v in stats[k]], float(rating[k]), float(click[k])) for k in range(n)]
    df = partitioned_df(spark, [rows], "user int, item int, stats array<float>, rating double, click double")
    return df, (users, items, stats, rating, click)


FEATURES = {"user": "user", "item": "item", "stats": "stats"}
LABELS = {"rating": "rating", "click": "click"}


def test_c15_multi_input_multi_output_equals_plain_keras(spark):
    """Columns mapped to inputs and labels to outputs by name; one worker in the input's order equals
    ``keras.Model.fit`` on the same arrays, validation on a second DataFrame included (every history key)."""
    df, (users, items, stats, rating, click) = _recommender_data(spark, n=20)
    rows = df.collect()
    train, val = partitioned_df(spark, [rows[:12]], df.schema), spark.createDataFrame(rows[12:], df.schema).repartition(3)
    est = KerasEstimator(model=_recommender(), optimizer="adam", loss="mse", featuresCols=FEATURES, labelCols=LABELS,
                         numWorkers=1, keepPartitioning=True, shuffle=False, epochs=2, batchSize=4, verbose=0)
    fitted = est.fit(train, validationData=val)
    model = _recommender()
    model.compile(optimizer="adam", loss="mse")
    x = [users.reshape(-1, 1).astype(np.int32), items.reshape(-1, 1).astype(np.int32), stats]
    history = model.fit([a[:12] for a in x], [rating[:12], click[:12]], validation_data=([a[12:] for a in x], [rating[12:], click[12:]]),
                        batch_size=4, epochs=2, shuffle=False, verbose=0).history
    _allclose(fitted.getKerasModel().get_weights(), model.get_weights(), atol=1e-5)
    assert sorted(fitted.history) == sorted(history) and "val_loss" in history
    for key in history:
        np.testing.assert_allclose(fitted.history[key], history[key], rtol=1e-5, atol=1e-7, err_msg=key)
    assert fitted.fitInfo["validation_rows"] == 8
    # labelCols as a list in output order trains the same
    est.setLabelCols(["rating", "click"])
    again = est.fit(train)
    _allclose(again.getKerasModel().get_weights(), model.get_weights(), atol=1e-5)


def test_c15_int_inputs_stay_ints(spark):
    """The int32 inputs are prepared as (wide, checked) int64 arrays and read as int32 (an id above 2**24
    would not survive float32): the data layer's own functions, as ``fit`` calls them."""
    from sparkdl.spark.data import prepare_training_data, request_columns

    df, _ = _recommender_data(spark)
    df = df.withColumn("user", F.col("user") + F.lit(2**24 + 1))
    est = KerasEstimator(model=_recommender(), loss="mse", featuresCols=FEATURES, labelCols=LABELS)
    loss = [est._compile_spec().loss_info] * len(LABELS)  # one per output
    request = request_columns(df, est._spec, loss, "features", est.getFeaturesCols(), "label", est.getLabelCols())
    assert [(name, dtype) for name, _, dtype, _ in request.inputs] == [("user", "int32"), ("item", "int32"), ("stats", "float32")]
    data = prepare_training_data(df, request, loss, 1)
    try:
        assert [t.dtype for t in data.columns.inputs] == ["int32", "int32", "float32"]
        types = [f.dataType.simpleString() for f in data.df.schema.fields[:3]]
        assert types == ["array<bigint>", "array<bigint>", "array<float>"], types  # read wide, range-checked, cast by the tasks
        users = sorted(r[0][0] for r in data.df.select(data.df.columns[0]).collect())
        assert users[0] == 2**24 + 1  # exact: not rounded through float32 (2**24 + 1 -> 2**24)
    finally:
        data.df.unpersist()


def test_c15_mapping_errors_before_any_job(spark):
    df, _ = _recommender_data(spark)

    def est(**kw):
        args = dict(model=_recommender(), loss="mse", featuresCols=FEATURES, labelCols=LABELS, verbose=0)
        args.update(kw)
        return KerasEstimator(**args)

    msg = _fails_early(spark, lambda: est(featuresCols={"user": "user", "stats": "stats"}).fit(df), SchemaError, "c15-in", no_job=True)
    assert "'item'" in msg and "featuresCols" in msg
    msg = _fails_early(spark, lambda: est(featuresCols={**FEATURES, "age": "user"}).fit(df), SchemaError, "c15-unknown", no_job=True)
    assert "'age'" in msg
    msg = _fails_early(spark, lambda: est(featuresCol="stats", featuresCols=None).fit(df), SchemaError, "c15-one", no_job=True)
    assert "3 inputs" in msg
    msg = _fails_early(spark, lambda: est(labelCol="rating", labelCols=None).fit(df), SchemaError, "c15-label", no_job=True)
    assert "2 outputs" in msg and "labelCols" in msg
    msg = _fails_early(spark, lambda: est(labelCols={"rating": "rating"}).fit(df), SchemaError, "c15-label-dict", no_job=True)
    assert "'click'" in msg
    msg = _fails_early(spark, lambda: est(labelCols={"rating": "rating", "click": "clicked"}).fit(df), SchemaError, "c15-col", no_job=True)
    assert "'clicked'" in msg
    msg = _fails_early(spark, lambda: est(classWeight={0: 1.0}).fit(df), ConfigError, "c15-cw", no_job=True)
    assert "single-output" in msg


# ---- C03, C32: label encodings ---------------------------------------------------------------------


def _encoded(spark):
    """8 rows, 3 classes: an int label, a one-hot array, OneHotEncoder(dropLast=False) sparse ml and mllib vectors."""
    from pyspark.ml.feature import OneHotEncoder
    from pyspark.mllib.util import MLUtils

    rng = np.random.default_rng(30)
    x = rng.normal(size=(9, 2)).astype(np.float32)
    classes = np.arange(9) % 3
    rows = [([float(v) for v in x[k]], int(classes[k]), [float(classes[k] == j) for j in range(3)]) for k in range(9)]
    df = spark.createDataFrame(rows, "x array<float>, y_int int, y_arr array<double>")
    df = OneHotEncoder(inputCol="y_int", outputCol="y_vec", dropLast=False).fit(df).transform(df)
    df = MLUtils.convertVectorColumnsFromML(df.withColumn("y_old", F.col("y_vec")), "y_old")
    return df


def _softmax_fit(df, label, loss):
    est = KerasEstimator(model=_dense(2, units=3, seed=4, activation="softmax"), optimizer="adam", loss=loss,
                         featuresCol="x", labelCol=label, numWorkers=1, epochs=2, batchSize=3, seed=5, verbose=0)
    return est.fit(df)


def test_c03_int_one_hot_and_one_hot_encoder_labels_train_alike(spark):
    df = _encoded(spark)
    assert "sparse" in str(df.select("y_vec").first()[0].__class__).lower()
    base = _softmax_fit(df, "y_int", "sparse_categorical_crossentropy")
    for label in ("y_arr", "y_vec", "y_old"):
        other = _softmax_fit(df, label, "categorical_crossentropy")
        _allclose(other.getKerasModel().get_weights(), base.getKerasModel().get_weights(), atol=1e-6)
        np.testing.assert_allclose(other.history["loss"], base.history["loss"], rtol=1e-6)


def test_c03_multi_label_arrays_train_as_plain_keras(spark):
    rng = np.random.default_rng(31)
    x = rng.normal(size=(10, 2)).astype(np.float32)
    y = np.stack([x[:, 0] > 0, x[:, 1] > 0, x[:, 0] + x[:, 1] > 0.5], axis=1).astype(np.float32)
    y[0] = [1.0, 0.0, 1.0]
    rows = [([float(v) for v in x[k]], [float(v) for v in y[k]]) for k in range(10)]
    df = partitioned_df(spark, [rows], "x array<float>, y array<double>")
    est = KerasEstimator(model=_dense(2, units=3, seed=7, activation="sigmoid"), optimizer="adam", loss="binary_crossentropy",
                         metrics=["binary_accuracy"], featuresCol="x", labelCol="y", numWorkers=1, keepPartitioning=True,
                         shuffle=False, epochs=2, batchSize=4, verbose=0)
    fitted = est.fit(df)
    model = _dense(2, units=3, seed=7, activation="sigmoid")
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["binary_accuracy"])
    history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0).history
    _allclose(fitted.getKerasModel().get_weights(), model.get_weights(), atol=1e-5)
    for key in history:
        np.testing.assert_allclose(fitted.history[key], history[key], rtol=1e-5)


def test_c03_c32_label_errors_before_any_training_job(spark):
    from pyspark.ml.feature import OneHotEncoder

    df = _encoded(spark)
    strings = df.withColumn("y_str", F.element_at(F.array(F.lit("cat"), F.lit("dog"), F.lit("eel")), F.col("y_int") + 1))
    msg = _fails_early(spark, lambda: _softmax_fit(strings, "y_str", "sparse_categorical_crossentropy"), SchemaError, "c03-str", no_job=True)
    assert "StringIndexer" in msg and "'y_str'" in msg
    narrow = OneHotEncoder(inputCol="y_int", outputCol="y_drop").fit(df).transform(df)  # dropLast=True: width 2
    msg = _fails_early(spark, lambda: _softmax_fit(narrow, "y_drop", "categorical_crossentropy"), SchemaError, "c32-drop")
    assert "'y_drop'" in msg and "3 value(s) per row" in msg and "dropLast=True writes 2 values for 3 classes" in msg
    msg = _fails_early(spark, lambda: _softmax_fit(df, "y_arr", "sparse_categorical_crossentropy"), SchemaError, "c03-sparse")
    assert "categorical_crossentropy" in msg


def test_c32_dropped_last_class_fails_before_any_job_at_all(spark):
    from pyspark.ml.feature import OneHotEncoder

    df = _encoded(spark)
    narrow = OneHotEncoder(inputCol="y_int", outputCol="y_drop").fit(df).transform(df)
    assert narrow.schema["y_drop"].metadata["ml_attr"]["num_attrs"] == 2
    _fails_early(spark, lambda: _softmax_fit(narrow, "y_drop", "categorical_crossentropy"), SchemaError, "c32-no-job", no_job=True)
