"""Delta outputs: each output holds only what is new, and a step costs the same at token 10
as at token 10,000 -- checked on what is kept and sent, not on a clock.

The detokenizer's stop strings are checked against their definition (decode everything, cut
before the first stop string), whatever the pieces the text arrives in.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm import LLM, SamplingParams
from minivllm.core.engine_core import EngineCore
from minivllm.core.interfaces import ModelRunnerOutput
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.messages import EngineCoreRequest
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.engine import detokenizer as detok_module
from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.engine.output_processor import OutputProcessor
from minivllm.outputs import RequestOutputKind


@pytest.fixture(scope="module")
def llm():
    return LLM(seed=0)


@pytest.fixture(scope="module")
def tok(llm):
    return llm.tokenizer


def decode_all(tok, prompt, ids, skip=True) -> str:
    """The reference text: what the detokenizer emits for ``ids`` with no stop string."""
    d = IncrementalDetokenizer(tok, prompt, SamplingParams(skip_special_tokens=skip))
    d.add_tokens(ids)
    return d.take(finished=True)


# --- the detokenizer --------------------------------------------------------------------------
def test_pieces_and_one_call_give_the_same_text(tok):
    ids = tok("Once upon a time there was a fox, and she ran home. Then it rained.", add_special_tokens=False).input_ids
    whole = decode_all(tok, [1], ids)
    d = IncrementalDetokenizer(tok, [1], SamplingParams())
    pieces = []
    for t in ids:
        d.add_tokens([t])
        pieces.append(d.take(finished=False))
    assert "".join(pieces) + d.take(finished=True) == whole
    assert whole.strip().startswith("Once upon a time")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_stop_strings_cut_where_their_definition_says(tok, data):
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    ids = [rng.randrange(3, 1900) for _ in range(data.draw(st.integers(1, 60)))]
    text = decode_all(tok, [1], ids)
    if not text:
        return
    # stop strings: pieces of the text itself (so they hit), and one that never does
    stops = []
    for _ in range(data.draw(st.integers(1, 3))):
        a = rng.randrange(len(text))
        stops.append(text[a : a + rng.randint(1, 8)])
    stops.append("\x00never")
    include = data.draw(st.booleans())
    # The definition: after each token, look for every stop string in the whole text so far;
    # the first time one is there, the text ends at the earliest of those found.
    plain = IncrementalDetokenizer(tok, [1], SamplingParams())
    so_far = ""
    for t in ids:
        plain.add_tokens([t])
        so_far += plain.take(finished=True)
        found = [(so_far.find(s), s) for s in stops if s in so_far]
        if found:
            first = min(found)
            break
    want = so_far[: first[0] + len(first[1])] if include else so_far[: first[0]]

    d = IncrementalDetokenizer(tok, [1], SamplingParams(stop=stops, include_stop_str_in_output=include))
    got, hit = [], None
    for t in ids:
        hit = d.add_tokens([t])
        got.append(d.take(finished=hit is not None))
        if hit is not None:
            break
    assert hit == first[1]
    assert "".join(got) == want
    # while it ran, nothing that could begin a stop string was handed out early
    assert all(len("".join(got[: i + 1])) <= len(want) for i in range(len(got)))


def test_the_detokenizer_keeps_a_bounded_window(tok, monkeypatch):
    monkeypatch.setattr(detok_module, "_TRIM_AT", 64)
    d = IncrementalDetokenizer(tok, [1], SamplingParams(stop=["\x00never"]))
    ids = tok("The fox ran to the big old tree and saw one little bird. " * 80, add_special_tokens=False).input_ids
    out = []
    for t in ids:
        d.add_tokens([t])
        out.append(d.take(finished=False))
        assert len(d.ids) <= 64 + 8 and len(d._pending) <= len("\x00never") + 16
    assert "".join(out) + d.take(True) == decode_all(tok, [1], ids)


# --- the output processor ------------------------------------------------------------------------
def deltas(rid: str, tokens: list[int], finish: str | None = None):
    from minivllm.core.messages import RequestDelta

    return [RequestDelta(rid, tokens, finish)]


@pytest.mark.parametrize("kind", list(RequestOutputKind))
def test_each_kind_of_output_holds_what_it_promises(tok, kind):
    ids = tok("Once upon a time there was a fox who ran home", add_special_tokens=False).input_ids
    op = OutputProcessor(tok)
    op.add_request("r", "p", [1], SamplingParams(max_tokens=len(ids)), kind)
    outs = []
    for i, t in enumerate(ids):
        outs += op.process(deltas("r", [t], "length" if i == len(ids) - 1 else None)).outputs
    whole = decode_all(tok, [1], ids)
    if kind is RequestOutputKind.FINAL_ONLY:
        assert len(outs) == 1
    else:
        assert len(outs) == len(ids)
    assert outs[-1].finished and not op.families
    if kind is RequestOutputKind.DELTA:
        assert [len(o.outputs[0].token_ids) for o in outs] == [1] * len(ids)
        assert "".join(o.outputs[0].text for o in outs) == whole
    else:
        assert outs[-1].outputs[0].text == whole and outs[-1].outputs[0].token_ids == ids
        texts = [o.outputs[0].text for o in outs]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))


def test_a_delta_stream_keeps_nothing_it_has_sent(tok):
    """After 5,000 tokens a DELTA request holds no token, text or log-probability it sent."""
    op = OutputProcessor(tok)
    op.add_request("r", None, [1], SamplingParams(max_tokens=10_000, logprobs=1), RequestOutputKind.DELTA)
    from minivllm.core.interfaces import Logprobs
    from minivllm.core.messages import RequestDelta

    state = op.children["r"]
    for i in range(5000):
        t = 300 + i % 500
        (out,) = op.process([RequestDelta("r", [t], new_logprobs=[Logprobs(t, -0.5, 1, [(t, -0.5)])])]).outputs
        assert len(out.outputs[0].token_ids) == 1 and len(out.outputs[0].logprobs) == 1
        assert state.token_ids == [] and state.text == [] and state.logprobs == []
    assert state.num_tokens == 5000


# --- the core's side: deltas of a step ------------------------------------------------------------
class EchoExecutor:
    """Samples token 7 for every request that samples (a stand-in for the model)."""

    def execute(self, out):
        return ModelRunnerOutput(new_token_ids={r.request_id: [7] for r, s in zip(out.requests, out.sample) if s})


def test_a_steps_deltas_hold_one_token_per_sample_at_any_length():
    kv = KVCacheManager(num_blocks=2048, block_size=16, enable_caching=False)
    core = EngineCore(Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=20_000), kv),
                      EchoExecutor())
    for i in range(3):
        for r in EngineCoreRequest(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=10_000, ignore_eos=True), 0.0).samples(()):
            core.add_request(r)
    for step in range(10_000):
        ds = core.step().deltas
        assert sorted(d.request_id for d in ds) == ["r0", "r1", "r2"]
        assert all(d.new_token_ids == [7] for d in ds), step
    assert all(d.finish_reason == "length" for d in ds)
    assert not core.has_unfinished_requests()
