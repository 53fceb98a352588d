"""Tiny model factories for the ``sparkdl-train`` tests (``model.factory: tests.cli_models:<name>``),
and the small Parquet inputs they train on."""

import numpy as np

import keras


def softmax(inputs: int = 4, classes: int = 3, seed: int = 1) -> keras.Model:
    """``(batch, inputs)`` -> ``(batch, classes)`` softmax."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((inputs,), name="x"), keras.layers.Dense(classes, activation="softmax")])


def linear(inputs: int = 4, seed: int = 1) -> keras.Model:
    """``(batch, inputs)`` -> ``(batch, 1)``, a regressor."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((inputs,), name="x"), keras.layers.Dense(1)])


def two_outputs(inputs: int = 4, seed: int = 1) -> keras.Model:
    """``(batch, inputs)`` -> outputs ``a`` ``(batch, 1)`` and ``b`` ``(batch, 1)``."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((inputs,), name="x")
    hidden = keras.layers.Dense(3, activation="relu")(x)
    return keras.Model(x, {"a": keras.layers.Dense(1, name="a")(hidden), "b": keras.layers.Dense(1, name="b")(hidden)})


def write_rows(path, rows: int, seed: int, inputs: int = 4, classes: int = 3) -> dict:
    """A Parquet file at ``path`` with ``x`` (array<float>[inputs]), ``label`` (int class index),
    ``onehot`` (array<float>[classes]), ``y`` (double), ``ya`` and ``yb`` (double); returns the columns as numpy."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, inputs)).astype(np.float32)
    label = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5).astype(np.int32)  # 0..2, learnable
    onehot = np.eye(classes, dtype=np.float32)[label]
    y = (x @ np.arange(1, inputs + 1, dtype=np.float32) / inputs).astype(np.float64)
    columns = {"x": x, "label": label, "onehot": onehot, "y": y, "ya": y, "yb": -0.5 * y}
    table = pa.table({
        "x": pa.array(list(x), type=pa.list_(pa.float32())),
        "label": pa.array(label, type=pa.int32()),
        "onehot": pa.array(list(onehot), type=pa.list_(pa.float32())),
        "y": pa.array(y), "ya": pa.array(columns["ya"]), "yb": pa.array(columns["yb"]),
    })
    pq.write_table(table, str(path))
    return columns


def compiled_softmax(inputs: int = 4, classes: int = 3, seed: int = 1) -> keras.Model:
    """:func:`softmax`, compiled with ``SGD(learning_rate=0.3)`` and the sparse cross-entropy."""
    model = softmax(inputs, classes, seed)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.3), loss="sparse_categorical_crossentropy")
    return model
