"""Grade exercise 02 (`pytest -m ex02`): beyond the notebook's cases (`test_cases.py`),
random traces (hypothesis): the same decisions as minivllm's reference scheduler, and a
chunked configuration refused.

Imports `exercises/ex02_continuous.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

import pytest
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


def test_refuses_a_chunked_config(ex):
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.core.scheduler import SchedulerConfig

    with pytest.raises(ValueError, match="enable_chunked_prefill=False"):
        ex.ContinuousScheduler(SchedulerConfig(enable_chunked_prefill=True), KVCacheManager(8, 16))
