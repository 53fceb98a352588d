"""What keeps a row from being scored, read from Arrow columns without Spark: nulls, null elements, NaN,
±inf and wrong sizes, counted apart, for scalar, list and sequence columns (sliced too)."""

import numpy as np
import pyarrow as pa

from sparkdl.serialization.columns import RowFaults, array_faults, row_faults

NAN, INF = float("nan"), float("inf")


def _rows(faults: RowFaults) -> dict:
    return {kind: np.flatnonzero(getattr(faults, kind)).tolist() for kind in ("null", "null_element", "nan", "inf", "size")}


def test_a_list_column_counts_each_fault_apart():
    column = pa.array([[1.0, 2.0, 3.0], None, [1.0, NAN, 3.0], [INF, 1.0, 2.0], [1.0, 2.0], [1.0, None, 3.0], [NAN, -INF]],
                      pa.list_(pa.float32()))
    faults = row_faults(column, size=3)
    assert _rows(faults) == {"null": [1], "null_element": [5], "nan": [2, 6], "inf": [3, 6], "size": [4, 6]}
    assert faults.any.tolist() == [False, True, True, True, True, True, True]
    assert faults.describe() == "1 null rows, 1 rows with null elements, 2 wrongly sized rows, 2 rows with NaN, 2 rows with ±inf"
    sliced = row_faults(column.slice(2, 3), size=3)  # offsets of a slice: rows 2, 3, 4
    assert _rows(sliced) == {"null": [], "null_element": [], "nan": [0], "inf": [1], "size": [2]}
    assert not row_faults(pa.array([[1.0, 2.0]] * 4, pa.list_(pa.float64())), size=2).any.any()


def test_scalar_sequence_and_integer_columns():
    assert _rows(row_faults(pa.array([1.0, None, NAN, -INF]), size=1)) == {
        "null": [1], "null_element": [], "nan": [2], "inf": [3], "size": []}
    sequences = pa.array([[[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], None], [[1.0]], None, [[NAN, 1.0]], [[1.0, None]]],
                         pa.list_(pa.list_(pa.float32())))
    assert _rows(row_faults(sequences, width=2)) == {"null": [3], "null_element": [1, 5], "nan": [4], "inf": [], "size": [2]}
    assert _rows(row_faults(pa.array([[1, 2], [3], None], pa.list_(pa.int64())), size=2)) == {
        "null": [2], "null_element": [], "nan": [], "inf": [], "size": [1]}


def test_decoded_arrays_count_nan_and_inf_rows():
    values = np.zeros((4, 2, 2), np.float32)
    values[1, 0, 1], values[2, 1, 1], values[3] = NAN, INF, NAN
    faults = array_faults(values)
    assert (faults.nan.tolist(), faults.inf.tolist()) == ([False, True, False, True], [False, False, True, False])
    assert not array_faults(np.ones((3, 2), np.int64)).any.any()
