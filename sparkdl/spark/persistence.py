"""Spark ML persistence for the Keras stages: JSON metadata plus a ``.keras`` file.

Layout of a saved stage at ``path``::

    path/metadata/part-00000   Spark ML Params metadata (``DefaultParamsWriter``), with the
                               compile configs as Params and ``history`` etc. in extra metadata
    path/model.keras           the Keras model (Keras' zip of config JSON + HDF5 weights)

The ``.keras`` file goes through ``pyarrow.fs`` (local, ``s3://``, ``gs://``, ``hdfs://``) at
the path Hadoop qualifies for the metadata (a path without a scheme lands on the cluster's
default filesystem, next to its metadata). No pickle is involved anywhere. Works inside ``Pipeline`` and
``PipelineModel`` save/load, which call these writers and readers per stage.
"""

from __future__ import annotations

from urllib.parse import urlparse

import pyarrow.fs as pafs
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

MODEL_FILE = "model.keras"


def qualify(path: str, sc) -> str:
    """``path`` qualified by Hadoop (scheme and authority added), as ``DefaultParamsWriter`` resolves it."""
    hadoop_path = sc._jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path.getFileSystem(sc._jsc.hadoopConfiguration()).makeQualified(hadoop_path).toString()


def _resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    if uri.startswith("file:"):
        return pafs.LocalFileSystem(), urlparse(uri).path
    return pafs.FileSystem.from_uri(uri)


def write_bytes(uri: str, data: bytes) -> None:
    """Write ``data`` to a qualified URI (``file:/...``, ``hdfs://...``, ``s3://...``), creating parent folders."""
    fs, fs_path = _resolve(uri)
    fs.create_dir(fs_path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(fs_path) as f:
        f.write(data)


def read_bytes(uri: str) -> bytes | None:
    """The bytes at a qualified URI, or ``None`` when no file is there."""
    fs, fs_path = _resolve(uri)
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
            write_bytes(qualify(f"{path.rstrip('/')}/{MODEL_FILE}", self.sc), spec.to_keras_bytes())


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
        model_uri = qualify(f"{path.rstrip('/')}/{MODEL_FILE}", self.sc)
        data = read_bytes(model_uri)
        if data is None and self.cls._requires_model:
            raise FileNotFoundError(f"a saved {self.cls.__name__} must contain {MODEL_FILE}. Received: no file at {model_uri}")
        instance._spec = ModelSpec.from_keras_bytes(data) if data is not None else None
        instance._load_extra_metadata(metadata)
        return instance


class KerasStageIO(MLReadable, MLWritable):
    """``write()``/``read()`` for stages holding a ``_spec``; subclasses add extra metadata (JSON-able)."""

    _requires_model = False  # whether a saved stage without model.keras is an error on load

    def write(self) -> KerasStageWriter:
        return KerasStageWriter(self)

    @classmethod
    def read(cls) -> KerasStageReader:
        return KerasStageReader(cls)

    def _extra_metadata(self) -> dict:
        return {}

    def _load_extra_metadata(self, metadata: dict) -> None:
        pass
