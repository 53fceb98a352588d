"""Registered Keras custom objects, shipped with each task so executors can rebuild the model.

A custom layer, activation, loss or metric registered on the driver with
``@keras.saving.register_keras_serializable`` is unknown in an executor's Python worker until
something imports the module that registers it. A fit and a transform therefore carry the
driver's registered objects with their task: Spark serializes a class or function of an
importable module by reference (unpickling imports the module, which registers it again) and
one defined in ``__main__`` or a notebook by value. :func:`register` then adds them to the
worker's registry before any model is deserialized.
"""

from __future__ import annotations

import importlib.util

from sparkdl.errors import ConfigError
from sparkdl.keras.runtime import keras_module


def registered() -> dict[str, object]:
    """The driver's registered custom objects, ``{"package>Name": class_or_function}``.

    Raises:
        ConfigError: when an object's module cannot be imported here, so executors could not either.
    """
    objects = dict(keras_module().saving.get_custom_objects())
    for name, obj in objects.items():
        module = getattr(obj, "__module__", None) or "__main__"
        if module != "__main__" and importlib.util.find_spec(module.split(".")[0]) is None:
            raise ConfigError(
                f"custom object {name!r} must live in a module the executors can import. "
                f"Received: {obj!r} from module {module!r}, which is not importable"
            )
    return objects


def register(objects: dict[str, object]) -> None:
    """Add ``objects`` (from :func:`registered`) to this process's Keras registry."""
    if objects:
        keras_module().saving.get_custom_objects().update(objects)


def register_custom_objects(objects: dict | None) -> None:
    """Register ``objects`` with Keras in this process, as Keras' ``custom_objects`` argument names
    them (``{"Scale": Scale, "my_package>swish": swish}``); fits and transforms then ship them to the
    executors with every task (:func:`registered`). ``None`` does nothing.

    Raises:
        ConfigError: not a dict of names to classes or functions.
    """
    if objects is None:
        return
    if not isinstance(objects, dict) or not all(isinstance(k, str) and callable(v) for k, v in objects.items()):
        raise ConfigError(f"customObjects must be a dict of names to classes or functions. Received: {objects!r}")
    keras_module().saving.get_custom_objects().update(objects)
