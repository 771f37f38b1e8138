"""Grade exercise 03 (`pytest -m ex03`): the same cases as `course.check` in the notebook.

Imports `exercises/ex03_chunked_prefill.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

import pytest

from minivllm import course

NAME = "ex03_chunked_prefill"
pytestmark = pytest.mark.ex03


@pytest.fixture(scope="module")
def ex():
    return course.load(NAME)


@pytest.mark.parametrize("case", course.cases_for(NAME), ids=lambda c: f"{c.func}: {c.name}")
def test_case(ex, case):
    course.require(case, ex)


# --- properties over many random states ----------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from minivllm.course.checks.ex03_chunked_prefill import compare_with_reference  # noqa: E402
from minivllm.course.reference import TraceRequest  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 100_000), st.integers(1, 4096))
def test_chunks_add_up(ex, num_tokens, chunk_size):
    chunks = ex.split_into_chunks(num_tokens, chunk_size)
    assert sum(chunks) == num_tokens
    assert all(1 <= c <= chunk_size for c in chunks)
    assert all(c == chunk_size for c in chunks[:-1])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 600), max_size=10),
    st.lists(st.integers(1, 600), max_size=10),
    st.integers(1, 1024),
    st.integers(1, 24),
    st.one_of(st.none(), st.integers(1, 512)),
)
def test_plan_respects_budget_seats_and_chunks(ex, left, prompts, budget, seqs, chunk):
    running = [(f"r{i}", n) for i, n in enumerate(left[:seqs])]
    waiting = [(f"w{i}", n) for i, n in enumerate(prompts)]
    plan = ex.plan_step(running, waiting, budget, seqs, chunk)
    sizes = dict(running + waiting)
    assert sum(n for _, n in plan) <= budget
    assert len(plan) <= seqs
    assert all(1 <= n <= sizes[rid] and (chunk is None or n <= chunk) for rid, n in plan)
    order = [rid for rid, _ in running + waiting]
    assert [rid for rid, _ in plan] == order[: len(plan)], "requests are served in order, none skipped"


@st.composite
def traces(draw):
    n = draw(st.integers(0, 12))
    trace, t = [], 0
    for i in range(n):
        t += draw(st.integers(0, 4))
        trace.append(TraceRequest(f"q{i}", draw(st.integers(1, 400)), draw(st.integers(1, 10)), t))
    return trace, draw(st.integers(1, 8)), draw(st.integers(1, 300))


@settings(max_examples=60, deadline=None)
@given(traces())
def test_matches_reference_on_any_trace(ex, case_input):
    trace, seqs, budget = case_input
    compare_with_reference(ex, trace, seqs, budget)
