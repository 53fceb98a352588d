"""Issue 5 items 8-11 and 13: no temp files left per round, job aborts as sparkdl errors naming
the setting, the caller's job group and tags reach the rounds (so a notebook's cancel stops
training), label values checked before training, caches and persisted data released."""

import os
import threading
import uuid
import time

import numpy as np
import pytest
from pyspark.sql import functions as F

import keras
from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError, FitCancelledError, SchemaError, WorkerError


def _temp_files(spark):
    return len(os.listdir(spark.sparkContext._temp_dir))


def _wide_model():
    """~0.24M parameters: with Adam the master state is ~2.8 MB, above PySpark's 1 MB closure-broadcast threshold."""
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(300), keras.layers.Dense(1)])


def test_rounds_leave_no_temp_files_on_the_driver(spark):
    """The master state once rode in the task closure, and PySpark broadcast every closure over 1 MB
    to a temp file it never deleted (19 files, 33 MiB for 20 rounds; here 8 rounds). Now: an explicit broadcast per
    round, destroyed when the round ends."""
    rows = [([float(i % 7)] * 784, float(i % 3)) for i in range(40)]
    df = spark.createDataFrame(rows, "x array<float>, y double")
    est = KerasEstimator(model=_wide_model(), optimizer="adam", loss="mse", featuresCol="x", labelCol="y", numWorkers=2,
                         epochs=4, batchSize=10, localSteps=1, verbose=0)
    before = _temp_files(spark)
    fitted = est.fit(df)
    assert fitted.fitInfo["rounds"] == 8
    assert _temp_files(spark) == before
    # transform: one broadcast of the weights per model and SparkContext, reused by every call, not one file per call
    first = fitted.transform(df).select("prediction").collect()
    with_model = _temp_files(spark)
    assert with_model <= before + 1
    for _ in range(5):
        assert fitted.transform(df).select("prediction").collect() == first
    assert _temp_files(spark) == with_model


class _HeapAfterGC(keras.callbacks.Callback):
    """The driver JVM's heap in use after a full GC (bytes), at each epoch's end: what it still holds."""

    needs_weights = False

    def __init__(self, spark):
        super().__init__()
        from sparkdl.spark.internals import jvm

        self.jvm, self.used = jvm(spark.sparkContext), []

    def on_epoch_end(self, epoch, logs=None):
        runtime = self.jvm.java.lang.Runtime.getRuntime()
        self.jvm.java.lang.System.gc()
        self.used.append(int(runtime.totalMemory() - runtime.freeMemory()))


def test_rounds_release_each_rounds_broadcast_and_results_in_the_driver_jvm(spark):
    """Issue 31 item 11: the driver JVM's RSS rose over the epochs of a rounds fit (4.0, 6.2, 5.9 GB at 20M with
    Adam). Its heap after a full GC is flat over the epochs (measured at 10M with Adam: 66-67 MB over 6 epochs while
    the RSS moved between 2.5 and 4.0 GB, G1 sizing its heap to each round's garbage), so nothing of a finished
    round stays: a kept broadcast or kept results (~2.8 MB and 2 x 2.8 MB a round here) would add 2.8-8.4 MB a round.
    Spark's own records of each job (a few KB) stay in the margin."""
    rows = [([float(i % 7)] * 784, float(i % 3)) for i in range(80)]
    df = spark.createDataFrame(rows, "x array<float>, y double")
    probe = _HeapAfterGC(spark)
    fitted = KerasEstimator(model=_wide_model(), optimizer="adam", loss="mse", featuresCol="x", labelCol="y", numWorkers=2, epochs=5,
                            batchSize=10, localSteps=1, verbose=0, backend="rounds", callbacks=[probe]).fit(df)
    assert fitted.fitInfo["rounds"] == 20 and len(probe.used) == 5
    state = 3 * 4 * fitted.getKerasModel().count_params()
    growth = probe.used[-1] - probe.used[0]  # 16 rounds between the first reading and the last
    assert growth < 16 * state / 3, (probe.used, state)  # a third of what one kept broadcast a round would add


class _Crash(keras.layers.Layer):
    """Kills the Python worker that runs it inside a Spark task (as the OOM killer would)."""

    def call(self, x):
        from pyspark import TaskContext

        if TaskContext.get() is not None:
            os._exit(3)
        return x


keras.saving.register_keras_serializable(package="sparkdl_jobs")(_Crash)


def test_a_killed_python_worker_becomes_a_worker_error_naming_round_and_setting(spark):
    model = keras.Sequential([keras.Input((1,)), _Crash(), keras.layers.Dense(1)])
    df = spark.createDataFrame([([float(i)], float(i)) for i in range(8)], "x array<float>, y double")
    est = KerasEstimator(model=model, optimizer="sgd", loss="mse", featuresCol="x", labelCol="y", numWorkers=2, verbose=0,
                         backend="rounds")  # the round's job is named in the message
    with pytest.raises(WorkerError) as info:
        est.fit(df)
    message = str(info.value)
    assert "round 1/1" in message and "Python worker died" in message and "spark.executor.pyspark.memory" in message
    assert "Py4JJavaError" not in type(info.value).__name__
    # local[2] runs a task once: the advice is local[N,F], not spark.task.maxFailures (issue 31)
    assert "the task ran 1 time: a local[2] master runs each task once, without retries" in message
    assert "the master local[2,4] gives each task 4 attempts" in message and "raise it (e.g. --conf" not in message
    assert "Job aborted due to stage failure" in message and "awaitResult" not in message


# Spark's failure text as a thread's job raises it: the cause below a wrapper line (issue 31).
AWAIT_RESULT = """An error occurred while calling o1234.toArrow.
: org.apache.spark.SparkException: Exception thrown in awaitResult: 
	at org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:56)
	at org.apache.spark.util.ThreadUtils$.awaitResult(ThreadUtils.scala:310)
Caused by: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 7.0 failed {n} times, most \
recent failure: Lost task 1.3 in stage 7.0 (TID 12) (10.0.0.7 executor 2): org.apache.spark.SparkException: Python worker \
exited unexpectedly (crashed)
	at org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:612)
"""


def _spark_failure(text):
    from pyspark.errors.exceptions.connect import PythonException

    return PythonException(message=text)


@pytest.mark.parametrize("master, max_failures, n, advice", [
    ("local[2]", None, 1, "the task ran 1 time: a local[2] master runs each task once, without retries (spark.task.maxFailures "
                          "does not apply to local masters); the master local[2,4] gives each task 4 attempts"),
    ("local", "8", 1, "the task ran 1 time: a local master runs each task once, without retries (spark.task.maxFailures does "
                      "not apply to local masters); the master local[1,4] gives each task 4 attempts"),
    ("local[*,3]", None, 3, "the task ran 3 times: the master local[*,3] gives each task 3 attempts; raise its second number "
                            "for more (spark.task.maxFailures does not apply to local masters)"),
    ("yarn", None, 4, "the task ran 4 times: spark.task.maxFailures=4 attempts per task; raise it (e.g. --conf "
                      "spark.task.maxFailures=8) for more"),
    ("local-cluster[2,1,1024]", "6", 6, "the task ran 6 times: spark.task.maxFailures=6 attempts per task; raise it"),
])
def test_a_spent_retries_message_gives_each_masters_setting_and_keeps_sparks_cause(master, max_failures, n, advice):
    from sparkdl.spark.jobs import task_error

    text = AWAIT_RESULT.format(n=n)
    error = task_error(_spark_failure(text), "sparkdl fit 1a2b: round 3/8", master=master, max_failures=max_failures)
    message = str(error)
    assert isinstance(error, WorkerError)
    assert message.startswith("sparkdl fit 1a2b: round 3/8 failed: a Python worker died (killed by a signal")
    assert f"; {advice}" in message
    assert (f"Received: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 7.0 failed {n} "
            "time") in message
    assert "awaitResult" not in message


def test_a_failure_without_an_abort_line_keeps_its_deepest_cause_not_the_wrapper():
    from sparkdl.spark.jobs import task_error

    text = ("An error occurred while calling o88.collectToPython.\n: org.apache.spark.SparkException: Exception thrown in "
            "awaitResult: \n\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:56)\n"
            "Caused by: org.apache.spark.SparkException: Checkpoint block rdd_7_1 not found! Either the executor that "
            "originally checkpointed this partition is no longer alive\n\tat org.apache.spark.rdd.X.compute(X.scala:1)\n")
    message = str(task_error(_spark_failure(text), "sparkdl fit 1a2b: round 2/8", master="yarn"))
    assert message.startswith("sparkdl fit 1a2b: round 2/8 failed on an executor; the task's attempts were spent: "
                              "spark.task.maxFailures=4 attempts per task")
    assert message.endswith("Received: org.apache.spark.SparkException: Checkpoint block rdd_7_1 not found! Either "
                            "the executor that originally checkpointed this partition is no longer alive")
    assert str(task_error(_spark_failure(text), "job")).startswith("job failed on an executor. Received: ")  # no master: no advice


def _slow_fit(spark):
    """About 40 rounds of one step each: several seconds of training."""
    df = spark.createDataFrame([([float(i % 5)], float(i % 5)) for i in range(80)], "x array<float>, y double")
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    return KerasEstimator(model=model, optimizer="sgd", loss="mse", featuresCol="x", labelCol="y", numWorkers=2,
                          epochs=4, batchSize=4, localSteps=1, verbose=0, backend="rounds"), df


def test_rounds_carry_the_callers_job_group_and_a_notebook_cancel_stops_training(spark):
    sc = spark.sparkContext
    est, df = _slow_fit(spark)
    est.setEpochs(1).setLocalSteps(None)
    sc.setJobGroup("notebook-cell-1", "a user's cell")
    try:
        est.fit(df)
        jobs = list(sc.statusTracker().getJobIdsForGroup("notebook-cell-1"))
        assert len(jobs) >= 2  # the check job and the round job ran under the user's group
    finally:
        sc.setJobGroup("", "")
    est.setEpochs(50).setLocalSteps(1)
    sc.addJobTag("notebook-cell-2")
    fitting = threading.Event()

    def cancel():  # the user presses "cancel" (again) while the fit runs; a cancel between two rounds reaches no job
        time.sleep(5.0)
        while fitting.is_set():
            sc.cancelJobsWithTag("notebook-cell-2")
            time.sleep(0.5)

    canceller = threading.Thread(target=cancel, daemon=True)
    try:
        fitting.set()
        canceller.start()
        started = time.monotonic()
        with pytest.raises(FitCancelledError, match="was cancelled; the master weights are unchanged"):
            est.fit(df)
        assert time.monotonic() - started < 60
    finally:
        fitting.clear()
        sc.removeJobTag("notebook-cell-2")


class TestLabelValuesBeforeTraining:
    """Checked by the one check job, so no training job starts on bad labels."""

    def _fit(self, spark, labels, label_type="double", loss="sparse_categorical_crossentropy", outputs=3):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(outputs, activation="softmax")])
        df = spark.createDataFrame([([0.1, 0.2], v) for v in labels], f"x array<float>, y {label_type}").orderBy(F.rand(1))
        est = KerasEstimator(model=model, loss=loss, featuresCol="x", labelCol="y", numWorkers=2, verbose=0)
        sc = spark.sparkContext
        group = f"label-check-{uuid.uuid4().hex}"  # a new group each time: a group's job ids are kept
        sc.setJobGroup(group, "label check")
        try:
            with pytest.raises(SchemaError) as info:
                est.fit(df)
            store = sc._jsc.sc().statusStore()
            descriptions = [store.job(j).description() for j in sc.statusTracker().getJobIdsForGroup(group)]
            descriptions = [d.get() if d.isDefined() else "" for d in descriptions]
        finally:
            sc.setJobGroup("", "")
        assert descriptions and all(d == "sparkdl: check and count training rows" for d in descriptions), descriptions  # no round job ran
        return str(info.value)

    def test_class_index_out_of_range(self, spark):
        assert "integer class indices in [0, 2]" in self._fit(spark, [0.0, 1.0, 5.0], "double")
        assert "Received: values from -1 to 2" in self._fit(spark, [0, 2, -1], "int")

    def test_fractional_class_index(self, spark):
        assert "1 of them not integers" in self._fit(spark, [0.0, 0.5, 2.0])

    def test_null_element_in_an_array_label(self, spark):
        msg = self._fit(spark, [[1.0, 0.0, 0.0], [0.0, None, 1.0]], "array<double>", loss="categorical_crossentropy")
        assert "column 'y' must have no null elements. Received: 1 null elements in 2 rows" in msg

    def test_ignore_class_labels_are_allowed(self, spark):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, activation="softmax")])
        df = spark.createDataFrame([([0.1, 0.2], v) for v in (0, 2, 255, 1)], "x array<float>, y int").orderBy(F.rand(1))
        loss = keras.losses.SparseCategoricalCrossentropy(ignore_class=255)
        fitted = KerasEstimator(model=model, loss=loss, featuresCol="x", labelCol="y", numWorkers=2, verbose=0).fit(df)
        assert fitted.fitInfo["rows"] == 4
        msg = self._fit(spark, [0, 255, 3], "int", loss=keras.losses.SparseCategoricalCrossentropy(ignore_class=255))
        assert "in [0, 2] (or ignore_class=255)" in msg and "from 0 to 3" in msg

    def test_hinge_labels_outside_minus_one_one(self, spark):
        msg = self._fit(spark, [[1.0], [2.0]], "array<double>", loss="hinge", outputs=1)
        assert "must hold -1/1 (or 0/1) labels" in msg

    def test_infinite_labels(self, spark):
        msg = self._fit(spark, [[1.0, 0.0, 0.0], [0.0, float("inf"), 0.0]], "array<double>", loss="categorical_crossentropy")
        assert "column 'y' must hold finite values. Received: 1 NaN or infinite values in 2 rows" in msg

    def test_one_hot_values_outside_zero_one(self, spark):
        msg = self._fit(spark, [[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]], "array<double>", loss="categorical_crossentropy")
        assert "must hold values in [0, 1]" in msg and "from 0 to 2" in msg


def _persisted(spark):
    return spark.sparkContext._jsc.getPersistentRDDs().size()


def test_cached_training_data_is_released_on_every_exit_path(spark):
    df = spark.createDataFrame([([0.1, 0.2], 7.0)], "x array<float>, y double")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, activation="softmax")])
    before = _persisted(spark)
    with pytest.raises(SchemaError):  # fails in the check job, after the data was cached
        KerasEstimator(model=model, loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y", verbose=0).fit(df)
    assert _persisted(spark) == before
    good = spark.createDataFrame([([0.1, 0.2], 1.0)] * 4, "x array<float>, y double")
    fitted = KerasEstimator(model=model, loss="sparse_categorical_crossentropy", featuresCol="x", labelCol="y", verbose=0).fit(good)
    assert _persisted(spark) == before
    # the executors' caches dropped the fit after its last round
    held = spark.sparkContext.parallelize(range(4), 4).mapPartitions(_held_fits).collect()
    assert fitted.fitInfo["rows"] == 4 and not any(fitted.fitInfo["fit_id"] in fits for fits in held), held


def _held_fits(_):
    from sparkdl.spark.partitions import WORKER_CACHE

    yield WORKER_CACHE.fits()


@pytest.mark.slow  # the default run's time budget
def test_two_concurrent_fits_on_one_dataframe_keep_their_own_cached_data(spark):
    """CrossValidator(parallelism=2) fits one DataFrame twice at once: Spark's cache is keyed by plan,
    so each fit's cached copy must be its own, or the first to finish unpersists the other's."""
    from pyspark import InheritableThread

    df = spark.createDataFrame([([float(i % 5)], float(i % 5)) for i in range(40)], "x array<float>, y double").orderBy(F.rand(7))
    results, errors = {}, []

    def fit(epochs):
        try:
            model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
            est = KerasEstimator(model=model, optimizer="sgd", loss="mse", featuresCol="x", labelCol="y", numWorkers=2,
                                 epochs=epochs, batchSize=4, localSteps=2, verbose=0)
            results[epochs] = est.fit(df).fitInfo
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [InheritableThread(fit, args=(epochs,)) for epochs in (2, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert {e: info["rows"] for e, info in results.items()} == {2: 40, 4: 40}


def test_c32_one_hot_encoder_labels(spark):
    """C32: OneHotEncoder(dropLast=False) labels (sparse vectors, width 3) train to the same weights as dense
    one-hot arrays; the default dropLast=True (width 2) fails before training, naming the widths and dropLast."""
    from pyspark.ml.feature import OneHotEncoder, StringIndexer

    rows = [([0.1 * i, 1.0 - 0.1 * i], "abc"[i % 3]) for i in range(6)]
    df = StringIndexer(inputCol="cat", outputCol="idx", stringOrderType="alphabetAsc").fit(
        spark.createDataFrame(rows, "x array<float>, cat string")).transform(spark.createDataFrame(rows, "x array<float>, cat string"))

    def fit(frame, label):
        keras.utils.set_random_seed(2)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, activation="softmax")])
        est = KerasEstimator(model=model, optimizer="sgd", loss="categorical_crossentropy", featuresCol="x", labelCol=label,
                             numWorkers=1, epochs=2, batchSize=3, verbose=0)
        return est.fit(frame).getKerasModel().get_weights()

    wide = OneHotEncoder(inputCol="idx", outputCol="onehot", dropLast=False).fit(df).transform(df)
    dense = df.withColumn("onehot_arr", F.transform(F.sequence(F.lit(0), F.lit(2)), lambda k: (k == F.col("idx")).cast("double")))
    for a, b in zip(fit(wide.coalesce(1), "onehot"), fit(dense.coalesce(1), "onehot_arr"), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    narrow = OneHotEncoder(inputCol="idx", outputCol="onehot").fit(df).transform(df)
    with pytest.raises(SchemaError, match=r"must hold 3 value\(s\) per row.*dropLast=True writes 2 values for 3 classes"):
        fit(narrow, "onehot")


def test_compile_arguments_that_cannot_work_fail_before_any_job(spark):
    """loss_weights for two outputs on a one-output model once failed inside every task of round 1."""
    sc = spark.sparkContext
    df = spark.createDataFrame([([1.0], 2.0)] * 4, "x array<float>, y double")
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    est = KerasEstimator(model=model, loss="mse", lossWeights=[1.0, 2.0], featuresCol="x", labelCol="y", verbose=0)
    sc.setJobGroup("compile-check", "compile check")
    try:
        with pytest.raises(ConfigError, match=r"lossWeights .* must give one weight per output \(1\)"):
            est.fit(df)
        assert list(sc.statusTracker().getJobIdsForGroup("compile-check")) == []
    finally:
        sc.setJobGroup("", "")


def test_run_on_partitions_runs_the_chosen_partitions_only_and_returns_every_batch(spark):
    """The RDD job a straggler-tolerant round runs per partition: one task on each chosen partition,
    each of its batches back as Arrow (several per task, in order), no other partition run."""
    import pyarrow as pa
    from pyspark import TaskContext

    from sparkdl.spark.jobs import run_on_partitions

    schema = pa.schema([("partition", pa.int32()), ("rows", pa.int64()), ("batch", pa.int32())])

    def produce(rows):
        n = sum(1 for _ in rows)
        partition = TaskContext.get().partitionId()
        for i in range(3):
            yield pa.RecordBatch.from_pylist([{"partition": partition, "rows": n, "batch": i}], schema=schema)

    table = run_on_partitions(spark.range(0, 40, numPartitions=4), produce, [1, 3], schema)
    assert table.schema == schema
    assert list(zip(*(table.column(c).to_pylist() for c in schema.names))) == [
        (1, 10, 0), (1, 10, 1), (1, 10, 2), (3, 10, 0), (3, 10, 1), (3, 10, 2)]
