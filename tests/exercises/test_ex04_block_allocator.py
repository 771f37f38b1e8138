"""Grade exercise 04 (`pytest -m ex04`): beyond the notebook's cases (`test_cases.py`),
random traces (hypothesis) replayed through minivllm's scheduler over your manager and over
minivllm's own, which must agree step by step, and bad inputs.

Imports `exercises/ex04_block_allocator.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.course.kv_replay import VOCAB, KVSetup, TraceRequest, compare_with_minivllm

NAME = "ex04_block_allocator"


@st.composite
def traces(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_model_len = 48
    setup = KVSetup(
        num_blocks=draw(st.integers(max_model_len // block_size, 3 * max_model_len // block_size)),
        block_size=block_size, max_model_len=max_model_len, max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.sampled_from([3, 8, 16, 48])),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
    )
    trace = []
    for i in range(draw(st.integers(1, 10))):
        prompt = tuple(draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24)))
        trace.append(TraceRequest(f"q{i}", prompt, draw(st.integers(1, 48 - len(prompt))),
                               draw(st.integers(0, 6)), priority=draw(st.integers(0, 2)),
                               abort_step=draw(st.sampled_from([None, None, None, 2, 5]))))
    return trace, setup


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_any_trace_gives_minivllms_block_tables(ex, case_input):
    trace, setup = case_input
    compare_with_minivllm(lambda: ex.PagedKVCacheManager(setup.num_blocks, setup.block_size), trace, setup,
                          caching=False)


def test_invariants_catch_a_corrupted_pool(ex):
    """M8 through the contract alone: the pool's books changed behind the manager's back (a free
    block touched through ``self.pool``, rule M5) are noticed, and the block is named."""
    from minivllm.request import Request

    kv = ex.PagedKVCacheManager(4, 4)
    kv.allocate_slots(Request("a", [1, 2, 3, 4, 5]), 5)
    kv.check_invariants(["a"])
    with pytest.raises(AssertionError, match=r"\ba\b"):
        kv.check_invariants([])
    (spare,) = [b for b in range(4) if b not in kv.get_block_ids("a")][:1]
    kv.pool.touch([spare])  # a reference no table accounts for
    with pytest.raises(AssertionError, match=rf"\b{spare}\b"):
        kv.check_invariants(["a"])


def test_a_double_free_is_refused_and_named(ex):
    pool = ex.BlockPool(3)
    pool.allocate(2)
    pool.free([1])
    with pytest.raises(ValueError, match="block 1"):
        pool.free([1])
    assert pool.free_block_ids() == [2, 1] and pool.ref_count(0) == 1
