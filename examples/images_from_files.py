# %% [markdown]
# # Images from files, decoded on the executors
#
# Write 600 digits of the bundled MNIST sample (`data/mnist10k/`) as PNG files to a temporary folder,
# read them with Spark's `binaryFile` source (one row per file: `path`, `content` bytes, ...), take
# the label from the file name, and train a small CNN. The PNG bytes are decoded on the executors by
# a decoder named `"module:function"` (`png_decoder:decode_gray_28`, in `examples/png_decoder.py`).
#
# Run it from the repository root, with sparkdl installed (`pip install -e '.[cpu]'`):
#
#     python examples/images_from_files.py
#
# or as a notebook (`jupytext --to notebook examples/images_from_files.py`). About a minute on two cores.

# %%
import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from PIL import Image
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkdl import KerasEstimator

HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else os.getcwd()
ROOT = os.path.dirname(HERE)

spark = (SparkSession.builder.master("local[2]").appName("images-from-files")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

# %% [markdown]
# ## Ship the decoder's module
# The executors import the decoder by name. `addPyFile` copies the module to every executor (on a
# cluster, `spark-submit --py-files png_decoder.py` does the same); the driver imports it too.

# %%
decoder_file = os.path.join(HERE, "png_decoder.py")
spark.sparkContext.addPyFile(decoder_file)
sys.path.insert(0, HERE)

# %% [markdown]
# ## Write PNG files
# 500 training and 100 test digits as `<split>/<index>_label<digit>.png`.

# %%
digits = np.load(os.path.join(ROOT, "data", "mnist10k", "mnist10k.npz"))
folder = tempfile.mkdtemp(prefix="sparkdl-pngs-")
for split, x, y, n in (("train", digits["x_train"], digits["y_train"], 500), ("test", digits["x_test"], digits["y_test"], 100)):
    os.makedirs(os.path.join(folder, split))
    for i in range(n):
        Image.fromarray(x[i].reshape(28, 28)).save(os.path.join(folder, split, f"{i:04d}_label{y[i]}.png"))


def read_pngs(split):
    """One row per PNG: its bytes and the label parsed from the file name."""
    return (spark.read.format("binaryFile").option("pathGlobFilter", "*.png").load(os.path.join(folder, split))
            .withColumn("label", F.regexp_extract("path", r"_label(\d)\.png$", 1).cast("double"))
            .select("path", "content", "label"))


train, test = read_pngs("train"), read_pngs("test")
print("train files:", train.count(), "test files:", test.count())

# %% [markdown]
# ## Train with a decoder
# `decoders={"content": "png_decoder:decode_gray_28"}`: the check job decodes every row once, so a
# decoder that returns the wrong shape fails before training, naming the decoder and both shapes.

# %%
keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(8, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Flatten(),
    keras.layers.Dense(10, activation="softmax"),
])
estimator = KerasEstimator(
    model=model, optimizer=keras.optimizers.Adam(0.003), loss="sparse_categorical_crossentropy", metrics=["accuracy"],
    featuresCol="content", labelCol="label", decoders={"content": "png_decoder:decode_gray_28"},
    numWorkers=2, epochs=8, batchSize=32, seed=0, verbose=0,
)
fitted = estimator.fit(train)
print("training accuracy per epoch:", [round(a, 3) for a in fitted.history["accuracy"]])

# %% [markdown]
# ## Score the test files
# The fitted model keeps the decoder, so `transform` and `evaluate` read the same binary column.

# %%
scored = fitted.transform(test)
scored.select(F.regexp_extract("path", r"[^/]+$", 0).alias("file"), "label", "prediction").show(5, truncate=False)
metrics = fitted.evaluate(test)
print(f"test accuracy: {metrics['accuracy']:.3f}")
assert metrics["accuracy"] > 0.6, metrics

spark.stop()
