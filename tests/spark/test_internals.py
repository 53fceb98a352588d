"""The private PySpark attributes sparkdl uses (``sparkdl/spark/internals.py``), each asked on a real
``local[2]`` session (or a real Spark Connect client) for the value it must give, so that a Spark
upgrade that moves or changes one fails here, naming it, rather than inside a fit (issue 31 item 10).

Run on pyspark 4.0.0 (the lowest setup.cfg allows) and 4.3.0.
"""

import types

import pytest

from sparkdl.spark import internals
from tests.conftest import run_spark_script


def test_jvm_and_jvm_context_are_this_sessions(spark):
    sc = spark.sparkContext
    context = internals.jvm_context(sc)
    assert context.master() == "local[2]" and context.applicationId() == sc.applicationId
    assert internals.jvm(sc).org.apache.spark.SparkContext.getOrCreate().applicationId() == sc.applicationId
    assert internals.context_stopped(sc) is False


def test_max_concurrent_tasks_counts_the_task_slots_of_local_2(spark):
    assert internals.max_concurrent_tasks(spark.sparkContext) == 2


def test_executors_lists_no_driver_on_local_2(spark):
    """A local master's only executor is the driver, which the list leaves out (on a cluster each executor is
    listed with its reason once removed: tests/integration/test_node_loss.py asserts Spark's 'worker lost')."""
    assert internals.executors(spark.sparkContext) == []


def test_run_job_raw_runs_only_the_chosen_partitions_and_returns_their_bytes_as_sent_in_that_order(spark):
    from pyspark import TaskContext

    big = bytes(range(256)) * 12_288  # 3 MiB with every byte value: a pickled or re-encoded copy differs

    def produce(rows):
        count = sum(1 for _ in rows)
        partition = TaskContext.get().partitionId()
        yield f"partition {partition}: {count} rows".encode()
        if partition == 3:
            yield big

    rdd = spark.sparkContext.parallelize(range(40), 4)
    got = internals.run_job_raw(rdd, produce, [3, 1])
    assert len(got) == 3 and got[0] == b"partition 3: 10 rows" and got[1] == big and got[2] == b"partition 1: 10 rows"
    assert internals.run_job_raw(rdd, produce, []) == []


def test_hadoop_path_and_configuration_resolve_local_files_as_spark_does(spark, tmp_path):
    sc = spark.sparkContext
    (tmp_path / "there.txt").write_text("x")
    path = internals.hadoop_path(sc, (tmp_path / "there.txt").as_uri())
    fs = path.getFileSystem(internals.hadoop_configuration(sc))
    assert fs.getUri().toString() == "file:///"
    assert fs.exists(path) and not fs.exists(internals.hadoop_path(sc, (tmp_path / "missing").as_uri()))
    assert fs.makeQualified(internals.hadoop_path(sc, str(tmp_path / "there.txt"))).toString() == f"file:{tmp_path}/there.txt"
    configuration = internals.hadoop_configuration(sc)
    configuration.set("sparkdl.test.internals", "seen")
    try:  # the SparkContext's own configuration, not a copy
        assert internals.hadoop_configuration(sc).get("sparkdl.test.internals") == "seen"
    finally:
        configuration.unset("sparkdl.test.internals")


def test_the_console_progress_bar_is_taken_off_and_given_back(spark):
    sc = spark.sparkContext
    assert not internals.progress_bar_running(sc)  # the test session starts without one
    assert internals.take_progress_bar(sc) is False
    try:
        assert internals.give_progress_bar(sc) is True
        bar = internals.jvm_context(sc).progressBar()
        assert bar.isDefined() and bar.get().getClass().getName() == "org.apache.spark.ui.ConsoleProgressBar"
        assert internals.progress_bar_running(sc)
        assert internals.take_progress_bar(sc) is True
        assert not internals.progress_bar_running(sc)
    finally:
        internals.take_progress_bar(sc)


def test_a_session_started_from_python_has_the_bar_and_a_stopped_context_is_told(tmp_path):
    """Also docs/user-guide/quiet-logs.md's "A session started from Python ... has
    spark.ui.showConsoleProgress=true and so draws them": no setting given here."""
    script = """
import json, sys
from pyspark.sql import SparkSession
from sparkdl.spark import internals
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
sc = spark.sparkContext
out = {"running": internals.progress_bar_running(sc), "stopped_before": internals.context_stopped(sc)}
spark.stop()
out.update(stopped_after=internals.context_stopped(sc), given=internals.give_progress_bar(sc))
json.dump(out, open(sys.argv[1], "w"))
"""
    got = run_spark_script(script, tmp_path, timeout_s=300)
    assert got == {"running": True, "stopped_before": False, "stopped_after": True, "given": False}


def test_connect_clients_host_and_channel_options():
    pytest.importorskip("grpc")
    from pyspark.sql.connect.client import DefaultChannelBuilder, SparkConnectClient

    plain = SparkConnectClient("sc://spark.example.com:15002")
    limited = SparkConnectClient(DefaultChannelBuilder("sc://10.1.2.3:15002", channelOptions=[("grpc.max_send_message_length", 8 * 2**20)]))
    try:
        assert internals.connect_host(types.SimpleNamespace(client=plain)) == "spark.example.com"
        assert internals.connect_host(types.SimpleNamespace(client=limited)) == "10.1.2.3"
        assert internals.connect_channel_option(types.SimpleNamespace(client=plain), "grpc.max_send_message_length") == 128 * 2**20
        assert internals.connect_channel_option(types.SimpleNamespace(client=limited), "grpc.max_send_message_length") == 8 * 2**20
        assert internals.connect_channel_option(types.SimpleNamespace(client=limited), "grpc.no_such_option") is None
    finally:
        plain.close()
        limited.close()


def test_the_pyspark_ml_subclassing_protocol_sparkdl_relies_on(spark, tmp_path):
    """Not wrapped (every custom Spark ML stage is written against it), but checked: ``Params._dummy``,
    ``_setDefault``, ``_set``, ``_paramMap`` (the values set, not the defaults), ``_shouldOwn``,
    ``_copyValues``, ``_resetUid`` and ``MLWriter._handleOverwrite``."""
    from pyspark.ml.param import Param, Params
    from pyspark.ml.util import DefaultParamsWriter, MLWriter

    class Stage(Params):
        width = Param(Params._dummy(), "width", "a width")

        def __init__(self):
            super().__init__()
            self._setDefault(width=3)

    stage, other = Stage(), Stage()
    assert stage.getOrDefault("width") == 3 and dict(stage._paramMap) == {}
    stage._set(width=5)
    assert {p.name: v for p, v in stage._paramMap.items()} == {"width": 5}
    stage._shouldOwn(stage.width)
    with pytest.raises(ValueError):
        stage._shouldOwn(other.width)
    stage._copyValues(other)
    assert other.getOrDefault("width") == 5 and other.width.parent == other.uid
    other._resetUid("Stage_fixed")
    assert other.uid == "Stage_fixed" and other.width.parent == "Stage_fixed"
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "part-00000").write_text("{}")
    writer = DefaultParamsWriter(stage)
    assert isinstance(writer, MLWriter)
    writer._handleOverwrite(str(saved))  # what overwrite().save(path) does first: the old save deleted
    assert not saved.exists()


def test_kill_task_attempt_answers_false_for_an_attempt_spark_does_not_run(spark):
    """The JVM method exists and says whether it found the attempt (none runs with this id)."""
    from sparkdl.spark import internals

    assert internals.kill_task_attempt(spark.sparkContext, 10**9, "test: no such attempt") is False


def _worker_pid(rows):
    import os

    for _ in rows:
        pass
    yield os.getpid()


def test_an_rdd_given_the_dataframe_runners_worker_variables_shares_their_python_workers(spark):
    assert internals.dataframe_worker_env(spark) == {"SPARK_SIMPLIFIED_TRACEBACK": "1"}  # the session's defaults
    sc = spark.sparkContext
    before = dict(sc.environment)
    rdd = internals.with_worker_env(sc.parallelize(range(2), 2).mapPartitions(_worker_pid), internals.dataframe_worker_env(spark))
    assert dict(sc.environment) == before  # the context's environment given back as it was
    import pyarrow as pa

    def arrow_pid(batches):
        import os

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]})

    rdd_pids, arrow_pids = set(rdd.collect()), {r.pid for r in spark.range(2).repartition(2).mapInArrow(arrow_pid, "pid long").collect()}
    assert rdd_pids & arrow_pids, (rdd_pids, arrow_pids)  # Python workers reused across the two kinds of task
    plain = {*sc.parallelize(range(2), 2).mapPartitions(_worker_pid).collect()}
    assert not plain & arrow_pids, (plain, arrow_pids)  # without them an RDD's workers are other processes (another daemon)
    key = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"
    try:
        spark.conf.set(key, "true")  # a variable this cannot tell: none returned, the caller runs a DataFrame job
        assert internals.dataframe_worker_env(spark) is None
        spark.conf.set(key, "false")
        assert internals.dataframe_worker_env(spark) is None  # set at all
    finally:
        spark.conf.unset(key)
    try:
        spark.conf.set("spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled", "false")
        assert internals.dataframe_worker_env(spark) == {}
    finally:
        spark.conf.unset("spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled")
