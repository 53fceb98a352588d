"""classWeight -> per-row sample weights exactly as ``keras.Model.fit(class_weight=...)`` derives them, for
labels outside the table too: a loss's ignore_class (-1, 255), class indices past the table's largest key."""

import numpy as np
import pytest
from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights as keras_sample_weights

from sparkdl.serialization.columns import class_weights_to_sample_weights

TABLE = {0: 0.5, 1: 2.0, 2: 7.0}


@pytest.mark.parametrize("y, table", [
    (np.array([0, 1, 2, -1, 2, -1, 0]), TABLE),  # ignore_class=-1: not the last class's 7.0
    (np.array([0, 255, 1, 255]), TABLE),  # ignore_class=255, past the table
    (np.array([0, 1, -1, 2]), {**TABLE, -1: 0.25}),  # a weight given for -1 is used, as Keras does
    (np.array([[0.0], [1.2], [1.6], [-1.0]]), TABLE),  # (rows, 1), rounded
    (np.eye(3)[[2, 0, 1, 1]], TABLE),  # one-hot: argmax
    (np.array([0, 10**9, 2]), {0: 3.0, 10**9: 0.1}),  # a large class index: no table of 10**9 entries
])
def test_class_weights_equal_keras_fit(y, table):
    got = class_weights_to_sample_weights(y, tuple(sorted(table.items())))
    want = keras_sample_weights(y, table)
    assert got.dtype == np.float32 and got.shape == (len(y),)
    np.testing.assert_array_equal(got, want)


def test_ignored_rows_weigh_one_not_the_highest_class():
    weights = class_weights_to_sample_weights(np.array([2, -1, 0]), ((0, 0.5), (1, 2.0), (2, 7.0)))
    assert weights.tolist() == [7.0, 1.0, 0.5]
