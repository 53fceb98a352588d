"""The decoder of examples/images_from_files.py: one PNG file's bytes -> a float32 array.

A decoder is named ``"module:function"`` and imported on the executors, so it lives in a module of
its own (not in the script or notebook that fits): ship it with ``--py-files png_decoder.py`` or
``spark.sparkContext.addPyFile(".../png_decoder.py")``, or install it with your package.
"""

import io

import numpy as np


def decode_gray_28(data: bytes) -> np.ndarray:
    """A 28x28 grayscale PNG's bytes -> float32 ``(28, 28, 1)`` in [0, 1].

    Raises:
        ValueError: the image is not 28x28 pixels.
    """
    from PIL import Image

    image = np.asarray(Image.open(io.BytesIO(data)).convert("L"), dtype=np.float32) / 255.0
    if image.shape != (28, 28):
        raise ValueError(f"expected a 28x28 image, got {image.shape}")
    return image[:, :, None]
