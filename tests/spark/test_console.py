"""Spark's console progress bar (``[Stage 21:> (0 + 2) / 2]``) is off while a fit prints its own lines
(``verbose`` > 0), and running again after the fit, also a failed one (issue 23)."""

import numpy as np
import pytest

from sparkdl import KerasEstimator
from sparkdl.errors import SchemaError
from sparkdl.spark.internals import progress_bar_hidden
from tests.conftest import partitioned_df

import keras  # noqa: E402


def set_bar(spark, on: bool):
    """Give the session's SparkContext a running ConsoleProgressBar (as spark.ui.showConsoleProgress=true at
    start would), or stop and remove it (the test session starts without one)."""
    jsc, jvm = spark.sparkContext._jsc.sc(), spark.sparkContext._jvm
    field = jsc.getClass().getDeclaredField("_progressBar")
    field.setAccessible(True)
    if jsc.progressBar().isDefined():
        jsc.progressBar().get().stop()
    field.set(jsc, jvm.scala.Option.apply(jvm.org.apache.spark.ui.ConsoleProgressBar(jsc)) if on else jvm.scala.Option.empty())
    return jsc


def test_a_verbose_fit_hides_sparks_progress_bar_and_gives_a_running_one_back(spark):
    rng = np.random.default_rng(0)
    rows = [(rng.normal(size=2).astype(np.float32).tolist(), float(i % 2)) for i in range(16)]
    df = partitioned_df(spark, [rows[:8], rows[8:]], "x array<float>, y double")
    seen = []

    class Probe(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(jsc.progressBar().isDefined())

    def estimator(**params):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        base = dict(optimizer="sgd", loss="mse", featuresCol="x", labelCol="y", numWorkers=2, batchSize=4, callbacks=[Probe()])
        return KerasEstimator(model=model, **{**base, **params})

    jsc = set_bar(spark, True)
    try:
        before = jsc.progressBar().get()
        estimator(verbose=1).fit(df)
        assert seen == [False]  # no bar while the epoch lines print
        after = jsc.progressBar()
        assert after.isDefined() and not after.get().equals(before)  # a new bar, its refresh thread running

        with progress_bar_hidden(spark, hide=False):  # what a silent fit (verbose=0) asks for: the bar left alone
            assert jsc.progressBar().get().equals(after.get())
        with progress_bar_hidden(spark), progress_bar_hidden(spark):  # nested (two fits at once): one hiding
            assert not jsc.progressBar().isDefined()
        assert jsc.progressBar().isDefined()

        with pytest.raises(SchemaError):
            estimator(verbose=1, featuresCol="missing").fit(df)
        assert jsc.progressBar().isDefined()  # back after a failed fit too
    finally:
        set_bar(spark, False)
    assert not jsc.progressBar().isDefined()
