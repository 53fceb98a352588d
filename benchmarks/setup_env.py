"""Shared start of the benchmark scripts: the repository on ``sys.path`` and the environment
every run needs (executors on this interpreter, the TensorFlow backend, quiet logs, loopback).
Import it before pyspark, keras or sparkdl."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
ENV = {
    "PYSPARK_PYTHON": sys.executable,
    "KERAS_BACKEND": "tensorflow",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "SPARK_LOCAL_IP": "127.0.0.1",
}
for key, value in ENV.items():
    os.environ.setdefault(key, value)
