"""Generate ``exercises/`` from ``solutions/``: answers out, stubs in.

In a solution file, every answer sits between two marker comments, inside a function::

    def idle_slot_steps(output_lens):
        \"\"\"Seat-steps the batch computes for members that are already done.\"\"\"
        # BEGIN SOLUTION
        longest = max(output_lens, default=0)
        return sum(longest - n for n in output_lens)
        # END SOLUTION

The generator replaces each region (markers included) with one line at the marker's
indentation, whose message is the contract -- the first sentence of the function's docstring --
and where to get help::

        raise NotImplementedError("ex01 idle_slot_steps: Seat-steps the batch computes for members
        that are already done. Yours to write; stuck? course.hint('ex01') (notebooks/01_...)")

A stub says what to do, never how: hints live in ``minivllm/course/hints/<exercise>.md`` and
come one at a time (:mod:`minivllm.course.hints`), so a ``# HINT:`` comment above a region is
refused. The notebook comes from the solution file's ``NOTEBOOK = "..."`` line.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from minivllm.course.hints import PROGRESS_FILE

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
HEADER = (
    "# This file is generated from solutions/{name}.py by `minivllm course make-exercises`.\n"
    "# It is yours: replace each `raise NotImplementedError(...)` with your code, then run\n"
    "# `minivllm grade {short}` or `pytest -m {short}`. Stuck? `course.hint(\"{short}\")` in the\n"
    "# notebook (or `minivllm hint {short}`) gives a hint, one at a time.\n"
)
CONTRACT_CHARS = 120
_DEF = re.compile(r"^(\s*)(?:async\s+)?(?:def|class)\s+(\w+)")
_NOTEBOOK = re.compile(r"^NOTEBOOK\s*=\s*[\"']([^\"']+)[\"']", re.M)


class SolutionFormatError(ValueError):
    """A solution file's markers are unbalanced, misplaced or outside a function."""


@dataclass(frozen=True)
class Region:
    begin: int  # 0-based line index of the BEGIN marker
    end: int  # 0-based line index of the END marker
    indent: str
    func: str
    contract: str  # the first sentence of the enclosing function's docstring ("" if none)


def find_regions(source: str, filename: str = "<solution>") -> list[Region]:
    lines = source.splitlines()
    contracts = _contracts(source)
    regions: list[Region] = []
    open_at: int | None = None
    for i, line in enumerate(lines):
        text = line.strip()
        if text == BEGIN:
            if open_at is not None:
                raise SolutionFormatError(f"{filename}:{i + 1}: BEGIN SOLUTION inside another region")
            open_at = i
        elif text == END:
            if open_at is None:
                raise SolutionFormatError(f"{filename}:{i + 1}: END SOLUTION without BEGIN")
            indent = lines[open_at][: len(lines[open_at]) - len(lines[open_at].lstrip())]
            end_indent = line[: len(line) - len(line.lstrip())]
            if end_indent != indent:
                raise SolutionFormatError(f"{filename}:{i + 1}: END SOLUTION is not indented like its BEGIN")
            func = _enclosing_def(lines, open_at, indent)
            if func is None:
                raise SolutionFormatError(f"{filename}:{open_at + 1}: a solution region must be inside a function")
            if _hint_above(lines, open_at):
                raise SolutionFormatError(
                    f"{filename}:{open_at}: hints live in minivllm/course/hints/<exercise>.md "
                    "(course.hint gives them one at a time), not above a solution region"
                )
            regions.append(Region(open_at, i, indent, func, contracts.get(open_at + 1, "")))
            open_at = None
        elif text.startswith(("# BEGIN SOL", "# END SOL")):
            raise SolutionFormatError(f"{filename}:{i + 1}: malformed marker {text!r}")
    if open_at is not None:
        raise SolutionFormatError(f"{filename}:{open_at + 1}: BEGIN SOLUTION is never closed")
    return regions


def _enclosing_def(lines: list[str], at: int, indent: str) -> str | None:
    """Name of the innermost function or method whose body holds line ``at``."""
    names = []
    width = len(indent)
    for line in reversed(lines[:at]):
        m = _DEF.match(line)
        if m and len(m.group(1)) < width:
            names.append(m.group(2))
            width = len(m.group(1))
            if width == 0:
                break
    if not names:
        return None
    return ".".join(reversed(names))


def _hint_above(lines: list[str], at: int) -> bool:
    """Whether the comment lines right above line ``at`` hold a ``# HINT:``."""
    j = at - 1
    while j >= 0 and lines[j].strip().startswith("#"):
        if lines[j].strip().startswith("# HINT:"):
            return True
        j -= 1
    return False


def _contracts(source: str) -> dict[int, str]:
    """``{1-based line: first sentence of the docstring}`` of the innermost function around each
    line of ``source`` (a file that does not parse has none: the marker errors say why)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = " ".join((ast.get_docstring(node) or "").split("\n\n")[0].split())
            sentence = re.split(r"(?<=[^.][.!?])\s", doc, maxsplit=1)[0] if doc else ""
            if len(sentence) > CONTRACT_CHARS:  # too long for one line of the scoreboard
                sentence = "What it must do is in its docstring."
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                out[line] = sentence  # ast.walk goes outside in: the innermost one wins
    return out


def make_exercise(source: str, name: str, filename: str = "<solution>") -> str:
    """The exercise file for the solution file ``source`` (text in, text out)."""
    regions = find_regions(source, filename)
    if not regions:
        raise SolutionFormatError(f"{filename}: no # BEGIN SOLUTION / # END SOLUTION region")
    m = _NOTEBOOK.search(source)
    notebook = m.group(1) if m else None
    short = name.split("_")[0]
    lines = source.splitlines()
    out: list[str] = []
    last = 0
    for r in regions:
        out.extend(lines[last : r.begin])
        what = f"{r.contract} Yours" if r.contract else "yours"
        where = f" ({notebook})" if notebook else ""
        message = f"{short} {r.func}: {what} to write; stuck? course.hint({short!r}){where}"
        out.append(f"{r.indent}raise NotImplementedError({message!r})")
        last = r.end + 1
    out.extend(lines[last:])
    body = "\n".join(out) + "\n"
    return HEADER.format(name=name, short=short) + body


def generate_all(root: Path) -> dict[Path, str]:
    """``{exercise path: text}`` for every ``solutions/exNN_*.py``."""
    result = {}
    for sol in sorted((root / "solutions").glob("ex[0-9][0-9]_*.py")):
        text = make_exercise(sol.read_text(encoding="utf-8"), sol.stem, f"solutions/{sol.name}")
        result[root / "exercises" / sol.name] = text
    return result


def stale_exercises(root: Path) -> list[str]:
    """Exercise files that differ from what the solutions generate (or are missing), and a
    student's record of hints seen, which belongs in a student's copy, not the course's."""
    stale = []
    for path, text in generate_all(root).items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(f"exercises/{path.name}")
    if (root / "exercises" / PROGRESS_FILE).exists():
        stale.append(f"exercises/{PROGRESS_FILE} (the hints seen here: delete it)")
    return stale


def write_exercises(root: Path) -> list[str]:
    """Write every exercise file that changed; return their names. This overwrites the
    files, so it is a maintainer's command: a student's work lives in ``exercises/``."""
    written = []
    for path, text in generate_all(root).items():
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(f"exercises/{path.name}")
    return written
