"""KerasModel.transform on a Structured Streaming DataFrame (issue 44 item 3): the stream's rows get the
predictions a batch ``transform`` of the same rows gives (docs/user-guide/inference.md, "Streaming")."""

import numpy as np

from sparkdl import KerasModel

import keras  # noqa: E402


def test_transform_of_a_parquet_stream_into_a_memory_sink_equals_the_batch_transform(spark, tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(loss="sparse_categorical_crossentropy")
    scorer = KerasModel.fromKeras(model, featuresCol="features", inferenceBatchSize=4)
    rows = [(i, [float(i % 5), float(-i), 0.25 * i]) for i in range(30)]
    batch = spark.createDataFrame(rows, "id long, features array<double>")
    batch.repartition(3).write.parquet(str(tmp_path / "in"))  # three files: the stream's first micro-batch reads them all

    stream = spark.readStream.schema(batch.schema).parquet(str(tmp_path / "in"))
    query = (scorer.transform(stream).writeStream.format("memory").queryName("sparkdl_stream_predictions")
             .outputMode("append").option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(300) is True  # availableNow: the query ends once the folder's files are read
        assert query.exception() is None
        streamed = {r["id"]: r for r in spark.table("sparkdl_stream_predictions").collect()}
    finally:
        query.stop()
        spark.catalog.dropTempView("sparkdl_stream_predictions")
    expected = {r["id"]: r for r in scorer.transform(batch).collect()}

    assert stream.isStreaming and sorted(streamed) == list(range(30))
    for i, row in expected.items():
        assert streamed[i]["prediction"] == row["prediction"]
        # float32 within a few units in the last place: the CPU's matrix kernels may differ with the batch's rows
        np.testing.assert_allclose(streamed[i]["probability"].toArray(), row["probability"].toArray(), rtol=1e-5, atol=1e-7)
    assert len({row["prediction"] for row in expected.values()}) > 1  # the rows are told apart, not one constant class
