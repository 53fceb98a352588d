"""transform's weights broadcasts are bounded on the driver: scoring many models (a CrossValidator's
folds, a hyperparameter search) keeps the weights of the live models plus the 8 most recently scored,
measured as PySpark's broadcast temp files in the driver's temp directory and the block managers'
storage memory; a live model's lazy DataFrame still runs, and a model scored again after its broadcast
was destroyed gets a new one with the same predictions."""

import gc
import os

import numpy as np

from sparkdl import KerasModel
from sparkdl.spark import inference
from sparkdl.spark.inference import held_weight_broadcasts

import keras  # noqa: E402

UNITS = 128  # Dense(128 -> 128): 16,512 float32 weights, 66 KB of random (incompressible) bytes per model


def _keras_model(seed):
    """Dense(128 -> 128) with random weights of ``seed``, named so that its JSON (and digest) is the same on every call."""
    model = keras.Sequential([keras.Input((UNITS,), name="x"), keras.layers.Dense(UNITS, name="dense")], name=f"model_{seed}")
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(size=(UNITS, UNITS)).astype(np.float32), rng.normal(size=UNITS).astype(np.float32)])
    return model


def _scorer(seed):
    """A KerasModel of ``_keras_model(seed)``; its transform runs no job (checkFeatures off) until collected."""
    return KerasModel.fromKeras(_keras_model(seed), featuresCol="x", task="regression", checkFeatures=False)


def _rows(spark):
    x = np.random.default_rng(7).normal(size=(6, UNITS)).astype(np.float32)
    return x, spark.createDataFrame([(i, x[i].tolist()) for i in range(6)], "id int, x array<float>")


def _predictions(df):
    return np.array([r["prediction"] for r in sorted(df.collect(), key=lambda r: r["id"])])


def _storage_used(sc) -> int:
    """Bytes of storage memory in use over the block managers (the driver's, in local mode)."""
    values = sc._jsc.sc().getExecutorMemoryStatus().values().iterator()
    used = 0
    while values.hasNext():
        max_and_remaining = values.next()
        used += max_and_remaining._1() - max_and_remaining._2()
    return used


def test_scoring_many_models_keeps_the_live_ones_and_eight_recent_broadcasts(spark):
    sc = spark.sparkContext
    x, df = _rows(spark)
    gc.collect()
    _scorer(0).transform(df)  # sweeps what earlier tests left behind (their models gone)
    files_before, used_before = set(os.listdir(sc._temp_dir)), _storage_used(sc)
    kept = _scorer(1)  # a live model: its lazy DataFrame must still run after 24 others were scored
    kept_scored = kept.transform(df)
    digests = []
    for seed in range(100, 124):  # 24 models, each gone after its transform
        scorer = _scorer(seed)
        digests.append(scorer._spec.digest)
        scorer.transform(df)
        del scorer
    gc.collect()
    kept.transform(df)  # scoring again sweeps the broadcasts no live model holds; kept is the most recent now
    held = held_weight_broadcasts(spark)
    assert inference._RECENT == 8
    assert held == {kept._spec.digest, *digests[-7:]}  # the 8 most recent (kept among them); 25 unbounded
    new_files = set(os.listdir(sc._temp_dir)) - files_before
    assert len(new_files) == 8  # one broadcast temp file each (25 without the bound)
    # storage memory: 8 models' weights (with their pieces' headers), not 25: a leak would add 25 * 66 KB
    assert _storage_used(sc) - used_before < 11 * len(kept._spec.weights)
    np.testing.assert_allclose(_predictions(kept_scored), kept.getKerasModel().predict(x, verbose=0), rtol=1e-5, atol=1e-5)


def test_a_model_scored_again_after_its_broadcast_was_destroyed_gets_the_same_predictions(spark):
    x, df = _rows(spark)
    digest = _scorer(200)._spec.digest
    first = _predictions(_scorer(200).transform(df))
    for seed in range(201, 201 + inference._RECENT - 1):  # 7 other models, each gone after its line
        _scorer(seed).transform(df)
    gc.collect()
    assert digest in held_weight_broadcasts(spark)  # among the 8 most recent: kept for its lazy DataFrames
    _scorer(300).transform(df)
    assert digest not in held_weight_broadcasts(spark)  # 9th most recent and no live model: destroyed  # destroyed: model 200 is neither live nor recent
    again = _scorer(200)
    scored = again.transform(df)
    assert digest in held_weight_broadcasts(spark)
    np.testing.assert_array_equal(_predictions(scored), first)
    np.testing.assert_allclose(first, _keras_model(200).predict(x, verbose=0), rtol=1e-5, atol=1e-5)
