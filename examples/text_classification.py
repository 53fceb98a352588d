# %% [markdown]
# # Text classification on token ids of varying length
#
# Each row holds one document as an `array<int>` column of token ids, of its own length. The model
# takes `keras.Input((None,), dtype="int32")` and an `Embedding(mask_zero=True)`: id 0 is padding,
# and sparkdl pads each batch with 0 to its longest row, so the mask hides the padding.
# The task: a document is positive when it holds more "good" tokens (ids 1–9) than "bad" ones (10–19).
#
# Run it from the repository root, with sparkdl installed (`pip install -e '.[cpu]'`):
#
#     python examples/text_classification.py
#
# or as a notebook (`jupytext --to notebook examples/text_classification.py`). About a minute on two cores.
#
# Note: integer sequences (`array<int>` into `Input((None,), dtype="int32")`) arrive with the release
# that documents them on the *Text models* page.

# %%
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from pyspark.sql import SparkSession

from sparkdl import KerasEstimator

spark = (SparkSession.builder.master("local[2]").appName("text")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

# %% [markdown]
# ## Documents: 600 rows of 3 to 30 token ids from a vocabulary of 50 (0 is padding)

# %%
VOCAB = 50
rng = np.random.default_rng(0)
rows = []
for _ in range(600):
    tokens = rng.integers(1, VOCAB, size=int(rng.integers(3, 31)))
    good, bad = np.sum(tokens < 10), np.sum((tokens >= 10) & (tokens < 20))
    rows.append((tokens.tolist(), float(good > bad)))
df = spark.createDataFrame(rows, "tokens array<int>, label double")
train, test = df.randomSplit([0.8, 0.2], seed=3)
df.show(3, truncate=60)

# %% [markdown]
# ## The model: embedding with a mask, mean over the real tokens, a sigmoid

# %%
keras.utils.set_random_seed(0)
tokens = keras.Input((None,), dtype="int32", name="tokens")
embedded = keras.layers.Embedding(VOCAB, 16, mask_zero=True)(tokens)
pooled = keras.layers.GlobalAveragePooling1D()(embedded)  # uses the mask: padding is not averaged
output = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(16, activation="relu")(pooled))
model = keras.Model(tokens, output)

estimator = KerasEstimator(
    model=model, optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"],
    featuresCol="tokens", labelCol="label", numWorkers=2, epochs=10, batchSize=32, seed=0, verbose=0,
)
fitted = estimator.fit(train)
print("training accuracy per epoch:", [round(a, 3) for a in fitted.history["accuracy"]])

# %% [markdown]
# ## Score the held-out documents

# %%
fitted.transform(test).select("tokens", "label", "prediction").show(5, truncate=50)
accuracy = fitted.evaluate(test)["accuracy"]
print(f"test accuracy: {accuracy:.3f}")
assert accuracy > 0.75, accuracy

spark.stop()
