"""Every DataFrame a Spark user brings (issue 8): vectors, separate columns, nulls/NaN, sequences,
binary columns with a decoder. Each representation is compared with plain Keras on the same numbers;
each error is checked to come before any training job."""

import itertools

import numpy as np
import pytest
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.mllib.linalg import Vectors as MLlibVectors
from pyspark.mllib.linalg import VectorUDT as MLlibVectorUDT
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError, SchemaError
from sparkdl.serialization.columns import PAD_VALUE
from tests.conftest import partitioned_df

import keras  # noqa: E402  (conftest selected the backend)

EPOCHS, BATCH = 2, 2
_GROUPS = itertools.count()


def _mlp(inputs=3, seed=7):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])


def _estimator(model, **params):
    """One worker on the input's one partition, rows in order: the fit is plain Keras' fit."""
    base = dict(model=model, optimizer="adam", loss="mse", labelCol="y", numWorkers=1, keepPartitioning=True,
                shuffle=False, epochs=EPOCHS, batchSize=BATCH, verbose=0)
    base.update(params)
    return KerasEstimator(**base)


def _plain_keras(model_fn, x, y, epochs=EPOCHS, batch_size=BATCH, loss="mse"):
    model = model_fn()
    model.compile(optimizer="adam", loss=loss)
    history = model.fit(x, np.asarray(y, np.float32), batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights(), history.history


def _weights(fitted):
    return fitted.getKerasModel().get_weights()


def _assert_weights(got, want, atol=1e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=atol, rtol=0)


def _job_descriptions(sc, group):
    """The descriptions of the group's jobs (``setJobDescription``), from Spark's status store.
    Stage names are no help: jobs run from sparkdl's helper thread are all ``copy_local_properties``."""
    store = sc._jsc.sc().statusStore()
    found = []
    for j in sc.statusTracker().getJobIdsForGroup(group):
        description = store.job(j).description()
        found.append(description.get() if description.isDefined() else None)
    return found


def _fit_error(spark, est, df, any_job=True, error=SchemaError):
    """The ``error`` (SchemaError) of ``est.fit(df)``, checked to come before any training job: with ``any_job``
    the check job's jobs only (with a repartition, AQE runs its shuffle as jobs of their own), else
    no Spark job at all."""
    sc = spark.sparkContext
    group = f"data-inputs-{next(_GROUPS)}"  # a new group each time: job ids of a group are kept
    sc.setJobGroup(group, "data input check")
    try:
        with pytest.raises(error) as info:
            est.fit(df)
        descriptions = _job_descriptions(sc, group)
    finally:
        sc.setJobGroup("", "")
    if any_job:
        assert descriptions and all(d == "sparkdl: check and count training rows" for d in descriptions), descriptions
    else:
        assert descriptions == [], descriptions
    return str(info.value)


# ---------------------------------------------------------------- C01: ml / mllib, dense / sparse vectors

C01_X = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [1.0, 0.0, 0.0], [0.0, 0.0, -0.7]], np.float32)
C01_Y = [0.0, 1.0, 1.0, 0.0]


def _sparse(vectors, row):
    return vectors.sparse(len(row), {i: float(v) for i, v in enumerate(row) if v != 0})


def _dense(vectors, row):
    return vectors.dense([float(v) for v in row])


C01_VARIANTS = {
    "ml_dense": (VectorUDT(), lambda r, i: _dense(Vectors, r)),
    "ml_sparse": (VectorUDT(), lambda r, i: _sparse(Vectors, r)),
    "ml_mixed": (VectorUDT(), lambda r, i: (_sparse if i % 2 else _dense)(Vectors, r)),  # as VectorAssembler writes
    "mllib_mixed": (MLlibVectorUDT(), lambda r, i: (_dense if i % 2 else _sparse)(MLlibVectors, r)),
}


@pytest.mark.slow  # the default run's 25-minute budget: test_c02_same_rows_every_representation_same_weights[dv, sv] runs its kind
def test_c01_vector_types_dense_and_sparse_train_the_same(spark):
    assert C01_VARIANTS["ml_sparse"][1](C01_X[2], 2) == Vectors.sparse(3, {0: 1.0})
    expected, _ = _plain_keras(_mlp, C01_X, C01_Y)
    initial = _mlp().get_weights()
    results = {}
    for name, (udt, make) in C01_VARIANTS.items():
        schema = T.StructType([T.StructField("features", udt), T.StructField("y", T.DoubleType())])
        df = partitioned_df(spark, [[(make(r, i), y) for i, (r, y) in enumerate(zip(C01_X, C01_Y, strict=True))]], schema)
        results[name] = _weights(_estimator(_mlp(), featuresCol="features").fit(df))
        _assert_weights(results[name], expected)
    assert not np.allclose(results["ml_dense"][0], initial[0])  # training moved the weights
    for name, got in results.items():  # the same numbers, dense or sparse: identical weights
        for g, w in zip(got, results["ml_dense"], strict=True):
            np.testing.assert_array_equal(g, w, err_msg=name)


# ---------------------------------------------------------------- C02: one input from several columns

C02_X = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [0.5, 0.0, -1.0], [0.0, 0.0, 2.0]], np.float32)
C02_Y = [0.0, 1.0, 1.0, 0.0]


@pytest.fixture(scope="module")
def c02_df(spark):
    schema = T.StructType(
        [T.StructField(n, T.DoubleType()) for n in ("x1", "x2", "x3")]
        + [T.StructField("ad", T.ArrayType(T.DoubleType())), T.StructField("af", T.ArrayType(T.FloatType())),
           T.StructField("dv", VectorUDT()), T.StructField("sv", VectorUDT()), T.StructField("arr2", T.ArrayType(T.DoubleType())),
           T.StructField("y", T.DoubleType())]
    )
    rows = []
    for r, y in zip(C02_X, C02_Y, strict=True):
        v = [float(a) for a in r]
        rows.append((*v, v, v, Vectors.dense(v), _sparse(Vectors, r), v[1:], y))
    df = partitioned_df(spark, [rows], schema)
    return VectorAssembler(inputCols=["x1", "x2", "x3"], outputCol="va").transform(df)


@pytest.mark.parametrize("features", [
    {"featuresCol": "ad"}, {"featuresCol": "af"}, {"featuresCol": "dv"}, {"featuresCol": "sv"}, {"featuresCol": "va"},
    {"featuresCols": ["x1", "x2", "x3"]}, {"featuresCols": ["x1", "arr2"]},
], ids=lambda f: "-".join(f.get("featuresCols") or [f["featuresCol"]]))
def test_c02_same_rows_every_representation_same_weights(spark, c02_df, features):
    expected, history = _plain_keras(_mlp, C02_X, C02_Y)
    fitted = _estimator(_mlp(), **features).fit(c02_df)
    _assert_weights(_weights(fitted), expected)
    np.testing.assert_allclose(fitted.history["loss"], history["loss"], rtol=1e-5)
    assert fitted.fitInfo["rows"] == 4


def test_c02_columns_in_the_listed_order(spark, c02_df):
    """["x3", "x2", "x1"] fills the input with each row reversed."""
    expected, _ = _plain_keras(_mlp, C02_X[:, ::-1].copy(), C02_Y)
    fitted = _estimator(_mlp(), featuresCols=["x3", "x2", "x1"]).fit(c02_df)
    _assert_weights(_weights(fitted), expected)


def test_c02_width_mismatch_fails_before_training(spark, c02_df):
    msg = _fit_error(spark, _estimator(_mlp(), featuresCols=["x1", "arr2", "x3"]), c02_df)
    assert "must hold 3 values per row in all" in msg, msg
    assert "Received 4: 'x1': 1, 'arr2': 2, 'x3': 1" in msg, msg


def _two_inputs(seed=1):
    keras.utils.set_random_seed(seed)
    ids = keras.Input((2,), dtype="int32", name="ids")
    num = keras.Input((3,), name="num")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(10, 2)(ids))
    return keras.Model([ids, num], keras.layers.Dense(1)(keras.layers.Concatenate()([embedded, num])))


def test_featurescols_dict_fills_each_model_input(spark):
    """{input name: column(s)}: integer ids stay integers for the Embedding; "num" is assembled from a scalar and an array."""
    ids = np.array([[1, 7], [3, 2], [9, 0], [4, 4]], np.int32)
    rows = [(int(i[0]), int(i[1]), float(x[0]), [float(v) for v in x[1:]], y) for i, x, y in zip(ids, C02_X, C02_Y, strict=True)]
    df = partitioned_df(spark, [rows], "i1 int, i2 long, x1 double, arr2 array<double>, y double")
    fitted = _estimator(_two_inputs(), featuresCols={"ids": ["i1", "i2"], "num": ["x1", "arr2"]}).fit(df)
    model = _two_inputs()
    model.compile(optimizer="adam", loss="mse")
    model.fit({"ids": ids, "num": C02_X}, np.asarray(C02_Y, np.float32), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    _assert_weights(_weights(fitted), model.get_weights())


# ---------------------------------------------------------------- C04: nulls, NaN, ±inf; handleInvalid

C04_SCHEMA = "a int, b double, y double"
C04_ROWS = [(1, 0.5, 0.0), (None, 0.7, 1.0), (3, float("nan"), 0.0), (None, None, 1.0), (5, 0.9, 1.0), (2, 0.3, 0.0)]
C04_ALL_NULL_A = [(None, 0.1, 0.0), (None, 0.2, 1.0)]  # a partition where `a` is null in every row
C04_VALID = [(1, 0.5, 0.0), (5, 0.9, 1.0), (2, 0.3, 0.0)]


def _c04_df(spark, partitions=(C04_ROWS, C04_ALL_NULL_A)):
    return partitioned_df(spark, [list(p) for p in partitions], C04_SCHEMA)


def _c04_estimator(**params):
    # all rows in one batch: the order the worker holds them in cannot change the result
    return _estimator(_mlp(2), featuresCols=["a", "b"], numWorkers=1, keepPartitioning=False, batchSize=8, epochs=3, **params)


def test_c04_nulls_fail_before_training_naming_the_column_and_count(spark):
    msg = _fit_error(spark, _c04_estimator(), _c04_df(spark))
    # a null int stays a null row (not a row holding a null element), and every column's faults are named at once
    assert "column 'a' must have no null values. Received: 4 null rows of 8" in msg, msg
    assert "column 'b' must have no null values. Received: 1 null rows of 8" in msg, msg
    assert "column 'b' must hold finite values. Received: 1 NaN or infinite values in 8 rows" in msg, msg
    assert msg.endswith("(handleInvalid='skip' drops such rows)") and "'y'" not in msg, msg
    clean_a = _c04_df(spark).withColumn("a", F.coalesce("a", F.lit(0)))
    msg = _fit_error(spark, _c04_estimator(), clean_a.where(F.col("b").isNotNull()))
    assert msg.startswith("column 'b' must hold finite values. Received: 1 NaN or infinite values in 7 rows"), msg
    assert "'a'" not in msg, msg


def test_c04_skip_trains_on_the_valid_rows_only(spark):
    with pytest.warns(UserWarning, match="5 rows with a null, NaN or infinite value or a wrong number of values were dropped"):
        fitted = _c04_estimator(handleInvalid="skip").fit(_c04_df(spark))
    assert fitted.fitInfo["rows_skipped"] == 5 and fitted.fitInfo["rows"] == 3
    x = np.array([[a, b] for a, b, _ in C04_VALID], np.float32)
    expected, history = _plain_keras(lambda: _mlp(2), x, [y for _, _, y in C04_VALID], epochs=3, batch_size=8)
    _assert_weights(_weights(fitted), expected, atol=1e-6)
    assert np.all(np.isfinite(fitted.history["loss"]))
    np.testing.assert_allclose(fitted.history["loss"], history["loss"], rtol=1e-5)
    clean = _c04_estimator().fit(_c04_df(spark, [C04_VALID]))
    _assert_weights(_weights(fitted), _weights(clean), atol=1e-7)


def test_c04_infinite_feature_and_nan_label_are_invalid(spark):
    inf, nan = float("inf"), float("nan")
    rows = [([0.1, 0.2], 0.0), ([0.3, -inf], 1.0), ([0.5, 0.6], nan), ([0.7, 0.8], 1.0), ([inf, 0.0], 0.0)]
    df = partitioned_df(spark, [rows], "x array<double>, y double")
    msg = _fit_error(spark, _estimator(_mlp(2), featuresCol="x"), df)
    assert "column 'x' must hold finite values. Received: 2 NaN or infinite values in 5 rows" in msg, msg
    assert "column 'y' must hold finite values. Received: 1 NaN or infinite values in 5 rows" in msg, msg
    with pytest.warns(UserWarning, match="3 rows"):
        fitted = _estimator(_mlp(2), featuresCol="x", handleInvalid="skip").fit(df)
    assert fitted.fitInfo["rows_skipped"] == 3 and fitted.fitInfo["rows"] == 2
    expected, _ = _plain_keras(lambda: _mlp(2), np.array([[0.1, 0.2], [0.7, 0.8]], np.float32), [0.0, 1.0])
    _assert_weights(_weights(fitted), expected)


# ---------------------------------------------------------------- C06: variable-length sequences

C06_STEPS = (2, 5, 3)


def _c06_rows(width=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.1, 1.0, size=(steps, width)).astype(np.float32) for steps in C06_STEPS], [0.5, -0.5, 1.0]


def _lstm(seed=5):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((None, 4)), keras.layers.Masking(), keras.layers.LSTM(3), keras.layers.Dense(1)])


def test_c06_sequences_are_padded_to_the_longest_row(spark):
    seqs, ys = _c06_rows()
    df = partitioned_df(spark, [[([[float(v) for v in step] for step in s], y) for s, y in zip(seqs, ys, strict=True)]],
                        "seq array<array<float>>, y double")
    fitted = _estimator(_lstm(), featuresCol="seq").fit(df)
    assert np.all(np.isfinite(fitted.history["loss"]))
    padded = np.full((3, max(C06_STEPS), 4), PAD_VALUE, np.float32)
    for i, s in enumerate(seqs):
        padded[i, : len(s)] = s
    expected, history = _plain_keras(_lstm, padded, ys)
    _assert_weights(_weights(fitted), expected, atol=1e-5)
    np.testing.assert_allclose(fitted.history["loss"], history["loss"], rtol=1e-5)


def test_c06_step_of_the_wrong_width_fails_before_training(spark):
    rows = [([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]], 0.0), ([[0.1, 0.2, 0.3]], 1.0)]
    df = partitioned_df(spark, [rows], "seq array<array<float>>, y double")
    msg = _fit_error(spark, _estimator(_lstm(), featuresCol="seq"), df)
    assert "column 'seq' must hold 4 values per step" in msg and "[3, 4]" in msg, msg


def test_c06_null_steps_and_elements_are_invalid_rows(spark):
    seqs, ys = _c06_rows()
    rows = [([[float(v) for v in step] for step in seq], y) for seq, y in zip(seqs, ys, strict=True)]
    bad = [([[0.1, 0.2, 0.3, 0.4], None], 1.0), ([[0.1, None, 0.3, 0.4]], 0.0), (None, 0.0), ([[0.5] * 4] * 5 + [[float("nan")] * 4], 1.0)]  # the longest row is invalid
    df = partitioned_df(spark, [rows[:1] + bad + rows[1:]], "seq array<array<float>>, y double")
    msg = _fit_error(spark, _estimator(_lstm(), featuresCol="seq"), df)
    assert "column 'seq' must have no null values. Received: 1 null rows of 7" in msg, msg
    assert "column 'seq' must have no null elements. Received: 2 null elements in 7 rows" in msg, msg  # a null step, a null value
    assert "column 'seq' must hold finite values. Received: 4 NaN or infinite values in 7 rows" in msg, msg
    with pytest.warns(UserWarning, match="4 rows with a null"):
        fitted = _estimator(_lstm(), featuresCol="seq", handleInvalid="skip").fit(df)
    assert fitted.fitInfo["rows"] == 3 and fitted.fitInfo["rows_skipped"] == 4
    padded = np.full((3, max(C06_STEPS), 4), PAD_VALUE, np.float32)
    for i, seq in enumerate(seqs):
        padded[i, : len(seq)] = seq
    expected, _ = _plain_keras(_lstm, padded, ys)
    _assert_weights(_weights(fitted), expected, atol=1e-5)


# ---------------------------------------------------------------- C08: binary column and a decoder

def _pngs(n=3, seed=0):
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 4, 4, 3), dtype=np.uint8)
    return images, [bytes(tf.io.encode_png(image).numpy()) for image in images]


def _cnn(seed=11):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Conv2D(2, 2, activation="relu"), keras.layers.Flatten(),
                             keras.layers.Dense(2, activation="softmax")])


@pytest.fixture(scope="module")
def png_df(spark):
    _, blobs = _pngs()
    return partitioned_df(spark, [[(b, label) for b, label in zip(blobs, [0, 1, 1], strict=True)]], "content binary, label long")


def test_c08_binary_column_decoded_on_the_executors(spark, png_df):
    images, _ = _pngs()
    est = _estimator(_cnn(), featuresCol="content", labelCol="label", loss="sparse_categorical_crossentropy",
                     decoders={"content": "tests.decoders:decode_png"})
    fitted = est.fit(png_df)
    model = _cnn()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(images.astype(np.float32) / 255.0, np.array([0, 1, 1]), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    _assert_weights(_weights(fitted), model.get_weights(), atol=1e-6)
    assert fitted.fitInfo["rows"] == 3


def test_c08_binary_column_without_a_decoder_fails_before_any_job(spark, png_df):
    msg = _fit_error(spark, _estimator(_cnn(), featuresCol="content", labelCol="label", loss="sparse_categorical_crossentropy"),
                     png_df, any_job=False)
    assert "features column 'content' is binary" in msg and "decoders={'content': a_function} or {'content': 'module:function'}" in msg, msg


@pytest.mark.parametrize("decoder, received", [("decode_png_small", "(2, 2, 3)"), ("decode_png_channels_first", "(3, 4, 4)")])
def test_c08_decoder_of_the_wrong_shape_fails_before_training(spark, png_df, decoder, received):
    est = _estimator(_cnn(), featuresCol="content", labelCol="label", loss="sparse_categorical_crossentropy",
                     decoders={"content": f"tests.decoders:{decoder}"})
    msg = _fit_error(spark, est, png_df)
    assert f"decoder 'tests.decoders:{decoder}'" in msg and "(4, 4, 3)" in msg and received in msg, msg


def test_c08_decoders_that_cannot_run_fail_before_any_job(spark, png_df):
    def est(decoders):
        return _estimator(_cnn(), featuresCol="content", labelCol="label", loss="sparse_categorical_crossentropy", decoders=decoders)

    msg = _fit_error(spark, est({"content": "tests.no_such_module:decode"}), png_df, any_job=False, error=ConfigError)
    assert "decoder 'tests.no_such_module:decode' must be an importable callable" in msg, msg
    msg = _fit_error(spark, est({"content": "tests.decoders:decode_png", "label": "tests.decoders:decode_png", "contnet": "tests.decoders:decode_png"}),
                     png_df, any_job=False)
    assert "decoders must name binary feature columns" in msg and "'contnet' (no such column)" in msg and "'label' (bigint)" in msg, msg


def test_integer_inputs_refuse_fractional_nan_and_out_of_range_ids_before_training(spark):
    """Integer model inputs (Embedding ids) are read wide and checked: 1.7 is not truncated to 1 in silence."""

    def model():
        keras.utils.set_random_seed(0)
        ids = keras.Input((1,), dtype="int32")
        return keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.Embedding(10, 2)(ids))))

    cases = [([(1.7, 1.0), (2.0, 0.0)], "id double", r"whole numbers in \[-2147483648, 2147483647\]. Received: values from 1.7 to 2, 1 of them not whole numbers"),
             ([(1, 1.0), (2**32 + 1, 0.0)], "id long", r"Received: values from 1 to 4.29497e\+09"),
             ([(1.0, 1.0), (float("nan"), 0.0)], "id double", r"column 'id' must hold finite values. Received: 1 NaN")]
    for rows, schema, message in cases:
        df = spark.createDataFrame(rows, f"{schema}, y double")
        est = KerasEstimator(model=model(), loss="mse", featuresCol="id", labelCol="y", numWorkers=1, verbose=0)
        with pytest.raises(SchemaError, match=message):
            est.fit(df)
    whole = spark.createDataFrame([(3.0, 1.0), (7.0, 0.0)], "id double, y double")
    fitted = KerasEstimator(model=model(), loss="mse", featuresCol="id", labelCol="y", numWorkers=1, verbose=0).fit(whole)
    assert fitted.fitInfo["rows"] == 2
