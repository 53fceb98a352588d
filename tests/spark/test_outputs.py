"""transform's output by loss family, as Spark ML classifiers write it: vectors that Spark's
evaluators and CrossValidator read, classifier methods, errors with counts over the input."""

import numpy as np
import pytest
from pyspark.ml.evaluation import BinaryClassificationEvaluator, MulticlassClassificationEvaluator
from pyspark.ml.linalg import DenseVector, VectorUDT
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
from pyspark.sql import functions as F

from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError, SchemaError
from tests.conftest import partitioned_df

import keras  # noqa: E402


def _frozen_fit(spark, model, loss, rows, schema, **params):
    """Fit with SGD(0): the KerasModel keeps the given weights, so outputs have closed forms."""
    df = spark.createDataFrame(rows, schema)
    est = KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.0), loss=loss, numWorkers=1, verbose=0, **params)
    return est.fit(df), df


def _linear(inputs, units, kernel, bias):
    model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(units)])
    model.set_weights([np.asarray(kernel, np.float32).reshape(inputs, units), np.asarray(bias, np.float32).reshape(units)])
    return model


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _auc(scores, labels):
    """Area under the ROC curve by hand: P(score of a positive > score of a negative), ties 1/2."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    greater = (pos[:, None] > neg[None, :]).mean()
    ties = (pos[:, None] == neg[None, :]).mean()
    return greater + 0.5 * ties


def _shuffled(spark, rows, schema):
    """The rows after a shuffle (orderBy a seeded random key), as a user's join/sort result would come."""
    return spark.createDataFrame(rows, schema).orderBy(F.rand(3))


@pytest.mark.parametrize("loss", [keras.losses.SparseCategoricalCrossentropy(name="scce"), "SparseCategoricalCrossentropy"])
def test_c4_named_sparse_loss_trains_on_class_indices_like_plain_keras(spark, loss):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 3)).astype(np.float32)
    y = rng.integers(0, 3, 24)

    def model():
        keras.utils.set_random_seed(5)
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, activation="softmax")])

    df = _shuffled(spark, [(x[i].tolist(), int(y[i])) for i in range(24)], "features array<double>, label int")
    fitted = KerasEstimator(model=model(), optimizer=keras.optimizers.SGD(0.5), loss=loss, numWorkers=1, epochs=3,
                            batchSize=64, verbose=0).fit(df)  # one full-batch step per epoch: row order cannot matter
    plain = model()
    plain.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
    plain.fit(x, y, batch_size=64, epochs=3, shuffle=False, verbose=0)
    for got, want in zip(fitted.getKerasModel().get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert fitted.getTask() == "classification" and fitted.numClasses == 3


def test_c4_named_binary_loss_gives_a_classifier(spark):
    model = _linear(1, 1, [[1.0]], [0.0])
    sigmoid = keras.Sequential([model, keras.layers.Activation("sigmoid")])
    fitted, df = _frozen_fit(spark, sigmoid, keras.losses.BinaryCrossentropy(name="bce_loss"),
                             [(v, float(v > 0)) for v in (-2.0, -0.1, 0.0, 0.4, 3.0)], "features double, label double")
    assert fitted.getTask() == "classification"
    out = fitted.transform(df)
    assert isinstance(out.schema["probability"].dataType, VectorUDT)  # known without a job
    got = out.collect()
    p = _sigmoid(np.array([-2.0, -0.1, 0.0, 0.4, 3.0]))
    assert [r["prediction"] for r in got] == (p >= 0.5).astype(float).tolist()
    np.testing.assert_allclose(np.array([r["probability"].toArray() for r in got]), np.stack([1 - p, p], axis=1), rtol=1e-6)
    assert fitted.numClasses == 2


def test_c5_hinge_prediction_is_the_margin_sign_with_no_probability(spark):
    m = np.array([-1.5, -0.2, 0.3, 2.0])
    fitted, df = _frozen_fit(spark, _linear(1, 1, [[1.0]], [0.0]), keras.losses.Hinge(name="my_hinge"),
                             [(float(v), float(np.sign(v))) for v in m], "features double, label double")
    out = fitted.transform(df)
    assert out.columns == ["features", "label", "prediction", "rawPrediction"]
    got = out.collect()
    assert [r["prediction"] for r in got] == [0.0, 0.0, 1.0, 1.0]
    np.testing.assert_allclose(np.array([r["rawPrediction"].toArray() for r in got]), np.stack([-m, m], axis=1), rtol=1e-6)
    assert fitted.numClasses == 2
    with pytest.raises(ConfigError, match="hinge losses give margins. Received: loss 'hinge'"):
        fitted.predictProbability([0.3])


def test_c5_multi_label_logits_get_a_sigmoid_per_label(spark):
    kernel = np.array([[1.0, -2.0, 0.5], [0.5, 1.0, -1.0]])
    bias = np.array([0.1, -0.2, 0.0])
    x = np.array([[1.0, 2.0], [-1.0, 0.5], [0.0, -3.0]])
    fitted, df = _frozen_fit(spark, _linear(2, 3, kernel, bias), keras.losses.BinaryCrossentropy(from_logits=True),
                             [(x[i].tolist(), [1.0, 0.0, 1.0]) for i in range(3)], "features array<double>, label array<double>")
    out = fitted.transform(df)
    assert dict(out.dtypes)["prediction"] == "array<double>"
    got = out.collect()
    z = x @ kernel + bias
    probability = np.array([r["probability"].toArray() for r in got])
    np.testing.assert_allclose(probability, _sigmoid(z), rtol=1e-5)
    assert not np.allclose(probability.sum(axis=1), 1.0)  # not a softmax across labels
    assert [r["prediction"] for r in got] == (z >= 0).astype(float).tolist()


def test_c5_categorical_hinge_is_argmax_without_probability(spark):
    kernel = np.array([[1.0, -1.0, 0.0], [0.0, 1.0, -2.0]])
    x = np.array([[2.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    fitted, df = _frozen_fit(spark, _linear(2, 3, kernel, np.zeros(3)), "categorical_hinge",
                             [(x[i].tolist(), [1.0, 0.0, 0.0]) for i in range(3)], "features array<double>, label array<double>")
    out = fitted.transform(df)
    assert "probability" not in out.columns
    got = out.collect()
    assert [r["prediction"] for r in got] == (x @ kernel).argmax(axis=1).astype(float).tolist()


def test_c15_regression_loss_with_task_classification_gives_probabilities_in_unit_interval(spark):
    o = np.array([-2.0, 0.3, 0.5, 3.0])
    fitted, df = _frozen_fit(spark, _linear(1, 1, [[1.0]], [0.0]), "mse", [(float(v), 1.0) for v in o],
                             "features double, label double", task="classification")
    got = fitted.transform(df).collect()
    probability = np.array([r["probability"].toArray() for r in got])
    assert probability.min() >= 0.0 and probability.max() <= 1.0
    p = np.clip(o, 0, 1)
    np.testing.assert_allclose(probability, np.stack([1 - p, p], axis=1), rtol=1e-6)
    assert [r["prediction"] for r in got] == [0.0, 0.0, 1.0, 1.0]
    assert fitted.predictProbability([3.0]).toArray().tolist() == [0.0, 1.0]


def test_c15_classifier_methods_match_transform(spark):
    kernel = np.array([[1.0, -1.0, 0.2], [0.3, 0.4, -0.5]])
    softmax = keras.Sequential([_linear(2, 3, kernel, np.zeros(3)), keras.layers.Softmax()])
    x = [[0.5, 1.0], [-2.0, 0.3], [1.5, -1.0]]
    fitted, df = _frozen_fit(spark, softmax, "sparse_categorical_crossentropy", [(v, 0) for v in x], "features array<double>, label int")
    rows = fitted.transform(df).collect()
    assert fitted.numClasses == 3
    for r in rows:
        assert fitted.predict(DenseVector(r["features"])) == fitted.predict(r["features"]) == r["prediction"]
        np.testing.assert_allclose(fitted.predictProbability(np.array(r["features"])).toArray(), r["probability"].toArray(), rtol=1e-6)
        np.testing.assert_allclose(fitted.predictRaw(r["features"]).toArray(), r["rawPrediction"].toArray(), rtol=1e-6)
    with pytest.raises(SchemaError, match=r"must hold 2 numbers .*Received: 3 values"):
        fitted.predict([1.0, 2.0, 3.0])
    regressor, _ = _frozen_fit(spark, _linear(1, 1, [[2.0]], [1.0]), "mse", [(1.0, 3.0)], "features double, label double")
    assert regressor.predict([2.0]) == 5.0
    with pytest.raises(ConfigError, match="numClasses needs a classifier.*Received: task 'regression'"):
        regressor.numClasses  # noqa: B018


def test_c6_array_scores_on_request_and_columns_left_out_when_named_empty(spark):
    fitted, df = _frozen_fit(spark, _linear(1, 2, [[1.0, -1.0]], [0.0, 0.0]), keras.losses.CategoricalCrossentropy(from_logits=True),
                             [(1.0, [1.0, 0.0])], "features double, label array<double>")
    arrays = fitted.copy().setScoreColumnType("array").transform(df)
    assert dict(arrays.dtypes)["probability"] == "array<double>" and dict(arrays.dtypes)["rawPrediction"] == "array<double>"
    np.testing.assert_allclose(arrays.first()["probability"], [_sigmoid(2.0), _sigmoid(-2.0)], rtol=1e-6)
    assert fitted.copy().setRawPredictionCol("").transform(df).columns == ["features", "label", "prediction", "probability"]


@pytest.mark.slow  # CrossValidator runs by default in test_params.py
def test_c6_evaluators_read_transform_output_like_numpy(spark):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 2))
    kernel = np.array([[1.0, -0.5, 0.2], [0.4, 0.6, -1.0]])
    y = (x @ kernel + rng.normal(scale=1.0, size=(40, 3))).argmax(axis=1)
    fitted, _ = _frozen_fit(spark, _linear(2, 3, kernel, np.zeros(3)), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                            [(x[i].tolist(), int(y[i])) for i in range(40)], "features array<double>, label int")
    rows = [(i, x[i].tolist(), float(y[i]), float(y[i] == 2)) for i in range(40)]
    df = _shuffled(spark, rows, "id int, features array<double>, label double, is2 double")
    out = fitted.transform(df).cache()
    ids = np.array([r["id"] for r in out.select("id").collect()])
    z = x[ids] @ kernel
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    labels = y[ids]
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(out)
    log_loss = MulticlassClassificationEvaluator(metricName="logLoss").evaluate(out)
    assert accuracy == pytest.approx((z.argmax(axis=1) == labels).mean(), abs=1e-12)
    assert log_loss == pytest.approx(-np.log(p[np.arange(40), labels]).mean(), rel=1e-5)
    # Class 2 against the rest, scored by its logit: Spark reads rawPrediction[1] of a 2-vector, so give it [-s, s].
    binary, _ = _frozen_fit(spark, _linear(2, 1, kernel[:, 2:], [0.0]), keras.losses.BinaryCrossentropy(from_logits=True),
                            [(x[0].tolist(), 0.0)], "features array<double>, label double")
    auc = BinaryClassificationEvaluator(labelCol="is2").evaluate(binary.transform(df))
    assert auc == pytest.approx(_auc(x @ kernel[:, 2], (y == 2).astype(int)), abs=1e-9)
    out.unpersist()


@pytest.mark.slow
def test_c6_cross_validator_over_epochs_matches_metrics_by_hand(spark):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(40, 2)).astype(np.float32)
    y = (x[:, 0] - 0.5 * x[:, 1] + rng.normal(scale=0.5, size=40) > 0).astype(float)
    df = spark.createDataFrame([(x[i].tolist(), float(y[i]), i % 2) for i in range(40)], "features array<double>, label double, fold int")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, activation="sigmoid")])
    est = KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy", numWorkers=1, batchSize=8, verbose=0)
    grid = ParamGridBuilder().addGrid(est.epochs, [1, 3]).build()
    for evaluator in (BinaryClassificationEvaluator(), MulticlassClassificationEvaluator(metricName="logLoss")):
        cv = CrossValidator(estimator=est, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, foldCol="fold",
                            collectSubModels=True).fit(df)
        for j in range(len(grid)):
            by_hand = []
            for fold in range(2):
                keep = np.arange(40) % 2 == fold
                p = cv.subModels[fold][j].getKerasModel().predict(x[keep], verbose=0)[:, 0].astype(np.float64)
                if isinstance(evaluator, BinaryClassificationEvaluator):
                    by_hand.append(_auc(p, y[keep].astype(int)))
                else:
                    by_hand.append(-np.log(np.where(y[keep] == 1, p, 1 - p)).mean())
            assert cv.avgMetrics[j] == pytest.approx(np.mean(by_hand), rel=1e-5)


def test_c11_check_features_raises_schema_error_with_counts_over_the_whole_input(spark):
    fitted, _ = _frozen_fit(spark, _linear(3, 1, np.ones(3), [0.0]), "mse", [([1.0, 2.0, 3.0], 6.0)], "features array<double>, label double")
    rows = [(i, [1.0, 2.0, 3.0]) for i in range(20)] + [(20, None), (21, [1.0, 2.0]), (22, [1.0, 2.0, 3.0, 4.0]), (23, [1.0, None, 3.0])]
    df = spark.createDataFrame(rows, "id int, features array<double>").repartition(4)  # bad rows spread over partitions
    with pytest.raises(SchemaError, match=r"must hold 3 non-null values per row .*Received, of 24 rows: 1 null rows, "
                                          r"1 rows with null elements, 2 rows of 2 to 4 values"):
        fitted.setCheckFeatures(True).transform(df)
    ok = fitted.transform(spark.createDataFrame(rows[:20], "id int, features array<double>").repartition(3))
    assert sorted(r["prediction"] for r in ok.collect()) == [6.0] * 20


def test_transform_is_lazy_by_default_and_the_scoring_task_names_the_bad_batch_and_its_partitions_count(spark):
    """Issue 31 item 15: the default (``checkFeatures=False``) runs no check job, so transform is as
    fast as without a check, and stays as safe: the task that meets a bad row raises ``SchemaError``
    naming the column, the batch and the partition, with the partition's bad rows counted in all."""
    fitted, _ = _frozen_fit(spark, _linear(3, 1, np.ones(3), [0.0]), "mse", [([1.0, 2.0, 3.0], 6.0)], "features array<double>, label double")
    assert fitted.getCheckFeatures() is False
    rows = [(i, [1.0, 2.0, 3.0]) for i in range(30)]
    rows[15], rows[25] = (15, [1.0, 2.0]), (25, [1.0, float("nan"), 3.0])  # one bad row in the second and in the last batch
    df = partitioned_df(spark, [rows], "id int, features array<double>")
    sc = spark.sparkContext
    sc.setJobGroup("lazy-transform", "lazy transform")
    try:
        scored = fitted.transform(df)
        assert list(sc.statusTracker().getJobIdsForGroup("lazy-transform")) == []  # nothing ran yet
    finally:
        sc.setJobGroup("", "")
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        with pytest.raises(Exception, match=r"(?s)SchemaError: transform, partition 0, a batch of 10 rows: column 'features' must hold 3 "
                                            r".*This partition holds 2 such rows of the 30 it was given"):
            scored.collect()
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    good = fitted.transform(spark.createDataFrame(rows[:15], "id int, features array<double>"))
    assert sorted(r["prediction"] for r in good.collect()) == [6.0] * 15


def test_c11_misspelled_metric_fails_before_any_job(spark):
    tracker = spark.sparkContext.statusTracker()
    before = tracker.getJobIdsForGroup()
    with pytest.raises(ConfigError, match="Received: metrics='acuracy'$"):
        KerasEstimator(model=_linear(1, 1, [[1.0]], [0.0]), loss="mse", metrics=["acuracy"])
    assert tracker.getJobIdsForGroup() == before


def test_c11_streaming_input_skips_the_check_job_and_tasks_name_the_bad_batch(spark, tmp_path):
    fitted, _ = _frozen_fit(spark, _linear(3, 1, np.ones(3), [0.0]), "mse", [([1.0, 2.0, 3.0], 6.0)], "features array<double>, label double")
    source = tmp_path / "in"
    spark.createDataFrame([(0, [1.0, 2.0, 3.0]), (1, [1.0, 2.0])], "id int, features array<double>").coalesce(1).write.json(str(source))
    stream = spark.readStream.schema("id int, features array<double>").json(str(source))
    scored = fitted.transform(stream)  # no job may run on a streaming DataFrame: the check is left to the tasks
    assert scored.isStreaming and scored.columns == ["id", "features", "prediction"]
    query = scored.writeStream.format("memory").queryName("sparkdl_bad_stream").trigger(availableNow=True).start()
    with pytest.raises(Exception, match=r"SchemaError: transform, partition 0, a batch of 2 rows: column 'features' must hold 3 values"):
        query.awaitTermination(120)
    query.stop()
