"""Issue 5 item 9: a fit on backend ``rounds`` (whose round results come back through the driver;
``auto`` picks ``ps`` on ``local[2]``, whose updates travel through its server) whose round results
would exceed ``spark.driver.maxResultSize`` fails before its first round with a ``ConfigError`` naming the setting, not as a raw ``Py4JJavaError``
after a round of work.

Runs in a subprocess: ``spark.driver.maxResultSize`` is fixed when a SparkContext starts.
"""

import textwrap

import pytest

from tests.conftest import run_spark_script

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    import keras
    from sparkdl import KerasEstimator
    from sparkdl.errors import ConfigError
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.maxResultSize", "1m").getOrCreate())
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(400), keras.layers.Dense(1)])  # ~1.3 MB of weights
    df = spark.createDataFrame([([0.5] * 784, 1.0)] * 8, "x array<float>, y double")
    est = KerasEstimator(model=model, optimizer="sgd", loss="mse", featuresCol="x", labelCol="y", numWorkers=2, verbose=0,
                         backend="rounds")
    try:
        est.fit(df)
        out = {"error": None}
    except ConfigError as exc:
        out = {"error": type(exc).__name__, "message": str(exc)}
    json.dump(out, open(sys.argv[1], "w"))
    spark.stop()
    """
)


@pytest.mark.slow
def test_results_over_max_result_size_name_the_setting(tmp_path):
    got = run_spark_script(SCRIPT, tmp_path, timeout_s=600)
    assert got["error"] == "ConfigError", got
    message = got["message"]  # 2 workers' updates, combined on the driver, over the limit: the size and the setting named
    assert "must fit spark.driver.maxResultSize (1048576 bytes)" in message and "--conf spark.driver.maxResultSize=" in message, message
