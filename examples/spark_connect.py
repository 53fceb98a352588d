# %% [markdown]
# # sparkdl on Spark Connect
#
# Spark Connect runs the driver's Spark side in a server; your Python is a thin client. sparkdl's
# `fit`, `transform`, `evaluate` and `save`/`load` work on a Connect session as on a classic one.
# This example starts a local Connect server with `SparkSession.builder.remote("local[2]")` (use
# `remote("sc://host:15002")` for a real one), fits on both backends, scores, saves and loads.
#
# Needs the Connect client's packages: `pip install -e '.[cpu,connect]'`. Run it from the repository
# root:
#
#     python examples/spark_connect.py
#
# or as a notebook (`jupytext --to notebook examples/spark_connect.py`). A Connect session cannot
# share a Python process with a classic one: run it in a fresh process or kernel. About a minute.

# %%
import os
import sys
import tempfile
import warnings

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from pyspark.sql import SparkSession

from sparkdl import KerasEstimator, KerasModel

# remote("local[2]") starts the server here, with the builder's settings (pyspark then warns that it
# cannot change the static ones again at runtime: harmless, silenced here)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    spark = (SparkSession.builder.remote("local[2]").appName("connect")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
print("Spark Connect session:", type(spark).__module__)

# %% [markdown]
# ## Data: y = 2a - b + 1 with a little noise

# %%
rng = np.random.default_rng(0)
rows = [(float(a), float(b), float(2 * a - b + 1 + rng.normal(0, 0.05))) for a, b in rng.uniform(-1, 1, size=(200, 2))]
df = spark.createDataFrame(rows, "a double, b double, y double")


def estimator(backend):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    return KerasEstimator(model=model, optimizer=keras.optimizers.Adam(0.1), loss="mse", metrics=["mae"],
                          featuresCols=["a", "b"], labelCol="y", numWorkers=2, epochs=20, batchSize=16,
                          seed=0, verbose=0, backend=backend)


# %% [markdown]
# ## Fit on both backends
# On Connect there is no broadcast: each round's weights travel inside the task's plan. On backend
# `ps` the parameter server runs in this client's process; a remote server's executors must reach it
# (`spark.conf.set("spark.sparkdl.ps.host", "<this machine's address>")`).

# %%
fitted = estimator("rounds").fit(df)
on_ps = estimator("ps").fit(df)
for name, model in (("rounds", fitted), ("ps", on_ps)):
    print(f"weights ({name}):", [[round(float(v), 2) for v in w.ravel()] for w in model.getKerasModel().get_weights()])

# %% [markdown]
# ## Score, evaluate, save and load
# `save`/`load` write the model files from this client (through `pyarrow.fs`) and the metadata from
# the server, so both must reach the path: here a local folder, as the server runs on this machine.

# %%
fitted.transform(df).select("a", "b", "y", "prediction").show(3)
mae = fitted.evaluate(df)["mae"]
print(f"mae: {mae:.3f}")
path = os.path.join(tempfile.mkdtemp(prefix="sparkdl-connect-"), "model")
fitted.save(path)
loaded = KerasModel.load(path)
first = [r["prediction"] for r in fitted.transform(df).orderBy("a").limit(5).collect()]
again = [r["prediction"] for r in loaded.transform(df).orderBy("a").limit(5).collect()]
print("loaded model predicts the same:", np.allclose(first, again, atol=1e-6))
assert mae < 0.2 and np.allclose(first, again, atol=1e-6), mae

spark.stop()  # ends the local Connect server too
