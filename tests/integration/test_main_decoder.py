"""Issue 23 item 3: a spark-submit script that defines its decoder in ``__main__`` (a module the
executors cannot import) passes the function itself: it travels to the executors by value, as custom
objects of ``__main__`` do, and the fit trains and scores. The save keeps the decoder's name; a fresh
process that loads it is told which column's decoder to pass again, and scores identically once given it.
(Its cheap kind runs by default in tests/spark/test_model_sources.py.)"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import ROOT, spark_submit_main

SCRIPT = textwrap.dedent('''
    import json, sys
    import keras
    import numpy as np
    from pyspark.sql import SparkSession
    from sparkdl import KerasEstimator

    def decode(data):
        return np.frombuffer(data, np.uint8).reshape(4, 4, 3).astype(np.float32) / 255.0

    out = sys.argv[1]
    spark = SparkSession.builder.getOrCreate()
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Conv2D(2, 2, activation="relu"), keras.layers.Flatten(),
                              keras.layers.Dense(2, activation="softmax")])
    images = np.random.default_rng(1).integers(0, 256, size=(8, 4, 4, 3), dtype=np.uint8)
    df = spark.createDataFrame([(i, bytearray(image.tobytes()), i % 2) for i, image in enumerate(images)],
                               "id long, content binary, label long")
    fitted = KerasEstimator(model=model, loss="sparse_categorical_crossentropy", featuresCol="content", labelCol="label",
                            decoders={"content": decode}, numWorkers=2, epochs=2, batchSize=4, verbose=0).fit(df)
    scored = fitted.transform(df).orderBy("id").collect()
    fitted.save(out + "/model")
    df.write.parquet(out + "/data.parquet")
    expected = fitted.getKerasModel().predict(np.stack([decode(bytes(r["content"])) for r in scored]), verbose=0)
    json.dump({"probability": [r["probability"].toArray().tolist() for r in scored], "expected": expected.tolist(),
               "loss": fitted.history["loss"]}, open(out + "/out.json", "w"))
    spark.stop()
''')

LOAD = textwrap.dedent('''
    import json, sys, warnings
    import numpy as np
    from pyspark.sql import SparkSession
    from sparkdl import KerasModel

    out = sys.argv[1]
    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = KerasModel.load(out + "/model")
    df = spark.read.parquet(out + "/data.parquet")
    try:
        model.transform(df)
        refused = None
    except Exception as exc:
        refused = str(exc)
    scored = model.setDecoders({"content": "tests.decoders:decode_raw"}).transform(df).orderBy("id").collect()
    json.dump({"warnings": [str(w.message) for w in caught], "refused": refused,
               "probability": [r["probability"].toArray().tolist() for r in scored]}, open(out + "/loaded.json", "w"))
    spark.stop()
''')


@pytest.mark.slow  # two Python processes with Spark and Keras (about a minute; 15 min on a machine loaded 20 times over)
@pytest.mark.timeout(1800)
def test_a_decoder_defined_in_main_of_a_spark_submit_script_fits_scores_and_is_asked_for_at_load(tmp_path):
    trained = spark_submit_main(SCRIPT, tmp_path)
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    assert len(trained["loss"]) == 2 and np.isfinite(trained["loss"]).all()
    np.testing.assert_allclose(trained["probability"], trained["expected"], atol=1e-6)
    (tmp_path / "load.py").write_text(LOAD)
    fresh = subprocess.run([sys.executable, str(tmp_path / "load.py"), str(tmp_path)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    loaded = json.loads((tmp_path / "loaded.json").read_text())
    assert any("decoder for column 'content' is '__main__:decode'" in w and ".setDecoders({'content': decode})" in w
               for w in loaded["warnings"]), loaded["warnings"]
    assert loaded["refused"] is not None and "names a function of __main__" in loaded["refused"], loaded["refused"]
    np.testing.assert_allclose(loaded["probability"], trained["probability"], atol=1e-6)
