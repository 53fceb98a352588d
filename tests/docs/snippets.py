"""The fenced code of the documentation, as the docs tests read it (the convention is in
docs/architecture/tests.md, "Snippets in the docs").

Pages: README.md, conf/README.md (the site's Job config keys page) and every ``docs/**/*.md``. A
snippet is a fenced block whose language is ``python``, ``bash``, ``sh`` or ``console``. The HTML
comments on the lines right above its fence say how the docs tests treat it:

- none: it runs as written, in a fresh process, in an empty folder where ``data/``, ``conf/``,
  ``examples/``, ``benchmarks/`` and ``jobs/`` are the repository's and ``.venv`` is the tests'
  virtualenv (Python with a ``local[2]`` session of its own; bash with ``bash -euo pipefail``);
- ``<!-- run-with: NAME -->``: it runs after ``tests/docs/preludes/NAME.py`` (and the preludes
  that one names on its ``# after: NAME`` lines), which defines the names it uses (a session, a
  DataFrame, a fitted model) on small data;
- ``<!-- continues -->``: it runs after the page's previous snippet, in the same process;
- ``<!-- tested: NAME -->``: a test elsewhere runs it verbatim, finding it by this marker;
- ``<!-- not-run: REASON -->``: it does not run, and the reason says why (a fragment, a cluster,
  an install, minutes of training).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LANGUAGES = {"python", "bash", "sh", "console"}
PRELUDES = os.path.join(ROOT, "tests", "docs", "preludes")

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>not-run|run-with|continues|tested)\s*(?::\s*(?P<value>.*?))?\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Snippet:
    page: str  # relative to the repository root
    line: int  # the opening fence's line, from 1
    language: str
    code: str
    markers: dict  # kind -> value ("" for continues)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return "not-run" not in self.markers and "tested" not in self.markers


def pages() -> list[str]:
    found = ["README.md", "conf/README.md"]
    found += sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return found


def fenced_blocks(page: str) -> list[Snippet]:
    """Every fenced block of ``page`` (any language), with the markers right above it."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        lines = f.read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, indent = match["fence"], len(match["indent"])
        end = i + 1
        while end < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        body = "\n".join(line[indent:] if line[:indent].strip() == "" else line for line in lines[i + 1 : end])
        markers, j = {}, i - 1
        while j >= 0 and (marker := _MARKER.match(lines[j])):
            markers[marker["kind"]] = (marker["value"] or "").strip()
            j -= 1
        blocks.append(Snippet(page, i + 1, match["lang"].lower(), body + "\n", markers))
        i = end + 1
    return blocks


def snippets() -> list[Snippet]:
    """The snippets (python, bash, sh, console blocks) of every page, in page order."""
    return [block for page in pages() for block in fenced_blocks(page) if block.language in LANGUAGES]


def program(snippet: Snippet, all_snippets: list[Snippet] | None = None) -> str:
    """What runs for ``snippet``: its prelude (``run-with``) or the page's previous snippets it
    continues, then its own code."""
    parts = [snippet.code]
    current = snippet
    page = [s for s in (all_snippets or snippets()) if s.page == snippet.page]
    while "continues" in current.markers:
        before = [s for s in page if s.line < current.line]
        current = before[-1]
        parts.insert(0, current.code)
    if "run-with" in current.markers:
        parts.insert(0, prelude(current.markers["run-with"]))
    return "\n".join(parts)


def prelude(name: str) -> str:
    """``tests/docs/preludes/<name>.py``, after the preludes its ``# after: NAME`` lines name."""
    with open(os.path.join(PRELUDES, name + ".py"), encoding="utf-8") as f:
        text = f.read()
    before = [prelude(m) for m in re.findall(r"^# after: (\w+)$", text, re.M)]
    return "\n".join([*before, text])
