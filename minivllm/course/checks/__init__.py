"""Graded cases, one module per exercise: ``minivllm.course.checks.<exercise>.CASES``.

Expected values here are computed independently of ``solutions/`` (by hand-checked formulas,
or by running minivllm's own scheduler), so the same cases grade the reference answers in the
repository's CI and a student's answers in their fork.
"""

from __future__ import annotations

import importlib

from minivllm.course.grading import Case


def cases_for(exercise: str) -> list[Case]:
    """The cases of ``exercise`` (full name, e.g. ``"ex02_continuous"``)."""
    try:
        module = importlib.import_module(f"minivllm.course.checks.{exercise}")
    except ModuleNotFoundError as err:
        if err.name == f"minivllm.course.checks.{exercise}":
            raise KeyError(f"no checks written for {exercise!r}") from None
        raise
    return list(module.CASES)
