"""classWeight with a loss's ignore_class: one worker in the input's order trains exactly as
``keras.Model.fit(class_weight=...)`` on the same rows, the ignored rows (label -1) weighted as Keras
weighs them (1.0, not the highest class's weight), weighted metrics included."""

import numpy as np

from sparkdl import KerasEstimator
from tests.conftest import partitioned_df

import keras  # noqa: E402

CLASS_WEIGHT = {0: 0.5, 1: 2.0, 2: 6.0}


def _model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])


def _compile_args():
    return dict(optimizer=keras.optimizers.SGD(0.3), loss=keras.losses.SparseCategoricalCrossentropy(ignore_class=-1),
                metrics=["accuracy"], weighted_metrics=["accuracy"])


def test_class_weight_with_ignored_labels_trains_as_keras_fit(spark):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(30, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=30)
    y[rng.permutation(30)[:9]] = -1  # 9 rows the loss ignores
    df = partitioned_df(spark, [[(x[i].tolist(), int(y[i])) for i in range(30)]], "x array<float>, y int")
    args = _compile_args()
    fitted = KerasEstimator(model=_model(), optimizer=args["optimizer"], loss=args["loss"], metrics=args["metrics"],
                            weightedMetrics=args["weighted_metrics"], featuresCol="x", labelCol="y", classWeight=CLASS_WEIGHT,
                            numWorkers=1, keepPartitioning=True, shuffle=False, epochs=3, batchSize=8, verbose=0).fit(df)
    plain = _model()
    plain.compile(**_compile_args())
    history = plain.fit(x, y, class_weight=CLASS_WEIGHT, batch_size=8, epochs=3, shuffle=False, verbose=0).history
    for got, want in zip(fitted.getKerasModel().get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert sorted(fitted.history) == sorted(history) == ["accuracy", "loss", "weighted_accuracy"]
    for key in history:
        np.testing.assert_allclose(fitted.history[key], history[key], atol=1e-5)
    # the ignored rows count in the weighted accuracy with weight 1 (Keras); with the highest class's weight 6.0
    # it would be lower: rows labelled -1 are never right
    assert history["weighted_accuracy"][-1] != history["accuracy"][-1]
