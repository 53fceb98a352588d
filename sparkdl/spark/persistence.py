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

On Spark Connect there is no driver JVM in this process to reach: ``model.keras`` and
``optimizer.arrow`` go through ``pyarrow.fs`` from this client (``FileSystem.from_uri``:
``s3a://``/``s3://``, ``gs://``, ``abfs(s)://``, ``hdfs://`` where libhdfs is installed), while
the Connect server writes and reads the metadata with its DataFrame writer, so both must reach the
same place. A path without a scheme (or ``file:``) is a local path, accepted only when the Connect
server runs on this machine (:func:`sparkdl.spark.session.is_local_server`): it is made absolute
against this process's working directory and handed to the server as ``file:/...``. Other schemes
pyarrow cannot open (``dbfs:/``, ``viewfs://``) are refused before anything is written, naming
Spark Connect. ``write().overwrite()`` deletes the old save through the same filesystem.

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

import contextlib
import importlib
import json
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from urllib.parse import urlparse

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from sparkdl.errors import ConfigError, IncompleteSaveError, SavePathExistsError, StageClassError
from sparkdl.spark import internals
from sparkdl.spark.session import is_connect, is_local_server

MODEL_FILE = "model.keras"
OPTIMIZER_FILE = "optimizer.arrow"
METADATA_DIR = "metadata"


COPY_CHUNK_BYTES = 8 * 2**20  # pyarrow.fs copies (Spark Connect) stream in pieces of this size
# Hadoop schemes and the pyarrow.fs scheme that opens the same store (Spark Connect only)
_ARROW_SCHEMES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}


class _HadoopFiles:
    """A classic session's files: the Hadoop ``FileSystem`` of each path, through the driver's JVM."""

    def __init__(self, sc) -> None:
        self.sc = sc

    def _resolve(self, path: str):
        """``(FileSystem, qualified Path)`` of ``path`` through the JVM's Hadoop configuration."""
        jpath = internals.hadoop_path(self.sc, path)
        fs = jpath.getFileSystem(internals.hadoop_configuration(self.sc))
        return fs, fs.makeQualified(jpath)

    def qualify(self, path: str) -> str:
        return self._resolve(path)[1].toString()

    def server_path(self, path: str) -> str:
        return path  # Spark's writers and readers qualify it as the JVM does for these files

    def exists(self, path: str) -> bool:
        fs, qpath = self._resolve(path)
        return bool(fs.exists(qpath))

    def is_dir(self, path: str) -> bool:
        fs, qpath = self._resolve(path)
        return bool(fs.exists(qpath) and fs.getFileStatus(qpath).isDirectory())

    def listing(self, path: str) -> list[str]:
        fs, qpath = self._resolve(path)
        if not fs.exists(qpath):
            return []
        return sorted(status.getPath().getName() for status in fs.listStatus(qpath))

    def _local_path(self, local: str):
        return internals.hadoop_path(self.sc, pathlib.Path(local).absolute().as_uri())

    def upload(self, local: str, path: str) -> None:
        fs, qpath = self._resolve(path)
        fs.copyFromLocalFile(False, True, self._local_path(local), qpath)

    def download(self, path: str, local: str) -> bool:
        fs, qpath = self._resolve(path)
        if not fs.exists(qpath) or not fs.getFileStatus(qpath).isFile():
            return False
        fs.copyToLocalFile(False, qpath, self._local_path(local), True)  # raw local filesystem: no .crc next to ``local``
        return True

    def delete(self, path: str) -> None:
        fs, qpath = self._resolve(path)
        if fs.exists(qpath):
            fs.delete(qpath, True)


class _ArrowFiles:
    """A Spark Connect session's files, written and read by this client through ``pyarrow.fs``
    (see the module docstring); the metadata goes to :meth:`server_path` through the server."""

    def __init__(self, spark) -> None:
        self.spark = spark

    def _resolve(self, path: str):
        """``(pyarrow FileSystem, its path, the URI the Connect server is given)`` of ``path``.

        Raises:
            ConfigError: a local path with a remote Connect server, or a scheme pyarrow cannot open.
        """
        import pyarrow as pa
        from pyarrow import fs as pafs

        scheme = urlparse(path).scheme.lower()
        if scheme in ("", "file"):
            if not is_local_server(self.spark):
                raise ConfigError(
                    "on Spark Connect a path without a scheme (or file:) must name a disk the Connect server shares: this "
                    "client writes the model files, the server the metadata, and a remote server does not see this "
                    "machine's disk. Use a URI both reach (s3a://, gs://, abfss://, hdfs://), or a classic SparkSession. "
                    f"Received: {path!r} with a remote Connect server"
                )
            local = os.path.abspath(urlparse(path).path if scheme == "file" else path)
            return pafs.LocalFileSystem(), local, f"file:{local}"
        uri = _ARROW_SCHEMES[scheme] + path[len(scheme):] if scheme in _ARROW_SCHEMES else path
        try:
            fs, fs_path = pafs.FileSystem.from_uri(uri)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ConfigError(
                "on Spark Connect a stage's files are read and written from this client through pyarrow.fs, which must "
                "open the path's scheme (s3a:// or s3://, gs://, abfs(s)://, hdfs:// with libhdfs, or a local path with "
                "a Connect server on this machine): use such a path, or a classic SparkSession, whose driver reaches any "
                f"Hadoop filesystem. Received: {path!r} ({type(exc).__name__}: {exc})"
            ) from exc
        return fs, fs_path, path

    def _info(self, path: str):
        fs, fs_path, _ = self._resolve(path)
        return fs, fs_path, fs.get_file_info(fs_path)

    def qualify(self, path: str) -> str:
        return self._resolve(path)[2]

    def server_path(self, path: str) -> str:
        return self._resolve(path)[2]

    def exists(self, path: str) -> bool:
        from pyarrow.fs import FileType

        return self._info(path)[2].type != FileType.NotFound

    def is_dir(self, path: str) -> bool:
        from pyarrow.fs import FileType

        return self._info(path)[2].type == FileType.Directory

    def listing(self, path: str) -> list[str]:
        from pyarrow.fs import FileSelector, FileType

        fs, fs_path, info = self._info(path)
        if info.type != FileType.Directory:
            return []
        return sorted(entry.base_name for entry in fs.get_file_info(FileSelector(fs_path)))

    def upload(self, local: str, path: str) -> None:
        fs, fs_path, _ = self._resolve(path)
        parent = fs_path.rstrip("/").rpartition("/")[0]
        if parent:
            fs.create_dir(parent, recursive=True)
        with open(local, "rb") as source, fs.open_output_stream(fs_path) as target:
            shutil.copyfileobj(source, target, COPY_CHUNK_BYTES)

    def download(self, path: str, local: str) -> bool:
        from pyarrow.fs import FileType

        fs, fs_path, info = self._info(path)
        if info.type != FileType.File:
            return False
        with fs.open_input_stream(fs_path) as source, open(local, "wb") as target:
            shutil.copyfileobj(source, target, COPY_CHUNK_BYTES)
        return True

    def delete(self, path: str) -> None:
        from pyarrow.fs import FileType

        fs, fs_path, info = self._info(path)
        if info.type == FileType.Directory:
            fs.delete_dir(fs_path)
        elif info.type != FileType.NotFound:
            fs.delete_file(fs_path)


def _files(spark) -> _HadoopFiles | _ArrowFiles:
    """The filesystem access of ``spark``: Hadoop through the driver's JVM on a classic session,
    ``pyarrow.fs`` from this client on Spark Connect."""
    return _ArrowFiles(spark) if is_connect(spark) else _HadoopFiles(spark.sparkContext)


def qualify(path: str, spark) -> str:
    """``path`` qualified (scheme and authority added) as the session's filesystem resolves it: by
    Hadoop, as ``DefaultParamsWriter`` does (classic); a local path as ``file:/...`` on Spark Connect."""
    return _files(spark).qualify(path)


def exists(path: str, spark) -> bool:
    """Whether a file or directory is at ``path`` (any Hadoop-supported URI or a path without scheme)."""
    return _files(spark).exists(path)


def listing(path: str, spark) -> list[str]:
    """The names in the folder at ``path`` (sorted; empty when there is none)."""
    return _files(spark).listing(path)


def delete(path: str, spark) -> None:
    """Delete the file or folder (recursively) at ``path``, if any."""
    _files(spark).delete(path)


def upload_file(local: str, path: str, spark) -> None:
    """Copy the driver-local file ``local`` to ``path`` (overwriting it), parent folders created.

    Classic: the driver's JVM streams the bytes (``FileSystem.copyFromLocalFile``; S3A uploads in
    parts): nothing crosses py4j but the two paths, so no file size limit applies. Measured on the
    local filesystem: 743 MiB/s, where 4 MiB ``byte[]`` chunks through py4j wrote 28 MiB/s and read
    11 MiB/s. Spark Connect: ``pyarrow.fs`` streams it from this client in 8 MiB pieces.

    Raises:
        ConfigError: on Spark Connect, a path this client cannot reach (see the module docstring).
    """
    _files(spark).upload(local, path)


def download_file(path: str, local: str, spark) -> bool:
    """Copy the file at ``path`` to the driver-local path ``local``; ``False`` when no file is at ``path``."""
    return _files(spark).download(path, local)


#: the name of a driver-local scratch folder (a file on its way to or from the session's filesystem) starts
#: with this, then the pid of the process that made it: ``sparkdl-io-<pid>-<random>``
SCRATCH_PREFIX = "sparkdl-io-"
_SCRATCH_NAME = re.compile(rf"^{re.escape(SCRATCH_PREFIX)}([0-9]+)-")


@contextlib.contextmanager
def scratch_folder() -> Iterator[str]:
    """A driver-local temporary folder named after this process (:data:`SCRATCH_PREFIX`), removed
    when the block ends; a driver killed inside the block (while it writes a snapshot: the whole
    state's bytes) leaves it behind for :func:`remove_scratch_leftovers`."""
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as tmp:
        yield tmp


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: is there such a process (POSIX only: on Windows it would send CTRL_C_EVENT)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM), or a question the system does not answer: keep its folder
        return True
    return True


def remove_scratch_leftovers(folder: str | None = None) -> list[str]:
    """Remove the scratch folders (:func:`scratch_folder`) of processes that are gone: a driver killed
    while it wrote a snapshot or a model left the bytes there (108 MB for a 9M-parameter Adam state),
    and no later run would. A folder of a live process (another driver on this machine, this one) is
    kept; nothing is removed where the system cannot tell (not POSIX).

    Args:
        folder: where to look; default the driver's temporary folder (``tempfile.gettempdir()``).

    Returns:
        The paths removed.
    """
    if os.name != "posix":
        return []
    folder = folder or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for entry in entries:
        found = _SCRATCH_NAME.match(entry.name)
        if found is None or not entry.is_dir(follow_symlinks=False):
            continue
        pid = int(found.group(1))
        if pid == os.getpid() or _process_alive(pid):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.exists(entry.path):
            removed.append(entry.path)
    return removed


def write_bytes(path: str, data: bytes, spark) -> None:
    """Write ``data`` to ``path`` through the session's filesystem (via a driver-local temporary file,
    in a :func:`scratch_folder`)."""
    with scratch_folder() as tmp:
        local = os.path.join(tmp, "data")
        with open(local, "wb") as f:
            f.write(data)
        upload_file(local, path, spark)


def read_bytes(path: str, spark) -> bytes | None:
    """The bytes of the file at ``path`` read through the session's filesystem, or ``None`` when no file is there."""
    with scratch_folder() as tmp:
        local = os.path.join(tmp, "data")
        if not download_file(path, local, spark):
            return None
        with open(local, "rb") as f:
            return f.read()


def read_keras_file(path, who: str):
    """The ``keras.Model`` of the ``.keras`` archive at ``path`` (compiled as saved, when it holds
    compile arguments): a local path or ``file:`` URI read directly, any other Hadoop-filesystem
    URI (``hdfs://``, ``s3a://``, ``dbfs:/``) through the active SparkSession.

    Args:
        path: a ``str`` or ``os.PathLike``.
        who: what takes the path, for messages (``"fromKeras"``, ``"KerasEstimator model"``).

    Raises:
        ConfigError: no file at ``path``, a file that is not a ``.keras`` archive, or custom
            objects the archive names that are not registered (each named).
    """
    from sparkdl.keras.spec import load_keras_bytes

    path = os.fspath(path)
    scheme = urlparse(path).scheme
    data = None
    if len(scheme) > 1 and scheme != "file" or path.startswith("dbfs:"):  # a Hadoop-filesystem URI
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        data = read_bytes(path, spark) if spark is not None else None
    else:
        local = urlparse(path).path if scheme == "file" else path
        if os.path.isfile(local):
            with open(local, "rb") as f:
                data = f.read()
    if data is None:
        raise ConfigError(f"{who} needs a .keras file written by keras.Model.save. Received: no file at {path!r}")
    return load_keras_bytes(data, compile=True)


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


# The layout of a saved stage (files, metadata keys, the Params it records). A later sparkdl reads
# every format up to its own; a save in a newer format than this sparkdl knows is refused, naming
# both versions. Format 2: a KerasModel records its estimator's training Params
# (numWorkers, epochs, mode, ...) and handleInvalid, which a format-1 reader does not know; a
# format-1 model loads with those Params at their defaults.
SAVE_FORMAT = 2


def saved_versions() -> dict:
    """What wrote a save: ``{"format": SAVE_FORMAT, "sparkdl": "0.2.0", "keras": "3.15.1",
    "backend": "tensorflow", "backendVersion": "2.21.0", "python": "3.11.9"}``."""
    import platform

    import sparkdl
    from sparkdl.keras.runtime import keras_module

    keras = keras_module()
    backend = keras.backend.backend()
    try:
        from importlib.metadata import version

        backend_version = getattr(__import__(backend), "__version__", None) or version(backend)
    except Exception:
        backend_version = None
    return {"format": SAVE_FORMAT, "sparkdl": sparkdl.__version__, "keras": keras.__version__, "backend": backend,
            "backendVersion": backend_version, "python": platform.python_version()}


def saved_params(instance) -> dict:
    """The Params ``instance`` holds, name -> JSON value, as a save writes them: a decoder given as a
    function is written as its name ``"module:qualname"`` (``"__main__:decode"`` for one defined
    in a script or notebook, which :func:`warn_decoders_to_pass_again` asks for again at load)."""
    from sparkdl.serialization.columns import decoder_name

    params = {param.name: value for param, value in instance._paramMap.items()}
    if isinstance(params.get("decoders"), dict):
        params["decoders"] = {column: decoder_name(d) for column, d in params["decoders"].items()}
    return params


def warn_decoders_to_pass_again(instance) -> None:
    """Warn, naming the column and how to pass it, for each loaded decoder name that this process
    cannot resolve: a function of ``__main__`` (a script or notebook) that was given by value and
    is not defined here, or a module that cannot be imported here. ``transform`` and ``fit`` refuse
    such a decoder before any job with the same advice; ``setDecoders`` replaces it."""
    import warnings

    from sparkdl.serialization.columns import BY_VALUE_MODULE, resolve_decoder, split_decoder_name

    decoders = instance.getOrDefault("decoders") if instance.isDefined("decoders") else None
    for column, name in (decoders or {}).items():
        try:
            resolve_decoder(name, column)
        except ConfigError as exc:
            module, attribute = split_decoder_name(name)
            how = (f"it was given as a function defined in {BY_VALUE_MODULE} (a script or notebook), which a save keeps by "
                   "name only" if module == BY_VALUE_MODULE else f"it cannot be found here ({exc})")
            warnings.warn(
                f"the loaded {type(instance).__name__}'s decoder for column {column!r} is {name!r}: {how}. Pass it again "
                f"before transform, evaluate or fit: .setDecoders({{{column!r}: {attribute.split('.')[-1]}}}) with the "
                f"function itself (or {{{column!r}: 'module:function'}} of an importable module)", stacklevel=3)


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
        elif exists(path, self.sparkSession):
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
            f"exists ({qualify(path, self.sparkSession)})"
        )

    def _handleOverwrite(self, path: str) -> None:
        """Delete ``path`` before an overwrite: Spark's ``FileSystemOverwrite`` on a classic session;
        on Spark Connect through ``pyarrow.fs``, where the files are written."""
        if is_connect(self.sparkSession):
            _files(self.sparkSession).delete(path)
        else:
            super()._handleOverwrite(path)

    def saveImpl(self, path: str) -> None:
        # The metadata JSON is built before anything is written, so a stage whose metadata cannot
        # be serialized fails without touching the path.
        metadata = DefaultParamsWriter._get_metadata_to_save(self.instance, self.sparkSession, self._extra_metadata(),
                                                             paramMap=saved_params(self.instance))
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
        extra["versions"] = saved_versions()
        return extra

    def _write_files(self, path: str) -> None:
        """Step 1 of a save: the model file and the optimizer state (the metadata follows)."""
        root = path.rstrip("/")
        spec = self.instance._spec
        if spec is not None:
            with scratch_folder() as tmp:
                local = os.path.join(tmp, MODEL_FILE)
                spec.to_keras_file(local)
                upload_file(local, f"{root}/{MODEL_FILE}", self.sparkSession)
        state = self.instance._optimizer_state
        if state is not None:
            from sparkdl.serialization.arrow_codec import encode_arrays

            write_bytes(f"{root}/{OPTIMIZER_FILE}", encode_arrays(state), self.sparkSession)

    def _write_metadata(self, path: str, metadata: str) -> None:
        """Step 2 of a save: the metadata, as ``DefaultParamsWriter.saveMetadata`` writes it."""
        target = _files(self.sparkSession).server_path(f"{path.rstrip('/')}/{METADATA_DIR}")
        self.sparkSession.createDataFrame([(metadata,)], schema=["value"]).coalesce(1).write.text(target)


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
        found = listing(path, self.sparkSession)
        return IncompleteSaveError(
            f"a saved {self.cls.__name__} must contain {missing}; the metadata is written last, so a save that "
            f"stopped early has none: save again with {'model' if self.cls.__name__ == 'KerasModel' else 'stage'}"
            f".write().overwrite().save(path)"
            + (f"; {path!r} names a file of a save: load its folder" if path.rstrip("/").endswith((".keras", ".arrow")) else "")
            + f". Received: {qualify(path, self.sparkSession)} holding {found or 'nothing'}"
        )

    def _metadata(self, path: str) -> dict:
        root = path.rstrip("/")
        files = _files(self.sparkSession)
        if not files.exists(root):
            raise IncompleteSaveError(
                f"load(path) needs a saved {self.cls.__name__} at path. Received: nothing at {files.qualify(root)}"
            )
        metadata_path = f"{root}/{METADATA_DIR}"
        if not files.is_dir(metadata_path):
            raise self._incomplete(root, f"{METADATA_DIR}/")
        row = self.sparkSession.read.text(files.server_path(metadata_path)).first()
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
                f"at {qualify(root, self.sparkSession)}"
            )
        versions = metadata.get("versions") or {}
        if int(versions.get("format", 1)) > SAVE_FORMAT:
            raise IncompleteSaveError(
                f"{self.cls.__name__}.load(path) reads saves of format {SAVE_FORMAT} or older; this one was written by "
                f"sparkdl {versions.get('sparkdl')} in format {versions.get('format')}: upgrade sparkdl. Received: "
                f"{qualify(root, self.sparkSession)}"
            )
        files = metadata.get("sparkdlFiles")
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        warn_decoders_to_pass_again(instance)
        model_path = f"{root}/{MODEL_FILE}"
        data = read_bytes(model_path, self.sparkSession)
        if data is None and (self.cls._requires_model or (files is not None and MODEL_FILE in files)):
            raise IncompleteSaveError(
                f"a saved {self.cls.__name__} must contain {MODEL_FILE}. Received: no file at "
                f"{qualify(model_path, self.sparkSession)} (holding {listing(root, self.sparkSession)})"
            )
        instance._spec = ModelSpec.from_keras_bytes(data) if data is not None else None
        state_info = metadata.get("optimizerState")
        if state_info is not None:
            state_path = f"{root}/{state_info['file']}"
            payload = read_bytes(state_path, self.sparkSession)
            if payload is None:
                raise IncompleteSaveError(
                    f"a saved {self.cls.__name__} with optimizer state must contain {state_info['file']}. Received: "
                    f"no file at {qualify(state_path, self.sparkSession)} (holding {listing(root, self.sparkSession)})"
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
    def load(cls, path: str, customObjects: dict | None = None):
        """Read a saved stage (see the module docstring); ``customObjects`` (a dict name -> class or
        function, as Keras' ``custom_objects``) are registered first, here and for the executors.

        Raises:
            IncompleteSaveError, StageClassError: see :class:`KerasStageReader`.
            ConfigError: the saved model uses custom objects not registered here (named).
        """
        from sparkdl.keras.custom_objects import register_custom_objects

        register_custom_objects(customObjects)
        return cls.read().load(path)

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
