"""The grader, graded: the reference solutions get full marks on every exercise, the untouched
stubs get none (every case "todo", never a pass), and every plausible wrong answer of the
mutation suite fails its exercise.

The three legs, for every exercise:

1. ``test_the_reference_gets_full_marks``: ``solutions/`` passes every case;
2. ``test_untouched_stubs_score_zero``: stubs generated now from ``solutions/`` fail every case
   with the stub's ``NotImplementedError`` (a stub that passes a case still holds an answer, or
   the case checks nothing);
3. the mutants: ``MUTANTS`` in ``tests/course/test_course.py`` (a solution with one plausible slip
   each), run by ``test_checks_catch_a_wrong_answer`` there; here, that every exercise has some.

An exercise that is added or redesigned extends the checks (``minivllm/course/checks/``) and
the mutation suite; legs 1 and 2 cover it by themselves.
"""

from __future__ import annotations

import pytest
from test_course import MUTANTS

from minivllm import course
from minivllm.course import exgen
from minivllm.course.grading import PASS, TODO, run_cases
from minivllm.course.loader import load_path, use_solutions

ROOT = course.course_root()
NAMES = course.exercise_names()


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_gets_full_marks(name):
    if use_solutions():
        pytest.skip("tests/exercises/test_cases.py, or the exercise's notebook, grades every case on solutions/ in this run")
    report = course.grade([name], solutions=True)[0]
    assert report.passed, report.render()


@pytest.mark.parametrize("name", NAMES)
def test_untouched_stubs_score_zero(name, tmp_path):
    text = exgen.make_exercise((ROOT / "solutions" / f"{name}.py").read_text(), name)
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    report = run_cases(name, load_path(path, name, "stub"), course.cases_for(name), "stub")
    assert report.results and report.num_passed == 0
    not_todo = [(r.case.func, r.case.name, r.status) for r in report.results if r.status != TODO]
    assert not not_todo, f"cases a stub does not fail with NotImplementedError: {not_todo}"
    assert all(r.status != PASS for r in report.results)


@pytest.mark.parametrize("name", NAMES)
def test_every_exercise_has_wrong_answers_to_catch(name):
    mine = [m for m in MUTANTS if m[0] == name]
    assert mine, f"add plausible wrong answers of {name} to MUTANTS in tests/course/test_course.py"
    solution = (ROOT / "solutions" / f"{name}.py").read_text()
    stale = [old for _, old, _ in mine if old not in solution]
    assert not stale, f"mutants of {name} whose text is no longer in the solution: {stale}"
