"""Issue 31 item 8: errors that came late or from elsewhere come first and in sparkdl's words: a
pandas DataFrame (or anything but a Spark one) given to fit, positional arguments, a column typo
or a mode or backend out of its choices (did you mean), a local master whose Python workers cannot run sparkdl (before any job, the
explanation first), labels that are all 0/1 under a regression loss (a warning)."""

import os
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import keras
from sparkdl import KerasEstimator, KerasModel
from sparkdl.errors import ConfigError, KeywordArgumentsError, SchemaError, did_you_mean
from tests.conftest import jobs_started


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])


def _estimator(**params):
    columns = {} if "featuresCols" in params else {"featuresCol": "pixels"}
    return KerasEstimator(**{"model": _model(), "loss": "mse", **columns, "labelCol": "label", "numWorkers": 1, "verbose": 0,
                             **params})


# --- what fit is given ----------------------------------------------------------------------------


def test_fit_transform_and_evaluate_of_a_pandas_dataframe_say_how_to_make_a_spark_one():
    pdf = pd.DataFrame({"pixels": [[1.0, 2.0]], "label": [1.0]})
    est = _estimator()
    with pytest.raises(ConfigError) as info:
        est.fit(pdf)
    assert str(info.value) == ("KerasEstimator.fit needs a Spark DataFrame (pyspark.sql.DataFrame): make one from a pandas "
                               "DataFrame with spark.createDataFrame(pandas_df). Received: pandas.core.frame.DataFrame")
    for call, who in ((KerasModel().transform, "KerasModel.transform"), (KerasModel().evaluate, "KerasModel.evaluate")):
        with pytest.raises(ConfigError, match=rf"^{who} needs a Spark DataFrame .*spark\.createDataFrame\(pandas_df\)"):
            call(pdf)
    with pytest.raises(ConfigError, match=r"read the file into one first, e\.g\. spark\.read\.parquet\(path\)\. Received: str$"):
        est.fit("data/train.parquet")
    with pytest.raises(ConfigError, match=r"spark\.createDataFrame\(rows\) .* Received: numpy\.ndarray$"):
        est.fit(np.zeros((4, 3)))


def test_fit_of_an_rdd_gives_the_one_line_recipe_that_makes_its_dataframe(spark):
    """An Elephas user's RDD of (x, y) numpy pairs: refused before any job, and the message's recipe makes the DataFrame."""
    import re

    rdd = spark.sparkContext.parallelize([(np.array([1.0, 2.0]), 1), (np.array([3.0, 4.0]), 0)], 2)
    with pytest.raises(ConfigError) as info:
        _estimator().fit(rdd)
    message = str(info.value)
    assert message.startswith("KerasEstimator.fit needs a Spark DataFrame (pyspark.sql.DataFrame): make one from an RDD with "
                              "spark.createDataFrame(rdd, schema), e.g. ")
    assert message.endswith(". Received: pyspark.core.rdd.RDD")
    with pytest.raises(ConfigError, match=r"^KerasModel\.transform needs a Spark DataFrame .*createDataFrame\(rdd, schema\)"):
        KerasModel().transform(rdd)
    recipe = re.search(r"as Elephas takes them: (spark\.createDataFrame\(.*\))\. Received", message)[1]
    df = eval(recipe, {"spark": spark, "rdd": rdd})  # noqa: S307 - the message's own one line
    assert df.schema.simpleString() == "struct<features:array<double>,label:double>"
    assert sorted(tuple(r) for r in df.collect()) == [([1.0, 2.0], 1.0), ([3.0, 4.0], 0.0)]


def test_positional_arguments_name_the_keyword_form():
    model = _model()
    with pytest.raises(KeywordArgumentsError) as info:
        KerasEstimator(model, "mse")
    assert isinstance(info.value, TypeError) and isinstance(info.value, ConfigError)  # as pyspark's, and sparkdl's tree
    message = str(info.value)
    assert message.startswith("KerasEstimator takes keyword arguments only, each Param by its name: KerasEstimator(model=model, "
                              "loss='mse', featuresCol='features', labelCol='label', epochs=5)")
    assert message.endswith("Received: 2 positional arguments (Sequential, 'mse')")
    with pytest.raises(KeywordArgumentsError, match=r"^KerasEstimator\.setParams takes keyword arguments only.*"
                                                    r"est\.setParams\(epochs=5, batchSize=64\).*Received: 1 positional argument \(5\)$"):
        KerasEstimator().setParams(5)


# --- column typos ---------------------------------------------------------------------------------


def test_did_you_mean_names_the_closest_name_or_nothing():
    assert did_you_mean("pixel", ["label", "pixels"]) == " Did you mean 'pixels'?"
    assert did_you_mean("FEATURES", ["label", "features"]) == " Did you mean 'features'?"  # a case slip
    assert did_you_mean("zzz", ["label", "pixels"]) == ""


@pytest.mark.parametrize("params, message", [
    ({"featuresCol": "pixel"}, "features column 'pixel' must exist in the DataFrame. Did you mean 'pixels'?"),
    ({"labelCol": "lable"}, "label column 'lable' must exist in the DataFrame. Did you mean 'label'?"),
    ({"sampleWeightCol": "wieght"}, "sampleWeightCol column 'wieght' must exist in the DataFrame. Did you mean 'weight'?"),
    ({"featuresCols": ["Pixels"]}, "features column 'Pixels' must exist in the DataFrame. Did you mean 'pixels'?"),
    ({"labelCols": ["labl"]}, "label column 'labl' must exist in the DataFrame. Did you mean 'label'?"),
    ({"validationCol": "is_vall"}, "validationCol 'is_vall' must exist in the DataFrame. Did you mean 'is_val'?"),
])
def test_a_column_typo_gets_a_did_you_mean_before_any_job(spark, params, message):
    df = spark.createDataFrame([([1.0, 2.0], 1.0, 1.0, False)], "pixels array<double>, label double, weight double, is_val boolean")
    raised = []
    assert jobs_started(spark, lambda: raised.append(pytest.raises(SchemaError, _estimator(**params).fit, df))) == 0
    assert str(raised[0].value) == f"{message} Received columns: ['pixels', 'label', 'weight', 'is_val']"


@pytest.mark.parametrize("params, message", [
    ({"mode": "synchronous"}, "Did you mean 'sync'? Received: mode='synchronous'"),  # Elephas' words
    ({"mode": "asynchronous"}, "Did you mean 'async'? Received: mode='asynchronous'"),
    ({"backend": "shard"}, "Did you mean 'sharded'? Received: backend='shard'"),
])
def test_a_mode_or_backend_out_of_its_choices_gets_a_did_you_mean_before_any_job(spark, params, message):
    df = spark.createDataFrame([([1.0, 2.0], 1.0)], "pixels array<double>, label double")
    raised = []
    # refused where it is set (the Param's declared choices), so before any job
    assert jobs_started(spark, lambda: raised.append(pytest.raises(ConfigError, lambda: _estimator(**params).fit(df)))) == 0
    assert str(raised[0].value).endswith(message) and " must be one of " in str(raised[0].value)


def test_a_column_typo_in_transform_gets_a_did_you_mean(spark):
    df = spark.createDataFrame([([1.0, 2.0],)], "pixels array<double>")
    model = KerasModel.fromKeras(_model(), featuresCol="pixles")
    with pytest.raises(SchemaError, match=r"^features column 'pixles' must exist in the DataFrame\. Did you mean 'pixels'\?"):
        model.transform(df)


# --- optimizer, loss and metric names ----------------------------------------------------------------


@pytest.mark.parametrize("param, value, received, closest, kind, listed", [
    ("optimizer", "adm", "'adm'", "adam", "optimizer", "rmsprop, schedulefreeadamw, sgd."),
    ("loss", "mean_squared_eror", "'mean_squared_eror'", "mean_squared_error", "loss", "mae, mape,"),
    ("loss", "MeanSquareError", "'MeanSquareError'", "MeanSquaredError", "loss", " mse, msle,"),  # a class name: its own
    ("loss", {"out": "hnge"}, "'hnge'", "hinge", "loss", "squared_hinge, tversky."),  # per output
    ("metrics", ["accuracy", "acuracy"], "'acuracy'", "accuracy", "metric", "acc, accuracy, auc,"),
    ("weightedMetrics", ["aucc"], "'aucc'", "auc", "metric", "precision, r2_score, recall,"),
])
def test_a_misspelled_optimizer_loss_or_metric_names_the_param_the_closest_and_the_names_before_any_job(
        spark, param, value, received, closest, kind, listed):
    df = spark.createDataFrame([([1.0, 2.0], 1.0)], "pixels array<double>, label double")
    raised = []

    def fit():
        with pytest.raises(ConfigError) as info:
            _estimator(**{param: value}).fit(df)
        raised.append(str(info.value))
        with pytest.raises(ConfigError) as info:
            _estimator().setParams(**{param: value})
        raised.append(str(info.value))

    assert jobs_started(spark, fit) == 0
    assert raised[0] == raised[1]
    message = raised[0]
    assert message.startswith(f"{param} must be ")
    assert f". Did you mean {closest!r}? The {kind} names: " in message
    assert listed in message and "metric," not in message and "'" not in message.split("names: ")[1].split(". Received")[0]
    assert message.endswith(f". Received: {param}={received}")


# --- rows of the wrong width ------------------------------------------------------------------------


def test_rows_of_the_wrong_width_are_counted_and_handle_invalid_skip_drops_them(spark):
    """3 of 10 rows of another length than the model input's 2 values (1 and 3 values, in two
    partitions): the check job's error counts them and names handleInvalid='skip', which then trains
    on the other 7 (the training tasks drop the same rows: the rows they read match the count)."""
    rows = [([float(i), 1.0], float(i)) for i in range(7)] + [([1.0], 7.0), ([1.0, 2.0, 3.0], 8.0), ([], 9.0)]
    df = spark.createDataFrame(rows, "pixels array<double>, label double").repartition(2)
    with pytest.raises(SchemaError) as info:
        _estimator(numWorkers=2).fit(df)
    assert str(info.value) == ("features column 'pixels' must hold 2 values per row (the model input shape (2,) has 2); "
                               "handleInvalid='skip' drops the rows that do not. Received: 3 of 10 rows hold 0 to 3 values")
    with pytest.warns(UserWarning, match=r"^handleInvalid='skip': 3 rows with a null, NaN or infinite value or a wrong number "
                                         r"of values were dropped, 7 rows are trained on"):
        fitted = _estimator(numWorkers=2, handleInvalid="skip", epochs=1).fit(df)
    assert fitted.fitInfo["rows_skipped"] == 3 and fitted.fitInfo["rows"] == 7


def test_wrong_width_rows_are_found_by_the_rule_the_training_tasks_drop_them_by():
    import pyarrow as pa

    from sparkdl.serialization.columns import ColumnSpec, ModelColumns, TensorSpec, valid_mask, wrong_width_rows

    column = pa.array([[1.0, 2.0], [1.0], None, [], [1.0, 2.0, 3.0], [float("nan"), 1.0]])
    assert wrong_width_rows(column, 2).tolist() == [False, True, False, True, True, False]  # a null row: invalid_rows' own
    assert wrong_width_rows(pa.array([1.0, 2.0]), 2).tolist() == [False, False]  # not a list: no width to count
    x = ColumnSpec("x0_0", (2,), "float32", "pixels")
    columns = ModelColumns((TensorSpec("in", (2,), "float32", (x,)),), (), skip_invalid=True)
    table = pa.table({"x0_0": column})
    assert valid_mask(table, columns).tolist() == [True, False, False, False, False, False]
    assert valid_mask(table, ModelColumns(columns.inputs, ())) is None  # handleInvalid='error': the check job refused them


# --- the executors' Python, before any job ----------------------------------------------------------


def _fake_python(tmp_path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_a_local_masters_python_workers_without_sparkdl_are_refused_before_any_job(spark, tmp_path, monkeypatch):
    """What a missing PYSPARK_PYTHON gives (python3 without sparkdl's packages): said first, before
    the first job and its Java stack traces; here a Python without any site-packages (-I -S)."""
    bare = _fake_python(tmp_path, f'exec {sys.executable} -I -S "$@"')
    monkeypatch.setattr(spark.sparkContext, "pythonExec", bare)
    df = spark.createDataFrame([([1.0, 2.0], 1.0)], "pixels array<double>, label double")
    raised = []
    assert jobs_started(spark, lambda: raised.append(pytest.raises(ConfigError, _estimator().fit, df))) == 0
    message = str(raised[0].value)
    assert message.startswith("the executors' Python must have sparkdl and its dependencies installed, as the driver's: "
                              "set PYSPARK_PYTHON to such a Python before the SparkSession starts")
    # sparkdl itself is asked for unless the session ships Python files (an earlier test's addPyFile on the shared session)
    shipped = any(f.endswith((".zip", ".egg", ".whl", ".py")) for f in (spark.sparkContext.listFiles or []))
    assert f"Checked before any job: master local[2] runs its Python workers with {bare!r}, which cannot import " \
           f"{'' if shipped else 'sparkdl, '}numpy, pyarrow, keras, tensorflow (" in message
    assert f"the driver runs {sys.executable}" in message and len(message.splitlines()) == 1


def test_the_executors_python_problems_in_words(tmp_path):
    from sparkdl.spark.daemon import python_problem

    modules = ["sparkdl", "numpy", "pyarrow", "keras"]
    assert python_problem(sys.executable, modules) is None  # this Python has them all
    assert python_problem(str(tmp_path / "no-python"), modules) == "is not a program this machine has"
    other = _fake_python(tmp_path, """echo '{"version": "3.8", "executable": "/usr/bin/python3.8", "missing": []}'""")
    ours = "%d.%d" % sys.version_info[:2]
    assert python_problem(other, modules) == f"is Python 3.8 (/usr/bin/python3.8), where pyspark needs the driver's {ours}"
    (tmp_path / "python").unlink()
    broken = _fake_python(tmp_path, "echo 'no such interpreter' >&2; exit 127")
    assert python_problem(broken, modules) == "does not run Python code (exit status 127: no such interpreter)"


# --- labels all 0/1 under a regression loss (the fit's own warning: tests/spark/test_partitioning.py) --


def test_zero_one_labels_warn_only_under_a_regression_task():
    from sparkdl.keras.losses import describe_loss
    from sparkdl.spark.data import PreparedData, zero_one_warnings

    def warned(ranges, loss="mse", task="auto", shape=(1,)):
        request = SimpleNamespace(outputs=(("out", shape, "y"),))
        return zero_one_warnings(request, [describe_loss(loss)], task, PreparedData(None, (3,), None, label_ranges=(ranges,)))

    assert len(warned((0, 1, 0))) == 1 and "binary_crossentropy (one sigmoid unit)" in warned((0, 1, 0))[0]
    assert "categorical_crossentropy (softmax)" in warned((0, 1, 0), shape=(3,))[0]  # one-hot rows under mse
    assert warned((0, 2, 0)) == [] and warned((0, 1, 2)) == [] and warned((1, 1, 0)) == [] and warned(None) == []
    assert warned((0, 1, 0), loss="binary_crossentropy") == []  # a classifier's loss
    assert warned((0, 1, 0), task="classification") == []  # transform writes rawPrediction
