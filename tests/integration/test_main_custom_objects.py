"""Issue 10 item 4 (C13's kind): a spark-submit script that defines its custom layer, activation and
loss in ``__main__`` (a module the executors cannot import) fits, transforms and saves; the save loads
and predicts in a fresh process that imports the same objects from a module of its own."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import ROOT, spark_submit_main

OBJECTS = textwrap.dedent('''
    import keras

    @keras.saving.register_keras_serializable(package="main_c13")
    class Scale(keras.layers.Layer):
        def __init__(self, factor=1.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def call(self, x):
            return x * self.factor

        def get_config(self):
            return {**super().get_config(), "factor": self.factor}

    @keras.saving.register_keras_serializable(package="main_c13")
    def swish_like(x):
        return x * keras.ops.sigmoid(x)

    @keras.saving.register_keras_serializable(package="main_c13")
    def double_mae(y_true, y_pred):
        return keras.ops.mean(keras.ops.abs(y_true - y_pred), axis=-1) * 2.0
''')

SCRIPT = OBJECTS + textwrap.dedent('''
    import json, sys
    import numpy as np
    from pyspark.sql import SparkSession
    from sparkdl import KerasEstimator

    out = sys.argv[1]
    spark = SparkSession.builder.getOrCreate()
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation=swish_like), Scale(0.5), keras.layers.Dense(1)])
    x = np.random.default_rng(1).normal(size=(8, 3)).astype(np.float32)
    df = spark.createDataFrame([(row.tolist(), float(row.sum())) for row in x], "x array<float>, y float")
    fitted = KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.05), loss=double_mae, metrics=[double_mae],
                            featuresCol="x", labelCol="y", numWorkers=2, epochs=2, batchSize=4, verbose=0).fit(df)
    scored = fitted.transform(df).collect()
    fitted.save(out + "/model")
    json.dump({"x": [r["x"] for r in scored], "prediction": [r["prediction"] for r in scored],
               "loss": fitted.history["loss"]}, open(out + "/out.json", "w"))
    spark.stop()
''')

LOAD = textwrap.dedent('''
    import json, sys
    import numpy as np
    import c13_objects  # registers Scale, swish_like and double_mae under the same names
    from pyspark.sql import SparkSession
    from sparkdl import KerasModel

    out = sys.argv[1]
    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    model = KerasModel.load(out + "/model")
    x = np.asarray(json.load(open(out + "/out.json"))["x"], np.float32)
    json.dump({"prediction": model.getKerasModel().predict(x, verbose=0)[:, 0].tolist()}, open(out + "/loaded.json", "w"))
    spark.stop()
''')


@pytest.mark.slow  # its kind (C13) runs by default in tests/spark/test_custom_objects.py
def test_custom_objects_defined_in_main_of_a_spark_submit_script(tmp_path):
    (tmp_path / "c13_objects.py").write_text(OBJECTS)
    (tmp_path / "load.py").write_text(LOAD)
    trained = spark_submit_main(SCRIPT, tmp_path)
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    assert len(trained["prediction"]) == 8 and len(trained["loss"]) == 2 and np.isfinite(trained["loss"]).all()
    fresh = subprocess.run([sys.executable, str(tmp_path / "load.py"), str(tmp_path)], cwd=tmp_path,
                           env=dict(env, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}"), capture_output=True, text=True, timeout=600)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    loaded = json.loads((tmp_path / "loaded.json").read_text())["prediction"]
    np.testing.assert_allclose(loaded, trained["prediction"], atol=1e-5)
    # without the module the load names the missing objects
    missing = subprocess.run([sys.executable, "-c", LOAD.replace("import c13_objects", "pass"), str(tmp_path)], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=600)
    last = missing.stderr.strip().splitlines()[-1]
    assert missing.returncode != 0 and "main_c13>double_mae" in last and "register" in last, last
