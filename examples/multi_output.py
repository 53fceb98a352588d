# %% [markdown]
# # Two inputs, two outputs: a regression and a classification head
#
# A model with two inputs (`numeric`: 4 readings; `category`: an id for an `Embedding`) and two
# outputs (`price`: a regression; `kind`: 3 classes), trained with a loss per output and metrics per
# output, given as dicts by output name: `loss={"price": "mse", "kind": "sparse_categorical_crossentropy"}`,
# `metrics={"price": ["mae"], "kind": ["accuracy"]}`.
#
# Run it from the repository root, with sparkdl installed (`pip install -e '.[cpu]'`):
#
#     python examples/multi_output.py
#
# or as a notebook (`jupytext --to notebook examples/multi_output.py`). About a minute on two cores.
#
# Note: a loss and metrics per output (dicts) arrive with the release that documents them on the
# *Multi-output models* page.

# %%
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from pyspark.sql import SparkSession

from sparkdl import KerasEstimator

spark = (SparkSession.builder.master("local[2]").appName("multi-output")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

# %% [markdown]
# ## Data: 800 rows; the price depends on the readings and the category, the kind on the readings

# %%
rng = np.random.default_rng(0)
n = 800
numeric = rng.normal(size=(n, 4))
category = rng.integers(0, 5, size=n)
price = numeric @ np.array([1.5, -1.0, 0.5, 0.0]) + 0.8 * category + rng.normal(0, 0.1, n)
kind = np.argmax(numeric[:, :3], axis=1)
rows = [(numeric[i].tolist(), int(category[i]), float(price[i]), float(kind[i])) for i in range(n)]
df = spark.createDataFrame(rows, "numeric array<double>, category int, price double, kind double")
train, test = df.randomSplit([0.8, 0.2], seed=4)

# %% [markdown]
# ## The model: inputs and outputs by name

# %%
keras.utils.set_random_seed(0)
numeric_in = keras.Input((4,), name="numeric")
category_in = keras.Input((1,), dtype="int32", name="category")
embedded = keras.layers.Flatten()(keras.layers.Embedding(5, 4)(category_in))
hidden = keras.layers.Dense(32, activation="relu")(keras.layers.Concatenate()([numeric_in, embedded]))
price_out = keras.layers.Dense(1, name="price")(hidden)
kind_out = keras.layers.Dense(3, activation="softmax", name="kind")(hidden)
model = keras.Model([numeric_in, category_in], [price_out, kind_out])

estimator = KerasEstimator(
    model=model, optimizer=keras.optimizers.Adam(0.01),
    loss={"price": "mse", "kind": "sparse_categorical_crossentropy"},
    metrics={"price": ["mae"], "kind": ["accuracy"]},
    featuresCols={"numeric": "numeric", "category": "category"},
    labelCols={"price": "price", "kind": "kind"},
    outputCols={"price": "price_hat", "kind": "kind_hat"},  # keep the label columns' names free
    numWorkers=2, epochs=15, batchSize=32, seed=0, verbose=0,
)
fitted = estimator.fit(train)
print("history keys:", sorted(fitted.history))

# %% [markdown]
# ## Score: one column per output (and the classifier's probabilities)

# %%
scored = fitted.transform(test)
scored.select("price", "price_hat", "kind", "kind_hat", "kind_hat_probability").show(5, truncate=40)
metrics = fitted.evaluate(test)
print("test metrics:", {k: round(v, 3) for k, v in metrics.items()})
mae = next(v for k, v in metrics.items() if k.endswith("mae"))
accuracy = next(v for k, v in metrics.items() if k.endswith("accuracy"))
print(f"price mae: {mae:.3f}  kind accuracy: {accuracy:.3f}")
assert mae < 0.5 and accuracy > 0.8, metrics

spark.stop()
