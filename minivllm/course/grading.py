"""The grading core: named cases, one scoreboard format, used by notebooks, pytest and the CLI.

A *case* is a small function that takes the student's exercise module, calls one of its
functions on a chosen input, and compares the answer with an expected value computed
independently of the reference solution. Each exercise has a list of cases in
``minivllm.course.checks.<exercise>``. Whoever runs them (``course.check`` in a notebook,
``tests/exercises`` under pytest, ``minivllm grade`` in a terminal) gets the same verdicts:

- ``pass``: the answer matched;
- ``fail``: it did not; the scoreboard shows expected vs got and a hint;
- ``todo``: the function still raises ``NotImplementedError`` (the untouched stub);
- ``error``: it raised something else; the scoreboard shows the exception.

The grader holds against the process it grades: a ``SystemExit``, ``KeyboardInterrupt`` or
``GeneratorExit`` that the student's code raises is that case's ``error`` too, and grading goes
on. Only a Ctrl-C that the user pressed stops it (:func:`watching_interrupts` tells the two
apart).
"""

from __future__ import annotations

import math
import signal
import textwrap
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

PASS, FAIL, TODO, ERROR = "pass", "fail", "todo", "error"
RENDER_WIDTH = 100  # columns of the scoreboard's details
_MARK = {PASS: "✓", FAIL: "✗", TODO: "·", ERROR: "!"}


class Mismatch(AssertionError):
    """Raised by a case when the student's answer differs from the expected one."""

    def __init__(self, expected: Any, got: Any, note: str = ""):
        self.expected, self.got, self.note = expected, got, note
        text = f"expected {_short(expected)}, got {_short(got)}"
        super().__init__(f"{note}: {text}" if note else text)


class CheckFailed(AssertionError):
    """Raised by :func:`minivllm.course.check` when a case got a wrong answer or raised.

    In a notebook the scoreboard printed above it says which case and why, so the error shows
    as this one line instead of a traceback through the course's code (IPython asks an
    exception for ``_render_traceback_`` before it formats one)."""

    def _render_traceback_(self) -> list[str]:
        return [f"CheckFailed: {self}"]


@dataclass(frozen=True)
class Case:
    """One graded check. ``run(module)`` raises :class:`Mismatch` when the answer is wrong."""

    name: str  # what input this is, e.g. "chapter batch" or "empty trace"
    func: str  # the student's function (or class) it exercises
    run: Callable[[ModuleType], None]
    hint: str = ""


@dataclass
class CaseResult:
    case: Case
    status: str
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == PASS


@dataclass
class Report:
    exercise: str
    source: str  # "exercises" or "solutions" (or a path)
    results: list[CaseResult] = field(default_factory=list)
    hints: tuple[int, int] | None = None  # (seen, written) for a student's file; None: not counted
    shown: bool = field(default=False, repr=False, compare=False)  # the scoreboard was printed

    @property
    def num_passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def passed(self) -> bool:
        return bool(self.results) and self.num_passed == len(self.results)

    @property
    def wrong(self) -> bool:
        """A case failed or raised: a wrong answer, not work still to do."""
        return any(r.status in (FAIL, ERROR) for r in self.results)

    @property
    def started(self) -> bool:
        """Some case is no longer a stub's ``todo``."""
        return any(r.status != TODO for r in self.results)

    def counts(self) -> dict[str, int]:
        out = {PASS: 0, FAIL: 0, TODO: 0, ERROR: 0}
        for r in self.results:
            out[r.status] += 1
        return out

    def __repr__(self) -> str:
        return f"<Report {self.exercise} ({self.source}): {self.num_passed}/{len(self.results)} passed>"

    def _ipython_display_(self) -> None:
        """A check cell ends with ``course.check(ex)``, which printed the scoreboard already:
        the notebook then shows nothing more (a report not yet shown prints its scoreboard)."""
        if not self.shown:
            print(self.render())

    def render(self, verbose: bool = True) -> str:
        """The scoreboard as text: one line per case, details under the ones that failed."""
        hints = f"; {self.hints[0]} of {self.hints[1]} hints used" if self.hints and self.hints[1] else ""
        lines = [f"{self.exercise}  ({self.source}{hints})"]
        todo_shown: set[str] = set()
        for r in self.results:
            lines.append(f"  {_MARK[r.status]} {r.status:<5} {r.case.func} · {r.case.name}")
            if r.passed or not verbose:
                continue
            if r.status == TODO:  # each stub's message once is enough
                if r.message in todo_shown:
                    continue
                todo_shown.add(r.message)
            for piece in r.message.splitlines():
                # wrapped at spaces: a notebook breaks a long output line in mid-word
                lines.extend(textwrap.wrap(piece, RENDER_WIDTH, initial_indent=" " * 10,
                                           subsequent_indent=" " * 12, break_long_words=False,
                                           break_on_hyphens=False) or [""])
            if r.status in (FAIL, ERROR) and r.case.hint:
                lines.extend(textwrap.wrap(f"hint: {r.case.hint}", RENDER_WIDTH, initial_indent=" " * 10,
                                           subsequent_indent=" " * 16, break_long_words=False))
        lines.append(self.summary_line())
        return "\n".join(lines)

    def summary_line(self) -> str:
        c = self.counts()
        n = len(self.results)
        if self.passed:
            return f"  all {n} checks of {self.exercise} passed"
        parts = [f"{c[PASS]}/{n} passed"]
        parts += [f"{c[k]} {k}" for k in (FAIL, ERROR, TODO) if c[k]]
        return "  " + ", ".join(parts)


# --- writing cases -------------------------------------------------------------------------
def case(cases: list[Case], name: str, func: str, hint: str = "") -> Callable:
    """Decorator that appends the decorated function to ``cases`` as a :class:`Case`."""

    def register(fn: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
        cases.append(Case(name=name, func=func, run=fn, hint=hint))
        return fn

    return register


def expect(got: Any, expected: Any, note: str = "", rel: float = 1e-9, abs_tol: float = 1e-12) -> None:
    """Raise :class:`Mismatch` unless ``got`` equals ``expected`` (floats within tolerance)."""
    if not _same(got, expected, rel, abs_tol):
        raise Mismatch(expected, got, note)


def expect_raises(exc_type: type[BaseException], fn: Callable[[], Any], note: str = "") -> None:
    """The call must raise ``exc_type`` (a stub's ``NotImplementedError`` passes through)."""
    try:
        value = fn()
    except NotImplementedError:
        raise
    except exc_type:
        return
    except Exception as err:  # noqa: BLE001 - report what was raised instead
        raise Mismatch(f"{exc_type.__name__} raised", f"{type(err).__name__}: {err}", note) from None
    raise Mismatch(f"{exc_type.__name__} raised", f"returned {_short(value)}", note)


def _same(a: Any, b: Any, rel: float, abs_tol: float) -> bool:
    if isinstance(b, bool) or b is None:
        return a is b or a == b and type(a) is type(b)
    if isinstance(b, float) or (isinstance(b, int) and isinstance(a, float)):
        try:
            return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=abs_tol) or (
                math.isinf(float(b)) and float(a) == float(b)
            )
        except (TypeError, ValueError):
            return False
    if isinstance(b, int):
        return isinstance(a, int) and not isinstance(a, bool) and a == b
    if isinstance(b, (list, tuple)):
        if not isinstance(a, (list, tuple)) or len(a) != len(b):
            return False
        return all(_same(x, y, rel, abs_tol) for x, y in zip(a, b, strict=True))
    if isinstance(b, dict):
        if not isinstance(a, dict) or a.keys() != b.keys():
            return False
        return all(_same(a[k], b[k], rel, abs_tol) for k in b)
    return a == b


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- running cases -------------------------------------------------------------------------
def run_case(case_: Case, module: ModuleType) -> CaseResult:
    """Run one case and classify what happened. Never raises, except on a Ctrl-C the user
    pressed: whatever the code under test raises, ``SystemExit`` and ``KeyboardInterrupt``
    included, is the case's verdict.

    A module whose source reaches minivllm's own implementation of the part its exercise writes
    (:mod:`minivllm.course.handed_on`) fails every case before any of its code runs."""
    from minivllm.course.handed_on import hand_offs_of, part_name

    hand_offs = hand_offs_of(module)
    if hand_offs:
        return CaseResult(case_, FAIL, hand_offs[0].message(part_name(module.__exercise__)))
    with watching_interrupts():
        return _run_case(case_, module)


def _run_case(case_: Case, module: ModuleType) -> CaseResult:
    try:
        case_.run(module)
    except NotImplementedError as err:
        return CaseResult(case_, TODO, f"not implemented yet: {err}" if str(err) else "not implemented yet")
    except Mismatch as err:
        return CaseResult(case_, FAIL, str(err))
    except AssertionError as err:
        return CaseResult(case_, FAIL, str(err) or "assertion failed")
    except Exception as err:  # noqa: BLE001 - the student's code may raise anything
        where = _student_frame(err)
        return CaseResult(case_, ERROR, f"{type(err).__name__}: {err}{where}")
    except BaseException as err:  # SystemExit, KeyboardInterrupt, GeneratorExit from the code under test
        if pressed_ctrl_c(err):
            raise
        return CaseResult(case_, ERROR, process_exit_message(err))
    return CaseResult(case_, PASS)


def process_exit_message(err: BaseException) -> str:
    """What the scoreboard says of a ``BaseException`` that is not an ``Exception``, raised by
    the code under test: its name and value, where it was raised, and why it is an error."""
    return (f"{type(err).__name__}({', '.join(map(repr, err.args))}) raised{_student_frame(err)}: graded code "
            "must return, or raise an Exception; a SystemExit, KeyboardInterrupt or GeneratorExit of its own "
            "would stop whatever runs it (a notebook, pytest, `minivllm grade`)")


class _CtrlC:
    """Whether the user pressed Ctrl-C while graded code ran (``depth``: watches open)."""

    depth = 0
    pressed = False


@contextmanager
def watching_interrupts() -> Iterator[None]:
    """While graded code runs, note a Ctrl-C the user presses, so that :func:`pressed_ctrl_c` can
    tell the ``KeyboardInterrupt`` it raises from one the code raised itself. The SIGINT handler
    in place still runs (a notebook's kernel interrupts through it). Watches nest; only the main
    thread receives signals, so elsewhere every ``KeyboardInterrupt`` is the code's own."""
    handler = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if handler is None or handler is signal.SIG_IGN:
        yield
        return

    def noted(signum, frame):
        _CtrlC.pressed = True
        if callable(handler):
            return handler(signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, noted)
    _CtrlC.depth += 1
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        _CtrlC.depth -= 1
        if _CtrlC.depth == 0:
            _CtrlC.pressed = False


def pressed_ctrl_c(err: BaseException) -> bool:
    """``err`` is the user's Ctrl-C (seen by an open :func:`watching_interrupts`), which stops
    the grader; any other ``BaseException`` came from the code under test."""
    return isinstance(err, KeyboardInterrupt) and _CtrlC.pressed


def _student_frame(err: BaseException) -> str:
    """' (at exercises/ex02.py:57)': the innermost frame in an exercise or solution file."""
    frames = traceback.extract_tb(err.__traceback__)
    for fr in reversed(frames):
        path = fr.filename.replace("\\", "/")
        if "/exercises/" in path or "/solutions/" in path:
            tail = "/".join(path.split("/")[-2:])
            return f" (at {tail}:{fr.lineno})"
    return ""


def run_cases(exercise: str, module: ModuleType, cases: Iterable[Case], source: str) -> Report:
    report = Report(exercise, source)
    for c in cases:
        report.results.append(run_case(c, module))
    return report


def require(case_: Case, module: ModuleType) -> None:
    """Run one case and raise ``AssertionError`` with the scoreboard details unless it passes
    (for pytest: a stub's ``NotImplementedError`` counts as a failure too)."""
    result = run_case(case_, module)
    if result.passed:
        return
    text = f"[{result.status}] {case_.func} · {case_.name}: {result.message}"
    if case_.hint and result.status != TODO:
        text += f"\nhint: {case_.hint}"
    raise AssertionError(text)
