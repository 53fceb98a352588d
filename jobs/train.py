"""Train a Keras model on Spark from a YAML config, evaluate it, save it, its metrics and a plot.

Usage::

    spark-submit --master 'local[*]' jobs/train.py --config conf/mnist_cnn.yaml [--output DIR] [--set fit.epochs=1]

The same job as the ``sparkdl-train`` command (spark-submit needs a file): see
:mod:`sparkdl.cli.train` for the outputs (``model/``, ``metrics.json``, ``history.png`` under
``runs/<config name>/``) and ``conf/README.md`` for every config key.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    import sparkdl.cli.train  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, ROOT)
if ROOT not in sys.path:  # modules of the checkout (your own model factories) import from any working directory (Databricks: jobs/)
    sys.path.append(ROOT)

from sparkdl.cli.config import DATA_KEYS, FIT_KEYS, build_model, load_config  # noqa: E402,F401 - kept importable from here
from sparkdl.cli.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
