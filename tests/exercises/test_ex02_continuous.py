"""Grade exercise 02 (`pytest -m ex02`): beyond the notebook's cases (`test_cases.py`),
random traces (hypothesis): the same decisions as minivllm's reference scheduler, with
requests that end on their length, on a stop token or by an abort.

Imports `exercises/ex02_continuous.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.course.reference import TraceRequest, compare_with_reference

NAME = "ex02_continuous"


# --- properties: any trace, same decisions as the reference scheduler ------------------------------
@st.composite
def traces(draw):
    budget = draw(st.integers(1, 96))
    seqs = draw(st.integers(1, 8))
    n = draw(st.integers(0, 14))
    trace, t = [], 0
    for i in range(n):
        t += draw(st.integers(0, 4))
        trace.append(TraceRequest(f"q{i}", draw(st.integers(1, budget)), draw(st.integers(1, 12)), t))
    return trace, seqs, budget


@settings(max_examples=60, deadline=None)
@given(traces())
def test_matches_reference_on_any_trace(ex, case_input):
    trace, seqs, budget = case_input
    compare_with_reference(ex.ContinuousScheduler, trace, max_num_seqs=seqs, max_num_batched_tokens=budget)


@st.composite
def traces_with_ends(draw):
    """Requests that may stop on token 3 (tokens drawn from 0-3) or be aborted at some step."""
    budget = draw(st.integers(8, 64))
    trace, t = [], 0
    for i in range(draw(st.integers(1, 10))):
        t += draw(st.integers(0, 3))
        abort = draw(st.one_of(st.none(), st.integers(t, t + 10)))
        trace.append(TraceRequest(f"q{i}", draw(st.integers(1, budget)), draw(st.integers(1, 12)), t,
                                  stop=(3,), abort_step=abort))
    return trace, draw(st.integers(1, 6)), budget


@settings(max_examples=40, deadline=None)
@given(traces_with_ends())
def test_matches_reference_with_stop_tokens_and_aborts(ex, case_input):
    trace, seqs, budget = case_input
    compare_with_reference(ex.ContinuousScheduler, trace, max_num_seqs=seqs, max_num_batched_tokens=budget,
                           vocab=4)
