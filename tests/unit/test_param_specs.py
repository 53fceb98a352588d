"""The Param declarations (sparkdl.param_specs) without Spark or Keras: the docs' Params table and the
job config's ``fit`` and ``data`` keys are generated from them, keywords are checked against them."""

import os
import re
import subprocess
import sys

import pytest

from sparkdl.cli.config import SCHEMA
from sparkdl.errors import ConfigError
from sparkdl.param_specs import (
    BY_NAME,
    KEYWORDS,
    KINDS,
    NO_DEFAULT,
    PARAMS,
    SHARED,
    TRAINING,
    args_docstring,
    check_keywords,
    keyword_signature,
    params_markdown,
)
from tests.conftest import ROOT


def test_docs_params_table_is_the_declarations():
    text = open(os.path.join(ROOT, "docs", "reference", "params.md")).read()
    table = text.split("<!-- params:begin (python -m sparkdl.param_specs) -->\n")[1].split("<!-- params:end -->")[0]
    assert table == params_markdown(), "docs/reference/params.md's Params table is out of date: python -m sparkdl.param_specs"
    for spec in PARAMS:  # one row per Param, with its default and meaning
        assert f"| `{spec.name}` |" in table and spec.doc.replace("|", "\\|") in table, spec.name
    assert "| `callbacks` (not a Param) | `[]` |" in table


def test_the_module_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "sparkdl.param_specs"], cwd=ROOT, capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=ROOT)).stdout
    assert out == params_markdown()


def test_names_are_unique_camel_case_and_keys_snake_case():
    names = [spec.name for spec in PARAMS] + [k.name for k in KEYWORDS]
    assert len(names) == len(set(names)) == len(PARAMS) + 4
    for spec in PARAMS:
        assert re.fullmatch(r"[a-z][a-zA-Z]*", spec.name), spec.name
        assert re.fullmatch(r"[a-z][a-z_]*", spec.key), spec.key
    assert BY_NAME["maxTaskMemoryMB"].key == "max_task_memory_mb" and BY_NAME["numWorkers"].key == "num_workers"
    assert BY_NAME["logDir"].key == "log_dir" and BY_NAME["mlflow"].key == "mlflow"


def test_declarations_are_consistent():
    for spec in PARAMS:
        assert spec.doc and not spec.doc.endswith("."), spec.name  # the docstring adds the period
        if spec.kind == "choice":
            assert spec.choices and spec.default in spec.choices, spec.name
        if spec.choices is not None and spec.default is not NO_DEFAULT:
            assert spec.default in spec.choices, spec.name
        if spec.fit_choices is not None:
            assert set(spec.fit_choices) < set(spec.choices) and spec.default in spec.fit_choices, spec.name
        if spec.config is not None:
            assert spec.example is not None, spec.name
    assert {spec.stage for spec in PARAMS} == {SHARED, TRAINING}
    assert BY_NAME["checkFeatures"].stage == SHARED and BY_NAME["epochs"].stage == TRAINING
    assert BY_NAME["loss"].default is NO_DEFAULT


def test_compression_choices_are_the_core_ones():
    from sparkdl.core.compression import COMPRESSIONS

    assert BY_NAME["compression"].choices == (None, *COMPRESSIONS)


def test_config_fit_and_data_keys_come_from_the_declarations():
    fit, data = SCHEMA["fit"].keys, SCHEMA["data"].keys
    assert [k for k, key in fit.items() if key.param] == [spec.key for spec in PARAMS if spec.config == "fit"]
    assert [k for k, key in fit.items() if not key.param] == []  # learning_rate too is a Param's key (learningRate)
    assert fit["learning_rate"].param == "learningRate" and list(fit).index("learning_rate") == list(fit).index("optimizer") + 1
    assert [k for k, key in data.items() if key.param] == [spec.key for spec in PARAMS if spec.config == "data"]
    for section in (fit, data):
        for key, k in section.items():
            if not k.param:
                continue
            spec = BY_NAME[k.param]
            assert key == spec.key and k.types == KINDS[spec.kind].types
            assert k.default == (None if spec.default is NO_DEFAULT else spec.default)
            assert k.doc == f"{spec.doc} [{spec.name}]" and k.example == spec.example
    assert fit["handle_invalid"].choices == ("error", "skip")  # keep is for transform: the job's fit refuses it
    assert fit["mode"].choices[0] == "sync" and fit["compression"].choices[0] is None
    assert fit["min_workers_per_round"].types == ("int", "float", "null")


def test_unknown_keyword_names_the_closest_valid_one():
    check_keywords("KerasEstimator", {"epochs": 2, "model": None, "callbacks": []})  # all valid
    with pytest.raises(ConfigError, match=r"'epocs' is none of them\. Did you mean 'epochs'\? Received: epocs=2"):
        check_keywords("KerasEstimator", {"epochs": 1, "epocs": 2})
    with pytest.raises(ConfigError, match=r"Did you mean 'featuresCol'\?"):
        check_keywords("KerasEstimator", {"featureCol": "x"})
    with pytest.raises(ConfigError) as info:
        check_keywords("KerasEstimator", {"zzzzzz": 1})
    assert "Did you mean" not in str(info.value) and "Received: zzzzzz=1" in str(info.value)


def test_signature_and_docstring_list_every_keyword_with_its_default():
    signature = keyword_signature().parameters
    assert list(signature) == ["self"] + [k.name for k in KEYWORDS] + [spec.name for spec in PARAMS]
    assert signature["numWorkers"].default == 2 and signature["mode"].default == "sync"
    assert signature["optimizer"].default is None and signature["loss"].default is None  # compile: None = unset
    args = args_docstring(indent=8)
    for spec in PARAMS:
        assert re.search(rf"^        {spec.name} \(", args, re.M), spec.name
    assert "        numWorkers (int; default 2): model replicas" in args
    assert "        loss (str | dict | list | keras.losses.Loss; no default): Keras loss" in args


def test_each_range_is_declared_once_and_fit_config_takes_its_fields_defaults_and_checks_from_it():
    """FitConfig's fields are Params: their defaults and ranges come from the declarations, and
    FitConfig refuses a value in the words the Param's setter, the job config and the docs use."""
    import dataclasses

    from sparkdl.config import FitConfig

    for field in dataclasses.fields(FitConfig):
        spec = BY_NAME[field.metadata["param"]]
        assert field.default == spec.default, spec.name
    for spec in PARAMS:  # every default keeps its own rule and choices
        if spec.default is not NO_DEFAULT:
            spec.check(spec.default)
    cases = [("server_port", 70000, "serverPort must be an integer in [0, 65535]. Received: serverPort=70000"),
             ("staleness", -1, "staleness must be an integer >= 0. Received: staleness=-1"),
             ("round_deadline_s", float("inf"), "roundDeadline must be a number of seconds >= 0. Received: roundDeadline=inf"),
             ("compression_threshold", 1e39, "compressionThreshold must be a positive finite number within float32's range. "
                                             "Received: compressionThreshold=1e+39"),
             ("verbose", True, "verbose must be 0, 1 or 2. Received: verbose=True"),
             ("checkpoint_dir", " ", "checkpointDir must be None or a folder path or URI. Received: checkpointDir=' '")]
    for key, value, message in cases:
        with pytest.raises(ConfigError) as info:
            FitConfig(**{key: value})
        assert str(info.value) == message
    table = params_markdown()
    for spec in PARAMS:  # the docs state each rule in the words of the check
        if spec.rule is not None:
            assert f"| `{spec.name}` |" in table and f"| {spec.rule.text.replace('|', chr(92) + '|')} |" in table, spec.name
    with pytest.raises(ConfigError, match=r"^blockMomentum must be None or a number in \[0, 1\)"):
        from sparkdl.core.modes.averaging import BlockMomentum

        BlockMomentum(1.5)

