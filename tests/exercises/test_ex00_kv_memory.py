"""Grade exercise 00 (`pytest -m ex00`): the same cases as `course.check` in the notebook.

Imports `exercises/ex00_kv_memory.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

import pytest

from minivllm import course

NAME = "ex00_kv_memory"
pytestmark = pytest.mark.ex00


@pytest.fixture(scope="module")
def ex():
    return course.load(NAME)


@pytest.mark.parametrize("case", course.cases_for(NAME), ids=lambda c: f"{c.func}: {c.name}")
def test_case(ex, case):
    course.require(case, ex)
