# %% [markdown]
# # Resume a fit after a failure
#
# With `checkpointDir`, a fit writes its whole state (master weights and optimizer state, the
# mode's state, the schedule's position, the history) at every epoch's end. When a fit fails (here: a
# callback raises as epoch 3 begins, standing in for a lost driver), fitting the same estimator on
# the same data again with the same `checkpointDir` continues from the newest snapshot and ends
# where an uninterrupted fit ends.
#
# Run it from the repository root, with sparkdl installed (`pip install -e '.[cpu]'`):
#
#     python examples/resume_after_failure.py
#
# or as a notebook (`jupytext --to notebook examples/resume_after_failure.py`). About a minute on two cores.

# %%
import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from pyspark.sql import SparkSession

from sparkdl import KerasEstimator

spark = (SparkSession.builder.master("local[2]").appName("resume")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

rng = np.random.default_rng(0)
x = rng.normal(size=(200, 3))
y = (x @ np.array([1.0, -2.0, 0.5]) > 0).astype(float)
df = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range(200)], "x array<double>, y double")


def estimator(**extra):
    """The same estimator every time: same model, seed and Params."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(2, activation="softmax")])
    return KerasEstimator(model=model, optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy",
                          metrics=["accuracy"], featuresCol="x", labelCol="y", numWorkers=2, epochs=4, batchSize=16,
                          seed=5, verbose=0, **extra)


class Crash(keras.callbacks.Callback):
    """Fails the fit as epoch 3 begins (index 2), after epoch 2's snapshot was written."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise RuntimeError("driver lost")


# %% [markdown]
# ## An uninterrupted fit, for comparison

# %%
whole = estimator().fit(df)

# %% [markdown]
# ## A fit that fails after two epochs, then the same fit again

# %%
checkpoints = os.path.join(tempfile.mkdtemp(prefix="sparkdl-ckpt-"), "fit")  # any Hadoop path: hdfs://, s3a://, ...
try:
    estimator(checkpointDir=checkpoints, callbacks=[Crash()]).fit(df)
except RuntimeError as error:
    print("the first fit failed:", error)
print("snapshots:", sorted(os.listdir(checkpoints)))

resumed = estimator(checkpointDir=checkpoints).fit(df)
print("resumed from epoch", resumed.fitInfo["resumed_from_epoch"], "and ran", resumed.fitInfo["epochs_run"], "epochs")

# %% [markdown]
# ## The resumed fit ends where the uninterrupted one ends

# %%
difference = max(float(np.max(np.abs(a - b)))
                 for a, b in zip(resumed.getKerasModel().get_weights(), whole.getKerasModel().get_weights()))
print(f"max weight difference: {difference:.1e}")
print("history equal:", np.allclose(resumed.history["loss"], whole.history["loss"], rtol=1e-6))
assert difference < 1e-6 and resumed.fitInfo["resumed_from_epoch"] == 2, difference

spark.stop()
