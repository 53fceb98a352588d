"""MetricSums: the element-wise merge of workers' metric variables (pure numpy)."""

import numpy as np
import pytest

from sparkdl.core.metrics import MetricSums, append_epoch
from sparkdl.errors import CodecError


def test_sums_are_element_wise_and_exact_for_counts():
    sums = MetricSums()
    assert sums.total() is None
    # Mean's total/count and a 3-bucket confusion vector from two workers: the merged mean is
    # (1.5 + 0.5) / (3 + 1) = 0.5, not the mean of the means (0.5 + 0.5) / 2 that a buggy merge would match by luck.
    sums.add([np.float32(1.5), np.float32(3.0), np.array([1.0, 2.0, 0.0], np.float32)])
    sums.add([np.float32(0.5), np.float32(1.0), np.array([0.0, 1.0, 4.0], np.float32)])
    total = sums.total()
    assert [t.dtype for t in total] == [np.float64] * 3
    assert float(total[0]) == 2.0 and float(total[1]) == 4.0
    np.testing.assert_array_equal(total[2], [1.0, 3.0, 4.0])
    total[2][0] = 99.0  # total() hands out copies
    assert sums.total()[2][0] == 1.0


def test_float64_sums_count_rows_past_float32_precision():
    sums = MetricSums()
    for _ in range(3):
        sums.add([np.float32(2**24)])
    sums.add([np.float32(1.0)])
    assert int(sums.total()[0]) == 3 * 2**24 + 1  # float32 would round to 3 * 2**24


def test_mismatched_workers_raise_value_errors():
    sums = MetricSums()
    sums.add([np.zeros(()), np.zeros((200,))])
    with pytest.raises(CodecError, match=r"as many metric variables as the others \(2\)\. Received: 1 arrays"):
        sums.add([np.zeros(())])
    with pytest.raises(ValueError, match=r"metric variable 1 must have the same shape .*\(200,\)\)\. Received: shape \(100,\)"):
        sums.add([np.zeros(()), np.zeros((100,))])


def test_append_epoch_builds_a_keras_style_history():
    history = {}
    append_epoch(history, {"loss": np.float32(0.5), "auc": 0.75})
    append_epoch(history, {"loss": 0.25, "auc": 0.8})
    assert history == {"loss": [0.5, 0.25], "auc": [0.75, 0.8]}
    assert all(type(v) is float for values in history.values() for v in values)
