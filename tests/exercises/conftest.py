"""What every exercise's grader shares: the exercise a module grades is its ``NAME``; the
``ex`` fixture is that exercise, loaded as ``course.load`` loads it (``exercises/``, your work, or
``solutions/`` with ``MINIVLLM_SOLUTIONS=1`` or ``--solutions``); and every test of the module
carries the exercise's marker (``pytest -m ex04``; the root ``conftest.py`` declares one per
solution file). The notebook's cases of every exercise run in ``test_cases.py``.

A test here fails, and the session goes on, when the code under test raises ``SystemExit``,
``KeyboardInterrupt`` or ``GeneratorExit`` (pytest would otherwise stop the whole session on a
``KeyboardInterrupt``); a Ctrl-C the user presses still stops it."""

from __future__ import annotations

from pathlib import Path

import pytest

from minivllm import course
from minivllm.course.grading import pressed_ctrl_c, process_exit_message, watching_interrupts


def marker(name: str) -> pytest.MarkDecorator:
    """``ex04_block_allocator`` -> ``pytest.mark.ex04``."""
    return getattr(pytest.mark, name.split("_")[0])


@pytest.fixture(scope="module")
def ex(request):
    return course.load(request.module.NAME)


HERE = Path(__file__).resolve().parent


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test's call, with a ``BaseException`` of the code under test turned into a failure."""
    with watching_interrupts():
        try:
            return (yield)
        except Exception:
            raise
        except BaseException as err:
            if pressed_ctrl_c(err):
                raise
            raise AssertionError(process_exit_message(err)) from err


def pytest_collection_modifyitems(items) -> None:
    """Called with every item of the session (notebook cells too): mark this folder's. When the
    reference solutions are graded and an exercise's notebook runs in the same session, that
    notebook's check cell runs every case of ``test_cases.py`` for it (``course.check`` raises on
    the first wrong one, and nbval fails): those are not run twice."""
    notebooks = {Path(item.fspath).resolve() for item in items if str(item.fspath).endswith(".ipynb")}
    checked_by_notebook = {}
    if notebooks and course.loader.use_solutions():
        root = course.course_root()
        for name in course.exercise_names():
            notebook = getattr(course.load(name, solutions=True), "NOTEBOOK", None)
            if notebook and (root / notebook).resolve() in notebooks:
                checked_by_notebook[name] = notebook
        if "ex08_engine_step" in checked_by_notebook:  # its capstone section serves the whole engine
            checked_by_notebook["capstone"] = checked_by_notebook["ex08_engine_step"]
    for item in items:
        if Path(item.fspath).resolve().parent == HERE:
            name = getattr(getattr(item, "module", None), "NAME", None)
            if name is not None and name.startswith("ex"):
                item.add_marker(marker(name))
            case_of = getattr(getattr(item, "callspec", None), "params", {}).get("name")
            if item.originalname != "test_case":
                case_of = "capstone" if name == "capstone" else None
            if case_of in checked_by_notebook:
                item.add_marker(pytest.mark.skip(
                    reason=f"graded by {checked_by_notebook[case_of]}'s check cell in this run"))
