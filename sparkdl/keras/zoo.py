"""Model factories of the shipped job configs (``model.factory: sparkdl.keras.zoo:<name>`` in ``conf/``).

Installed with the package, so a config copied anywhere imports them. Each returns a built,
uncompiled ``keras.Model``; the config's ``fit`` section compiles it.
"""

import keras


def mnist_cnn(seed: int = 1) -> keras.Model:
    """Small CNN for 28×28 digits: input ``(batch, 784)`` raw grey levels 0..255 (float32), output ``(batch, 10)`` softmax."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((784,), name="pixels"),
            keras.layers.Rescaling(1.0 / 255.0),
            keras.layers.Reshape((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.25, seed=seed),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="mnist_cnn",
    )


def mnist_mlp(seed: int = 1) -> keras.Model:
    """MLP 784-256-128-10: input ``(batch, 784)`` grey levels 0..255 (float32), output ``(batch, 10)`` softmax."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((784,), name="pixels"),
            keras.layers.Rescaling(1.0 / 255.0),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="mnist_mlp",
    )
