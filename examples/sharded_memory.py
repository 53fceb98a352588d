# %% [markdown]
# # Size the memory of a `sharded` fit
#
# A `sharded` fit keeps the model's state (weights and optimizer state) in its workers' slices; the
# driver reads it once, at the end, to assemble the fitted model. This example sizes the driver,
# each executor's Python worker and the JVMs for a model of P parameters with Adam (the numbers of
# [Backend sharded: Memory sizing](../docs/user-guide/sharded.md#memory-sizing)), starts a session
# with those settings and fits on `sharded` with `maxTaskMemoryMB` set, checking that the driver
# read the state once: 12 bytes a parameter.
#
# Run it from the repository root, with sparkdl installed (`pip install -e '.[cpu]'`):
#
#     python examples/sharded_memory.py
#
# or as a notebook (`jupytext --to notebook examples/sharded_memory.py`). About a minute on two cores.

# %%
import math
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from pyspark.sql import SparkSession

from sparkdl import KerasEstimator

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
params = model.count_params()
workers = 2

# %% [markdown]
# ## The sizes, in multiples of the state
#
# The state S is 12 bytes a parameter with Adam (weights and two moments), 4 with SGD or
# `keepLocalOptimizer=True`. The driver's Python process grows by about 1.3 S during a fit (the
# fitted model, assembled once); 4.2 S when a callback reads the model's weights each epoch. Each
# executor's Python worker holds about 3 S plus 10 slices of S/N, plus its partition's rows up to
# `maxTaskMemoryMB`. Both also need about 1 GB for Python, TensorFlow and PySpark. The JVMs hold no
# state on `sharded`: the driver JVM stayed at 0.55 GB for a 229 MB state.


# %%
def gb(nbytes: float) -> int:
    """Whole GiB, rounded up."""
    return max(1, math.ceil(nbytes / 2**30))


state = 12 * params                          # bytes: Adam
task_mb = 256                                # the partition's rows a task keeps in memory (more: read from local disk)
runtime = 1 * 2**30                          # Python, TensorFlow, PySpark
driver_python = runtime + 1.3 * state
worker_python = runtime + 3 * state + 10 * state / workers + task_mb * 2**20
cluster = {                                  # spark-submit --conf KEY=VALUE on a cluster (YARN, Kubernetes)
    "spark.driver.memory": "1g",                                 # the driver JVM: no state on sharded
    "spark.executor.memory": "1g",                               # the executor JVM: the cached training data
    "spark.executor.memoryOverhead": f"{gb(worker_python)}g",    # the container's room for the Python workers
}
print(f"{params:,} parameters, state {state / 2**20:.1f} MB: driver Python about {driver_python / 2**30:.2f} GB, "
      f"each executor's Python worker about {worker_python / 2**30:.2f} GB")
print("cluster settings:", cluster)

# %% [markdown]
# ## A session with those settings, and the fit
#
# In local mode the executors are the driver's JVM and its Python workers: only `spark.driver.memory`
# applies, and it goes on the builder, before the session starts (a running JVM keeps its heap).
# `maxTaskMemoryMB` bounds the rows a task keeps in memory (a larger partition is read from local
# disk a batch at a time), so the rest of the Python worker's memory is the state's.

# %%
spark = (SparkSession.builder.master(f"local[{workers}]").appName("sharded-memory").config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.memory", cluster["spark.driver.memory"]).getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 64)).astype(np.float32)
y = (x[:, :10].argmax(axis=1)).astype(float)
df = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range(len(x))], "features array<float>, label double")

est = KerasEstimator(model=model, optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     metrics=["accuracy"], numWorkers=workers, epochs=2, batchSize=32, backend="sharded",
                     maxTaskMemoryMB=task_mb, verbose=0)
fitted = est.fit(df)

# %% [markdown]
# ## What the driver read
#
# `fitInfo["driver_bytes_fetched"]` counts the bytes the driver read from the slices: the state once
# (the weights, Adam's two moments, its iteration counter and learning rate), at the end.

# %%
fetched = fitted.fitInfo["driver_bytes_fetched"]
expected = 12 * params + 8 + 4               # + iterations (int64) + learning rate (float32)
print(f"driver read {fetched:,} bytes, the state once: {fetched == expected}")
print(f"accuracy after 2 epochs: {fitted.history['accuracy'][-1]:.3f}")
assert fetched == expected, (fetched, expected)

spark.stop()
