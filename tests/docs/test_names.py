"""The names the docs' prose uses exist in the code (issue 44 item 8): every Param-like name in
inline code (a camelCase name in backticks, alone or as ``name=``) is a keyword of
``KerasEstimator``, an attribute of ``KerasEstimator`` or ``KerasModel``, or one of the other
libraries' names listed here (each looked up in its library); every exception class a page names
(``SomethingError``, ``SomethingException``) is one sparkdl defines, a Python built-in, or one
listed here; and every ``name`` (default V) a page quotes is the declared default.

A page that keeps a Param after it was renamed or removed, or names an error the code no longer
raises, fails here, naming the page and the name.
"""

import ast
import builtins
import glob
import importlib
import inspect
import os
import re

from sparkdl.param_specs import PARAMS, keyword_names
from tests.docs.snippets import ROOT, pages

#: camelCase names of other libraries the pages use in inline code: name -> where it lives
#: (``module:attribute.path``, looked up), or ``"-"`` and why it is not code to look up.
OTHER_NAMES = {
    "mapInArrow": "pyspark.sql:DataFrame.mapInArrow",
    "toArrow": "pyspark.sql:DataFrame.toArrow",
    "orderBy": "pyspark.sql:DataFrame.orderBy",
    "groupBy": "pyspark.sql:DataFrame.groupBy",
    "readStream": "pyspark.sql:SparkSession.readStream",
    "writeStream": "pyspark.sql:DataFrame.writeStream",
    "availableNow": "pyspark.sql.streaming:DataStreamWriter.trigger",  # trigger(availableNow=True)
    "processAllAvailable": "pyspark.sql.streaming:StreamingQuery.processAllAvailable",
    "queryName": "pyspark.sql.streaming:DataStreamWriter.queryName",
    "outputMode": "pyspark.sql.streaming:DataStreamWriter.outputMode",
    "checkpointLocation": "-: a Structured Streaming option (DataStreamWriter.option)",
    "addPyFile": "pyspark:SparkContext.addPyFile",
    "setLogLevel": "pyspark:SparkContext.setLogLevel",
    "interruptTag": "pyspark.sql:SparkSession.interruptTag",
    "createDataFrame": "pyspark.sql:SparkSession.createDataFrame",
    "getNumPartitions": "pyspark:RDD.getNumPartitions",
    "binaryFile": "-: a DataFrameReader format (spark.read.format('binaryFile'))",
    "dropLast": "pyspark.ml.feature:OneHotEncoder.dropLast",
    "vocabSize": "pyspark.ml.feature:CountVectorizer.vocabSize",
    "minDF": "pyspark.ml.feature:CountVectorizer.minDF",
    "bestModel": "-: CrossValidatorModel's attribute, set in its constructor",
    "avgMetrics": "-: CrossValidatorModel's attribute, set in its constructor",
    "rawPrediction": "pyspark.ml.classification:ProbabilisticClassificationModel.rawPredictionCol",  # the column's default name
    "resultSize": "-: a field of Spark's REST API (a stage's task metrics)",
    "getX": "-: a placeholder for a Param's getter",
}

#: exception classes of other libraries the pages name: name -> where it lives (looked up)
OTHER_ERRORS = {
    "PythonException": "pyspark.errors:PythonException",
    "StreamingQueryException": "pyspark.errors:StreamingQueryException",
}

CAMEL = re.compile(r"[a-z][a-z0-9]*[A-Z][A-Za-z0-9]*")
ERROR = re.compile(r"\b([A-Z][A-Za-z0-9]*(?:Error|Exception))\b")


def lookup(where: str):
    module, _, path = where.partition(":")
    found = importlib.import_module(module)
    for part in path.split("."):
        found = getattr(found, part)
    return found


def prose(page: str) -> str:
    """The page without its fenced blocks (their code is the snippets tests')."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return re.sub(r"^\s*(`{3,}|~{3,}).*?^\s*\1\s*$", "", f.read(), flags=re.S | re.M)


def inline_code(page: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(page))


def sparkdl_names() -> set[str]:
    """The keywords of ``KerasEstimator`` and its ``fit``, and the attributes of ``KerasEstimator``
    and ``KerasModel`` (methods, Params, and those their ``__init__`` and ``fit`` set on ``self``)."""
    from sparkdl import KerasEstimator, KerasModel

    names = set(keyword_names()) | set(inspect.signature(KerasEstimator.fit).parameters)
    names |= set(dir(KerasEstimator)) | set(dir(KerasModel))
    for cls in (KerasEstimator, KerasModel):
        names |= set(re.findall(r"\b(?:self|model|that)\.(\w+)\s*(?::[^=\n]+)?=", inspect.getsource(inspect.getmodule(cls))))
    return names


def test_every_camelcase_name_a_page_puts_in_inline_code_exists():
    known = sparkdl_names()
    unknown = []
    for page in pages():
        for span in inline_code(page):
            whole = re.fullmatch(rf"({CAMEL.pattern})(=.*)?", span)
            named = {whole[1]} if whole else set()
            named |= set(re.findall(rf"(?<![\w.])({CAMEL.pattern})\s*=(?!=)", span))  # keywords: fit(df, validationData=...)
            unknown += [f"{page}: `{name}` (in `{span}`)" for name in sorted(named) if name not in known and name not in OTHER_NAMES]
    assert unknown == [], "a page names a Param or keyword sparkdl does not have:\n" + "\n".join(unknown)


def test_the_other_libraries_names_exist_there():
    for name, where in OTHER_NAMES.items():
        if where.startswith("-:"):
            assert len(where) > 10, name  # the reason it is not looked up
        else:
            assert lookup(where) is not None, name
    for name, where in OTHER_ERRORS.items():
        assert issubclass(lookup(where), BaseException) and where.endswith(":" + name), name


def test_every_exception_a_page_names_exists():
    import sparkdl.errors

    code = "\n".join(open(p, encoding="utf-8").read() for p in glob.glob(os.path.join(ROOT, "sparkdl", "**", "*.py"), recursive=True))
    defined = set(re.findall(r"^\s*class (\w+)\(", code, re.M))
    assert {"WorkerError", "SchemaError", "ConfigError", "SliceLost"} <= defined
    unknown = []
    for page in pages():
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            names = set(ERROR.findall(f.read()))
        for name in sorted(names):
            if name not in defined and not hasattr(builtins, name) and name not in OTHER_ERRORS:
                unknown.append(f"{page}: {name}")
    assert unknown == [], "a page names an exception the code does not have:\n" + "\n".join(unknown)
    # the public errors a page names are importable from sparkdl.errors, where the pages say they are
    public = {n for n in dir(sparkdl.errors) if isinstance(getattr(sparkdl.errors, n), type)}
    assert {"WorkerError", "SchemaError", "ConfigError", "NodeLostError", "FitCancelledError"} <= public


def test_every_default_a_page_quotes_for_a_param_is_the_declared_one():
    defaults = {p.name: p.default for p in PARAMS}
    forms = (
        r"`(\w+)`(?: \S{1,2})? \(default `?([^`),;]+?)`?[),;]",  # `padValue` (default 0), `x` η (default 1.0)
        r"`(\w+)` (?:now )?defaults to `?([^`\s,;.:]+(?:\.\d+)?)`?",  # `checkFeatures` now defaults to False
        r"`(\w+)`: `([^`]+)` \(default\)",  # `handleInvalid`: `"error"` (default)
    )
    quoted, wrong = 0, []
    for page in pages():
        text = re.sub(r"\s+", " ", prose(page))
        for form in forms:
            for name, value in re.findall(form, text):
                if name not in defaults:
                    continue
                try:
                    said = ast.literal_eval(value.strip())
                except (ValueError, SyntaxError):
                    continue  # an expression in words: "1 − 1/numWorkers"
                quoted += 1
                if said != defaults[name] or type(said) is bool and type(defaults[name]) is not bool:
                    wrong.append(f"{page}: `{name}` default {value!r}, declared {defaults[name]!r}")
    assert quoted >= 3
    assert wrong == [], "\n".join(wrong)
