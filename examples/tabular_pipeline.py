# %% [markdown]
# # A tabular Pipeline from a CSV file
#
# Read `examples/data/machines.csv` (300 machines: four sensor readings and a status `ok`/`warn`/`fail`),
# index the string label, assemble and scale the features, train a Keras classifier with
# `KerasEstimator` inside a Spark ML `Pipeline`, score it with Spark's evaluator, then save the
# `PipelineModel`, load it back and check it scores the same.
#
# Run it from the repository root, with sparkdl installed (`pip install -e '.[cpu]'`):
#
#     python examples/tabular_pipeline.py
#
# or as a notebook: `jupytext --to notebook examples/tabular_pipeline.py` (or open it in VS Code /
# JupyterLab with jupytext). It takes about half a minute on two cores.

# %%
import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors' Python: the one that has sparkdl
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TensorFlow's start-up lines

import keras
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import StandardScaler, StringIndexer, VectorAssembler
from pyspark.sql import SparkSession

from sparkdl import KerasEstimator

spark = (SparkSession.builder.master("local[2]").appName("tabular-pipeline")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else os.getcwd()
CSV = os.path.join(HERE, "data", "machines.csv")

# %% [markdown]
# ## The data
# `inferSchema` reads the four readings as doubles and `status` as a string.

# %%
df = spark.read.csv(CSV, header=True, inferSchema=True)
train, test = df.randomSplit([0.8, 0.2], seed=1)
df.printSchema()
print("rows:", df.count(), "train:", train.count(), "test:", test.count())

# %% [markdown]
# ## The Pipeline
# `StringIndexer` turns `status` into a class index (0.0, 1.0, 2.0) for the
# `sparse_categorical_crossentropy` loss; `VectorAssembler` + `StandardScaler` make one scaled vector
# column of 4 values, the model's `Input((4,))`.
#
# On small data, mind the arithmetic of averaging (docs: *Workers, epochs and learning rate*):
# `batchSize` is per worker, so with 2 workers each epoch takes half the steps of a Keras epoch and
# averaging two models moves the master about as far as one. With ~240 rows we give it 40 epochs
# and a learning rate of 0.01, and keep one round per epoch (`localSteps=None`, the default).

# %%
keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((4,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(3, activation="softmax"),
])
estimator = KerasEstimator(
    model=model, optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
    metrics=["accuracy"], featuresCol="scaled", labelCol="label",
    numWorkers=2, epochs=40, batchSize=16, seed=0, verbose=0,
)
pipeline = Pipeline(stages=[
    StringIndexer(inputCol="status", outputCol="label"),
    VectorAssembler(inputCols=["temperature", "pressure", "vibration", "hours"], outputCol="features"),
    StandardScaler(inputCol="features", outputCol="scaled", withMean=True, withStd=True),
    estimator,
])
fitted = pipeline.fit(train)
keras_stage = fitted.stages[-1]  # the KerasModel
print("training accuracy per epoch (last 3):", [round(a, 3) for a in keras_stage.history["accuracy"][-3:]])

# %% [markdown]
# ## Evaluate with Spark's evaluator and with Keras' metrics

# %%
scored = fitted.transform(test)
scored.select("status", "label", "prediction", "probability").show(5, truncate=False)
accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
print(f"test accuracy (Spark evaluator): {accuracy:.3f}")
# KerasModel.evaluate reads the columns the earlier stages produce, so evaluate the transformed frame
prepared = PipelineModel(stages=fitted.stages[:-1]).transform(test)
print("keras metrics:", {k: round(v, 3) for k, v in keras_stage.evaluate(prepared).items()})

# %% [markdown]
# ## Save, load, score again

# %%
path = os.path.join(tempfile.mkdtemp(prefix="sparkdl-example-"), "pipeline")
fitted.save(path)
reloaded = PipelineModel.load(path)
before = [r["prediction"] for r in scored.orderBy("temperature", "hours").collect()]
after = [r["prediction"] for r in reloaded.transform(test).orderBy("temperature", "hours").collect()]
print("reloaded predictions equal:", before == after)
assert before == after and accuracy > 0.7, (accuracy, before == after)

spark.stop()
