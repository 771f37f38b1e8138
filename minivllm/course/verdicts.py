"""Whether an exercise passes: ``check`` (the scoreboard), ``verdict`` (the same, silently,
remembered), ``working`` (yours if it passes, else the reference) and ``label`` (whose a module
is). ``minivllm.course`` re-exports them; the capstone uses them from here."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import ModuleType

from minivllm.course import hints as _hints
from minivllm.course.checks import cases_for
from minivllm.course.grading import CheckFailed, Report, run_cases
from minivllm.course.loader import has_solutions, load


def check(exercise: ModuleType | str, verbose: bool = True, raise_on_failure: bool = True) -> Report:
    """Run every case of an exercise on a loaded module (or on ``load(name)``) and print the
    scoreboard. Raise :class:`CheckFailed` if a case failed or raised (a wrong answer); an
    exercise whose other cases are all still ``todo`` gets a note instead, so that the rest of
    the notebook runs on the reference (``course.working``)."""
    module = load(exercise) if isinstance(exercise, str) else exercise
    name = getattr(module, "__exercise__", None)
    if name is None:
        raise TypeError("check() needs a module from course.load(...) or an exercise name")
    report = grade_module(name, module, getattr(module, "__course_source__", "?"))
    module.__course_report__ = report
    print(report.render(verbose=verbose))
    report.shown = True
    if report.passed:
        return report
    if report.wrong:
        if raise_on_failure:
            raise CheckFailed(f"{name}: {report.summary_line().strip()}; the scoreboard above says which case and why")
        return report
    print(_todo_note(report))
    return report


def grade_module(name: str, module: ModuleType, source: str) -> Report:
    """Every case of exercise ``name`` on ``module`` (from ``source``: exercises or solutions)."""
    report = run_cases(name, module, cases_for(name), source)
    if source == "exercises":  # a student's file: say how much help it took
        report.hints = _hints.usage(name)
    return report


def _todo_note(report: Report) -> str:
    c, n = report.counts(), len(report.results)
    if report.started:
        where = f"in progress: {c['pass']} of {n} cases pass, {c['todo']} still todo"
    else:
        where = f"not started: {n} cases todo"
    if not has_solutions():
        return f"  {where}. This copy has no solutions/, so the cells below need yours."
    return (f"  {where}. The cells below use the reference solution, labelled \"reference\", "
            "until yours passes (`ex = course.working(ex)`).")


def working(exercise: ModuleType | str) -> ModuleType:
    """The exercise module to use from here on: the given one if it passes every check (the
    result of the last ``check`` of it, or a fresh run), else the reference solution, with a
    notice saying so.

    A fresh run's verdict is remembered for as long as no exercise file in the module's folder
    changes, so that an exercise built on another one (exercise 07 imports
    ``working("ex04_block_allocator")``) does not grade its base again every time it is loaded.
    Called with a module (the notebook's ``ex = course.working(ex)``) it always says when it
    falls back; called with a name (an exercise loading its base) it says so once per verdict."""
    module = load(exercise) if isinstance(exercise, str) else exercise
    name = module.__exercise__
    report = verdict(module)
    if report.passed:
        return module
    key = (name, _verdict_key(module), report.summary_line())
    if not has_solutions():  # nothing can stand in: yours, and the cells that need it say so (go_on)
        if not isinstance(exercise, str) or key not in _NOTICES_GIVEN:
            _NOTICES_GIVEN.add(key)
            print(f"note: {name} does not pass its checks yet ({report.summary_line().strip()}), and this "
                  "copy has no solutions/ to stand in for it: the cells below use yours as it is.")
        return module
    if not isinstance(exercise, str) or key not in _NOTICES_GIVEN:
        _NOTICES_GIVEN.add(key)
        print(f"note: {name} does not pass its checks yet ({report.summary_line().strip()}); the "
              "reference solution stands in for it from here on. Re-run the check cell once yours passes.")
    return load(name, solutions=True)


_NOTICES_GIVEN: set[tuple] = set()


def verdict(exercise: ModuleType | str) -> Report:
    """How an exercise module (or ``load(name)``) fares on its checks, without printing: the
    result of its last ``check``, else a fresh run, remembered like :func:`working`'s."""
    module = load(exercise) if isinstance(exercise, str) else exercise
    report = getattr(module, "__course_report__", None)
    if report is None:
        key = _verdict_key(module)
        report = _VERDICTS.get(key) if key is not None else None
        if report is None:
            name = module.__exercise__
            report = grade_module(name, module, module.__course_source__)
            if key is not None:
                _VERDICTS[key] = report
        module.__course_report__ = report
    return report


_VERDICTS: dict[tuple[str, str, str], Report] = {}


def _verdict_key(module: ModuleType) -> tuple[str, str, str] | None:
    """``(exercise, its file, a digest of every exercise file next to it)``, or ``None`` for a
    module without a file. The digest covers the neighbours because one exercise's verdict
    can depend on another's (exercise 07 runs on exercise 04)."""
    path = getattr(module, "__file__", None)
    if not path:
        return None
    folder = Path(path).resolve().parent
    digest = hashlib.sha256()
    for file in sorted(folder.glob("ex[0-9][0-9]_*.py")):
        digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return module.__exercise__, str(Path(path).resolve()), digest.hexdigest()


def label(exercise: ModuleType) -> str:
    """Whose code a module from ``course.load`` or ``course.working`` is: ``"yours"`` (a file in
    ``exercises/``) or ``"reference"`` (``solutions/``), for the labels of plots and printouts
    (``f"paged ({course.label(ex)})"``), which must not call the reference yours."""
    source = getattr(exercise, "__course_source__", None)
    if source is None:
        raise TypeError(f"label() needs a module from course.load or course.working, got {exercise!r}")
    return "reference" if source == "solutions" else "yours"
