"""The documentation site (issue 23 item 7): ``mkdocs build --strict`` of mkdocs.yml passes, so every page
in the nav exists, every link and anchor between pages resolves, and every API reference page renders
from the docstrings (mkdocstrings). Keras is loaded on its ``numpy`` backend for the reference pages:
the build only reads docstrings and signatures, and so skips TensorFlow's import."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_mkdocs_build_strict_passes(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    env = dict(os.environ, PYTHONPATH=ROOT, KERAS_BACKEND="numpy", NO_MKDOCS_2_WARNING="1")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    site = tmp_path / "site"
    assert (site / "index.html").exists()
    estimator = (site / "reference" / "estimator" / "index.html").read_text()
    assert "numWorkers" in estimator and "featuresCol" in estimator  # the generated Params are rendered
    assert "Multi-output models" in (site / "user-guide" / "multi-output" / "index.html").read_text()

