"""One bad request never hurts the others; nothing hangs; nothing is left behind.

Every test here would have hung, crashed the engine for later calls, or silently lost work
before the engine's failure semantics (``docs/architecture.md``) were written down.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
import sys
import threading

import pytest
from support import assert_idle_and_empty

import minivllm
from minivllm import LLM, BeamSearchParams, SamplingParams
from minivllm.engine.core_client import local_core
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import MAX_N

GREEDY = SamplingParams(temperature=0, max_tokens=12)
PROMPTS = ["Once upon a time", "The little fox", "Tom went to the", "A bird sat on a branch"]


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=256, num_kv_blocks=64)


@pytest.fixture(scope="module")
def reference(llm):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


# --- validated at the door: a clear error, nothing queued -----------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(temperature=float("inf")), "temperature must be a finite number"),
    (dict(seed="abc"), "seed must be an integer"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(seed=2**70), r"seed must be in \[0, 18446744073709551615\]"),
    (dict(seed=True), "seed must be an integer"),
    (dict(max_tokens=1.5), "max_tokens must be an integer"),
    (dict(ignore_eos="yes"), "ignore_eos must be True or False"),
    (dict(top_p=float("nan")), "top_p must be a finite number"),
    (dict(n=2.0), "n must be an integer"),
    (dict(stop=5), "stop must be a string or a list"),
    (dict(logprobs=-1), "logprobs must be >= 0"),
])
def test_bad_sampling_params_are_refused(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        SamplingParams(**kwargs)


def test_bad_beam_params_are_refused():
    with pytest.raises(TypeError, match="beam_width must be an integer"):
        BeamSearchParams(beam_width=2.5, max_tokens=4)
    with pytest.raises(ValueError, match="length_penalty must be a finite number"):
        BeamSearchParams(beam_width=2, max_tokens=4, length_penalty=math.nan)


@pytest.mark.parametrize("prompt, error, message", [
    (b"Once upon", TypeError, "not bytes"),
    (None, TypeError, "got NoneType"),
    (7, TypeError, "got int"),
    ({"text": "hi"}, ValueError, "needs 'prompt' or 'prompt_token_ids'"),
    ("a \ud800 b", ValueError, "not valid Unicode"),
    ([1, 2.5], TypeError, "must be integers"),
    ([1, True], TypeError, "must be integers"),
    ([], ValueError, "the prompt is empty"),
    ([10**9], ValueError, "outside the vocabulary"),
])
def test_bad_prompts_are_refused_and_nothing_is_queued(llm, prompt, error, message):
    with pytest.raises(error, match=message):
        llm.generate(["fine", prompt] if prompt is not None else [prompt], GREEDY, use_tqdm=False)
    assert_idle_and_empty(llm)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(max_num_batched_tokens=0), ValueError, "max_num_batched_tokens must be >= 1, got max_num_batched_tokens=0"),
    (dict(max_model_len=0), ValueError, "max_model_len must be >= 2, got max_model_len=0"),
    (dict(max_model_len=-5), ValueError, "max_model_len must be >= 2, got max_model_len=-5"),
    (dict(max_model_len=1), ValueError, "max_model_len must be >= 2"),
    (dict(block_size=16.0), TypeError, "block_size must be an integer"),
    (dict(enable_prefix_caching="no"), TypeError, "enable_prefix_caching must be True or False"),
    (dict(kv_cache="contiguous", enable_prefix_caching=True), ValueError, "needs kv_cache='paged'"),
    (dict(scheduler="static", enable_prefix_caching=True), ValueError, "static"),
    (dict(num_kv_blocks=64, kv_cache_memory=1 << 20), ValueError, "not both"),
    (dict(num_kv_blocks=10**9), ValueError, "GiB of host memory but only"),
])
def test_bad_engine_arguments_fail_fast(kwargs, error, message):
    with pytest.raises(error, match=message):
        LLM(**kwargs)


def test_checkpoint_errors_name_the_file_and_the_tensor(tmp_path):
    src = minivllm.TINY_MODEL_DIR
    bad_json = tmp_path / "bad_json"
    shutil.copytree(src, bad_json)
    (bad_json / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"bad_json/config.json is not valid JSON"):
        LLM(str(bad_json))
    wrong_shape = tmp_path / "wrong_shape"
    shutil.copytree(src, wrong_shape)
    cfg = json.loads((wrong_shape / "config.json").read_text())
    cfg["intermediate_size"] += 8
    (wrong_shape / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"mlp.*has shape \(\d+, \d+\) but the model built from config.json expects"):
        LLM(str(wrong_shape))


def test_command_line_user_errors_print_one_line():
    for argv in (["generate", "--max-tokens", "0", "hi"], ["grade", "ex99"]):
        run = subprocess.run([sys.executable, "-m", "minivllm.cli", *argv], capture_output=True, text=True, timeout=120)
        assert run.returncode == 2, run.stderr
        assert run.stderr.startswith("error: ") and "Traceback" not in run.stderr


# --- what cannot be validated fails one request --------------------------------------------
class PoisonedSampler(Sampler):
    """Gives one request's row NaN logits, as a numerically broken model would."""

    def __init__(self, inner: Sampler, victim_prompt_start: list[int]):
        super().__init__()
        self.inner, self.victim = inner, victim_prompt_start

    def __call__(self, logits, requests):
        for i, r in enumerate(requests):
            if r.prompt_token_ids[: len(self.victim)] == self.victim:
                logits[i, 0] = float("nan")
        return self.inner(logits, requests)


def test_nan_logits_fail_one_request_and_spare_the_rest(llm, reference):
    victim = llm.tokenizer(PROMPTS[1]).input_ids
    runner = local_core(llm).executor
    runner.sampler = PoisonedSampler(runner.sampler, victim)
    try:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    finally:
        runner.sampler = runner.sampler.inner
    assert outs[1].outputs[0].finish_reason == "error"
    assert "non-finite logits" in outs[1].outputs[0].error
    assert [o.outputs[0].token_ids for i, o in enumerate(outs) if i != 1] == [r for i, r in enumerate(reference) if i != 1]
    assert_idle_and_empty(llm)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == reference


class FlakyExecutor:
    """An executor that fails its third step (a device error), and runs ``inner`` otherwise."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def execute(self, out):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("simulated device error")
        return self.inner.execute(out)


def test_a_step_that_raises_fails_its_requests_and_the_engine_goes_on(llm, reference, caplog):
    core = local_core(llm)
    real = core.executor
    core.executor = FlakyExecutor(real)
    try:
        first = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    finally:
        core.executor = real
    assert {o.outputs[0].finish_reason for o in first} == {"error"}
    assert all("simulated device error" in o.outputs[0].error for o in first)
    assert "simulated device error" in caplog.text
    assert_idle_and_empty(llm)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == reference


# --- beam search ---------------------------------------------------------------------------
def test_beam_search_refuses_what_the_pool_cannot_hold():
    llm = LLM(max_model_len=64, num_kv_blocks=4)
    with pytest.raises(ValueError, match=r"needs up to \d+ KV blocks .* but the pool has 4"):
        llm.beam_search("Once upon a time", BeamSearchParams(beam_width=5, max_tokens=20))
    assert_idle_and_empty(llm)


def test_beam_search_errors_leave_nothing_behind(llm, reference):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.beam_search(["Once upon a time", [10**9]], BeamSearchParams(beam_width=2, max_tokens=4))
    assert_idle_and_empty(llm)
    out = llm.beam_search(PROMPTS[:2], BeamSearchParams(beam_width=2, max_tokens=6))
    assert all(o.sequences for o in out)
    assert_idle_and_empty(llm)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == reference


# --- streams, aborts, threads --------------------------------------------------------------
def test_closing_a_stream_aborts_its_requests(llm):
    stream = llm.stream(PROMPTS, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()
    assert_idle_and_empty(llm)


def test_a_stream_and_generate_interleaved_each_get_their_own_outputs(llm, reference):
    stream = llm.stream(PROMPTS[:2], GREEDY, delta=True)
    got: dict[str, list[int]] = {}
    finished = set()
    first = next(stream)
    got.setdefault(first.request_id, []).extend(first.outputs[0].token_ids)
    gen = llm.generate(PROMPTS[2:], GREEDY, use_tqdm=False)  # steps the stream's requests too
    for out in stream:
        got.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
        if out.finished:
            finished.add(out.request_id)
    assert len(finished) == 2
    assert sorted(got.values()) == sorted(reference[:2])
    assert [o.outputs[0].token_ids for o in gen] == reference[2:]
    assert_idle_and_empty(llm)


def test_abort_returns_final_outputs_and_forgets_everything(llm):
    e = llm.engine
    rid = e.add_request(None, "Once upon a time", SamplingParams(n=MAX_N, seed=3, max_tokens=4))
    e.step()
    outs = llm.abort(rid)
    assert len(outs) == 1 and outs[0].finished and len(outs[0].outputs) == MAX_N
    assert {c.finish_reason for c in outs[0].outputs} == {"abort"}
    assert_idle_and_empty(llm)


def test_two_threads_share_one_engine(llm, reference):
    results: dict[int, list] = {}
    errors = []

    def work(k: int) -> None:
        try:
            prompts = PROMPTS[:2] if k == 0 else PROMPTS[2:]
            results[k] = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and results[0] + results[1] == reference
    assert_idle_and_empty(llm)


# --- prefix caching never changes what is computed ------------------------------------------
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_prefix_caching_never_changes_greedy_tokens(policy):
    """Random traces with three shared prefixes, small pools and budgets, priorities, block 4:
    caching on and off must give identical tokens (K/V that was never written would not)."""
    rng = random.Random(7)
    prefixes = [[rng.randrange(8, 500) for _ in range(rng.randint(5, 14))] for _ in range(3)]
    for trial in range(3):
        prompts = [rng.choice(prefixes) + [rng.randrange(8, 500) for _ in range(rng.randint(1, 6))] for _ in range(10)]
        prios = [rng.randrange(3) for _ in prompts]
        args = dict(block_size=4, max_model_len=64, num_kv_blocks=rng.randint(16, 24),
                    max_num_batched_tokens=rng.choice([4, 9, 16, 24]), scheduling_policy=policy)
        params = SamplingParams(temperature=0, max_tokens=rng.randint(3, 10), ignore_eos=True)
        runs = []
        for caching in (True, False):
            eng = LLM(enable_prefix_caching=caching, debug_checks=True, **args)
            outs = eng.generate(prompts, params, use_tqdm=False, priority=prios)
            runs.append([o.outputs[0].token_ids for o in outs])
        assert runs[0] == runs[1], f"trial {trial}: {args}"
