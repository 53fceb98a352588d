# The docs tests' prelude of snippets that use `spark`: a quiet local[2] session (as the examples start theirs).
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from sparkdl import KerasEstimator, KerasModel  # noqa: E402

spark = (SparkSession.builder.master("local[2]").config("spark.ui.showConsoleProgress", "false")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
