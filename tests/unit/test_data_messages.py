"""The check pass's messages for labels and features that do not fit the model, built without Spark:
each names the column, the rule, the fix and what was received."""

import pyarrow as pa
import pytest

from sparkdl.errors import SchemaError
from sparkdl.keras.losses import SPARSE_CATEGORICAL, LossInfo
from sparkdl.serialization.columns import column_to_numpy
from sparkdl.spark.data import class_index_message, features_width_message

SCCE = LossInfo(SPARSE_CATEGORICAL, name="sparse_categorical_crossentropy")


def test_class_indices_out_of_range_name_the_output_units_and_the_fix():
    message = class_index_message("label", 1, SCCE, 0.0, 1.0, 0)
    assert message == (
        "label column 'label' must hold integer class indices in [0, 0] for a model output of 1 value under loss "
        "'sparse_categorical_crossentropy': for k classes give the model a softmax output of k units "
        "(keras.layers.Dense(k, activation='softmax')), or for 0/1 labels and one output unit use a binary loss such as "
        "binary_crossentropy. Received: values from 0 to 1")
    assert "1 outputs" not in message
    message = class_index_message("y", 3, LossInfo(SPARSE_CATEGORICAL, name="sparse_categorical_crossentropy", ignore_class=-1),
                                   0.0, 5.5, 2)
    assert message.startswith("label column 'y' must hold integer class indices in [0, 2] (or ignore_class=-1) for a model "
                              "output of 3 values under loss")
    assert message.endswith("Received: values from 0 to 5.5, 2 of them not integers")


def test_a_features_width_no_row_has_suggests_the_models_input_when_the_data_is_right():
    assert features_width_message("x", (4,), 4, [3], 4, 4) == (
        "features column 'x' must hold 4 values per row (the model input shape (4,) has 4): when no row does, the column or "
        "the model input is not the one meant; when the data is right, change the model's input to 3 values per row, e.g. "
        "keras.Input(shape=(3,)). Received: all 4 rows hold 3 values")
    several = features_width_message("x", (4,), 4, [2, 3], 4, 4)  # no one width to build the model on
    assert "keras.Input" not in several and several.endswith("Received: all 4 rows hold 2 to 3 values")
    some = features_width_message("x", (4,), 4, [3], 1, 4)
    assert some == ("features column 'x' must hold 4 values per row (the model input shape (4,) has 4); handleInvalid='skip' "
                    "drops the rows that do not. Received: 1 of 4 rows hold 3 values")


def test_a_row_of_the_wrong_width_when_scoring_names_the_models_input():
    with pytest.raises(SchemaError) as info:
        column_to_numpy(pa.array([[1.0, 2.0, 3.0]], pa.list_(pa.float64())), "x", (4,), "float32")
    assert str(info.value) == ("column 'x' must hold 4 values per row to fill the model input of shape (4,): change the column, "
                               "or the model's keras.Input(shape=...) when the data is right. Received a row of 3 values")
