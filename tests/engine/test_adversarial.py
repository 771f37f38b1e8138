"""One client cannot hurt the others: values from the whole range of each type, a failure that
belongs to one row, beam searches that cannot finish, request ids that collide.

Every value here passed validation once and then failed a whole batch, hung a caller, or left
state behind. Waits are bounded (a thread joined with a timeout), so a regression fails the test
instead of hanging the suite.
"""

from __future__ import annotations

import threading

import pytest
from support import assert_idle_and_empty

from minivllm import LLM, BeamSearchParams, SamplingParams
from minivllm.engine.core_client import local_core
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import GREEDY_TEMPERATURE, MAX_N, MAX_STOP_STRINGS

GREEDY = SamplingParams(temperature=0, max_tokens=8)
PROMPTS = ["Once upon a time", "The little fox", "Tom went to the"]
JOIN_TIMEOUT = 120


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=128, num_kv_blocks=96)


@pytest.fixture(scope="module")
def reference(llm):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def vocab(llm):
    return llm.engine.model_config.vocab_size


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def in_thread(fn, timeout: float = JOIN_TIMEOUT):
    """Run ``fn()`` in a thread; its result, or the exception it raised. Fails if it hangs."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"{fn} did not return within {timeout} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


# --- the type's range, at the door -----------------------------------------------------------
INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(top_k=2**63), rf"top_k must be at most {INT64_MAX} \(int64's largest\)"),
    (dict(logprobs=2**63), rf"logprobs must be at most {INT64_MAX}"),
    (dict(prompt_logprobs=2**64), rf"prompt_logprobs must be at most {INT64_MAX}"),
    (dict(max_tokens=2**63), rf"max_tokens must be at most {INT64_MAX}"),
    (dict(min_tokens=2**63, max_tokens=None), rf"min_tokens must be at most {INT64_MAX}"),
    (dict(stop_token_ids=[3, 2**63]), rf"stop_token_ids\[1\] must be at most {INT64_MAX}"),
    (dict(n=MAX_N + 1), rf"n must be in \[1, {MAX_N}\]"),
    (dict(temperature=1e39), r"temperature must be at most 3.4\d*e\+38"),
    (dict(stop=["x"] * (MAX_STOP_STRINGS + 1)), rf"stop may have at most {MAX_STOP_STRINGS} strings, got {MAX_STOP_STRINGS + 1}"),
    (dict(stop=["fine", "a\ud800b"]), r"stop string 1 is not valid Unicode"),
])
def test_values_beyond_the_type_are_refused(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(seed="7" * 1_000_000),
    dict(stop=["x" * 1_000_000, ""]),
    dict(max_tokens=[1] * 1_000_000),
    dict(stop=[1] * 1_000_000),
])
def test_error_messages_stay_short_whatever_the_input(kwargs):
    with pytest.raises((ValueError, TypeError)) as info:
        SamplingParams(**kwargs)
    assert len(str(info.value)) < 300, str(info.value)[:400]


# --- the model's range, at the door ----------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(top_k=10**9, temperature=1.0), r"top_k must be at most {V} \(the vocabulary size\)"),
    (dict(logprobs=10**9), r"logprobs must be at most {V} \(the vocabulary size\)"),
    (dict(prompt_logprobs=10**9), r"prompt_logprobs must be at most {V} \(the vocabulary size\)"),
    (dict(stop_token_ids=[5] * 5000), r"stop_token_ids has 5000 entries but the vocabulary has {V}"),
    (lambda V: dict(stop_token_ids=[t for t in range(V) if t != 2], min_tokens=1),  # 2 is EOS
     r"min_tokens=1 cannot be met: with EOS, stop_token_ids cover all {V} tokens"),
])
def test_values_beyond_the_model_are_refused_and_nothing_is_queued(llm, vocab, kwargs, message):
    kwargs = kwargs(vocab) if callable(kwargs) else kwargs
    with pytest.raises(ValueError, match=message.format(V=vocab)):
        llm.generate(PROMPTS, [GREEDY, GREEDY, SamplingParams(max_tokens=4, **kwargs)], use_tqdm=False)
    assert_idle_and_empty(llm)


def test_limits_of_the_model_are_accepted_and_served(llm, vocab, reference):
    """The largest values the checks allow run next to greedy requests without touching them."""
    edge = SamplingParams(max_tokens=3, top_k=vocab, logprobs=vocab, prompt_logprobs=vocab, seed=2**64 - 1,
                          temperature=3e38, top_p=5e-324, stop_token_ids=list(range(vocab - 1)), min_tokens=2)
    outs = llm.generate(PROMPTS + ["A fox"], [GREEDY] * 3 + [edge], use_tqdm=False)
    assert tokens(outs[:3]) == reference
    last = outs[3].outputs[0]
    assert last.token_ids[:2] == [vocab - 1] * 2, "min_tokens leaves one token that is not a stop token"
    assert last.finish_reason in ("stop", "length") and len(last.token_ids) == 3
    assert len(last.logprobs[0]) == vocab
    assert_idle_and_empty(llm)


def test_a_tiny_temperature_is_greedy(llm, reference):
    """``1e-40`` is 0 in float32: dividing by it gave inf logits and token 0 every step."""
    for temperature in (1e-40, 5e-324, GREEDY_TEMPERATURE / 2):
        params = SamplingParams(temperature=temperature, max_tokens=8, seed=1)
        assert params.greedy
        assert tokens(llm.generate(PROMPTS, params, use_tqdm=False)) == reference
    assert not SamplingParams(temperature=GREEDY_TEMPERATURE).greedy


# --- a failure inside a step stays with its row ------------------------------------------------
class FailsForOnePrompt(Sampler):
    """Raises whenever the victim's row is among the rows it samples (a fault no check caught)."""

    def __init__(self, inner: Sampler, victim: list[int]):
        super().__init__()
        self.inner, self.victim = inner, victim

    def __call__(self, logits, requests):
        if any(r.prompt_token_ids == self.victim for r in requests):
            raise RuntimeError("simulated fault in one row")
        return self.inner(logits, requests)


def test_a_sampling_fault_in_one_row_fails_that_request_only(llm, reference):
    runner = local_core(llm).executor
    runner.sampler = FailsForOnePrompt(runner.sampler, llm.tokenizer(PROMPTS[1]).input_ids)
    try:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    finally:
        runner.sampler = runner.sampler.inner
    assert outs[1].outputs[0].finish_reason == "error"
    assert "simulated fault in one row" in outs[1].outputs[0].error
    assert [t for i, t in enumerate(tokens(outs)) if i != 1] == [r for i, r in enumerate(reference) if i != 1]
    assert_idle_and_empty(llm)


def test_a_logprobs_fault_in_one_row_fails_that_request_only(llm, reference, monkeypatch):
    import minivllm.engine.model_runner as model_runner

    real = model_runner.compute_logprobs

    def fragile(logits, token_ids, num_top):
        if 7 in num_top:
            raise RuntimeError("simulated logprobs fault")
        return real(logits, token_ids, num_top)

    monkeypatch.setattr(model_runner, "compute_logprobs", fragile)
    params = [SamplingParams(temperature=0, max_tokens=8, logprobs=2),
              SamplingParams(temperature=0, max_tokens=8, logprobs=7), GREEDY]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert outs[1].outputs[0].finish_reason == "error" and "simulated logprobs fault" in outs[1].outputs[0].error
    assert tokens(outs)[0] == reference[0] and tokens(outs)[2] == reference[2]
    assert len(outs[0].outputs[0].logprobs) == len(reference[0])
    prompt_lp = SamplingParams(temperature=0, max_tokens=8, prompt_logprobs=7)
    outs = llm.generate(PROMPTS, [GREEDY, prompt_lp, GREEDY], use_tqdm=False)
    assert outs[1].outputs[0].finish_reason == "error"
    assert tokens(outs)[0] == reference[0] and tokens(outs)[2] == reference[2]
    assert_idle_and_empty(llm)


# --- beam search always ends -----------------------------------------------------------------
def test_a_beam_width_beyond_the_vocabulary_is_refused_up_front(llm, vocab):
    with pytest.raises(ValueError, match=rf"beam_width may be at most {vocab // 2}"):
        llm.beam_search("Once upon a time", BeamSearchParams(beam_width=1000, max_tokens=4))
    with pytest.raises(ValueError, match=rf"beam_width may be at most {vocab}"):
        llm.beam_search("Once", BeamSearchParams(beam_width=vocab + 1, max_tokens=4, ignore_eos=True))
    assert_idle_and_empty(llm)


def test_a_beam_search_whose_steps_fail_ends_with_the_error(llm, reference):
    """Before: the failed step never marked the beams done, and ``run`` stepped an empty engine
    forever while holding ``LLM``'s lock (every other thread's ``generate`` hung with it)."""
    runner = local_core(llm).executor
    real, calls = runner.execute, []

    def flaky(out):
        calls.append(1)
        if len(calls) >= 3:
            raise RuntimeError("simulated device error")
        return real(out)

    runner.execute = flaky
    try:
        outs = in_thread(lambda: llm.beam_search(PROMPTS[:2], BeamSearchParams(beam_width=3, max_tokens=10)))
    finally:
        runner.execute = real
    assert all("simulated device error" in o.error for o in outs)
    assert_idle_and_empty(llm)
    assert tokens(in_thread(lambda: llm.generate(PROMPTS, GREEDY, use_tqdm=False))) == reference


def test_a_beam_search_that_cannot_progress_stops_within_its_step_bound(llm, monkeypatch):
    """A token chooser that never advances a beam: the engine stalls or the step bound is hit,
    either way the caller gets an error and every beam is freed."""
    from minivllm.core import beam_search

    monkeypatch.setattr(beam_search._BeamSearch, "groups_ready", lambda self: [])
    with pytest.raises(RuntimeError, match="planned nothing|did not finish within"):
        in_thread(lambda: llm.beam_search(PROMPTS[0], BeamSearchParams(beam_width=2, max_tokens=5)))
    assert_idle_and_empty(llm)


# --- request ids -------------------------------------------------------------------------------
def test_a_user_id_that_names_another_requests_sample_is_refused(llm):
    """``foo`` with n=2 has samples ``foo#0`` and ``foo#1``; a user request ``foo#1`` used to be
    accepted, share the sample's state, and wait forever once ``foo`` finished."""
    e = llm.engine
    e.add_request("foo", "Once upon a time", SamplingParams(n=2, seed=1, max_tokens=6))
    e.step()
    e.abort_request("foo#1")  # one sample ends (as at a stop string); foo runs on
    with pytest.raises(ValueError, match=r"request_id 'foo#1' is already in use"):
        e.add_request("foo#1", "The little fox", GREEDY)
    e.add_request("bar#0", "The little fox", GREEDY)
    with pytest.raises(ValueError, match=r"request_id 'bar' .*'bar#0' is already in use"):
        e.add_request("bar", "Tom went", SamplingParams(n=2, seed=1, max_tokens=4))
    finished = set()
    for _ in range(50):
        finished.update(o.request_id for o in e.step() if o.finished)
        if not e.has_unfinished_requests():
            break
    assert finished == {"foo", "bar#0"}
    assert_idle_and_empty(llm)


def test_generated_ids_skip_ids_the_user_took(llm):
    e = llm.engine
    taken = str(int(e.add_request(None, "Once", GREEDY)) + 1)
    e.add_request(taken, "The little fox", GREEDY)
    assert e.add_request(None, "Tom", GREEDY) != taken
    while e.has_unfinished_requests():
        e.step()
    assert_idle_and_empty(llm)


# --- Ctrl-C ----------------------------------------------------------------------------------------
def test_keyboard_interrupt_in_a_step_leaves_nothing_behind(llm, reference):
    runner = local_core(llm).executor
    real, calls = runner.execute, []

    def interrupted(out):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(out)

    runner.execute = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS, SamplingParams(n=3, seed=0, max_tokens=8), use_tqdm=False)
    finally:
        runner.execute = real
    assert_idle_and_empty(llm)
    assert tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == reference


# --- tenants -------------------------------------------------------------------------------------
def test_a_prompt_dicts_cache_salt_partitions_the_prefix_cache(llm):
    secret = "The vault code is 4417 and the spare key is under the third flower pot by the door."
    greedy = SamplingParams(temperature=0, max_tokens=1)

    def cached(prompt) -> int:
        return llm.generate([prompt], greedy, use_tqdm=False)[0].num_cached_tokens

    assert cached({"prompt": secret, "cache_salt": "tenant-a"}) == 0
    assert cached({"prompt": secret, "cache_salt": "tenant-a"}) > 0
    assert cached(secret) == 0
    assert cached({"prompt": secret, "cache_salt": "tenant-b"}) == 0
    with pytest.raises(TypeError, match="cache_salt must be a string"):
        llm.generate([{"prompt": "x"}, {"prompt": secret, "cache_salt": 7}], greedy, use_tqdm=False)
    assert_idle_and_empty(llm)
