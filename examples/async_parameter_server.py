# %% [markdown]
# # Asynchronous training on the parameter server (backend `ps`)
#
# Train the same classifier twice on generated data: mode `sync` on backend `rounds` (model
# averaging, one Spark job a round) and mode `async` on backend `ps` (Downpour SGD: each worker
# pushes its change every τ local steps to an Arrow Flight parameter server on the driver and pulls
# the master). Print the accuracies and what the server saw.
#
# Run it from the repository root, with sparkdl installed (`pip install -e '.[cpu]'`):
#
#     python examples/async_parameter_server.py
#
# or as a notebook (`jupytext --to notebook examples/async_parameter_server.py`). About a minute on two cores.

# %%
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from pyspark.sql import SparkSession

from sparkdl import KerasEstimator

spark = (SparkSession.builder.master("local[2]").appName("async-ps")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

# %% [markdown]
# ## Data: 1,000 rows, 8 features, 3 classes

# %%
rng = np.random.default_rng(0)
x = rng.normal(size=(1000, 8))
y = np.argmax(x[:, :3] + 0.3 * x[:, 3:6], axis=1)
df = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range(1000)], "features array<double>, label double")
train, test = df.randomSplit([0.8, 0.2], seed=2)


def estimator(**settings):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    return KerasEstimator(model=model, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                          numWorkers=2, epochs=6, batchSize=32, seed=0, verbose=0, **settings)


# %% [markdown]
# ## `sync` on `rounds`, then `async` on `ps`
# The asynchronous modes add every worker's change to the master, so the master moves about
# numWorkers times as far per τ steps: use about half the learning rate of `sync`.

# %%
sync = estimator(optimizer=keras.optimizers.Adam(0.01), mode="sync", backend="rounds").fit(train)
asynchronous = estimator(optimizer=keras.optimizers.Adam(0.005), mode="async", backend="ps", localSteps=4).fit(train)
for name, fitted in (("sync/rounds", sync), ("async/ps", asynchronous)):
    print(f"{name}: test accuracy {fitted.evaluate(test)['accuracy']:.3f}, fit {fitted.fitInfo['seconds']['total']:.1f} s")

# %% [markdown]
# ## What the parameter server saw
# `fitInfo["ps_epochs"]`: per epoch, the updates applied, their staleness and the bytes moved. Each
# push carries (worker, attempt, slot), so a retried task never applies an update twice.

# %%
for epoch in asynchronous.fitInfo["ps_epochs"]:
    print({k: epoch[k] for k in ("updates_applied", "staleness_mean", "staleness_max") if k in epoch})
async_accuracy = asynchronous.evaluate(test)["accuracy"]
print(f"async accuracy: {async_accuracy:.3f}")
assert async_accuracy > 0.7, async_accuracy

spark.stop()
