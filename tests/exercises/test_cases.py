"""Every exercise's cases -- the ones ``course.check`` runs in its notebook and ``minivllm grade``
in a terminal -- one test each, marked with its exercise (``pytest -m ex04``). The other modules
here add what only pytest does well: random traces (hypothesis), bad inputs, slow cases."""

from __future__ import annotations

import functools

import pytest

from conftest import marker
from minivllm import course


@functools.cache
def load(name: str):
    return course.load(name)


CASES = [
    pytest.param(name, case, marks=marker(name), id=f"{name}: {case.func}: {case.name}")
    for name in course.exercise_names()
    for case in course.cases_for(name)
]


@pytest.mark.parametrize(("name", "case"), CASES)
def test_case(name, case):
    course.require(case, load(name))
