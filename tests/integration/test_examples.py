"""The runnable examples of examples/ (issue 23 item 7): each runs as a script in a fresh process, as a
user runs it (``python examples/<name>.py`` from the repository root), exits 0 and prints the value it
promises (each also asserts its own result). They are Jupytext percent-format files, so the same file
opens as a notebook; the format checks are cheap and run by default, the runs are ``slow``.
"""

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

EXAMPLES = os.path.join(ROOT, "examples")

# name -> a regular expression its standard output must match
RUNS = {
    "tabular_pipeline": r"test accuracy \(Spark evaluator\): 0\.\d+\n(.*\n)*reloaded predictions equal: True",
    "images_from_files": r"test accuracy: 0\.\d+",
    "async_parameter_server": r"async/ps: test accuracy 0\.\d+.*\n(.*\n)*.*updates_applied",
    "resume_after_failure": r"resumed from epoch 2 and ran 2 epochs\n(.*\n)*max weight difference: \d\.\de[-+]\d+\nhistory equal: True",
    "spark_connect": r"Spark Connect session: pyspark\.sql\.connect(.*\n)*loaded model predicts the same: True",
    "text_classification": r"test accuracy: 0\.\d+",
    "multi_output": r"price mae: \d\.\d+  kind accuracy: 0\.\d+",
    "sharded_memory": r"driver read [\d,]+ bytes, the state once: True",
}


def _example_files():
    return sorted(f[:-3] for f in os.listdir(EXAMPLES) if f.endswith(".py") and f != "png_decoder.py")


def test_every_example_is_run_here():
    assert _example_files() == sorted(RUNS)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_example_is_a_percent_format_notebook_that_says_how_to_run_it(name):
    text = open(os.path.join(EXAMPLES, f"{name}.py")).read()
    assert text.startswith("# %% [markdown]\n# # "), name  # a title cell first
    first_cell = text.split("\n# %%\n")[0]
    assert f"python examples/{name}.py" in first_cell and "jupytext" in first_cell, name
    assert text.count("\n# %%") >= 3, name
    assert not re.search(r"^\s*(from|import) tests\b", text, re.M), f"{name} imports from tests/"
    jupytext = pytest.importorskip("jupytext")
    notebook = jupytext.reads(text, fmt="py:percent")
    kinds = [cell.cell_type for cell in notebook.cells]
    assert kinds.count("code") >= 2 and kinds.count("markdown") >= 2, (name, kinds)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_example_runs_and_prints_its_result(name):
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, os.path.join("examples", f"{name}.py")], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert re.search(RUNS[name], result.stdout), result.stdout[-3000:]
