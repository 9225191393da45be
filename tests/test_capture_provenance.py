"""The capture programs under bench/ are as they were when the fixtures were captured with them.

A fixture's traceback cites `bench/<capture folder>/PROGRAM.py, line N` and quotes that line's source: the
line must still hold it, or the fixture reads as if the program crashed on some other code. A reformat
(an import sort moved every line by one) once broke exactly that, so these programs are kept out of the
formatter and the import sorter.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
PROGRAM = r"(bench/(?:cpu_capture|gpu_capture|gpu_host_check)/\w+\.py)"
# Python's traceback: the frame, then (indented) its source line; faulthandler's frames have no source line.
PYTHON_FRAME = re.compile(rf'File "(?:[^"\n]*/)?{PROGRAM}", line (\d+),? in (\S+)\n(?:    (\S.*)\n)?')
# rich's traceback (ANSI removed): `PATH:N in FUNC`, then a window of numbered lines, `❱ N` marking the frame's.
RICH_FRAME = re.compile(rf"(?:[^\s│]*/)?{PROGRAM}:(\d+) in (\S+)")
RICH_LINE = re.compile(r"❱ (\d+) (.*?)\s*│?$", re.MULTILINE)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def citations(text: str) -> list[tuple[str, int, str, str | None]]:
    """(program, line, function, quoted source or None) for every frame of a capture program in the text."""
    text = ANSI.sub("", text)
    found = [(m[1], int(m[2]), m[3], m[4]) for m in PYTHON_FRAME.finditer(text)]
    for m in RICH_FRAME.finditer(text):
        window = text[m.end() : m.end() + 4000]
        quoted = next((q[2] for q in RICH_LINE.finditer(window) if int(q[1]) == int(m[2])), None)
        found.append((m[1], int(m[2]), m[3], quoted))
    return found


def cited_fixtures() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.suffix != ".md" and citations(p.read_text(errors="replace")))


def enclosing_function(source: str, line: int) -> str:
    """The innermost function holding the line, `<module>` for top-level code."""
    best, span = "<module>", None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if span is None or node.lineno > span:
                best, span = node.name, node.lineno
    return best


def test_the_fixtures_cite_the_capture_programs():
    # The parser finds them: a format change that hid every citation would make the check below vacuous.
    assert len(cited_fixtures()) >= 15, cited_fixtures()


@pytest.mark.parametrize("fixture", cited_fixtures(), ids=lambda p: p.relative_to(FIXTURES).as_posix())
def test_each_line_a_fixture_cites_in_a_capture_program_still_holds_the_quoted_source(fixture: Path):
    wrong = []
    for program, line, function, quoted in citations(fixture.read_text(errors="replace")):
        source = (ROOT / program).read_text()
        lines = source.splitlines()
        held = lines[line - 1].strip() if line <= len(lines) else None
        if quoted is not None and held != quoted.strip():
            wrong.append(f"{program}:{line} quoted {quoted.strip()!r}, holds {held!r}")
        elif quoted is None and (held in (None, "") or held.startswith("#") or enclosing_function(source, line) != function):
            # faulthandler names only the function: the line must be code inside it.
            wrong.append(f"{program}:{line} cited in {function}, holds {held!r} in {enclosing_function(source, line)}")
    assert not wrong, "capture programs changed since the fixture was captured (restore them as captured):\n" + "\n".join(wrong)
