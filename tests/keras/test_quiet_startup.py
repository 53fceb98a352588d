"""TensorFlow's start-up lines (oneDNN, CPU features, absl's notice), which TF_CPP_MIN_LOG_LEVEL does not reach
because they print before TensorFlow's logging starts, filtered by sparkdl as that level says (issue 23)."""

import os
import subprocess
import sys

import pytest

from sparkdl.keras.runtime import startup_lines
from tests.conftest import ROOT

NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
ONEDNN = ("I0000 00:00:1796164119.119062   29248 port.cc:153] oneDNN custom operations are on. You may see slightly "
          "different numerical results. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n")
CPU = ("I0000 00:00:1796164113.959617   29248 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
       "available CPU instructions in performance-critical operations.\n"
       "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow.\n")
WARN = "W0000 00:00:1796164120.000001   29248 cuda_dnn.cc:8310] Unable to register cuDNN factory\n"
ERROR = "E0000 00:00:1796164120.000002   29248 cuda_blas.cc:1418] Unable to register cuBLAS factory\n"
TEXT = "a line of the user's\n" + NOTICE + ONEDNN + CPU + WARN + ERROR + NOTICE + ONEDNN


@pytest.mark.parametrize("level, expected", [
    (0, TEXT),
    (1, "a line of the user's\n" + WARN + ERROR),
    (2, "a line of the user's\n" + ERROR),
    (3, "a line of the user's\n"),
])
def test_startup_lines_apply_tf_cpp_min_log_level_with_continuation_lines(level, expected):
    assert startup_lines(TEXT, level) == expected


def test_fatal_lines_are_always_kept():
    fatal = "F0000 00:00:1.0   1 cpu_feature_guard.cc:1] The TensorFlow library was compiled to use AVX\nnext line\n"
    assert startup_lines(NOTICE + ONEDNN + fatal, 3) == fatal


def worker_start(level: str) -> str:
    """stderr of a fresh Python process that sets Keras up as a Spark task does (configure: backend, threads)."""
    code = "from sparkdl.keras import runtime; runtime.configure(1, None, 'tensorflow'); import tensorflow; print('ok')"
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": level}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr[-2000:]
    return result.stderr


@pytest.mark.slow  # a fresh interpreter imports TensorFlow (20 s); the filter itself is tested above
def test_a_worker_imports_tensorflow_without_its_startup_lines():
    err = worker_start("2")
    assert "oneDNN custom operations" not in err and "cpu_feature_guard" not in err and "absl::InitializeLog" not in err
    assert not [line for line in err.splitlines() if line[:1] in "IW" and line[1:5].isdigit()], err


@pytest.mark.slow
def test_tf_cpp_min_log_level_0_shows_them():
    err = worker_start("0")
    if "I0000" not in err:
        pytest.skip("TensorFlow prints no start-up lines on this machine")
    assert NOTICE.strip() in err  # the stream untouched: absl's notice is shown with the records
