"""Build first, then compare: no notebook shows minivllm's implementation of an exercise's part
before that exercise's check (minivllm/course/engine_parts.py says which parts, and how a cell
shows one)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from minivllm import course
from minivllm.course import engine_parts

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def _exercise_notebooks() -> dict[str, str]:
    out = {}
    for name in course.exercise_names():
        text = (ROOT / "solutions" / f"{name}.py").read_text()
        out[name] = Path(re.search(r'^NOTEBOOK = "([^"]+)"', text, re.M).group(1)).name
    return out


def _cells(path: Path) -> list:
    return nbformat.read(path, as_version=4).cells


def test_every_exercise_names_its_engine_parts_and_they_exist():
    assert set(engine_parts.ENGINE_PARTS) == set(course.exercise_names())
    for exercise, parts in engine_parts.ENGINE_PARTS.items():
        for part in parts:
            assert engine_parts.source_pairs(part), f"{exercise}: {part} has no source to compare"


def test_no_notebook_shows_a_part_before_its_exercises_check():
    notebooks = {p.name: _cells(p) for p in NOTEBOOKS}
    homes = _exercise_notebooks()
    for name in set(homes.values()):  # a notebook without an exercise (08b) has no check
        assert engine_parts.check_cell(notebooks[name]) is not None, f"{name} has no course.check cell"
    violations = engine_parts.shown_too_early(notebooks, homes)
    assert not violations, "\n".join(map(str, violations))


# --- the rule itself, on made-up notebooks ------------------------------------------------------
def _code(source: str, output: str = "") -> dict:
    outputs = [{"output_type": "stream", "name": "stdout", "text": output}] if output else []
    return {"cell_type": "code", "source": source, "outputs": outputs}


def _md(source: str) -> dict:
    return {"cell_type": "markdown", "source": source}


CHECK = _code('ex = course.load("ex02_continuous")\ncourse.check(ex)')
HOME = {"ex02_continuous": "02.ipynb"}


def _found(*cells, before=None) -> list[str]:
    notebooks = {"01.ipynb": list(before or []), "02.ipynb": list(cells)}
    return [f"{v.cell} {v.how} {v.part.split(':')[1]}"
            for v in engine_parts.shown_too_early(notebooks, HOME)]


def test_asking_for_a_parts_source_before_the_check_is_caught_and_after_it_allowed():
    shown = _code("import inspect\nprint(inspect.getsource(Scheduler.schedule))")
    assert _found(shown, CHECK) == ["0 asks for the source of Scheduler.schedule"]
    assert _found(CHECK, shown) == []
    # another class's method of the same name is not the part
    assert _found(_code("print(inspect.getsource(LLMEngine.schedule))"), CHECK) == []
    # IPython's ?? and a helper the notebook wrote around getsource count too
    assert _found(_code("Scheduler._schedule_waiting??"), CHECK) == [
        "0 asks for the source of Scheduler._schedule_waiting"]
    helper = _code("def source(f):\n    return inspect.getsource(getattr(f, 'fn', f))")
    assert _found(helper, _code("display(Code(source(type(s).update_from_output)))"), CHECK) == [
        "1 asks for the source of Scheduler.update_from_output"]
    # and so does course.show_engine_code, folded or not, for each part it names
    assert _found(_code("course.show_engine_code(Scheduler.finish_requests, Scheduler.schedule)"), CHECK) == [
        "0 asks for the source of Scheduler.schedule", "0 asks for the source of Scheduler.finish_requests"]


def test_a_parts_source_in_an_output_or_a_markdown_cell_is_caught():
    import inspect

    from minivllm.core.scheduler import Scheduler

    body = inspect.getsource(Scheduler._schedule_waiting).splitlines()
    two_lines = "\n".join(line.strip() for line in body[2:6])  # re-indented: whitespace does not matter
    assert _found(_code("show()", output=two_lines), CHECK) == [
        "0 holds the source of Scheduler._schedule_waiting"]
    assert _found(_md("The admission loop:\n\n```python\n" + two_lines + "\n```"), CHECK) == [
        "0 holds the source of Scheduler._schedule_waiting"]
    one_line = body[3].strip()  # a single line may well recur in prose: not a copy
    assert _found(_md(f"`{one_line}`"), CHECK) == []


def test_an_earlier_notebook_must_not_show_a_later_exercises_part():
    early = _code("print(inspect.getsource(Scheduler.update_from_output))")
    assert _found(CHECK, before=[early]) == ["0 asks for the source of Scheduler.update_from_output"]


@pytest.mark.parametrize("part", sorted({p for parts in engine_parts.ENGINE_PARTS.values() for p in parts}))
def test_each_parts_own_source_would_be_caught(part):
    """The comparison sees every part: its own printed source counts as shown."""
    import inspect

    text = inspect.getsource(engine_parts.resolve(part))
    assert engine_parts._holds(text, part)
