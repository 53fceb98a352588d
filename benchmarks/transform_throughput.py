"""Inference throughput: sparkdl ``KerasModel.transform`` on ``local[2]`` vs ``keras.Model.predict`` in one process.

Same model (``sparkdl.keras.zoo:mnist_cnn`` trained one epoch in plain Keras on the bundled mnist10k,
then wrapped with ``KerasModel.fromKeras``), same rows (``--rows``, default 100,000 mnist-shaped rows:
the 10,000 bundled digits repeated), measured side by side in one run on the same cores.

- ``keras.Model.predict`` runs at each of ``--predict-batch-sizes`` once and then ``--repeats`` times
  at the best one (its best batch size, as a user tuning it would pick).
- sparkdl scores a cached DataFrame of the same rows (2 partitions per worker slot): one untimed
  transform of all rows first (every executor Python worker imports TensorFlow and builds the model,
  as in any session after its first transform; its time is reported as ``cold_first_transform_s``), then ``--repeats`` timed runs of ``transform(df)`` written to Spark's ``noop`` sink,
  which computes every output column of every row: with the default Params (the scoring pass
  checks every row) and with ``checkFeatures=True`` (one Spark-SQL pass over the input first),
  alternating with ``predict``; and (``--map-in-arrow``) the default Params through ``mapInArrow``,
  the path pyspark 4.0 takes (every input column goes to Python and comes back), where pyspark 4.1+
  scores through an Arrow UDF (only the model's inputs go, only the added columns come back).

Prints one JSON line per run, a JSON line with ``ratio`` = sparkdl rows/s ÷ predict rows/s (medians;
``ratio_check_features`` for ``checkFeatures=True``), then a Markdown table.

Usage: python benchmarks/transform_throughput.py [--rows 100000] [--workers 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import setup_env  # noqa: F401  (sys.path and the environment, before pyspark/keras)

import numpy as np  # noqa: E402
from fit_throughput import TEST, TRAIN, load  # noqa: E402  (mnist10k Parquet -> float32 pixels, int64 labels)


def trained_model():
    import keras

    from sparkdl.keras.zoo import mnist_cnn

    x, y = load(TRAIN)
    model = mnist_cnn()
    model.compile(optimizer=keras.optimizers.Adam(0.002), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    return model


def all_rows(rows):
    (x, y), (xt, yt) = load(TRAIN), load(TEST)
    x, y = np.concatenate([x, xt]), np.concatenate([y, yt])
    reps = -(-rows // len(x))
    return np.tile(x, (reps, 1))[:rows], np.tile(y, reps)[:rows]


def run_predict(model, x, batch_size):
    started = time.perf_counter()
    out = model.predict(x, batch_size=batch_size, verbose=0)
    seconds = time.perf_counter() - started
    return {"run": "keras.predict", "batch_size": batch_size, "rows": len(x), "seconds": round(seconds, 3),
            "rows_per_s": round(len(x) / seconds, 1)}, out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2, help="local[N]")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--predict-batch-sizes", default="128,256,512,1024,2048")
    parser.add_argument("--map-in-arrow", action="store_true", help="also time pyspark 4.0's mapInArrow path, interleaved")
    parser.add_argument("--inference-batch-size", type=int, default=None, help="sparkdl inferenceBatchSize (default: the Param's)")
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from sparkdl import KerasModel

    model = trained_model()
    x, y = all_rows(args.rows)

    predict_runs = []
    for batch_size in [int(b) for b in args.predict_batch_sizes.split(",")]:
        run, _ = run_predict(model, x, batch_size)
        predict_runs.append(run)
        print(json.dumps(run), flush=True)
    best = max(predict_runs, key=lambda r: r["rows_per_s"])["batch_size"]

    spark = (SparkSession.builder.master(f"local[{args.workers}]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.python.worker.reuse", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    import pyarrow as pa

    table = pa.table({"pixels": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1]).cast(pa.list_(pa.float32())),
                      "label": pa.array(y)})
    df = spark.createDataFrame(table.to_pandas()).repartition(2 * args.workers).cache()
    assert df.count() == args.rows
    params = {"featuresCol": "pixels"}
    if args.inference_batch_size:
        params["inferenceBatchSize"] = args.inference_batch_size
    wrapped = KerasModel.fromKeras(model, **params)  # the default Params: the scoring pass checks the rows
    checked = KerasModel.fromKeras(model, checkFeatures=True, **params)  # one Spark-SQL pass over the input first
    started = time.perf_counter()  # untimed: every executor Python worker imports TensorFlow and builds the model
    wrapped.transform(df).write.format("noop").mode("overwrite").save()
    cold_s = round(time.perf_counter() - started, 2)

    from sparkdl.spark import inference

    by_udf = inference.ARROW_UDF
    spark_runs, checked_runs, keras_runs, mapped_runs = [], [], [], []
    timed = [(wrapped, spark_runs, by_udf), (checked, checked_runs, by_udf)] + [(wrapped, mapped_runs, False)] * args.map_in_arrow
    for _ in range(args.repeats):
        run, out = run_predict(model, x, best)
        keras_runs.append(run)
        print(json.dumps(run), flush=True)
        for stage, runs, udf in timed:
            inference.ARROW_UDF = udf  # read on the driver as transform builds its plan
            started = time.perf_counter()
            stage.transform(df).write.format("noop").mode("overwrite").save()
            seconds = time.perf_counter() - started
            runs.append({"run": "sparkdl.transform", "workers": args.workers, "rows": args.rows, "seconds": round(seconds, 3),
                         "rows_per_s": round(args.rows / seconds, 1), "check_features": stage.getCheckFeatures(),
                         "inference_batch_size": stage.getInferenceBatchSize(), "through": "arrow_udf" if udf else "mapInArrow"})
            print(json.dumps(runs[-1]), flush=True)
    inference.ARROW_UDF = by_udf
    # the same predictions as plain Keras (the test rows, argmax)
    scored = wrapped.transform(df.limit(1000)).select("pixels", "prediction").toPandas()
    local = model.predict(np.stack(scored["pixels"].to_numpy()).astype(np.float32), verbose=0).argmax(axis=1)
    agree = float((local == scored["prediction"].to_numpy()).mean())
    accuracy = wrapped.transform(df).select(F.avg((F.col("prediction") == F.col("label")).cast("double"))).first()[0]
    spark.stop()

    keras_rps = statistics.median(r["rows_per_s"] for r in keras_runs)
    spark_rps = statistics.median(r["rows_per_s"] for r in spark_runs)
    checked_rps = statistics.median(r["rows_per_s"] for r in checked_runs)
    summary = {"ratio": round(spark_rps / keras_rps, 3), "ratio_check_features": round(checked_rps / keras_rps, 3),
               "sparkdl_rows_per_s": spark_rps, "check_features_rows_per_s": checked_rps, "predict_rows_per_s": keras_rps,
               "predict_batch_size": best, "ratios_per_repeat": [round(s["rows_per_s"] / k["rows_per_s"], 3) for k, s in zip(keras_runs, spark_runs)],
               "rows": args.rows, "workers": args.workers, "cpus": os.cpu_count(), "repeats": args.repeats,
               "agreement_with_predict": agree, "accuracy": round(accuracy, 4),
               "inference_batch_size": spark_runs[-1]["inference_batch_size"], "cold_first_transform_s": cold_s,
               "through": "arrow_udf" if by_udf else "mapInArrow"}
    if mapped_runs:
        summary["ratio_map_in_arrow"] = round(statistics.median(r["rows_per_s"] for r in mapped_runs) / keras_rps, 3)
    print(json.dumps(summary), flush=True)
    print("\n| run | seconds (median) | rows/s (median) |\n|---|---|---|")
    print(f"| keras.predict, batch {best}, 1 process | {statistics.median(r['seconds'] for r in keras_runs)} | {keras_rps} |")
    print(f"| sparkdl transform, local[{args.workers}], default Params | {statistics.median(r['seconds'] for r in spark_runs)} | {spark_rps} |")
    print(f"| sparkdl transform, local[{args.workers}], checkFeatures=True | {statistics.median(r['seconds'] for r in checked_runs)} | {checked_rps} |")
    if mapped_runs:
        print(f"| sparkdl transform, local[{args.workers}], mapInArrow (pyspark 4.0) | {statistics.median(r['seconds'] for r in mapped_runs)} | "
              f"{statistics.median(r['rows_per_s'] for r in mapped_runs)} |")
    print(f"\nratio (sparkdl / predict rows/s, medians): {summary['ratio']} (checkFeatures=True: {summary['ratio_check_features']})")


if __name__ == "__main__":
    main()
