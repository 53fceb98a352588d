"""Every Python and shell snippet of the docs runs, or says why it does not (issue 31 item 4).

The pages and the markers are read by :mod:`tests.docs.snippets` (the convention: docs/architecture/tests.md,
"Snippets in the docs"). By default: each snippet is accounted for, and the names the snippets use
exist (sparkdl's imports, ``KerasEstimator``'s keywords). ``make test-all`` (``slow``): each runnable
snippet runs, in a fresh process and an empty folder, and must exit 0.
"""

import ast
import glob
import os
import re
import subprocess
import sys

import pytest

from sparkdl.param_specs import keyword_names
from tests.docs.snippets import LANGUAGES, PRELUDES, ROOT, fenced_blocks, pages, program, snippets

SNIPPETS = snippets()
# Languages of fenced blocks that are not code to run: output, configs, diagrams.
OTHER_LANGUAGES = {"", "text", "yaml", "json", "toml", "ini", "properties", "dockerfile"}
# What a snippet's folder holds from the repository (the docs' paths are relative to the repository root).
LINKED = ("data", "conf", "examples", "benchmarks", "jobs")


def continued(snippet) -> bool:
    """Whether the page's next snippet continues this one (then that one's run covers it)."""
    later = [s for s in SNIPPETS if s.page == snippet.page and s.line > snippet.line]
    return bool(later) and "continues" in later[0].markers


RUNS = [s for s in SNIPPETS if s.runs and not continued(s)]


def test_every_snippet_runs_or_says_why_not():
    problems = []
    tests_text = "\n".join(open(p, encoding="utf-8").read() for p in glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True)
                           if os.sep + "docs" + os.sep not in p)
    for page in pages():
        for block in fenced_blocks(page):
            if block.language not in LANGUAGES | OTHER_LANGUAGES:
                problems.append(f"{block.id}: fence language {block.language!r}: write python, bash, sh or console (or text)")
            elif block.language not in LANGUAGES and block.markers:
                problems.append(f"{block.id}: a {block.language or 'plain'} block never runs: drop {sorted(block.markers)}")
    for s in SNIPPETS:
        m = s.markers
        if len(m) > 1:
            problems.append(f"{s.id}: one marker at most (a snippet that continues another has its prelude). Received: {sorted(m)}")
        if "not-run" in m and len(m["not-run"]) < 10:
            problems.append(f"{s.id}: <!-- not-run: REASON --> needs a reason (received {m['not-run']!r})")
        if "run-with" in m and not os.path.isfile(os.path.join(PRELUDES, m["run-with"] + ".py")):
            problems.append(f"{s.id}: no prelude tests/docs/preludes/{m['run-with']}.py")
        if "continues" in m:
            before = [b for b in SNIPPETS if b.page == s.page and b.line < s.line]
            if not before or not before[-1].runs or before[-1].language != s.language:
                problems.append(f"{s.id}: continues no runnable {s.language} snippet before it on its page")
        if "tested" in m and f'"{m["tested"]}"' not in tests_text:
            problems.append(f"{s.id}: <!-- tested: {m['tested']} --> but no test names {m['tested']!r}")
    assert problems == [], "\n".join(problems)
    # the rule has something to hold: both kinds exist, and most snippets that are Python run
    python = [s for s in SNIPPETS if s.language == "python"]
    assert sum(s.runs for s in python) >= len(python) // 2 and any(not s.runs for s in SNIPPETS)


def _top_level_names(module: str) -> set[str] | None:
    base = os.path.join(ROOT, *module.split("."))
    path = base + ".py" if os.path.isfile(base + ".py") else os.path.join(base, "__init__.py")
    if not os.path.isfile(path):
        return None
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                if isinstance(target, ast.Name) and target.id == "__all__":
                    names |= set(ast.literal_eval(node.value))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_snippets_import_from_sparkdl_only_what_exists():
    found = []
    for s in SNIPPETS:
        for module, names in re.findall(r"^\s*from (sparkdl[\w.]*) import ([\w, ]+)", s.code, re.M):
            exported = _top_level_names(module)
            for name in (n.strip() for n in names.split(",")):
                if exported is None or name not in exported:
                    found.append(f"{s.id}: from {module} import {name}")
    assert found == []


def _call_keywords(code: str, callee: str) -> list[str]:
    """The keyword names of every ``callee(...)`` call in ``code`` (read by brackets, so fragments with
    ``...`` count too)."""
    keywords = []
    for match in re.finditer(rf"\b{re.escape(callee)}\(", code):
        depth, i, start = 1, match.end(), match.end()
        while i < len(code) and depth:
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(code[i], 0)
            i += 1
        inner, flat, level = code[start : i - 1], [], 0
        for ch in inner:  # the call's own level only
            level += {"(": 1, "[": 1, "{": 1}.get(ch, 0) - {")": 1, "]": 1, "}": 1}.get(ch, 0)
            flat.append(ch if level == 0 or ch in ")]}" else " ")
        keywords += re.findall(r"(?:^|[,(\s])([A-Za-z_]\w*)\s*=(?!=)", "".join(flat))
    return keywords


def test_the_estimators_keywords_in_snippets_are_its_params():
    assert _call_keywords('KerasEstimator(model=m, loss={"a": "mse"}, f(x=1), ..., numWorkers=2)', "KerasEstimator") == [
        "model", "loss", "numWorkers"]  # the reader itself
    valid = set(keyword_names())
    unknown = [f"{s.id}: KerasEstimator({k}=...)" for s in SNIPPETS for k in _call_keywords(s.code, "KerasEstimator") if k not in valid]
    assert unknown == []
    assert sum(len(_call_keywords(s.code, "KerasEstimator")) for s in SNIPPETS) > 40  # the check reads the snippets


def _workdir(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name in LINKED:
        (work / name).symlink_to(os.path.join(ROOT, name))
    (work / ".venv").symlink_to(sys.prefix)
    return work


@pytest.mark.slow
@pytest.mark.parametrize("snippet", RUNS, ids=[s.id for s in RUNS])
def test_snippet_runs(snippet, tmp_path):
    work = _workdir(tmp_path)
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TF_CPP_MIN_LOG_LEVEL="2", PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    code = program(snippet, SNIPPETS)
    if snippet.language == "python":
        (work / "snippet.py").write_text(code)
        command = [sys.executable, "snippet.py"]
    else:
        command = ["bash", "-euo", "pipefail", "-c", code]
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, f"{snippet.id} exited {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
