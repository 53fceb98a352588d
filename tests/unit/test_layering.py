"""The dependency direction holds: core and serialization import neither Spark nor TF/Keras,
the keras layer never imports pyspark, and importing ``sparkdl`` loads neither."""

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "sparkdl"

BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError('layering: ' + name + ' must not be imported here')
sys.meta_path.insert(0, Block())
import importlib
for m in {modules!r}:
    importlib.import_module(m)
"""


def _modules(subpackage):
    for path in sorted((PACKAGE / subpackage).rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        yield ".".join(p for p in rel.parts if p != "__init__")


@pytest.mark.parametrize(
    "modules, blocked",
    [
        (["sparkdl", "sparkdl.errors", "sparkdl.config", "sparkdl.param_specs", "sparkdl.cli.config", *_modules("core"), *_modules("serialization"), *_modules("server")], ["pyspark", "tensorflow", "keras"]),
        (list(_modules("keras")), ["pyspark"]),
    ],
)
def test_layers_import_with_forbidden_packages_blocked(modules, blocked):
    code = BLOCKER.format(blocked=set(blocked), modules=modules)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_spark_layer_reaches_keras_only_through_sparkdl_keras():
    for path in (PACKAGE / "spark").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] not in {"keras", "tensorflow"}, f"{path.name} imports {name}"


def test_no_pickle_in_the_package():
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.split(".")[0] in {"pickle", "cloudpickle", "dill"} for n in names), path.name


def test_no_private_name_is_imported_from_another_module():
    """A module's private names (``_name``) stay in it: no ``from sparkdl.x import _name`` anywhere
    in the package, tests, jobs or benchmarks."""
    roots = [PACKAGE, PACKAGE.parent / "tests", PACKAGE.parent / "jobs", PACKAGE.parent / "benchmarks"]
    found = []
    for root in roots:
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sparkdl"):
                    found += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == [], found


# PySpark's private attributes and names (py4j's gateway, the Java context and RDD, the RDD's serializer,
# the Connect client's channel builder, SparkContext's private progress-bar field).
PYSPARK_PRIVATE = {"_jvm", "_jsc", "_jrdd", "_jrdd_deserializer", "_bypass_serializer", "_jdf", "_jconf", "_gateway",
                   "_active_spark_context", "_jsparkSession", "_builder", "_channel_options"}
# Modules that still reach one directly (none: every use goes through sparkdl.spark.internals).
NOT_YET_MOVED: set[str] = set()


def pyspark_private_uses(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in PYSPARK_PRIVATE:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in {"pyspark", "py4j"}:
            found += [f"line {node.lineno}: from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Constant) and node.value == "_progressBar":
            found.append(f"line {node.lineno}: '_progressBar'")
    return found


def test_pyspark_internals_are_reached_only_through_sparkdl_spark_internals():
    """Every private PySpark attribute the package uses goes through one function of
    ``sparkdl/spark/internals.py`` (each checked against Spark by ``tests/spark/test_internals.py``)."""
    users = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        uses = pyspark_private_uses(path)
        if uses and name != "spark/internals.py":
            users[name] = uses
    assert set(users) <= NOT_YET_MOVED, users
    assert pyspark_private_uses(PACKAGE / "spark" / "internals.py")  # the rule's own reach: it sees them there
