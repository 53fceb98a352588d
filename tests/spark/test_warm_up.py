"""The workers' warm-up job (sparkdl.spark.warm): its tasks return at once and leave Keras importing
(and the fit's replica building) on a thread of their Python worker; a later task in such a worker
waits for that thread before it configures Keras, so it never imports or builds beside it."""

import os

import pyarrow as pa

from sparkdl.keras.runtime import keras_backend
from sparkdl.spark.warm import WorkerWarmUp

SCHEMA = pa.schema([("pid", pa.int64()), ("warmed", pa.string()), ("keras", pa.bool_())])


def test_a_task_after_the_warm_up_job_finds_its_thread_done(spark, tmp_path):
    marks = str(tmp_path)

    def warm():  # a slow replica build: records its worker, then marks the process after 2 s
        import time

        with open(os.path.join(marks, f"{os.getpid()}.started"), "w"):
            pass
        time.sleep(2.0)
        os.environ["SPARKDL_TEST_WARMED"] = str(os.getpid())

    warming = WorkerWarmUp(spark, 2, keras_backend(), warm, "sparkdl-test-warm", "sparkdl: warm up 2 Python workers (test)")
    warming.stop(timeout_s=120)  # the job ended: its tasks returned, their threads still import Keras
    assert not warming._thread.is_alive()

    def report(batches):
        import sys

        from sparkdl.keras.runtime import configure

        for _ in batches:
            pass
        configure(None, None, None)  # waits for a warm-up thread of this process
        yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "warmed": os.environ.get("SPARKDL_TEST_WARMED"),
                                           "keras": "keras" in sys.modules}], schema=SCHEMA)

    # Twenty tasks on two slots: idle Python workers are handed out oldest first, so these pass through
    # the ones earlier tests left idle and reach the two the warm-up job used.
    rows = spark.range(0, 20, 1, 20).mapInArrow(report, "pid long, warmed string, keras boolean").collect()
    assert len(rows) == 20
    warmed = {int(name.split(".")[0]) for name in os.listdir(marks)}
    assert warmed  # the threads went on after their tasks returned
    assert any(row.pid in warmed for row in rows)
    for row in rows:
        if row.pid in warmed:  # a worker the warm-up reached: its thread had ended, Keras imported
            assert row.warmed == str(row.pid) and row.keras, row
