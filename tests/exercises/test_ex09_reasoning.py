"""Grade exercise 09 (`pytest -m ex09`): beyond the notebook's cases (`test_cases.py`),
the protocol the checks enforce, and random inputs (hypothesis): pools, and the policy's
written rules (the client's priority first; no two requests that may push each other out).

Imports `exercises/ex09_reasoning.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm import course
from minivllm.course.checks.ex09_reasoning import (
    KV_DTYPES,
    model_view,
    req,
    sequences_that_fit,
    simulator_pool_blocks,
    spec,
)
from minivllm.course.loader import has_solutions  # a copy with exercises/ alone reads the stub

NAME = "ex09_reasoning"


def test_the_exercise_documents_the_protocol_the_checks_enforce():
    from minivllm.course.checks import ex09_reasoning as checks

    assert course.load(NAME, solutions=has_solutions()).MODEL_ATTRIBUTES == checks.MODEL_ATTRIBUTES


# --- properties over many random inputs ------------------------------------------------------------
MODELS = ("llama-3-8b", "llama-3-70b", "qwen3-0.6b")


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(MODELS), st.sampled_from(KV_DTYPES), st.integers(0, 300), st.floats(0, 0.999),
    st.integers(1, 5000), st.sampled_from((2, 16, 64)),
)
def test_fit_matches_a_real_pool(ex, name, kv, whole_blocks, spare, seq_len, block_size):
    """Any pool of a few hundred blocks (plus a spare fraction of a block), any length."""
    m = spec(name, kv)
    memory = (whole_blocks + spare) * m.kv_bytes_per_token() * block_size
    want = sequences_that_fit(simulator_pool_blocks(m, memory, block_size), block_size, seq_len)
    assert ex.max_concurrent_sequences(model_view(m), memory, seq_len, block_size) == want


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(KV_DTYPES), st.floats(0, 200e9), st.integers(1, 100_000), st.integers(1, 100_000))
def test_fit_is_monotone(ex, kv, memory, short, long):
    """More memory never fits fewer sequences; longer sequences never fit more."""
    full = spec("llama-3-70b", kv)
    m = model_view(full)
    short, long = sorted((short, long))
    fit = ex.max_concurrent_sequences
    assert fit(m, memory, long) <= fit(m, memory, short)
    assert fit(m, memory, short) <= fit(m, 2 * memory, short)
    assert fit(m, memory, short) * -(-short // 16) * 16 * full.kv_bytes_per_token() <= memory


requests = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(1, 40_000)),  # max_tokens
        st.integers(0, 1000),  # arrival (distinct below)
        st.integers(-1, 2),  # priority
    ),
    min_size=1, max_size=12, unique_by=lambda t: t[1],
)


def build(specs) -> list:
    return [req(f"r{i}", mt, float(arr), prio) for i, (mt, arr, prio) in enumerate(specs)]


@settings(max_examples=100, deadline=None)
@given(requests)
def test_waiting_order_puts_the_clients_priority_first(ex, specs):
    p = ex.ChatFirstPolicy()
    order = sorted(build(specs), key=lambda r: tuple(p.waiting_key(r)))
    assert [r.priority for r in order] == sorted(r.priority for r in order)


@settings(max_examples=100, deadline=None)
@given(requests)
def test_victim_is_running_and_of_the_least_important_priority(ex, specs):
    p = ex.ChatFirstPolicy()
    running = build(specs)
    before = list(running)
    victim = p.choose_victim(running)
    assert running == before, "choose_victim must not reorder the scheduler's list"
    assert any(victim is r for r in running)
    assert victim.priority == max(r.priority for r in running)


@settings(max_examples=100, deadline=None)
@given(requests, requests)
def test_preemption_never_goes_both_ways_nor_up_the_priorities(ex, waiting_specs, running_specs):
    """If a may push b out, b may never push a out: two requests cannot take turns evicting
    each other (the scheduler would thrash, or loop inside one step). A request never pushes
    out one with a smaller priority value."""
    p = ex.ChatFirstPolicy()
    for a in build(waiting_specs):
        for b in build(running_specs):
            if p.may_preempt(a, b):
                assert not p.may_preempt(b, a)
                assert a.priority <= b.priority
