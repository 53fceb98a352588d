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


def spark_session(app_name: str, master: str | None = None):
    """The active SparkSession, or a new one named ``app_name`` (on ``master`` when given, else
    spark-submit's), quieted to ERROR logs; returns ``(spark, started_here)``: stop it only when
    ``started_here`` (a Databricks or notebook session stays up).

    A session started here runs its executors' Python workers from sparkdl's daemon, which imports
    TensorFlow and Keras once per executor (:func:`sparkdl.spark.daemon.session_conf`'s settings,
    each unless spark-submit's ``--conf`` or ``spark-defaults.conf`` gives it:
    ``--conf spark.python.daemon.module=pyspark.daemon`` turns it off), and starts them at once
    (:func:`sparkdl.spark.daemon.start_workers`). The executors' Python is this one unless
    ``PYSPARK_PYTHON`` says otherwise."""
    import os
    import sys

    from pyspark.sql import SparkSession

    from sparkdl.spark.daemon import session_conf, start_workers
    from sparkdl.spark.internals import submitted_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    started_here = SparkSession.getActiveSession() is None
    builder = SparkSession.builder.appName(app_name)
    if started_here:  # the fit prints its own progress: no Spark stage bars on top of it
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        given = submitted_conf()  # spark-submit's --conf and spark-defaults.conf
        for key, value in session_conf().items():
            if not given.contains(key):
                builder = builder.config(key, value)
    if master:
        builder = builder.master(master)
    spark = builder.getOrCreate()
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
