"""A property over the whole range of every ``SamplingParams`` field: whatever one client sends,
the others get exactly the tokens they would have got alone, nothing hangs, nothing is left.

Each example draws a few requests whose fields come from the whole range of each type (ints far
beyond int64, NaN, infinities, subnormal and huge floats, wrong types, lone surrogates, long
lists) and mixes them into a batch of well-formed greedy requests. A drawn request is refused
at the door (with a short message) or accepted; accepted ones run next to the well-formed ones
and are aborted when those are done (they may ask for 2**62 tokens).
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from support import assert_idle_and_empty

from minivllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6)
PROMPTS = ["Once upon a time", "The little fox", "Tom went to the"]
STEP_BOUND = 200  # far more steps than the well-formed requests need (a few, plus preemptions)

EDGE_INTS = [0, 1, -1, 2, 1975, 1976, 1977, 4096, 4097, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64,
             -(2**63), -(2**63) - 1, 10**30]
EDGE_FLOATS = [0.0, -0.0, 1e-40, 5e-324, 1e-5, 9.99e-6, 0.5, 1.0, 1.0000001, 3.4e38, 3.5e38, 1e308,
               float("nan"), float("inf"), -float("inf")]
WRONG_TYPES = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.just([1, 2]), st.just(b"x"))
# the whole range, with its edges and the values a field accepts weighted up (one_of draws its
# branches about equally often)
INTS = st.one_of(st.integers(0, 3000), st.sampled_from(EDGE_INTS), st.sampled_from(EDGE_INTS),
                 st.integers(), st.integers(-(2**70), 2**70))
FLOATS = st.one_of(st.floats(0, 2), st.sampled_from(EDGE_FLOATS), st.sampled_from(EDGE_FLOATS), st.floats())
TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["\ud800", "a\udfffb", "x" * 10_000, ""]))
NUMBER = st.one_of(FLOATS, FLOATS, FLOATS, INTS, WRONG_TYPES)
INTEGER = st.one_of(INTS, INTS, INTS, st.floats(), WRONG_TYPES)
FIELDS = {
    "n": INTEGER,
    "temperature": NUMBER,
    "top_k": INTEGER,
    "top_p": NUMBER,
    "max_tokens": INTEGER,
    "min_tokens": INTEGER,
    "seed": INTEGER,
    "logprobs": INTEGER,
    "prompt_logprobs": INTEGER,
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=70), WRONG_TYPES),
    "stop_token_ids": st.one_of(
        st.lists(INTS, max_size=20),
        st.builds(lambda k, t: [t] * k, st.integers(0, 5000), st.integers(0, 1975)),
        WRONG_TYPES,
    ),
    "ignore_eos": st.one_of(st.booleans(), WRONG_TYPES, INTS),
    "skip_special_tokens": st.one_of(st.booleans(), WRONG_TYPES),
    "include_stop_str_in_output": st.one_of(st.booleans(), WRONG_TYPES),
}
# A few fields at a time (the rest at their defaults), so that many drawn requests pass the
# door and run: a request with every field drawn would almost always be refused.
ANY_PARAMS = st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=3, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({name: FIELDS[name] for name in names})
)


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=64, num_kv_blocks=48, block_size=8)


@pytest.fixture(scope="module")
def reference(llm):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def check_batch(llm, reference, drawn: list[dict], delay: int) -> None:
    engine = llm.engine
    good = [engine.add_request(None, p, GREEDY) for p in PROMPTS]
    finished = {}

    def step() -> None:
        finished.update((o.request_id, o) for o in engine.step() if o.finished)

    for _ in range(delay):  # the drawn requests may join a batch already running
        step()
    accepted = []
    for kwargs in drawn:
        try:
            accepted.append(engine.add_request(None, "A bird sat on", SamplingParams(**kwargs)))
        except (ValueError, TypeError) as err:
            assert len(str(err)) < 300, f"a long message for {sorted(kwargs)}: {str(err)[:300]}"
    for _ in range(STEP_BOUND):
        if all(rid in finished for rid in good):
            break
        step()
    assert all(rid in finished for rid in good), f"well-formed requests still running after {STEP_BOUND} steps"
    assert [finished[rid].outputs[0].token_ids for rid in good] == reference
    for rid in accepted:
        out = finished.get(rid)
        if out is not None and any(c.finish_reason == "error" for c in out.outputs):
            pytest.fail(f"an accepted request failed inside the engine: {out.outputs[0].error}")
    engine.abort_request(accepted)
    assert_idle_and_empty(llm)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=st.lists(ANY_PARAMS, min_size=1, max_size=3), delay=st.integers(0, 2))
def test_random_params_never_change_well_formed_requests(llm, reference, drawn, delay):
    check_batch(llm, reference, drawn, delay)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=st.lists(ANY_PARAMS, min_size=1, max_size=5), delay=st.integers(0, 4))
def test_random_params_never_change_well_formed_requests_long(llm, reference, drawn, delay):
    check_batch(llm, reference, drawn, delay)
