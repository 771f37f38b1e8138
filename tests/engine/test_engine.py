"""The engine end to end on the shipped tiny model, checked against transformers.

Greedy token ids must equal Hugging Face ``generate`` for 32 ragged prompts under every way
of running the engine: plenty of memory, a pool so small that requests are preempted and
recomputed, a token budget so small that every prompt is chunked, the static-batching
baseline, and the contiguous KV baseline.
"""

from __future__ import annotations

import random

import pytest
from support import hf_greedy

from minivllm import LLM, SamplingParams
from minivllm.engine.core_client import local_core

NUM_PROMPTS = 32
MAX_TOKENS = 24
EOS = 2


@pytest.fixture(scope="module")
def ragged_prompts():
    rng = random.Random(0)
    lens = sorted(rng.randint(1, 300) for _ in range(NUM_PROMPTS - 2)) + [1, 300]
    rng.shuffle(lens)
    return [[1] + [rng.randrange(3, 1900) for _ in range(n - 1)] for n in lens]


@pytest.fixture(scope="module")
def hf_reference(tiny_hf_model, ragged_prompts):
    return [hf_greedy(tiny_hf_model, p, MAX_TOKENS, eos=EOS) for p in ragged_prompts]


GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)

ENGINE_SETUPS = {
    "ample_memory": dict(),
    "no_prefix_caching": dict(enable_prefix_caching=False),
    "preemption": dict(num_kv_blocks=26, max_model_len=400, max_num_batched_tokens=64),
    "chunked_prefill": dict(max_num_batched_tokens=8),
    "static_batching": dict(scheduler="static", max_num_seqs=8),
    "contiguous_kv": dict(kv_cache="contiguous", max_model_len=400, num_kv_blocks=200),
}


@pytest.mark.parametrize("setup", list(ENGINE_SETUPS))
def test_greedy_matches_transformers(setup, ragged_prompts, hf_reference):
    llm = LLM(debug_checks=True, **ENGINE_SETUPS[setup])
    outs = llm.generate(ragged_prompts, GREEDY, use_tqdm=False)
    got = [o.outputs[0].token_ids for o in outs]
    mismatched = [i for i, (g, w) in enumerate(zip(got, hf_reference)) if g != w]
    assert not mismatched, f"prompts {mismatched} differ from transformers"
    stats = llm.stats().summary()
    if setup == "preemption":
        assert stats["preemptions"] >= 10
    if setup == "chunked_prefill":
        assert max(s.batch_tokens for s in llm.stats().steps) <= 8
    if setup == "static_batching":
        assert stats["padding_tokens"] > 0
    assert local_core(llm).kv.num_used_blocks == 0, "blocks leaked"


def test_finish_reasons_and_eos(ragged_prompts, hf_reference):
    outs = LLM().generate(ragged_prompts[:8], GREEDY, use_tqdm=False)
    for o, ref in zip(outs, hf_reference[:8]):
        c = o.outputs[0]
        if ref[-1] == EOS and len(ref) <= MAX_TOKENS:
            assert c.finish_reason == "stop" and c.stop_reason is None
        else:
            assert c.finish_reason == "length" and len(c.token_ids) == MAX_TOKENS


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch():
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, max_tokens=30, seed=1234, ignore_eos=True)
    llm = LLM()
    alone = llm.generate(["Once upon a time"], params, use_tqdm=False)[0].outputs[0].token_ids
    again = llm.generate(["Once upon a time"], params, use_tqdm=False)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=k, seed=k) for k in (5, 40, 12)]
    crowd = llm.generate(["The dog", "Once upon a time", "Tom went to the", "A"],
                         [others[0], params, others[1], others[2]], use_tqdm=False)
    assert alone == again == crowd[1].outputs[0].token_ids
    other_seed = SamplingParams(**{**params.__dict__, "seed": 99})
    assert llm.generate(["Once upon a time"], other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_parallel_sampling_n_returns_n_distinct_seeded_completions():
    llm = LLM()
    params = SamplingParams(n=3, temperature=1.0, max_tokens=20, seed=7, ignore_eos=True)
    a = llm.generate("The little fox", params, use_tqdm=False)[0]
    b = llm.generate("The little fox", params, use_tqdm=False)[0]
    assert [c.index for c in a.outputs] == [0, 1, 2]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1


def test_stop_string_ends_text_before_it():
    llm = LLM()
    full = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=60), use_tqdm=False)[0]
    text = full.outputs[0].text
    words = text.split()
    assert len(words) > 4, f"the tiny model should write a sentence, got {text!r}"
    stop = " " + words[3]
    cut = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=60, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert cut.text == text[: text.index(stop)]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop


def test_stop_token_ids_and_min_tokens():
    llm = LLM()
    base = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)
    ids = base[0].outputs[0].token_ids
    stop_tok = ids[2]
    out = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_tok]),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ids[: ids.index(stop_tok) + 1] and out.stop_reason == stop_tok
    long = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=200, min_tokens=len(ids) + 5),
                        use_tqdm=False)[0].outputs[0]
    assert len(long.token_ids) >= len(ids) + 5


def test_streaming_deltas_add_up_to_the_generated_text():
    llm = LLM()
    params = SamplingParams(temperature=0, max_tokens=40)
    prompts = ["Once upon a time", "The little fox", "Tom went to the"]
    final = {o.prompt: o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)}
    text, ids, chunks = {}, {}, 0
    for out in llm.stream(prompts, params):
        c = out.outputs[0]
        text[out.prompt] = text.get(out.prompt, "") + c.text
        ids[out.prompt] = ids.get(out.prompt, []) + c.token_ids
        chunks += 1
    assert chunks > len(prompts)
    for p in prompts:
        assert text[p] == final[p].text and ids[p] == final[p].token_ids


def test_thousand_requests_through_a_tiny_pool():
    rng = random.Random(5)
    llm = LLM(num_kv_blocks=26, max_model_len=400, max_num_seqs=64, debug_checks=True)
    prompts = [[1] + [rng.randrange(3, 1900) for _ in range(rng.randint(0, 40))] for _ in range(1000)]
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(1, 8), ignore_eos=True) for _ in prompts]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert len(outs) == 1000 and len({o.request_id for o in outs}) == 1000
    assert all(len(o.outputs[0].token_ids) == p.max_tokens for o, p in zip(outs, params))
    assert local_core(llm).kv.num_free_blocks == local_core(llm).kv.num_blocks
    assert not llm.engine.has_unfinished_requests()


def test_bad_requests_are_rejected_before_queueing_and_others_keep_running():
    llm = LLM(max_model_len=256)
    engine = llm.engine
    engine.add_request("ok", "Once upon a time", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    engine.step()
    with pytest.raises(ValueError, match="300 tokens.*max_model_len=256"):
        engine.add_request("long", list(range(3, 303)), SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("empty", [], SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request("oov", [1, 10**7], SamplingParams())
    with pytest.raises(ValueError, match="batch.*|prompt"):
        llm.generate(["fine", list(range(3, 303))], SamplingParams(max_tokens=2), use_tqdm=False)
    assert engine.get_num_unfinished_requests() == 1  # nothing of the rejected batch was queued
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert outs[-1].request_id == "ok" and len(outs[-1].outputs[0].token_ids) == 10


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.5), "temperature must be >= 0, got temperature=-0.5"),
        (dict(top_p=0.0), "top_p must be in \\(0, 1\\], got top_p=0.0"),
        (dict(max_tokens=0), "max_tokens must be >= 1, got max_tokens=0"),
        (dict(n=0), "n must be in \\[1, 4096\\], got n=0"),
        (dict(min_tokens=5, max_tokens=2), "min_tokens=5 must not exceed max_tokens=2"),
    ],
)
def test_invalid_sampling_params_name_value_and_limit(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_engine_argument_errors():
    with pytest.raises(TypeError, match="unknown engine argument.*max_batch"):
        LLM(max_batch=4)
    with pytest.raises(ValueError, match="holds 3 blocks.*needs 16 blocks"):
        LLM(num_kv_blocks=3, max_model_len=256)
    with pytest.raises(ValueError, match="scheduler='magic'"):
        LLM(scheduler="magic")


def test_abort_frees_blocks_and_others_finish():
    llm = LLM(debug_checks=True)
    e = llm.engine
    for rid in "abc":
        e.add_request(rid, "Once upon a time", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    e.step()
    e.step()
    e.abort_request("b")
    assert "b" not in local_core(e).kv.req_to_blocks
    done = {}
    while e.has_unfinished_requests():
        for o in e.step():
            done[o.request_id] = o
    assert set(done) == {"a", "c"} and all(len(o.outputs[0].token_ids) == 30 for o in done.values())
    assert local_core(e).kv.num_used_blocks == 0


def test_metrics_are_recorded_per_step_and_per_request():
    llm = LLM()
    llm.generate(["Once upon a time", "The little fox"], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    st = llm.stats()
    assert st.steps and st.steps[0].num_prefill_tokens > 0
    assert all(s.kv_blocks_used <= s.kv_blocks_total for s in st.steps)
    for m in st.requests.values():
        assert 0 <= m.ttft <= m.e2e_latency
    summary = st.summary()
    assert summary["output_tokens"] == sum(m.num_output_tokens for m in st.requests.values())


def test_a_request_that_ends_at_its_first_token_has_a_ttft():
    """max_tokens=1 (and n=2 siblings that end with their first token): the request has left the
    scheduler when the step's times are stamped; it still gets its first-token time."""
    llm = LLM()
    outs = llm.generate(["Once upon a time", "The little fox"], SamplingParams(max_tokens=1, n=2, seed=1), use_tqdm=False)
    assert all(len(c.token_ids) == 1 for o in outs for c in o.outputs)
    metrics = llm.stats().requests
    assert len(metrics) >= 2
    for rid, m in metrics.items():
        assert m.ttft is not None and 0 <= m.ttft <= m.e2e_latency, rid


def test_detokenizer_cuts_at_the_earliest_stop_string():
    from minivllm.engine.detokenizer import IncrementalDetokenizer

    llm = LLM()
    tok = llm.tokenizer
    ids = tok("The fox ran home. Then the owl sang.", add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tok, [1], SamplingParams(stop=["owl", "ran"]))
    hit = detok.add_tokens(ids)  # both stop strings arrive in one step: the earlier one wins
    assert hit == "ran" and detok.take(finished=True) == "The fox "


def test_step_listener_sees_every_step_and_can_be_removed():
    llm = LLM(seed=0)
    core = local_core(llm)
    seen = []
    remove = core.add_step_listener(seen.append)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    llm.generate(["Once upon a time", "The little fox"], params, use_tqdm=False)
    assert seen and all(s.plan is not None for s in seen)
    planned = [rid for s in seen for rid, _ in s.plan.decisions()]
    assert {"0", "1"} <= set(planned)
    assert sum(len(s.new_token_ids) for s in seen) == 6  # 3 tokens for each of the two requests
    assert sorted(rid for s in seen for rid in s.finish_reasons) == ["0", "1"]
    remove()
    n = len(seen)
    llm.generate("Once", params, use_tqdm=False)
    assert len(seen) == n
    with pytest.raises(TypeError, match="callable"):
        core.add_step_listener(42)


def test_step_listener_sees_the_steps_of_a_plug_in_step_loop():
    """LLM(engine_core=...) with exercise 08's reference loop (an EngineCoreBase subclass) and
    with a subclass whose run_step wraps minivllm's: every step reported, exactly once."""
    from minivllm import course
    from minivllm.core.engine_core import EngineCore

    class Wrapping(EngineCore):
        def run_step(self, choose_tokens=None):
            return super().run_step(choose_tokens)

    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    for core_cls in (course.load("ex08_engine_step", solutions=True).StepLoop, Wrapping):
        llm = LLM(engine_core=core_cls)
        seen = []
        local_core(llm).add_step_listener(seen.append)
        llm.generate(["Once upon a time", "The little fox"], params, use_tqdm=False)
        assert len(seen) == llm.stats().num_steps, core_cls.__name__
        assert sum(len(s.new_token_ids) for s in seen) == 10, core_cls.__name__
        assert len({id(s) for s in seen}) == len(seen)


def test_an_interrupted_step_cleans_up_and_reports_nothing():
    """Ctrl-C inside the executor: the step's requests end with an error, their blocks are
    freed, the KeyboardInterrupt goes on up; the step returned no output, so no listener hears
    of it (the same for every step loop, minivllm's or a plug-in)."""
    from minivllm.core.engine_core import EngineCore
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.core.scheduler import Scheduler, SchedulerConfig
    from minivllm.request import Request, RequestStatus

    class Interrupted:
        def execute(self, out):
            raise KeyboardInterrupt

    core = EngineCore(Scheduler(SchedulerConfig(), KVCacheManager(8, 16)), Interrupted(), debug_checks=True)
    seen = []
    core.add_step_listener(seen.append)
    a = Request("a", [1, 2, 3], SamplingParams(max_tokens=2))
    core.add_request(a)
    with pytest.raises(KeyboardInterrupt):
        core.step()
    assert seen == [] and a.status is RequestStatus.FINISHED_ERROR
    assert not core.has_unfinished_requests() and core.kv.num_used_blocks == 0
    assert core.stats.num_steps == 1 and core.stats.requests["a"].finished_time is not None
