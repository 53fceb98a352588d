"""Spark ML persistence for the Keras stages: a ``.keras`` file, optimizer state, JSON metadata.

Layout of a saved stage at ``path``, in the order the files are written::

    path/model.keras           the Keras model (Keras' zip of config JSON + HDF5 weights)
    path/optimizer.arrow       optimizer state, only when the stage holds one (a fitted
                               KerasModel, or an estimator given an initialModel): the arrays of
                               ``optimizer.variables`` in order, as one Arrow IPC stream
                               (:func:`~sparkdl.serialization.arrow_codec.encode_arrays`)
    path/metadata/part-00000   Spark ML Params metadata (as ``DefaultParamsWriter`` writes it),
                               with the compile configs as Params and ``history`` etc. in extra
                               metadata; written last

Every file goes through the Hadoop ``FileSystem`` of the Hadoop-qualified path, the one Spark
uses for the metadata: a path without a scheme lands on the cluster's default filesystem, and
``hdfs://``, ``s3a://``, ``abfss://``, ``gs://``, ``dbfs:/`` and ``file:`` all work wherever
Spark itself can write them. The driver's JVM copies each file between a driver-local temporary
file and the filesystem (``copyFromLocalFile``/``copyToLocalFile``, streamed): no bytes cross
py4j, so there is no JVM array and no 2 GiB limit (the driver's Python and JVM share the driver's
local disk, as PySpark's py4j gateway runs beside the driver). No pickle is involved anywhere. Works inside
``Pipeline`` and ``PipelineModel`` save/load, which call these writers and readers per stage.

Guarantee: the metadata is written last, so a directory with readable metadata holds a complete
save. A save that stopped early (a crash, a lost connection, a full disk) leaves a directory
without metadata: ``load`` refuses it naming what is missing, and
``stage.write().overwrite().save(path)`` replaces it. ``save(path)`` without ``overwrite()``
refuses any existing path before it writes anything, so a complete earlier save is never
damaged. ``write().overwrite()`` deletes ``path`` first, as Spark's own ``MLWriter`` does; it is
not atomic: a crash during an overwrite leaves the incomplete state above (the old save is
gone, the new one is re-saved by running the overwrite again). A loaded stage holds its model in
memory, so overwriting the path it was loaded from is safe.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import tempfile

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from sparkdl.errors import IncompleteSaveError, SavePathExistsError, StageClassError

MODEL_FILE = "model.keras"
OPTIMIZER_FILE = "optimizer.arrow"
METADATA_DIR = "metadata"


def _hadoop_path(path: str, sc):
    """``(FileSystem, qualified Path)`` of ``path`` through the JVM's Hadoop configuration."""
    jpath = sc._jvm.org.apache.hadoop.fs.Path(path)
    fs = jpath.getFileSystem(sc._jsc.hadoopConfiguration())
    return fs, fs.makeQualified(jpath)


def qualify(path: str, sc) -> str:
    """``path`` qualified by Hadoop (scheme and authority added), as ``DefaultParamsWriter`` resolves it."""
    return _hadoop_path(path, sc)[1].toString()


def exists(path: str, sc) -> bool:
    """Whether a file or directory is at ``path`` (any Hadoop-supported URI or a path without scheme)."""
    fs, qpath = _hadoop_path(path, sc)
    return bool(fs.exists(qpath))


def _listing(path: str, sc) -> list[str]:
    fs, qpath = _hadoop_path(path, sc)
    if not fs.exists(qpath):
        return []
    return sorted(status.getPath().getName() for status in fs.listStatus(qpath))


def _local_path(local: str, sc):
    return sc._jvm.org.apache.hadoop.fs.Path(pathlib.Path(local).absolute().as_uri())


def upload_file(local: str, path: str, sc) -> None:
    """Copy the driver-local file ``local`` to ``path`` (overwriting it), parent folders created.

    The driver's JVM streams the bytes (``FileSystem.copyFromLocalFile``; S3A uploads in parts):
    nothing crosses py4j but the two paths, so no file size limit applies. Measured on the local
    filesystem: 743 MiB/s, where 4 MiB ``byte[]`` chunks through py4j wrote 28 MiB/s and read 11 MiB/s.
    """
    fs, qpath = _hadoop_path(path, sc)
    fs.copyFromLocalFile(False, True, _local_path(local, sc), qpath)


def download_file(path: str, local: str, sc) -> bool:
    """Copy the file at ``path`` to the driver-local path ``local``; ``False`` when no file is at ``path``."""
    fs, qpath = _hadoop_path(path, sc)
    if not fs.exists(qpath) or not fs.getFileStatus(qpath).isFile():
        return False
    fs.copyToLocalFile(False, qpath, _local_path(local, sc), True)  # raw local filesystem: no .crc next to ``local``
    return True


def write_bytes(path: str, data: bytes, sc) -> None:
    """Write ``data`` to ``path`` through Hadoop (via a driver-local temporary file)."""
    with tempfile.TemporaryDirectory(prefix="sparkdl-") as tmp:
        local = os.path.join(tmp, "data")
        with open(local, "wb") as f:
            f.write(data)
        upload_file(local, path, sc)


def read_bytes(path: str, sc) -> bytes | None:
    """The bytes of the file at ``path`` read through Hadoop, or ``None`` when no file is there."""
    with tempfile.TemporaryDirectory(prefix="sparkdl-") as tmp:
        local = os.path.join(tmp, "data")
        if not download_file(path, local, sc):
            return None
        with open(local, "rb") as f:
            return f.read()


def _python_class_name(saved: str) -> str:
    """The Python class that reads a stage saved as ``saved`` (Spark's JVM names map to ``pyspark``)."""
    return saved.replace("org.apache.spark", "pyspark", 1) if saved.startswith("org.apache.spark.") else saved


def _reader_name(saved: str) -> str:
    if saved.startswith("sparkdl."):
        return saved.rsplit(".", 1)[-1]  # ``from sparkdl import KerasModel``
    return _python_class_name(saved)


def _is_subclass(saved: str, cls) -> bool:
    module, _, name = _python_class_name(saved).rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - an unimportable class is simply not ``cls``
        return False
    return isinstance(found, type) and issubclass(found, cls)


class KerasStageWriter(MLWriter):
    """Writes a ``KerasEstimator`` or ``KerasModel``: ``model.keras``, ``optimizer.arrow``, then metadata.

    Raises (from ``save``):
        SavePathExistsError: ``path`` exists and ``overwrite()`` was not called.
    """

    def __init__(self, instance) -> None:
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        """Save to ``path``; with ``overwrite()`` an existing ``path`` is deleted first (see the module docstring)."""
        if self.shouldOverwrite:
            self._handleOverwrite(path)
        elif exists(path, self.sc):
            raise self._exists_error(path)
        try:
            self.saveImpl(path)
        except Exception as exc:
            if "PATH_ALREADY_EXISTS" in str(exc):  # the metadata write found a path another writer created meanwhile
                raise self._exists_error(path) from exc
            raise

    def _exists_error(self, path: str) -> SavePathExistsError:
        name = type(self.instance).__name__
        return SavePathExistsError(
            f"save(path) writes only to a new path; to replace what is there use "
            f"{'model' if name == 'KerasModel' else 'stage'}.write().overwrite().save(path). Received: path {path!r} "
            f"exists ({qualify(path, self.sc)})"
        )

    def saveImpl(self, path: str) -> None:
        # The metadata JSON is built before anything is written, so a stage whose metadata cannot
        # be serialized fails without touching the path.
        metadata = DefaultParamsWriter._get_metadata_to_save(self.instance, self.sparkSession, self._extra_metadata())
        self._write_files(path)
        self._write_metadata(path, metadata)

    def _extra_metadata(self) -> dict:
        extra = dict(self.instance._extra_metadata())
        files = []
        if self.instance._spec is not None:
            files.append(MODEL_FILE)
        if self.instance._optimizer_state is not None:
            files.append(OPTIMIZER_FILE)
            extra["optimizerState"] = {"file": OPTIMIZER_FILE, "optimizer": self.instance._state_optimizer()}
        extra["sparkdlFiles"] = files
        return extra

    def _write_files(self, path: str) -> None:
        """Step 1 of a save: the model file and the optimizer state (the metadata follows)."""
        root = path.rstrip("/")
        spec = self.instance._spec
        if spec is not None:
            with tempfile.TemporaryDirectory(prefix="sparkdl-") as tmp:
                local = os.path.join(tmp, MODEL_FILE)
                spec.to_keras_file(local)
                upload_file(local, f"{root}/{MODEL_FILE}", self.sc)
        state = self.instance._optimizer_state
        if state is not None:
            from sparkdl.serialization.arrow_codec import encode_arrays

            write_bytes(f"{root}/{OPTIMIZER_FILE}", encode_arrays(state), self.sc)

    def _write_metadata(self, path: str, metadata: str) -> None:
        """Step 2 of a save: the metadata, as ``DefaultParamsWriter.saveMetadata`` writes it."""
        self.sparkSession.createDataFrame([(metadata,)], schema=["value"]).coalesce(1).write.text(
            f"{path.rstrip('/')}/{METADATA_DIR}"
        )


class KerasStageReader(MLReader):
    """Reads what :class:`KerasStageWriter` wrote into a new instance of ``cls``.

    Raises (from ``load``):
        IncompleteSaveError: no saved stage at the path, a save that stopped before its metadata,
            or a missing ``model.keras``/``optimizer.arrow``.
        StageClassError: the path holds another class's save; the message names its reader.
    """

    def __init__(self, cls) -> None:
        super().__init__()
        self.cls = cls

    def _incomplete(self, path: str, missing: str) -> IncompleteSaveError:
        found = _listing(path, self.sc)
        return IncompleteSaveError(
            f"a saved {self.cls.__name__} must contain {missing}; the metadata is written last, so a save that "
            f"stopped early has none: save again with {'model' if self.cls.__name__ == 'KerasModel' else 'stage'}"
            f".write().overwrite().save(path). Received: {qualify(path, self.sc)} holding {found or 'nothing'}"
        )

    def _metadata(self, path: str) -> dict:
        root = path.rstrip("/")
        if not exists(root, self.sc):
            raise IncompleteSaveError(
                f"load(path) needs a saved {self.cls.__name__} at path. Received: nothing at {qualify(root, self.sc)}"
            )
        metadata_path = f"{root}/{METADATA_DIR}"
        fs, qpath = _hadoop_path(metadata_path, self.sc)
        if not fs.exists(qpath) or not fs.getFileStatus(qpath).isDirectory():
            raise self._incomplete(root, f"{METADATA_DIR}/")
        row = self.sparkSession.read.text(metadata_path).first()
        try:
            metadata = json.loads(row[0]) if row is not None else None
        except ValueError:
            metadata = None
        if not isinstance(metadata, dict) or "class" not in metadata:
            raise self._incomplete(root, f"readable {METADATA_DIR}/ (JSON with a 'class')")
        return metadata

    def load(self, path: str):
        from sparkdl.keras.spec import ModelSpec
        from sparkdl.serialization.arrow_codec import decode_arrays

        root = path.rstrip("/")
        metadata = self._metadata(root)
        saved, expected = metadata["class"], f"{self.cls.__module__}.{self.cls.__name__}"
        if saved != expected and not _is_subclass(saved, self.cls):
            raise StageClassError(
                f"{self.cls.__name__}.load(path) reads only a saved {self.cls.__name__}; this path holds a "
                f"{saved.rsplit('.', 1)[-1]}: load it with {_reader_name(saved)}.load(path). Received: class {saved!r} "
                f"at {qualify(root, self.sc)}"
            )
        files = metadata.get("sparkdlFiles")
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        model_path = f"{root}/{MODEL_FILE}"
        data = read_bytes(model_path, self.sc)
        if data is None and (self.cls._requires_model or (files is not None and MODEL_FILE in files)):
            raise IncompleteSaveError(
                f"a saved {self.cls.__name__} must contain {MODEL_FILE}. Received: no file at "
                f"{qualify(model_path, self.sc)} (holding {_listing(root, self.sc)})"
            )
        instance._spec = ModelSpec.from_keras_bytes(data) if data is not None else None
        state_info = metadata.get("optimizerState")
        if state_info is not None:
            state_path = f"{root}/{state_info['file']}"
            payload = read_bytes(state_path, self.sc)
            if payload is None:
                raise IncompleteSaveError(
                    f"a saved {self.cls.__name__} with optimizer state must contain {state_info['file']}. Received: "
                    f"no file at {qualify(state_path, self.sc)} (holding {_listing(root, self.sc)})"
                )
            instance._optimizer_state = decode_arrays(payload).arrays
            instance._optimizer_state_source = state_info.get("optimizer")
        instance._load_extra_metadata(metadata)
        return instance


class KerasStageIO(MLReadable, MLWritable):
    """``write()``/``read()`` for stages holding a ``_spec``; subclasses add extra metadata (JSON-able).

    Attributes:
        _optimizer_state: ``optimizer.variables`` values (numpy arrays, in order) saved as
            ``optimizer.arrow``, or ``None``.
        _optimizer_state_source: the optimizer (name or Keras config) that produced that state.
    """

    _requires_model = False  # whether a saved stage without model.keras is an error on load
    _spec = None
    _optimizer_state = None
    _optimizer_state_source = None

    def write(self) -> KerasStageWriter:
        return KerasStageWriter(self)

    @classmethod
    def read(cls) -> KerasStageReader:
        return KerasStageReader(cls)

    def _state_optimizer(self):
        """The optimizer (name or config) whose variables ``_optimizer_state`` holds."""
        return self._optimizer_state_source

    def _extra_metadata(self) -> dict:
        return {}

    def _load_extra_metadata(self, metadata: dict) -> None:
        pass
