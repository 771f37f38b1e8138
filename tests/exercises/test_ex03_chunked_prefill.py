"""Grade exercise 03 (`pytest -m ex03`): beyond the notebook's cases (`test_cases.py`),
random traces and pools (hypothesis): the same decisions as minivllm's reference
scheduler, and the steps to a first token.

Imports `exercises/ex03_chunked_prefill.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.course.reference import TraceRequest, compare_with_reference

NAME = "ex03_chunked_prefill"


# --- properties over many random traces and pools ------------------------------------------------
@st.composite
def traces(draw):
    """Ragged prompts (many longer than the budget), bursty arrivals, and a pool between the
    smallest that can hold the longest request and one that never fills."""
    n = draw(st.integers(0, 10))
    trace, t = [], 0
    for i in range(n):
        t += draw(st.integers(0, 4))
        trace.append(TraceRequest(f"q{i}", draw(st.integers(1, 120)), draw(st.integers(1, 24)), t))
    block_size = draw(st.sampled_from([1, 4, 16]))
    longest = max((-(-(r.prompt_len + r.output_len) // block_size) for r in trace), default=1)
    pool = draw(st.one_of(st.none(), st.integers(longest, 3 * longest)))
    return trace, draw(st.integers(1, 8)), draw(st.integers(1, 200)), pool, block_size


@settings(max_examples=60, deadline=None)
@given(traces())
def test_matches_reference_on_any_trace_and_pool(ex, case_input):
    trace, seqs, budget, pool, block_size = case_input
    compare_with_reference(ex.ChunkedScheduler, trace, max_num_seqs=seqs, max_num_batched_tokens=budget,
                           enable_chunked_prefill=True, num_kv_blocks=pool, block_size=block_size)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 100_000), st.integers(1, 4096), st.integers(0, 4096))
def test_steps_to_first_token_is_the_smallest_that_covers_the_prompt(ex, prompt, budget, decodes):
    steps = ex.steps_to_first_token(prompt, budget, decodes)
    if decodes >= budget:
        assert steps is None
    else:
        per_step = budget - decodes
        assert steps * per_step >= prompt > (steps - 1) * per_step
