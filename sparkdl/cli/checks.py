"""Checks of a job config against its model and its local data files, made before Spark starts.

``sparkdl-train`` runs them before it starts Spark and ``sparkdl-train --check`` runs them too, so
a config whose labels cannot train its model, or whose model has more outputs than label columns,
fails in a second with the config key named, not after the fit:

- :func:`check_outputs`: one label column per model output (``data.label_cols`` for a model with
  several outputs, naming every output when it is a mapping), and ``fit.task: classification``
  only for outputs of shape ``(classes,)``;
- :func:`check_data_labels`: in every local Parquet file or folder of ``data.train``, ``data.test``
  and ``data.validation``, each label column exists, holds numbers, and its per-row form (a scalar
  class index or value, or an array of k values read from the first row) fits the loss and the
  model output (:meth:`sparkdl.keras.losses.LossInfo.check_label_shape`): one-hot rows for
  ``categorical_crossentropy``, one class index for ``sparse_categorical_crossentropy``.

URIs, glob patterns and other formats are left to Spark and the estimator's own checks at fit time.
"""

from __future__ import annotations

import os
import re

from sparkdl.errors import ConfigError, SchemaError, did_you_mean

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+:")
_GLOB = re.compile(r"[*?[]")
_DATA_KEYS = ("train", "test", "validation")


def label_columns(config: dict, output_names: list[str]) -> list[str]:
    """The label column of each model output, in output order, as the config gives them.

    Args:
        config: a validated job config (:func:`sparkdl.cli.config.load_config`).
        output_names: the model's output names, in order, e.g. ``["rating", "clicked"]``.

    Raises:
        ConfigError: a model with several outputs and no ``data.label_cols``; ``data.label_cols``
            of another length than the outputs, or a mapping that does not name each output once.
    """
    data = config["data"]
    given = data.get("label_cols")
    if given is None:
        if len(output_names) != 1:
            raise ConfigError(
                f"a model with {len(output_names)} outputs needs data.label_cols, one label column per output "
                f"(a list in output order or a mapping output -> column): the outputs are {output_names}. "
                f"Received: data.label_col={data.get('label_col')!r} and no data.label_cols"
            )
        return [data["label_col"]]
    if isinstance(given, dict):
        if sorted(given) != sorted(output_names):
            raise ConfigError(
                f"data.label_cols must map every model output by name: the outputs are {output_names}. "
                f"Received: {sorted(given)}"
            )
        return [given[name] for name in output_names]
    if len(given) != len(output_names):
        raise ConfigError(
            f"data.label_cols must give one label column per model output {output_names}, in output order. "
            f"Received: {list(given)}"
        )
    return list(given)


def check_outputs(config: dict, estimator) -> list[str]:
    """Check the model's outputs against ``data.label_col``/``data.label_cols`` and ``fit.task``.

    Args:
        config: a validated job config.
        estimator: its ``KerasEstimator`` (:func:`sparkdl.cli.train.build_estimator`).

    Returns:
        The label column of each output, in output order.

    Raises:
        ConfigError: see :func:`label_columns`; ``fit.task: classification`` (given or inferred
            from the loss) for an output that is not one vector of class scores per row.
    """
    spec = estimator._spec
    names = [name for name, _ in spec.output_specs]
    columns = label_columns(config, names)
    if estimator.isDefined(estimator.loss):
        compile_spec = estimator._compile_spec()
        compile_spec.check_outputs(names)
        losses = compile_spec.output_losses(names)
        bad = [(name, tuple(shape), info.name) for (name, shape), info in zip(spec.output_specs, losses, strict=True)
               if info.infer_task(estimator.getTask()) == "classification" and len(shape) != 1]
        if bad:
            raise ConfigError(
                "a classifier's outputs must be shaped (classes,) per row: set fit.task: regression to keep the raw "
                f"outputs, or use a regression loss. Received: (output, shape, loss) {bad} with task {estimator.getTask()!r}"
            )
    return columns


def local_parquet(path: str | None, data_format: str) -> str | None:
    """``path`` when it is a local Parquet file or folder that exists, else None (URIs, globs,
    other formats and missing paths are Spark's to read and report)."""
    if not path or data_format != "parquet" or _URI.match(path) or _GLOB.search(path):
        return None
    return path if os.path.exists(path) else None


def label_shape(path: str, column: str) -> tuple | None:
    """The per-row shape of ``column`` in the Parquet file or folder ``path``: ``()`` for numbers,
    ``(k,)`` for arrays (k read from the first row that has a value), None when it cannot be told
    (a Spark ML vector, an empty file).

    Raises:
        SchemaError: no such column, or a column that does not hold numbers.
    """
    import pyarrow as pa
    import pyarrow.dataset as ds

    dataset = ds.dataset(path, format="parquet")
    if column not in dataset.schema.names:
        raise SchemaError(f"label column {column!r} is not in the file.{did_you_mean(column, dataset.schema.names)} "
                          f"Received columns: {dataset.schema.names}")
    data_type = dataset.schema.field(column).type
    if pa.types.is_integer(data_type) or pa.types.is_floating(data_type) or pa.types.is_boolean(data_type):
        return ()
    if pa.types.is_fixed_size_list(data_type):
        return (data_type.list_size,)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        values = dataset.scanner(columns=[column], filter=ds.field(column).is_valid()).head(1).column(0)
        return (len(values[0]),) if len(values) else None
    if pa.types.is_struct(data_type):  # a Spark ML vector: its width is in Spark's metadata, checked at fit
        return None
    raise SchemaError(
        f"label column {column!r} must be numeric, array<numeric> or a vector (index string labels with "
        f"pyspark.ml.feature.StringIndexer). Received: {data_type}"
    )


def check_data_labels(config: dict, estimator, columns: list[str]) -> None:
    """Check each label column of each local Parquet input against the loss and the model's outputs.

    Args:
        config: a validated job config.
        estimator: its ``KerasEstimator``; nothing is checked without a loss (a factory that
            compiles the model supplies it at fit).
        columns: the label column of each output (:func:`check_outputs`).

    Raises:
        ConfigError: naming the config key and the file: a missing or non-numeric label column,
            or labels of a form the loss does not take (one-hot rows for a sparse loss, class
            indices for ``categorical_crossentropy``, k values for a model output of another width).
    """
    if not estimator.isDefined(estimator.loss):
        return
    names = [name for name, _ in estimator._spec.output_specs]
    losses = estimator._compile_spec().output_losses(names)
    data = config["data"]
    for key in _DATA_KEYS:
        path = local_parquet(data.get(key), data["format"])
        if path is None:
            continue
        for (name, output_shape), column, loss in zip(estimator._spec.output_specs, columns, losses, strict=True):
            try:
                shape = label_shape(path, column)
                if shape is not None:
                    loss.check_label_shape(column, shape, tuple(output_shape))
            except SchemaError as e:
                raise ConfigError(f"data.{key} ({path}), label of output {name!r}: {e}") from None
