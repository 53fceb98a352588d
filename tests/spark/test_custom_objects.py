"""C13 / issue 5 item 2: registered custom layers, activations, losses and metrics work on the
executors (which never imported this module), for fit, transform and save -> load -> transform."""

import numpy as np
import pytest
from pyspark.sql import functions as F

import keras
from sparkdl import KerasEstimator, KerasModel
from sparkdl.errors import ConfigError


@keras.saving.register_keras_serializable(package="sparkdl_c13")
def swish_like(x):
    return x * keras.ops.sigmoid(x)


@keras.saving.register_keras_serializable(package="sparkdl_c13")
class Scale(keras.layers.Layer):
    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


@keras.saving.register_keras_serializable(package="sparkdl_c13")
def double_mae(y_true, y_pred):
    return keras.ops.mean(keras.ops.abs(y_true - y_pred), axis=-1) * 2.0


def _model():
    keras.utils.set_random_seed(11)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation=swish_like), Scale(0.5), keras.layers.Dense(1)])


def _data(spark):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = (x.sum(axis=1) * 0.5).astype(np.float32)
    df = spark.createDataFrame([([float(v) for v in xi], float(yi)) for xi, yi in zip(x, y)], "x array<float>, y float")
    return x, y, df


def test_c13_registered_custom_objects_train_and_score_on_executors(spark, tmp_path):
    x, y, df = _data(spark)
    est = KerasEstimator(model=_model(), optimizer=keras.optimizers.SGD(0.05), loss=double_mae, metrics=[double_mae],
                         featuresCol="x", labelCol="y", numWorkers=1, epochs=3, batchSize=4, shuffle=False,
                         keepPartitioning=True, verbose=0)
    fitted = est.fit(df.coalesce(1))
    plain = _model()
    plain.compile(optimizer=keras.optimizers.SGD(0.05), loss=double_mae, metrics=[double_mae])
    history = plain.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0).history
    for got, want in zip(fitted.getKerasModel().get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(fitted.history["loss"], history["loss"], rtol=1e-5)
    expected = plain.predict(x, verbose=0)[:, 0]
    scored = fitted.transform(df.orderBy(F.rand(5))).toPandas()
    np.testing.assert_allclose(
        scored.sort_values("y")["prediction"].to_numpy(), expected[np.argsort(y, kind="stable")], rtol=1e-5, atol=1e-6
    )
    fitted.save(str(tmp_path / "m"))
    reloaded = KerasModel.load(str(tmp_path / "m")).transform(df).select("prediction").toPandas()["prediction"].to_numpy()
    np.testing.assert_allclose(reloaded, expected, rtol=1e-5, atol=1e-6)


def test_custom_objects_defined_in_a_notebook_cell_travel_by_value(spark):
    """A function registered inside a function (as in a notebook's __main__) has no module to import:
    it travels by value and is registered on the executors before the model is rebuilt."""

    @keras.saving.register_keras_serializable(package="sparkdl_cell")
    def cell_activation(x):
        return keras.ops.tanh(x) * 2.0

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation=cell_activation)])
    x, y, df = _data(spark)
    fitted = KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.0), loss="mse", featuresCol="x", labelCol="y",
                            numWorkers=2, epochs=1, batchSize=4, verbose=0).fit(df)
    out = fitted.transform(df).select("prediction").toPandas()["prediction"].to_numpy()
    np.testing.assert_allclose(out, model.predict(x, verbose=0)[:, 0], rtol=1e-5, atol=1e-6)


def test_unregistered_custom_function_is_named_on_the_driver(spark):
    def not_registered(x):
        return x

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation=not_registered)])
    with pytest.raises(ConfigError, match="not_registered"):
        KerasEstimator(model=model, loss="mse")
