"""Grade exercise 07 (`pytest -m ex07`): beyond the notebook's cases (`test_cases.py`),
random traces (hypothesis) with shared prefixes, forks, salts and tight pools replayed through
minivllm's scheduler over your manager and over minivllm's own (prefix caching on), which
must agree step by step.

Imports `exercises/ex07_prefix_cache.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`. Exercise 07 runs on your exercise 04 if that passes
its checks, else on the reference one.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.course.kv_replay import VOCAB, KVSetup, TraceRequest, compare_with_minivllm

NAME = "ex07_prefix_cache"
PREFIXES = ((), (1, 2, 3, 1, 2, 3, 1, 2), (5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 3, 3), (1, 2, 3, 1))


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
        prefix = draw(st.sampled_from(PREFIXES))
        tail = tuple(draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12)))
        prompt = prefix + tail
        trace.append(TraceRequest(f"q{i}", prompt, draw(st.integers(1, 48 - len(prompt))),
                               draw(st.integers(0, 6)), n=draw(st.sampled_from([1, 1, 2, 3])),
                               priority=draw(st.integers(0, 2)),
                               cache_salt=draw(st.sampled_from([None, None, "t"])),
                               abort_step=draw(st.sampled_from([None, None, None, 2, 5]))))
    return trace, setup


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_any_trace_gives_minivllms_block_tables(ex, case_input):
    trace, setup = case_input
    compare_with_minivllm(lambda: ex.PrefixCachingKVCacheManager(setup.num_blocks, setup.block_size), trace,
                          setup, caching=True)


def test_without_caching_it_is_the_plain_allocator_that_forks(ex):
    """``enable_caching=False``: no hits, no registration; forks and copies still work."""
    from minivllm.course.kv_replay import reference_kv, replay

    setup = KVSetup(num_blocks=40, block_size=4)
    trace = [TraceRequest("a", (1, 2, 3, 4, 5, 6), 6, n=2), TraceRequest("b", (1, 2, 3, 4, 5, 6, 7), 4, arrival_step=4)]
    ours = replay(ex.PrefixCachingKVCacheManager(40, 4, enable_caching=False), trace, setup)
    theirs = replay(reference_kv(setup, caching=False), trace, setup)
    assert [s.scheduled for s in ours] == [s.scheduled for s in theirs]
    first = {}
    for s in ours:
        for rid, computed, _, _ in s.scheduled:
            first.setdefault(rid, computed)
    assert (first["a#0"], first["b"]) == (0, 0)  # b shares a block of a, but nothing is cached
    assert sum(len(s.copies) for s in ours) > 0


def test_it_keeps_its_blocks_in_exercise_04s_pool(ex):
    assert isinstance(ex.PrefixCachingKVCacheManager(8, 4).pool, ex.ex04.BlockPool)
