"""Figures the course has recorded, read from ``docs/benchmarks.md`` when a notebook quotes them.

A notebook that falls back on a recorded figure (vLLM is not installed, there is no GPU) shows
the newest one by reading the goals table at the top of ``docs/benchmarks.md``, the table each
benchmark run updates, instead of keeping a copy that goes stale when the figures move.
"""

from __future__ import annotations

from pathlib import Path

GOALS_HEADING = "## The goals at a glance"
SHOWN_COLUMNS = 3  # goal, measured, met? (the last column links into docs/benchmarks.md)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def goal_rows(topic: str, text: str | None = None) -> str:
    """The rows of the goals table whose goal or measurement names ``topic`` (as written, e.g.
    ``"vLLM"``), as a Markdown table of the goal, what was measured (with its date) and whether
    it is met.

    ``text`` is the Markdown to read; by default ``docs/benchmarks.md`` of this course. Raises
    ``ValueError`` when the table is missing or no goal names ``topic``."""
    if text is None:
        from minivllm.course.loader import course_file

        text = Path(course_file("docs/benchmarks.md")).read_text()
    start = text.find(GOALS_HEADING)
    if start < 0:
        raise ValueError(f"no {GOALS_HEADING!r} section")
    lines = text[start:].splitlines()[1:]
    first = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if first is None:
        raise ValueError(f"no table under {GOALS_HEADING!r}")
    table = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        table.append(_cells(line)[:SHOWN_COLUMNS])
    header, rows = table[0], [row for row in table[2:] if topic in row[0] + row[1]]
    if not rows:
        raise ValueError(f"no row of the goals table names {topic!r}")
    out = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(row) + " |" for row in out)
