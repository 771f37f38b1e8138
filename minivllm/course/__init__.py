"""Course tools: load an exercise, grade it, regenerate the exercise files.

In a notebook::

    from minivllm import course
    ex = course.load("ex02_continuous")   # your exercises/ex02_continuous.py
    course.check(ex)                      # scoreboard; raises if a case fails

``course.load`` reads ``exercises/`` (your work) unless ``MINIVLLM_SOLUTIONS=1`` is set, then
``solutions/`` (the reference). The same cases run under ``pytest -m ex02`` and ``minivllm grade``.

``course.check`` raises :class:`CheckFailed` on a wrong answer (a case that fails or raises), so
nbval, pytest and ``minivllm grade`` fail on it; an exercise not started (or not finished: every
case either passes or is still a stub's ``todo``) only prints its scoreboard, so that Run All goes
through a notebook with nothing solved. Cells after a check use ``ex = course.working(ex)``: your
module if it passed its checks, else the reference solution with a notice, and
``course.label(ex)`` says which ("yours" or "reference") wherever a result is labelled. In a copy
of the course without ``solutions/`` or ``benchmarks/``, a cell that needs what is missing says so
and the notebook goes on (:mod:`minivllm.course.go_on`).

Help, on request: ``course.hint("ex04")`` gives the next hint of exercise 04 (the scoreboard
counts them), and ``course.answer("nb04.blocks")`` the answer to a question a notebook asks
before its exercise, folded until opened. ``course.show_code(ex.X)`` prints your code (or a
reference answer) where a notebook compares it with minivllm's; its output is never stored.

What a notebook stores of an answer is folded (:mod:`minivllm.course.display`): ``with
course.folded(): ...`` shows what the block prints as one output that opens on a click (the
cell after a "predict, then run" question), and ``course.show_engine_code(X, ...)`` shows
minivllm's source of ``X`` folded, to compare with yours after an exercise's check.
"""

from __future__ import annotations

from minivllm.course.answers import answer
from minivllm.course.checks import cases_for
from minivllm.course.display import folded
from minivllm.course.go_on import install as _guard_cells_of_a_partial_copy
from minivllm.course.grading import (
    Case,
    CaseResult,
    CheckFailed,
    Mismatch,
    Report,
    require,
    run_cases,
)
from minivllm.course.hints import hint
from minivllm.course.loader import (
    CourseFileMissing,
    course_file,
    course_root,
    exercise_names,
    has_solutions,
    load,
    load_benchmark,
    load_or_error,
    resolve_name,
    use_solutions,
)
from minivllm.course.verdicts import check, grade_module, label, verdict, working

__all__ = [
    "show_code",
    "show_engine_code",
    "folded",
    "load",
    "load_benchmark",
    "check",
    "grade",
    "cases_for",
    "exercise_names",
    "course_root",
    "course_file",
    "use_solutions",
    "Case",
    "CaseResult",
    "CheckFailed",
    "Mismatch",
    "Report",
    "require",
    "working",
    "verdict",
    "label",
    "hint",
    "answer",
    "has_solutions",
    "CourseFileMissing",
]

_guard_cells_of_a_partial_copy()


def grade(names: list[str] | None = None, solutions: bool | None = None) -> list[Report]:
    """Grade several exercises (default: all, then the capstone) without raising; one
    :class:`Report` each. An exercise file that does not even import (or ends the process as
    it does) is reported as one failing case. ``"capstone"`` names the engine assembled from
    exercises 02-08 (its own line)."""
    asked = [str(n) for n in names] if names else None
    capstone = asked is None or any(n.lower() == "capstone" for n in asked)
    exercises = exercise_names() if asked is None else [resolve_name(n) for n in asked if n.lower() != "capstone"]
    reports = []
    for name in exercises:
        module = load_or_error(name, solutions)
        if isinstance(module, BaseException):
            def broken(_module, err=module):
                raise AssertionError(f"the file does not import: {type(err).__name__}: {err}")

            case = Case("import", "<module>", broken, "fix the error, then grade again")
            source = "solutions" if (use_solutions() if solutions is None else solutions) else "exercises"
            reports.append(run_cases(name, None, [case], source))
            continue
        reports.append(grade_module(name, module, module.__course_source__))
    if capstone:
        from minivllm.course.capstone import PREREQUISITES, capstone_report

        if asked is not None or set(PREREQUISITES) <= set(exercise_names()):  # a course with every part
            reports.append(capstone_report(solutions))
    return reports


def show_code(obj) -> None:
    """Print the source of ``obj``: your code, to read beside minivllm's after a check (or the
    reference answer's, where a notebook shows it). ``scripts/run_notebooks.py`` stores no output
    for a cell that calls this, so no answer is in a notebook before you run it."""
    import inspect

    print(inspect.getsource(obj))


def show_engine_code(*objects, summary: str | None = None) -> None:
    """Show minivllm's source of each of ``objects`` (functions, methods, classes, Triton
    kernels), folded under ``summary`` in a notebook (printed elsewhere): a notebook compares it
    with your code after the exercise's check, and stores it folded, so that nobody reading the
    notebook sees it before writing their own."""
    import inspect
    import textwrap

    from minivllm.course.display import collapsed_text

    objects = tuple(getattr(o, "fn", o) for o in objects)  # a @triton.jit kernel keeps its Python in .fn
    names = ", ".join(f"{o.__qualname__}" for o in objects)
    code = "\n".join(textwrap.dedent(inspect.getsource(o)) for o in objects)
    collapsed_text(summary or f"minivllm's {names} (open it once your exercise passes)", code)
