"""Spark ML persistence for the Keras stages: JSON metadata plus a ``.keras`` file.

Layout of a saved stage at ``path``::

    path/metadata/part-00000   Spark ML Params metadata (``DefaultParamsWriter``), with the
                               compile configs as Params and ``history`` etc. in extra metadata
    path/model.keras           the Keras model (Keras' zip of config JSON + HDF5 weights)

The ``.keras`` file goes through ``pyarrow.fs`` (local paths, ``file://``, ``s3://``,
``gs://``, ``hdfs://``), so no pickle is involved anywhere. Works inside ``Pipeline`` and
``PipelineModel`` save/load, which call these writers and readers per stage.
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

MODEL_FILE = "model.keras"


def _resolve(path: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in path and not path.startswith("file:"):
        return pafs.LocalFileSystem(), os.path.abspath(path)
    return pafs.FileSystem.from_uri(path)


def write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (any ``pyarrow.fs`` URI or a local path), creating parent folders."""
    fs, fs_path = _resolve(path)
    fs.create_dir(fs_path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(fs_path) as f:
        f.write(data)


def read_bytes(path: str) -> bytes | None:
    """The bytes at ``path``, or ``None`` when no file is there."""
    fs, fs_path = _resolve(path)
    if fs.get_file_info(fs_path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(fs_path) as f:
        return f.read()


class KerasStageWriter(MLWriter):
    """Writes a ``KerasEstimator`` or ``KerasModel``: Params metadata, then ``model.keras``."""

    def __init__(self, instance) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sc, extraMetadata=self.instance._extra_metadata())
        spec = self.instance._spec
        if spec is not None:
            write_bytes(f"{path.rstrip('/')}/{MODEL_FILE}", spec.to_keras_bytes())


class KerasStageReader(MLReader):
    """Reads what :class:`KerasStageWriter` wrote into a new instance of ``cls``."""

    def __init__(self, cls) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str):
        from sparkdl.keras.spec import ModelSpec

        metadata = DefaultParamsReader.loadMetadata(path, self.sc)
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        data = read_bytes(f"{path.rstrip('/')}/{MODEL_FILE}")
        instance._spec = ModelSpec.from_keras_bytes(data) if data is not None else None
        instance._load_extra_metadata(metadata)
        return instance


class KerasStageIO(MLReadable, MLWritable):
    """``write()``/``read()`` for stages holding a ``_spec``; subclasses add extra metadata (JSON-able)."""

    def write(self) -> KerasStageWriter:
        return KerasStageWriter(self)

    @classmethod
    def read(cls) -> KerasStageReader:
        return KerasStageReader(cls)

    def _extra_metadata(self) -> dict:
        return {}

    def _load_extra_metadata(self, metadata: dict) -> None:
        pass
