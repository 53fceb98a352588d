"""Score a file with a saved KerasModel and write the result.

Usage::

    spark-submit --master 'local[*]' jobs/predict.py --model runs/mnist_cnn/model \\
        --input data/mnist10k/test.parquet --output /tmp/predictions [--columns label]

The same job as the ``sparkdl-predict`` command (spark-submit needs a file): see
:mod:`sparkdl.cli.predict` for every option.
"""

from __future__ import annotations

import os
import sys

try:
    import sparkdl.cli.predict  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparkdl.cli.predict import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
