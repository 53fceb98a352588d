"""Command line tools: ``sparkdl-train`` (a YAML job config -> fit, test accuracy, saved model,
metrics, history plot) and ``sparkdl-predict`` (a saved ``KerasModel`` scores a file into another).

- :mod:`sparkdl.cli.config`: the job config's schema, ``load_config`` (validated up front, with
  ``--set section.key=value`` overrides) and the builders of the model and callbacks;
- :mod:`sparkdl.cli.train`: ``sparkdl-train`` (also ``spark-submit jobs/train.py``);
- :mod:`sparkdl.cli.predict`: ``sparkdl-predict`` (also ``spark-submit jobs/predict.py``);
- :mod:`sparkdl.cli.plot`: ``plot_history`` (matplotlib, the ``plot`` extra).

Importing this package loads neither Spark nor Keras. Sessions the commands start draw no Spark stage
bars (``spark.ui.showConsoleProgress=false``), and TensorFlow's start-up lines are filtered
(:func:`quiet_tensorflow`).
"""


def spark_settings(pairs: list[str]) -> dict[str, str]:
    """The ``--conf KEY=VALUE`` arguments as a dict (a later key wins), as spark-submit reads them.

    Raises:
        ConfigError: an argument without ``=`` or with an empty key.
    """
    from sparkdl.errors import ConfigError

    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--conf takes KEY=VALUE, a Spark setting, e.g. --conf spark.executor.memory=4g. Received: --conf {pair!r}")
        settings[key.strip()] = value
    return settings


def python_files(values: list[str]) -> list[str]:
    """The ``--py-files`` arguments (each a comma-separated list, as spark-submit's) as a list of
    paths: local ones made absolute, URIs (``hdfs://``, ``s3a://``) as given.

    Raises:
        ConfigError: a local path that names no file, or one that is not ``.py``, ``.zip``, ``.egg``
            or ``.whl``.
    """
    import os

    from sparkdl.cli.config import is_uri
    from sparkdl.errors import ConfigError

    found = []
    for value in values:
        for path in filter(None, (p.strip() for p in value.split(","))):
            if not path.endswith((".py", ".zip", ".egg", ".whl")):
                raise ConfigError(f"--py-files takes .py, .zip, .egg or .whl files (comma-separated). Received: {path!r}")
            if not is_uri(path):
                if not os.path.isfile(path):
                    raise ConfigError(f"--py-files: no file at {path!r} (read from the working directory {os.getcwd()!r}). "
                                      f"Received: {path!r}")
                path = os.path.abspath(path)
            found.append(path)
    return found


def options_markdown(parser) -> str:
    """An ``argparse`` parser's options as the Markdown table of docs/reference/cli.md: option (with
    its value's name), required or the default, and its help."""
    import argparse

    lines = ["| option | default | meaning |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = " ".join(action.option_strings)
        if action.nargs != 0:
            flag += f" {action.metavar or action.dest.upper()}"
        if action.required:
            default = "required"
        elif isinstance(action, argparse._AppendAction):
            default = "repeatable"
        elif action.nargs == 0 or action.default is None:
            default = ""
        else:
            default = f"`{action.default}`"
        choices = f" (one of {', '.join(f'`{c}`' for c in action.choices)})" if action.choices else ""
        lines.append(f"| `{flag}` | {default} | {action.help.replace('|', '/').replace('<', '&lt;')}{choices} |")
    return "\n".join(lines) + "\n"


def add_to_driver_path(py_files: list[str]) -> None:
    """Make the local ``--py-files`` importable on the driver too, as spark-submit does, before the
    config's model factory is imported: a ``.zip``, ``.egg`` or ``.whl`` itself, a ``.py`` file's
    folder, each appended to ``sys.path`` once."""
    import os
    import sys

    from sparkdl.cli.config import is_uri

    for path in py_files:
        if not is_uri(path):
            entry = os.path.dirname(path) if path.endswith(".py") else path
            if entry not in sys.path:
                sys.path.append(entry)


def spark_session(app_name: str, master: str | None = None, conf: dict[str, str] | None = None, py_files: list[str] = ()):
    """The active SparkSession, or a new one named ``app_name`` (on ``master`` when given, else
    spark-submit's), quieted to ERROR logs (and to WARN from its start, ``spark.log.level``, where the
    driver's JVM runs Spark's default log4j profile and neither ``--conf spark.log.level`` nor a
    log4j configuration of yours says otherwise); returns ``(spark, started_here)``: stop it only when
    ``started_here`` (a Databricks or notebook session stays up).

    A session started here runs its executors' Python workers from sparkdl's daemon, which imports
    TensorFlow and Keras once per executor (:func:`sparkdl.spark.daemon.session_conf`'s settings,
    each unless spark-submit's ``--conf`` or ``spark-defaults.conf`` gives it:
    ``--conf spark.python.daemon.module=pyspark.daemon`` turns it off), and starts them at once
    (:func:`sparkdl.spark.daemon.start_workers`). The executors' Python is this one unless
    ``PYSPARK_PYTHON`` says otherwise.

    ``conf`` (``--conf``) sets a session started here, over sparkdl's own settings; an existing
    session keeps its own (a warning names those not applied). ``py_files`` (``--py-files``) go to
    the executors with ``SparkContext.addPyFile``, on a session started here or an existing one."""
    import os
    import sys

    from pyspark.sql import SparkSession

    from sparkdl.spark.daemon import session_conf, start_workers
    from sparkdl.spark.internals import default_log4j, submitted_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    started_here = SparkSession.getActiveSession() is None
    builder = SparkSession.builder.appName(app_name)
    if started_here:  # the fit prints its own progress: no Spark stage bars on top of it
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        given = submitted_conf()  # spark-submit's --conf and spark-defaults.conf
        if not given.contains("spark.log.level") and default_log4j():  # no INFO lines as the context starts
            builder = builder.config("spark.log.level", "WARN")
        for key, value in session_conf().items():
            if not given.contains(key):
                builder = builder.config(key, value)
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
    if master:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    if conf and not started_here:
        import logging

        logging.getLogger("sparkdl.cli").warning(
            "the session exists already and keeps its settings: --conf %s not applied (set them where the session is made: "
            "the cluster's Spark config)", " ".join(f"{k}={v}" for k, v in conf.items()))
    for path in py_files:
        spark.sparkContext.addPyFile(path)
    if started_here:
        spark.sparkContext.setLogLevel("ERROR")
        start_workers(spark)
    return spark, started_here


def quiet_tensorflow() -> None:
    """Import TensorFlow now, when it is Keras' backend, with its start-up lines filtered by
    ``TF_CPP_MIN_LOG_LEVEL`` (default here 2, which the local Python workers inherit; 0 shows them):
    :func:`sparkdl.keras.runtime.import_tensorflow`. Nothing happens without TensorFlow."""
    import os

    from sparkdl.keras.runtime import import_tensorflow, keras_backend

    if keras_backend() != "tensorflow":
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import_tensorflow()
    except ImportError:
        pass  # the model's import names what is missing


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a problem of the input the command can state in one line (exit status 2):
    a sparkdl error (bad config, column, path, saved stage) or Spark's analysis error (a path that
    does not exist, a missing column); anything else is a bug and keeps its traceback."""
    from sparkdl.errors import SparkDLError

    return isinstance(exc, SparkDLError) or type(exc).__name__ == "AnalysisException"
