"""The command line's pieces without Spark (issue 12): the job config's schema and validation, ``--set``
overrides, the callbacks section, the shipped configs and docs, ``plot_history``, and the checks
``sparkdl-predict`` makes before Spark starts."""

import glob
import inspect
import json
import logging
import os
import re
import struct
import sys

import pytest
import yaml

from sparkdl.cli import config as cli_config
from sparkdl.cli.config import (
    FIT_KEYS,
    SCHEMA,
    apply_overrides,
    build_callbacks,
    estimator_params,
    load_config,
    schema_markdown,
)
from sparkdl.errors import ConfigError
from tests.conftest import ROOT

# the fit keys of jobs/train.py before the CLI moved to sparkdl.cli: every one must stay valid
OLD_FIT_KEYS = {
    "optimizer": "optimizer", "loss": "loss", "metrics": "metrics", "num_workers": "numWorkers", "epochs": "epochs",
    "batch_size": "batchSize", "local_steps": "localSteps", "mode": "mode", "seed": "seed", "shuffle": "shuffle",
    "verbose": "verbose", "backend": "backend", "staleness": "staleness", "server_port": "serverPort",
    "worker_timeout": "workerTimeout", "sample_weight_col": "sampleWeightCol", "class_weight": "classWeight",
    "validation_col": "validationCol", "validation_split": "validationSplit", "handle_invalid": "handleInvalid",
    "max_task_memory_mb": "maxTaskMemoryMB", "block_momentum": "blockMomentum", "block_learning_rate": "blockLearningRate",
    "nesterov": "nesterov", "elastic_force": "elasticForce", "compression": "compression",
    "compression_threshold": "compressionThreshold", "min_workers_per_round": "minWorkersPerRound",
    "round_deadline": "roundDeadline", "mixed_precision": "mixedPrecision",
}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

BASE = {
    "data": {"train": "data/mnist10k/train.parquet", "test": "data/mnist10k/test.parquet", "features_col": "pixels"},
    "model": {"factory": "sparkdl.keras.zoo:mnist_mlp", "kwargs": {"seed": 1}},
    "fit": {"loss": "sparse_categorical_crossentropy", "epochs": 3, "num_workers": 2},
}


def write_config(tmp_path, config, name="job.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return str(path)


def with_fit(**fit):
    config = json.loads(json.dumps(BASE))
    config["fit"].update(fit)
    return config


# --- validation ---------------------------------------------------------------------------------


def test_unknown_fit_key_is_named_with_its_section_the_closest_key_and_all_valid_keys(tmp_path):
    path = write_config(tmp_path, with_fit(epocs=2))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert "fit.epocs" in msg and "section 'fit'" in msg
    assert "Did you mean 'epochs'?" in msg
    listed = msg.split("Valid keys of section 'fit': ")[1].split(". Received")[0].split(", ")
    assert listed == list(SCHEMA["fit"].keys)  # every valid key (the Params' keys), in schema order
    assert path in msg


@pytest.mark.parametrize(
    "section, key, suggestion",
    [("data", "lable_col", "label_col"), ("model", "factroy", "factory"), ("output", "plots", "plot"), ("", "fitt", "fit")],
)
def test_unknown_key_in_any_section_suggests_the_closest(tmp_path, section, key, suggestion):
    config = json.loads(json.dumps(BASE))
    (config.setdefault(section, {}) if section else config)[key] = "x"
    with pytest.raises(ConfigError, match=rf"unknown key {re.escape(f'{section}.' if section else '')}{key}\b.*"
                                          rf"Did you mean '{suggestion}'\?"):
        load_config(write_config(tmp_path, config))


def test_unknown_key_far_from_every_valid_key_gets_no_suggestion(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path, with_fit(zzzzzz=1)))
    assert "Did you mean" not in str(e.value) and "fit.zzzzzz" in str(e.value)


@pytest.mark.parametrize(
    "fit, expected",
    [
        ({"epochs": "two"}, r"fit\.epochs must be int .*Received: 'two' \(str\)"),
        ({"epochs": True}, r"fit\.epochs must be int .*Received: True \(bool\)"),
        ({"num_workers": 2.5}, r"fit\.num_workers must be int .*Received: 2\.5 \(float\)"),
        ({"shuffle": "yes"}, r"fit\.shuffle must be bool .*Received: 'yes'"),
        ({"metrics": "accuracy"}, r"fit\.metrics must be list .*Received: 'accuracy' \(str\)"),
        ({"local_steps": "16"}, r"fit\.local_steps must be int or null .*Received: '16' \(str\)"),
        ({"verbose": 3}, r"fit\.verbose must be one of 0, 1, 2\. Received: 3"),
        ({"mode": "synchronous"}, r"fit\.mode must be one of sync, bmuf, .*\. Did you mean 'sync'\? Received: 'synchronous'"),
        ({"backend": "shard"}, r"fit\.backend must be one of rounds, ps, sharded, auto\. Did you mean 'sharded'\? Received: 'shard'"),
        ({"validation_split": "a tenth"}, r"fit\.validation_split must be float .*Received: 'a tenth' \(str\)"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_key_the_type_and_the_value(tmp_path, fit, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(write_config(tmp_path, with_fit(**fit)))


def test_accepted_values_and_defaults(tmp_path):
    config = load_config(write_config(tmp_path, with_fit(verbose=2, validation_split="1e-1", round_deadline=3,
                                                         min_workers_per_round=0.5, log_dir="tb", mlflow=False)))
    assert config["fit"]["verbose"] == 2
    assert config["fit"]["validation_split"] == pytest.approx(0.1)  # PyYAML reads 1e-1 as a string
    assert config["fit"]["round_deadline"] == 3 and config["fit"]["min_workers_per_round"] == 0.5
    assert config["name"] == "job"  # the file's name
    assert config["data"]["label_col"] == "label" and config["data"]["format"] == "parquet"  # defaults filled in
    assert config["data"]["features_col"] == "pixels"
    assert config["output"] == {"dir": None, "plot": True} and config["callbacks"] == []
    assert set(config["fit"]) == {"loss", "epochs", "num_workers", "verbose", "validation_split", "round_deadline",
                                  "min_workers_per_round", "log_dir", "mlflow"}  # only the keys given


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c: c["data"].pop("train"), r"missing the required key data\.train"),
        (lambda c: c.pop("model"), r"missing the required key model\b"),
        (lambda c: c["model"].update(json="m.json"), r"exactly one of model\.factory .* or model\.json"),
        (lambda c: c["model"].pop("factory"), r"exactly one of model\.factory"),
        (lambda c: c.update(fit=[1, 2]), r"config key fit must be dict or null"),
    ],
)
def test_missing_required_keys_are_named(tmp_path, mutate, expected):
    config = json.loads(json.dumps(BASE))
    mutate(config)
    with pytest.raises(ConfigError, match=expected):
        load_config(write_config(tmp_path, config))


def test_unreadable_or_non_mapping_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the job config"):
        load_config(str(tmp_path / "nope.yaml"))
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_config(str(path))


# --- overrides ----------------------------------------------------------------------------------


def test_set_overrides_are_applied_before_validation(tmp_path):
    path = write_config(tmp_path, BASE)
    config = load_config(path, ["fit.epochs=1", "fit.local_steps=null", "model.kwargs.seed=2", "name=trial",
                                "fit.metrics=[accuracy]", "fit.optimizer={class_name: SGD, config: {learning_rate: 0.1}}",
                                "output.dir=/tmp/x"])
    assert config["fit"]["epochs"] == 1 and isinstance(config["fit"]["epochs"], int)
    assert config["fit"]["local_steps"] is None
    assert config["model"]["kwargs"] == {"seed": 2}
    assert config["name"] == "trial"
    assert config["fit"]["metrics"] == ["accuracy"]
    assert config["fit"]["optimizer"] == {"class_name": "SGD", "config": {"learning_rate": 0.1}}
    assert config["output"]["dir"] == "/tmp/x"
    assert yaml.safe_load(open(path))["fit"]["epochs"] == 3  # the file is untouched


def test_bad_overrides_are_refused(tmp_path):
    path = write_config(tmp_path, BASE)
    with pytest.raises(ConfigError, match=r"section\.key=value.*Received: 'fit\.epochs'"):
        load_config(path, ["fit.epochs"])
    with pytest.raises(ConfigError, match=r"unknown key fit\.epocs.*Did you mean 'epochs'"):
        load_config(path, ["fit.epocs=1"])
    with pytest.raises(ConfigError, match=r"fit\.epochs must be int .*Received: 'two'"):
        load_config(path, ["fit.epochs=two"])
    with pytest.raises(ConfigError, match=r"'fit\.loss' is not a mapping"):
        load_config(path, ["fit.loss.name=x"])


def test_apply_overrides_creates_missing_sections():
    config = apply_overrides({}, ["output.plot=false", "callbacks=[{class: a.B}]"])
    assert config == {"output": {"plot": False}, "callbacks": [{"class": "a.B"}]}


# --- callbacks ----------------------------------------------------------------------------------


def test_callbacks_section_builds_the_keras_objects(tmp_path):
    import keras

    config = json.loads(json.dumps(BASE))
    config["callbacks"] = [
        {"class": "keras.callbacks.EarlyStopping", "kwargs": {"monitor": "val_loss", "patience": 3}},
        {"class": "keras.callbacks:TerminateOnNaN"},
    ]
    loaded = load_config(write_config(tmp_path, config))
    assert loaded["callbacks"][1] == {"class": "keras.callbacks:TerminateOnNaN", "kwargs": {}}
    built = build_callbacks(loaded)
    assert type(built[0]) is keras.callbacks.EarlyStopping
    assert built[0].patience == 3 and built[0].monitor == "val_loss"
    assert type(built[1]) is keras.callbacks.TerminateOnNaN


def test_callbacks_errors_name_the_entry(tmp_path):
    config = json.loads(json.dumps(BASE))
    config["callbacks"] = [{"class": "keras.callbacks.EarlyStopping", "kwarg": {}}]
    with pytest.raises(ConfigError, match=r"unknown key callbacks\[0\]\.kwarg\b.*Did you mean 'kwargs'"):
        load_config(write_config(tmp_path, config))
    config["callbacks"] = [{"kwargs": {}}]
    with pytest.raises(ConfigError, match=r"missing the required key callbacks\[0\]\.class"):
        load_config(write_config(tmp_path, config))
    for cls, kwargs, expected in [
        ("keras.callbacks.NoSuchCallback", {}, r"callbacks\[0\]\.class: 'keras\.callbacks' has no attribute"),
        ("no_such_module_xyz.Callback", {}, r"cannot import module 'no_such_module_xyz' \(No module named 'no_such_module_xyz'\): it "
                                            r"must be importable on the driver, from the working directory \(.*\) or PYTHONPATH; "
                                            r"ship a module of your own with --py-files \(of sparkdl-train or spark-submit\)"),
        ("keras.callbacks.EarlyStopping", {"patiense": 2}, r"callbacks\[0\]: keras\.callbacks\.EarlyStopping\(\*\*kwargs\) failed"),
        ("os.path.join", {}, r"callbacks\[0\]\.class must name a class"),
    ]:
        config["callbacks"] = [{"class": cls, "kwargs": kwargs}]
        with pytest.raises(ConfigError, match=expected):
            build_callbacks(load_config(write_config(tmp_path, config)))


# --- estimator keywords -------------------------------------------------------------------------


def test_old_fit_keys_are_kept_with_their_params():
    assert {k: FIT_KEYS[k] for k in OLD_FIT_KEYS} == OLD_FIT_KEYS
    assert FIT_KEYS["log_dir"] == "logDir" and FIT_KEYS["mlflow"] == "mlflow" and FIT_KEYS["verbose"] == "verbose"
    from jobs.train import FIT_KEYS as job_fit_keys  # still importable from the job file

    assert job_fit_keys is FIT_KEYS


def test_estimator_params_pass_only_what_the_config_gives(tmp_path):
    config = load_config(write_config(tmp_path, with_fit(local_steps=None)))
    params = estimator_params(config)
    assert params == {"loss": "sparse_categorical_crossentropy", "epochs": 3, "numWorkers": 2, "localSteps": None,
                      "featuresCol": "pixels", "labelCol": "label"}
    config = load_config(write_config(tmp_path, with_fit(log_dir="tb")))
    with pytest.raises(ConfigError, match=r"fit\.log_dir needs KerasEstimator\(logDir=\.\.\.\)"):
        estimator_params(config, accepted={"loss", "epochs", "numWorkers", "featuresCol", "labelCol"})


def test_schema_defaults_are_the_estimators():
    """The `default` column of conf/README.md: each fit/data key's default equals KerasEstimator's."""
    from sparkdl import KerasEstimator

    signature = inspect.signature(KerasEstimator.__init__).parameters
    checked = 0
    for section in ("fit", "data"):
        for key, spec in SCHEMA[section].keys.items():
            if spec.param in signature and spec.param not in ("optimizer", "loss", "metrics"):  # compile keywords: None = unset
                assert spec.default == signature[spec.param].default, f"{section}.{key}"
                checked += 1
    assert checked >= 30
    assert set(FIT_KEYS.values()) - set(signature) <= {"logDir", "mlflow"}  # being added to the estimator


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "conf", "*.yaml"))), ids=os.path.basename)
def test_every_shipped_config_validates(path):
    config = load_config(path)
    assert config["name"] == os.path.splitext(os.path.basename(path))[0]
    assert os.path.isfile(os.path.join(ROOT, config["data"]["train"]))
    params = estimator_params(config)
    assert params["featuresCol"] == "pixels" and params["loss"] == "sparse_categorical_crossentropy"


# --- docs ---------------------------------------------------------------------------------------


def test_conf_readme_tables_are_the_schemas():
    text = open(os.path.join(ROOT, "conf", "README.md")).read()
    tables = text.split("<!-- schema:begin -->\n")[1].split("<!-- schema:end -->")[0]
    assert tables == schema_markdown(), "conf/README.md is out of date: python -m sparkdl.cli.config"
    for section, spec in SCHEMA.items():
        for key, k in spec.keys.items():
            assert f"| `{key}` | {k.type_name()} |" in text, f"{section}.{key}"
    assert sum(len(s.keys) for s in SCHEMA.values()) >= 50


def test_databricks_job_runs_jobs_train_with_a_valid_config():
    with open(os.path.join(ROOT, "conf", "deploy", "databricks_job.json")) as f:
        job = json.load(f)
    (task,) = job["tasks"]
    python_task = task["spark_python_task"]
    assert python_task["python_file"].endswith("/jobs/train.py")
    args = python_task["parameters"]
    config = args[args.index("--config") + 1]
    overrides = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    local = os.path.join(ROOT, "conf", os.path.basename(config))
    loaded = load_config(local, overrides)  # the job's config with the job's overrides is valid
    assert loaded["data"]["train"].startswith("/Volumes/")
    assert task["new_cluster"]["spark_version"].startswith("17.")
    assert any(lib.get("whl", "").endswith(".whl") for lib in task["libraries"])


def test_deploy_doc_has_the_tested_block_and_every_cluster_manager():
    text = open(os.path.join(ROOT, "docs", "deploy.md")).read()
    block = re.search(r"<!-- tested: local-cluster -->\n```bash\n(.*?)```", text, re.S).group(1)
    assert "local-cluster[2,1,1024]" in block and "conf/mnist_quick.yaml" in block and "sparkdl-predict" in block
    for needle in ("spark://", "--archives env.tar.gz#environment", "spark.yarn.appMasterEnv.PYSPARK_PYTHON",
                   "k8s://https://", "docker/Dockerfile", "spark_python_task", "/Volumes/"):
        assert needle in text, needle
    dockerfile = open(os.path.join(ROOT, "docker", "Dockerfile")).read()
    assert re.search(r"^FROM apache/spark:\$\{SPARK_VERSION\}-scala2\.13-java17-python3-ubuntu$", dockerfile, re.M)
    assert re.search(r"^ARG SPARK_VERSION=4\.", dockerfile, re.M)
    assert 'pip install --no-cache-dir ".[cpu' in dockerfile


# --- plot ---------------------------------------------------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("with_val", [True, False])
def test_plot_history_writes_a_png(tmp_path, with_val):
    from sparkdl.cli.plot import plot_history

    history = {"loss": [0.9, 0.5, 0.3], "accuracy": [0.7, 0.85, 0.9]}
    if with_val:
        history.update(val_loss=[0.8, 0.6, 0.5], val_accuracy=[0.75, 0.8, 0.82])
    path = str(tmp_path / "sub" / "history.png")
    assert plot_history(history, path) == path
    data = open(path, "rb").read()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1024
    width, height = png_size(data)
    assert (width, height) == (900, 340)  # two subplots side by side, 4.5 x 3.4 inches each at 100 dpi


def test_plot_history_lays_out_one_subplot_per_metric(tmp_path):
    from sparkdl.cli.plot import metric_names, plot_history

    history = {"accuracy": [0.5, 0.6], "val_loss": [1.0, 0.9], "loss": [1.1, 0.8], "auc": [0.6, 0.7], "val_top5": [0.9, 0.95]}
    assert metric_names(history) == ["loss", "accuracy", "auc", "top5"]
    width, height = png_size(open(plot_history(history, str(tmp_path / "h.png")), "rb").read())
    assert (width, height) == (1350, 680)  # 4 metrics: 3 columns, 2 rows
    with pytest.raises(ValueError, match="empty history"):
        plot_history({}, str(tmp_path / "e.png"))
    with pytest.raises(ValueError, match=r"history\['loss'\] must be a list of numbers"):
        plot_history({"loss": "0.5"}, str(tmp_path / "e.png"))


def test_train_job_skips_the_plot_with_a_warning_without_matplotlib(tmp_path, monkeypatch, caplog):
    from sparkdl.cli import train

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with caplog.at_level(logging.WARNING, logger="sparkdl.cli"):
        assert train._plot({"loss": [1.0]}, str(tmp_path / "h.png"), "t") is None
    assert "matplotlib is not installed" in caplog.text and "sparkdl-keras[plot]" in caplog.text
    assert not os.path.exists(tmp_path / "h.png")


# --- command lines without Spark ----------------------------------------------------------------


def test_train_check_prints_the_validated_config(tmp_path, capsys):
    from sparkdl.cli.train import main

    path = write_config(tmp_path, BASE)
    assert main(["--config", path, "--set", "fit.epochs=1", "--check"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["fit"]["epochs"] == 1 and printed["name"] == "job"
    assert main(["--config", path, "--set", "fit.epocs=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparkdl-train: error: ") and "Did you mean 'epochs'?" in err


@pytest.mark.parametrize("override, expected", [
    ("fit.epochs=-1", r"epochs must be a positive integer. Received: epochs=-1"),
    ("fit.mode=async", None),  # fine: backend auto picks ps
    ("fit.backend=rounds", None),
])
def test_train_check_runs_the_estimators_own_checks_without_spark(tmp_path, capsys, override, expected):
    from sparkdl.cli.train import main

    path = write_config(tmp_path, BASE)
    code = main(["--config", path, "--set", override, "--check"])
    if expected is None:
        assert code == 0
    else:
        assert code == 2 and re.search(expected, capsys.readouterr().err)
    assert main(["--config", path, "--set", "fit.mode=async", "--set", "fit.backend=rounds", "--check"]) == 2
    assert "runs on backend 'ps'" in capsys.readouterr().err


def test_train_refuses_a_missing_data_path_before_spark(tmp_path, capsys):
    from sparkdl.cli.train import main

    path = write_config(tmp_path, BASE)
    assert main(["--config", path, "--set", f"data.train={tmp_path / 'nope.parquet'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparkdl-train: error: data.train: no file or folder at") and "Traceback" not in err


def test_uri_detection():
    from sparkdl.cli.train import is_uri, join

    assert all(is_uri(p) for p in ("hdfs:///x", "s3a://b/x", "dbfs:/x", "file:/tmp/x", "abfss://c@a.dfs.core.windows.net/x"))
    assert not any(is_uri(p) for p in ("runs/x", "/Volumes/main/x", "./a:b", "C:\\runs"))
    assert join("s3a://b/runs/", "model") == "s3a://b/runs/model" and join("runs", "model") == os.path.join("runs", "model")


def test_predict_checks_paths_before_spark(tmp_path, capsys):
    from sparkdl.cli.predict import check_paths, main

    test_parquet = os.path.join(ROOT, "data", "mnist10k", "test.parquet")
    with pytest.raises(ConfigError, match=r"no folder at .*nope"):
        check_paths(str(tmp_path / "nope"), test_parquet, str(tmp_path / "out"), "errorifexists")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"holds no saved Spark ML model \(no metadata/ folder"):
        check_paths(str(tmp_path / "empty"), test_parquet, str(tmp_path / "out"), "errorifexists")
    (tmp_path / "model" / "metadata").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"--input: no file or folder at .*missing\.parquet"):
        check_paths(str(tmp_path / "model"), str(tmp_path / "missing.parquet"), str(tmp_path / "out"), "errorifexists")
    (tmp_path / "out").mkdir()
    with pytest.raises(ConfigError, match=r"--output .* exists; pass --mode overwrite"):
        check_paths(str(tmp_path / "model"), test_parquet, str(tmp_path / "out"), "errorifexists")
    check_paths(str(tmp_path / "model"), test_parquet, str(tmp_path / "out"), "overwrite")  # no error
    check_paths("hdfs:///m", "s3a://b/in", str(tmp_path / "out"), "overwrite")  # URIs are Spark's to check
    for output in (test_parquet, os.path.join(test_parquet, "part"), os.path.dirname(test_parquet)):  # would delete the input
        with pytest.raises(ConfigError, match=r"--output must not be the input or a folder inside or around it"):
            check_paths(str(tmp_path / "model"), test_parquet, output, "overwrite")
    with pytest.raises(ConfigError, match=r"must not be the input"):
        check_paths(str(tmp_path / "model"), "s3a://b/in/", "s3a://b/in", "overwrite")
    assert main(["--model", str(tmp_path / "nope"), "--input", test_parquet, "--output", str(tmp_path / "o")]) == 2
    assert "sparkdl-predict: error: --model must be the folder of a saved Spark ML model" in capsys.readouterr().err


def test_schema_module_prints_the_tables():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "sparkdl.cli.config"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out == cli_config.schema_markdown()


# --- the config against its model and its label files, before Spark -------------------------------


def small_job(tmp_path, model, fit, **data):
    from tests.cli_models import write_rows

    write_rows(tmp_path / "train.parquet", 8, seed=0)
    write_rows(tmp_path / "test.parquet", 4, seed=1)
    config = {"data": {"train": str(tmp_path / "train.parquet"), "test": str(tmp_path / "test.parquet"), "features_col": "x",
                       **data},
              "model": {"factory": f"tests.cli_models:{model}"}, "fit": fit}
    return write_config(tmp_path, config)


@pytest.mark.parametrize("model, fit, data, expected", [
    ("softmax", {"loss": "categorical_crossentropy"}, {"label_col": "label"},
     r"data\.train \(.*train\.parquet\), label of output .*: label column 'label' must hold 3 value\(s\) per row .*"
     r"for class indices use sparse_categorical_crossentropy\. Received: 1 per row"),
    ("softmax", {"loss": "sparse_categorical_crossentropy"}, {"label_col": "onehot"},
     r"data\.train .*label column 'onehot' must hold one class index per row for sparse_categorical_crossentropy "
     r"\(use categorical_crossentropy for one-hot labels\)\. Received: 3 values per row"),
    ("linear", {"loss": "mse"}, {"label_col": "onehot"}, r"label column 'onehot' must hold 1 value\(s\) per row"),
    ("linear", {"loss": "mse"}, {"label_col": "nope"}, r"data\.train .*label column 'nope' is not in the file"),
    ("two_outputs", {"loss": "mse"}, {"label_col": "ya"},
     r"a model with 2 outputs needs data\.label_cols, one label column per output .* the outputs are \['a', 'b'\]"),
    ("two_outputs", {"loss": "mse"}, {"label_cols": ["ya"]}, r"data\.label_cols must give one label column per model output"),
    ("two_outputs", {"loss": "mse"}, {"label_cols": {"a": "ya", "c": "yb"}}, r"data\.label_cols must map every model output by name"),
    ("two_outputs", {"loss": "mse"}, {"label_cols": {"a": "ya", "b": "onehot"}}, r"label of output 'b': label column 'onehot'"),
    ("linear", {"loss": "mse", "task": "classification"}, {"label_col": "y"}, None),  # (1,) is (classes,): fine
])
def test_check_refuses_labels_that_do_not_fit_the_model_or_loss_before_spark(tmp_path, capsys, model, fit, data, expected):
    from sparkdl.cli.train import main

    path = small_job(tmp_path, model, fit, **data)
    code = main(["--config", path, "--check"])
    err = capsys.readouterr().err
    if expected is None:
        assert code == 0, err
        return
    assert code == 2 and err.startswith("sparkdl-train: error: ") and re.search(expected, err), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    # the job itself refuses it the same way, before Spark starts (no session: none is active after it)
    assert main(["--config", path, "--output", str(tmp_path / "run")]) == 2
    assert re.search(expected, capsys.readouterr().err)
    assert not (tmp_path / "run" / "model").exists()


def test_check_accepts_every_label_form_that_fits(tmp_path, capsys):
    from sparkdl.cli.train import main

    for model, fit, data in [("softmax", {"loss": "categorical_crossentropy"}, {"label_col": "onehot"}),
                             ("softmax", {"loss": "sparse_categorical_crossentropy"}, {"label_col": "label"}),
                             ("two_outputs", {"loss": "mse"}, {"label_cols": ["ya", "yb"]})]:
        assert main(["--config", small_job(tmp_path, model, fit, **data), "--check"]) == 0, capsys.readouterr().err


def test_a_loss_and_metrics_per_output_are_read_from_yaml_and_checked_against_the_outputs(tmp_path):
    from sparkdl.cli.train import build_estimator, check_job

    config = with_fit(loss={"a": "mse", "b": "binary_crossentropy"}, metrics={"b": ["accuracy"]})
    config["model"] = {"factory": "tests.cli_models:two_outputs"}
    config["data"]["label_cols"] = {"a": "ya", "b": "yb"}
    estimator = build_estimator(load_config(write_config(tmp_path, config)))
    assert estimator.getLoss() == {"a": "mse", "b": "binary_crossentropy"} and estimator.getMetrics() == {"b": ["accuracy"]}
    assert check_job(load_config(write_config(tmp_path, config)), estimator) == ["ya", "yb"]
    config["fit"]["loss"] = {"a": "mse", "c": "mae"}
    wrong = load_config(write_config(tmp_path, config))
    with pytest.raises(ConfigError, match=r"loss as a dict must name every model output.*outputs are \['a', 'b'\]"):
        check_job(wrong, build_estimator(wrong))
# --- paths and the learning rate (issue 23) ------------------------------------------------------


def test_a_config_files_relative_paths_are_its_folders_and_the_overrides_the_working_directorys(tmp_path, monkeypatch):
    folder = tmp_path / "job"
    folder.mkdir()
    config = json.loads(json.dumps(BASE))
    config["data"].update(train="data/train.parquet", test="hdfs://nn/mnist/test.parquet", validation="/abs/val.parquet")
    config["model"] = {"json": "model.json"}
    config["fit"].update(checkpoint_dir="../ckpt", log_dir="~/tb")
    config["output"] = {"dir": "out"}
    config["callbacks"] = [{"class": "keras.callbacks.CSVLogger", "kwargs": {"filename": "epochs.csv", "separator": ";"}}]
    path = write_config(folder, config)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    loaded = load_config(path)
    assert loaded["data"]["train"] == str(folder / "data" / "train.parquet")
    assert loaded["data"]["test"] == "hdfs://nn/mnist/test.parquet"  # a URI as it is
    assert loaded["data"]["validation"] == "/abs/val.parquet"
    assert loaded["model"]["json"] == str(folder / "model.json")
    assert loaded["fit"]["checkpoint_dir"] == str(tmp_path / "ckpt")
    assert loaded["fit"]["log_dir"] == os.path.join(os.path.expanduser("~"), "tb")
    assert loaded["output"]["dir"] == str(folder / "out")
    assert loaded["callbacks"][0]["kwargs"] == {"filename": str(folder / "epochs.csv"), "separator": ";"}

    loaded = load_config(path, ["data.train=mine.parquet", "output.dir=run", "fit.epochs=2"])
    assert loaded["data"]["train"] == str(elsewhere / "mine.parquet")  # a path typed on the command line: the cwd's
    assert loaded["output"]["dir"] == str(elsewhere / "run")
    assert loaded["fit"]["epochs"] == 2


def test_shipped_configs_read_the_bundled_data_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(os.path.join(ROOT, "conf", "mnist_cnn.yaml"))
    assert config["data"]["train"] == os.path.join(ROOT, "data", "mnist10k", "train.parquet")
    assert os.path.isfile(config["data"]["train"]) and config["model"]["factory"] == "sparkdl.keras.zoo:mnist_cnn"
    assert config["output"]["dir"] is None  # the default, runs/mnist_cnn, is the working directory's


@pytest.mark.parametrize("optimizer, factory, expected", [
    ({"class_name": "SGD", "config": {"learning_rate": 0.1, "momentum": 0.5}}, "softmax", ("SGD", {"momentum": 0.5})),
    ("rmsprop", "softmax", ("RMSprop", {})),
    (None, "compiled_softmax", ("SGD", {})),  # the compiled model's optimizer
    (None, "softmax", ("Adam", {})),  # the estimator's default, adam
])
def test_fit_learning_rate_is_the_optimizers(tmp_path, optimizer, factory, expected):
    from sparkdl.cli.train import build_estimator

    config = {"data": {"train": "t.parquet", "test": "t.parquet", "features_col": "x"},
              "model": {"factory": f"tests.cli_models:{factory}"},
              "fit": {"loss": "sparse_categorical_crossentropy", "learning_rate": 0.05, "block_learning_rate": 0.7}}
    if optimizer is not None:
        config["fit"]["optimizer"] = optimizer
    estimator = build_estimator(load_config(write_config(tmp_path, config)))
    spec = estimator._compile_spec().optimizer
    assert spec["class_name"] == expected[0] and spec["config"]["learning_rate"] == 0.05
    assert expected[1].items() <= spec["config"].items()  # the optimizer's other settings kept
    assert estimator.getBlockLearningRate() == 0.7  # BMUF's own rate, apart
    assert estimator.getLearningRate() == 0.05 and estimator.isSet("learningRate")  # the Param, one mechanism with the API

    import keras

    rebuilt = keras.optimizers.deserialize(spec)
    assert float(keras.ops.convert_to_numpy(rebuilt.learning_rate)) == pytest.approx(0.05)


def test_fit_learning_rate_must_be_a_number(tmp_path):
    with pytest.raises(ConfigError, match=r"fit\.learning_rate must be float or null"):
        load_config(write_config(tmp_path, with_fit(learning_rate="fast")))


CHECK_WITHOUT_KERAS = r"""
import contextlib, io, json, sys
from sparkdl.cli.train import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    status = main(["--config", sys.argv[1], *sys.argv[2:]])
loaded = sorted(m for m in ("tensorflow", "keras", "pyspark", "jax", "torch") if m in sys.modules)
print(json.dumps({"status": status, "stderr": err.getvalue(), "loaded": loaded}))
"""


@pytest.mark.parametrize("case", ["yaml typo", "no config file", "no data file"])
def test_check_reports_config_errors_before_importing_tensorflow(tmp_path, case):
    """Issue 31: `sparkdl-train --check` of a typo took 8-12 s, TensorFlow's import, before saying so;
    a run (no --check: --check accepts data paths this machine does not have) of a missing data file too."""
    import subprocess

    config = json.loads(json.dumps(BASE))
    config["data"]["train"] = os.path.join(ROOT, "data", "mnist10k", "train.parquet")
    config["data"]["test"] = os.path.join(ROOT, "data", "mnist10k", "test.parquet")
    if case == "yaml typo":
        config["fit"]["epocs"] = 2
    if case == "no data file":
        config["data"]["train"] = str(tmp_path / "nothere.parquet")
    path = write_config(tmp_path, config) if case != "no config file" else str(tmp_path / "absent.yaml")
    env = dict(os.environ, PYTHONPATH=ROOT)
    check = [] if case == "no data file" else ["--check"]
    result = subprocess.run([sys.executable, "-c", CHECK_WITHOUT_KERAS, path, *check], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    expected = {"yaml typo": "unknown key fit.epocs in section 'fit' of the job config. Did you mean 'epochs'?",
                "no config file": "cannot read the job config", "no data file": "data.train: no file or folder at"}[case]
    assert out["status"] == 2 and expected in out["stderr"] and out["stderr"].startswith("sparkdl-train: error: ")
    assert out["loaded"] == []  # reported before TensorFlow (and Keras, Spark) were imported


# --- --conf and --py-files, and the options' reference -------------------------------------------


def test_train_takes_conf_and_py_files_as_spark_submit_does(tmp_path, monkeypatch):
    from sparkdl.cli import python_files, spark_settings
    from sparkdl.cli.train import parse_args

    (tmp_path / "mymodels.py").write_text("VALUE = 1\n")
    (tmp_path / "lib.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    monkeypatch.chdir(tmp_path)
    args = parse_args(["--config", "job.yaml", "--conf", "spark.executor.memory=4g", "--conf", "spark.a=x=y",
                       "--py-files", "mymodels.py,lib.zip", "--py-files", "hdfs:///libs/more.zip"])
    assert spark_settings(args.spark_conf) == {"spark.executor.memory": "4g", "spark.a": "x=y"}
    assert python_files(args.py_files) == [str(tmp_path / "mymodels.py"), str(tmp_path / "lib.zip"), "hdfs:///libs/more.zip"]
    assert parse_args(["--config", "job.yaml"]).spark_conf == [] and parse_args(["--config", "job.yaml"]).py_files == []


@pytest.mark.parametrize("argv, expected", [
    (["--conf", "spark.executor.memory"], "--conf takes KEY=VALUE, a Spark setting, e.g. --conf spark.executor.memory=4g. "
                                          "Received: --conf 'spark.executor.memory'"),
    (["--conf", "=4g"], "Received: --conf '=4g'"),
    (["--py-files", "nope.py"], "--py-files: no file at 'nope.py'"),
    (["--py-files", "notes.txt"], "--py-files takes .py, .zip, .egg or .whl files (comma-separated). Received: 'notes.txt'"),
])
def test_bad_conf_or_py_files_are_refused_before_the_config_is_read(tmp_path, monkeypatch, capsys, argv, expected):
    from sparkdl.cli.train import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("")
    assert main(["--config", "missing.yaml", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparkdl-train: error: ") and expected in err and "missing.yaml" not in err


def test_py_files_put_a_factory_module_on_the_drivers_path_for_check(tmp_path, monkeypatch, capsys):
    """A config whose model factory lives in a --py-files module checks (--check) from another folder."""
    import sys

    from sparkdl.cli.train import main

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "my_factories_44.py").write_text("from sparkdl.keras.zoo import mnist_mlp as build\n")
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    monkeypatch.setattr(sys, "path", list(sys.path))
    config = json.loads(json.dumps(BASE))
    config["model"] = {"factory": "my_factories_44:build", "kwargs": {"seed": 1}}
    path = write_config(tmp_path, config)
    assert main(["--config", path, "--check"]) == 2
    assert "my_factories_44" in capsys.readouterr().err
    assert main(["--config", path, "--check", "--py-files", "../lib/my_factories_44.py"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["factory"] == "my_factories_44:build"


@pytest.mark.parametrize("command", ["train", "predict"])
def test_the_cli_reference_tables_are_the_commands_parsers(command):
    import importlib

    from sparkdl.cli import options_markdown

    parser = importlib.import_module(f"sparkdl.cli.{command}").build_parser()
    page = open(os.path.join(ROOT, "docs", "reference", "cli.md"), encoding="utf-8").read()
    table = page.split(f"<!-- options:begin sparkdl-{command} (sparkdl.cli.options_markdown) -->\n")[1].split(
        f"<!-- options:end sparkdl-{command} -->")[0]
    assert table.strip() == options_markdown(parser).strip(), f"docs/reference/cli.md's sparkdl-{command} table is out of date"
    flags = {flag for action in parser._actions for flag in action.option_strings} - {"-h", "--help"}
    assert flags == set(re.findall(r"^\| `(--[\w-]+)", table, re.M))
    if command == "train":
        assert {"--conf", "--py-files", "--master", "--set", "--check"} <= flags
