"""Issue 23: where a fit's model and decoders come from. A ``.keras`` path as the estimator's model
(item 4) and a decoder given as a function (item 3), each compared with the in-memory or named form."""

import numpy as np
import pytest

from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError
from tests.conftest import partitioned_df

import keras  # noqa: E402  (conftest selected the backend)


def _mlp(seed=3):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def _rows(n=12, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return [(row.tolist(), float(row.sum())) for row in x]


# ---------------------------------------------------------------- item 4: a model from a .keras file

def test_a_keras_path_fits_as_the_model_it_holds_and_the_estimator_saves(spark, tmp_path):
    df = partitioned_df(spark, [_rows()], "x array<float>, y double")
    common = dict(featuresCol="x", labelCol="y", numWorkers=1, keepPartitioning=True, shuffle=False, epochs=2, batchSize=4, verbose=0)
    model = _mlp()
    path = str(tmp_path / "mlp.keras")
    model.save(path)
    from_memory = KerasEstimator(model=model, **common).fit(df)
    estimator = KerasEstimator(model="file://" + path, **common)  # compile Params come from the file's model
    assert estimator.getOrDefault("loss") == "mse" and estimator.getOrDefault("optimizer")["class_name"] == "SGD"
    from_file = estimator.fit(df)
    for a, b in zip(from_file.getKerasModel().get_weights(), from_memory.getKerasModel().get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert from_file.history["loss"] == from_memory.history["loss"]
    estimator.save(str(tmp_path / "est"))
    loaded = KerasEstimator.load(str(tmp_path / "est"))
    for a, b in zip(loaded.getKerasModel().get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ConfigError, match=r"KerasEstimator model needs a \.keras file .* no file at '.*nowhere\.keras'"):
        KerasEstimator(model=str(tmp_path / "nowhere.keras"))


# ---------------------------------------------------------------- item 2: token ids of any length

def _text_model(seed=4):
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(20, 4, mask_zero=True)(tokens)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(2, activation="softmax")(x))


def _token_rows(n, seed):
    rng = np.random.default_rng(seed)
    ids = [rng.integers(1, 20, size=int(rng.integers(1, 7))).tolist() for _ in range(n)]  # no 0: 0 is the padding id
    return ids, [int(sum(r) % 2) for r in ids]


@pytest.mark.parametrize("backend", ["rounds", pytest.param("ps", marks=pytest.mark.slow)])  # ps: a server and a barrier stage more
def test_token_ids_of_any_length_train_validate_evaluate_and_score_as_plain_keras_on_padded_batches(spark, backend):
    ids, labels = _token_rows(12, 0)
    val_ids, val_labels = _token_rows(5, 1)
    schema = "tokens array<int>, label long"
    df = partitioned_df(spark, [list(zip(ids, labels))], schema)
    val_df = partitioned_df(spark, [list(zip(val_ids, val_labels))], schema)
    est = KerasEstimator(model=_text_model(), optimizer="adam", loss="sparse_categorical_crossentropy", featuresCol="tokens",
                         labelCol="label", numWorkers=1, keepPartitioning=True, shuffle=False, epochs=2, batchSize=4,
                         backend=backend, verbose=0)
    fitted = est.fit(df, validationData=val_df) if backend == "rounds" else est.fit(df)
    plain = _text_model()
    plain.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    for _ in range(2):  # batches of 4 rows in order, each padded after its values to its own longest row
        for start in range(0, 12, 4):
            batch = keras.utils.pad_sequences(ids[start : start + 4], padding="post", value=0, dtype="int32")
            plain.train_on_batch(batch, np.asarray(labels[start : start + 4]))
    for got, want in zip(fitted.getKerasModel().get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    padded_val = keras.utils.pad_sequences(val_ids, padding="post", value=0, dtype="int32")
    want_val = plain.evaluate(padded_val, np.asarray(val_labels), batch_size=4, verbose=0)
    if backend == "rounds":
        np.testing.assert_allclose(fitted.history["val_loss"][-1], want_val, rtol=1e-5)
    np.testing.assert_allclose(fitted.evaluate(val_df)["loss"], want_val, rtol=1e-5)
    scored = fitted.transform(val_df).collect()
    np.testing.assert_allclose([r["probability"].toArray() for r in scored], plain.predict(padded_val, verbose=0), atol=1e-6)


def test_a_pad_value_an_integer_input_cannot_hold_is_refused_before_any_job(spark):
    df = partitioned_df(spark, [[([1, 2], 0), ([3], 1)]], "tokens array<int>, label long")
    est = KerasEstimator(model=_text_model(), loss="sparse_categorical_crossentropy", featuresCol="tokens", labelCol="label",
                         padValue=0.5, numWorkers=1, verbose=0)
    with pytest.raises(ConfigError, match=r"padValue must be a value the sequence input .* of dtype int32 holds .* Received: padValue=0.5"):
        est.fit(df)


# ---------------------------------------------------------------- item 3: a decoder given as a function

def _cnn(seed=11):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Conv2D(2, 2, activation="relu"), keras.layers.Flatten(),
                             keras.layers.Dense(2, activation="softmax")])


def test_a_decoder_given_as_a_function_of_main_fits_scores_saves_and_is_asked_for_again_at_load(spark, tmp_path):
    from tests.decoders import decode_raw

    def decode(data):  # a local function: no executor can import it, so it travels by value
        return np.frombuffer(data, np.uint8).reshape(4, 4, 3).astype(np.float32) / 255.0

    decode.__module__, decode.__qualname__ = "__main__", "decode"  # as a spark-submit script's or a notebook's function
    images = np.random.default_rng(0).integers(0, 256, size=(6, 4, 4, 3), dtype=np.uint8)
    df = partitioned_df(spark, [[(bytes(image.tobytes()), i % 2) for i, image in enumerate(images)]], "content binary, label long")
    common = dict(featuresCol="content", labelCol="label", loss="sparse_categorical_crossentropy", numWorkers=1,
                  keepPartitioning=True, shuffle=False, epochs=1, batchSize=3, verbose=0)
    by_value = KerasEstimator(model=_cnn(), decoders={"content": decode}, **common).fit(df)
    by_name = KerasEstimator(model=_cnn(), decoders={"content": "tests.decoders.decode_raw"}, **common).fit(df)  # module.function
    for a, b in zip(by_value.getKerasModel().get_weights(), by_name.getKerasModel().get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert by_value.getDecoders() == {"content": decode}
    scored = [r["probability"].toArray() for r in by_value.transform(df).collect()]
    expected = by_value.getKerasModel().predict(np.stack([decode_raw(image.tobytes()) for image in images]), verbose=0)
    np.testing.assert_allclose(scored, expected, atol=1e-6)
    by_value.save(str(tmp_path / "model"))
    from sparkdl import KerasModel

    with pytest.warns(UserWarning, match=r"decoder for column 'content' is '__main__:decode': it was given as a function defined in "
                                         r"__main__ .* \.setDecoders\(\{'content': decode\}\)"):
        loaded = KerasModel.load(str(tmp_path / "model"))
    assert loaded.getDecoders() == {"content": "__main__:decode"}
    with pytest.raises(ConfigError, match=r"decoder '__main__:decode' names a function of __main__ .* decoders=\{'content': decode\}"):
        loaded.transform(df)
    again = [r["probability"].toArray() for r in loaded.setDecoders({"content": decode}).transform(df).collect()]
    np.testing.assert_allclose(again, scored, atol=0)
