"""Speculative decoding: n-gram and draft-model drafts, verified with the rejection rule.

What must hold: greedy output identical to decoding without speculation (through preemption,
chunked prefill, prefix-cache hits and the engine core's own process); at temperature > 0 the
tokens distributed as the target model alone samples them (checked against the exact
distribution computed with transformers, and for the rejection rule itself against ``p``); rejected
drafts' blocks return to the pool and never enter the prefix cache; bad settings refused when the
engine is built.
"""

from __future__ import annotations

import math

import pytest
import torch
from support import assert_idle_and_empty, save_random_checkpoint

import minivllm
from minivllm import LLM, SamplingParams
from minivllm.engine.core_client import local_core
from minivllm.spec_decode.config import CPU_DISABLE_BY_BATCH_SIZE, SpeculativeConfig
from minivllm.spec_decode.ngram import propose_ngram
from minivllm.spec_decode.rejection import verify, verify_greedy

TINY = minivllm.TINY_MODEL_DIR
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": None, "prompt_lookup_min": 2}
PROMPTS = [
    "Once upon a time",
    "Tom had a red ball. Tom had a red ball. Tom had a",
    "The cat and the dog played in the park. The cat and the dog",
    "A girl named Sue",
]


def chi2_threshold(dof: int, z: float = 4.0) -> float:
    """Upper quantile of chi-square(dof) at about z standard deviations (Wilson-Hilferty)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of ``counts`` against ``probs`` (bins with expectation < 5 pooled)."""
    n = counts.sum().item()
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum().item()
    return stat, int(keep.sum()) - 1


@pytest.fixture(scope="module")
def reference_outputs():
    llm = LLM(TINY, seed=0)
    params = SamplingParams(temperature=0, max_tokens=80)
    outs = {p: o.outputs[0].token_ids for p, o in zip(PROMPTS, llm.generate(PROMPTS, params, use_tqdm=False),
                                                        strict=True)}
    return params, outs


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory):
    """A random-weight draft model with the tiny model's tokenizer: its q is far from p."""
    d = tmp_path_factory.mktemp("draft")
    save_random_checkpoint(d, "llama", seed=3, num_hidden_layers=1, hidden_size=64, num_attention_heads=2,
                           num_key_value_heads=1)
    return d


# --- the pieces --------------------------------------------------------------------------------
def test_ngram_proposes_what_followed_the_most_recent_match():
    assert propose_ngram([5, 6, 7, 8, 1, 5, 6], k=3) == [7, 8, 1]
    assert propose_ngram([1, 2, 3, 9, 1, 2, 4, 1, 2], k=2) == [4, 1]  # the most recent [1, 2]
    assert propose_ngram([1, 2, 3, 4], k=3) == []  # nothing recurs
    assert propose_ngram([7, 7], k=4) == [7]  # only what the text holds
    # the longest n-gram first: [3, 1] recurs at 0 and 5; the 1-gram [1] more recently
    assert propose_ngram([3, 1, 8, 1, 9, 3, 1], k=1, max_n=2) == [8]
    assert propose_ngram([3, 1, 8, 1, 9, 3, 1], k=1, max_n=2, min_n=2) == [8]
    assert propose_ngram([4, 1, 9, 1], k=2, max_n=3, min_n=2) == []  # only a 1-gram recurs


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-model", "ngram"])
def test_rejection_rule_keeps_the_target_distribution(one_hot):
    """Drafts proposed from q (or fixed, one-hot), verified against p: the first emitted token is
    distributed as p_0 and the mean number of accepted drafts is the exact one."""
    gen = torch.Generator().manual_seed(1)
    vocab, k, trials = 6, 2, 40000
    p = torch.softmax(torch.randn(k + 1, vocab, generator=gen, dtype=torch.float64) * 1.5, dim=1)
    q = torch.softmax(torch.randn(k + 1, vocab, generator=gen, dtype=torch.float64) * 1.5, dim=1)
    if one_hot:
        drafts = [[3, 1]] * trials
        accept = [p[0, 3], p[1, 1]]  # P(accept) of a one-hot draft: p(d)
    else:
        drafts = torch.multinomial(q[:k], trials, replacement=True, generator=gen).T.tolist()
        accept = [torch.minimum(p[i], q[i]).sum() for i in range(k)]  # sum_x min(p, q)
    u = torch.rand(trials * (k + 1), generator=gen, dtype=torch.float64)
    e = torch.empty(trials * (k + 1), vocab, dtype=torch.float64).exponential_(generator=gen)
    out = verify(p.repeat(trials, 1), drafts, None if one_hot else q.repeat(trials, 1), u, e)
    first = torch.bincount(torch.tensor([t[0] for t in out]), minlength=vocab).double()
    stat, dof = chi2(first, p[0])
    assert stat < chi2_threshold(dof), (stat, dof)
    mean = sum(len(t) - 1 for t in out) / trials
    expected = (accept[0] + accept[0] * accept[1]).item()
    assert abs(mean - expected) < 5 * k / math.sqrt(trials), (mean, expected)
    # a residual draw never repeats the rejected one-hot draft
    if one_hot:
        assert all(t[0] != 3 for t in out if len(t) == 1)


def test_rejection_rule_is_argmax_for_greedy_rows():
    """p one-hot at the argmax: a draft is accepted exactly when it is the argmax."""
    p = torch.zeros(4, 5, dtype=torch.float64)
    p[0, 2] = p[1, 4] = p[2, 0] = p[3, 1] = 1.0
    u, e = torch.rand(4, dtype=torch.float64), torch.ones(4, 5, dtype=torch.float64)
    assert verify(p, [[2, 4, 3]], None, u, e) == [[2, 4, 0]]
    assert verify(p, [[2, 4, 0]], None, u, e) == [[2, 4, 0, 1]]  # all accepted: the bonus token
    assert verify(p, [[1, 4, 0]], None, u, e) == [[2]]
    # p == q for a one-hot draft whose token is certain: never an empty residual
    assert verify(p[:1], [[]], None, u[:1], e[:1]) == [[2]]


def test_the_greedy_rule_is_the_rejection_rule_on_one_hot_rows():
    """``verify_greedy`` from the rows' argmax against ``verify`` on one-hot ``p`` (with a
    one-hot ``q`` too, as a greedy draft model gives), over random drafts that often agree."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        ks = torch.randint(0, 5, (torch.randint(1, 4, (1,), generator=gen).item(),), generator=gen).tolist()
        rows = sum(ks) + len(ks)
        targets = torch.randint(0, 4, (rows,), generator=gen)
        p = torch.zeros(rows, 4, dtype=torch.float64).scatter_(1, targets[:, None], 1.0)
        drafts, start = [], 0
        for k in ks:
            agree = torch.rand(k, generator=gen) < 0.7
            drafts.append([t if a else (t + 1) % 4 for t, a in zip(targets[start:start + k].tolist(), agree.tolist())])
            start += k + 1
        q = torch.zeros_like(p)
        start = 0
        for d in drafts:
            for j, tok in enumerate(d):
                q[start + j, tok] = 1.0
            start += len(d) + 1
        u, e = torch.rand(rows, generator=gen, dtype=torch.float64), torch.ones(rows, 4, dtype=torch.float64)
        expected = verify(p, drafts, None, u, e)
        assert verify_greedy(targets.tolist(), drafts) == expected == verify(p, drafts, q, u, e)
    with pytest.raises(ValueError, match="rows"):
        verify_greedy([1, 2, 3], [[1]])


def test_a_plugged_verifier_is_called_for_greedy_requests_too(reference_outputs):
    """The greedy shortcut is minivllm's own rule: a verifier plugged in as
    ``speculative_config``'s ``verifier`` (exercise 11's) sees every step's drafts, greedy or not."""
    params, ref = reference_outputs
    calls = []

    def counting(*args):
        calls.append(1)
        return verify(*args)

    llm = LLM(TINY, speculative_config={**NGRAM, "verifier": counting})
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [ref[p] for p in PROMPTS]
    assert calls


def test_rejection_rule_batches_requests_independently():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(5, 7, generator=gen, dtype=torch.float64), dim=1)
    u = torch.rand(5, generator=gen, dtype=torch.float64)
    e = torch.empty(5, 7, dtype=torch.float64).exponential_(generator=gen)
    both = verify(p, [[1, 2], [3]], None, u, e)
    assert both == [verify(p[:3], [[1, 2]], None, u[:3], e[:3])[0], verify(p[3:], [[3]], None, u[3:], e[3:])[0]]
    with pytest.raises(ValueError, match="rows"):
        verify(p, [[1, 2]], None, u, e)


# --- the engine: greedy output identical ------------------------------------------------------------
@pytest.mark.parametrize("extra", [
    {},
    {"num_kv_blocks": 12, "max_num_batched_tokens": 40, "max_model_len": 190},  # preempts, chunks
    {"attention_backend": "torch_padded", "enable_prefix_caching": False},
], ids=["default", "small-pool", "padded"])
def test_greedy_output_is_identical_with_ngram_drafts(reference_outputs, extra):
    params, ref = reference_outputs
    llm = LLM(TINY, speculative_config=NGRAM, debug_checks=True, **extra)
    prompts = PROMPTS * 2  # the second copy hits the prefix cache
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [ref[p] for p in prompts]
    summary = llm.stats().summary()
    assert summary["spec_draft_tokens"] > 0 and summary["spec_accepted_tokens"] > 0
    assert 0 < summary["spec_acceptance_rate"] <= 1
    if extra.get("num_kv_blocks"):
        assert summary["preemptions"] > 0
    assert_idle_and_empty(llm)


@pytest.mark.parametrize("which", ["self", "random"])
def test_greedy_output_is_identical_with_a_draft_model(reference_outputs, random_draft, which):
    params, ref = reference_outputs
    draft = TINY if which == "self" else random_draft
    llm = LLM(TINY, speculative_config={"model": str(draft), "num_speculative_tokens": 3, "disable_by_batch_size": None}, debug_checks=True,
              num_kv_blocks=40, max_model_len=400)
    outs = llm.generate(PROMPTS * 2, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [ref[p] for p in PROMPTS * 2]
    rate = llm.stats().summary()["spec_acceptance_rate"]
    if which == "self":  # the target as its own draft: every draft is its own argmax
        assert rate == 1.0
    else:
        assert rate < 0.5
    assert_idle_and_empty(llm)


def test_speculation_in_the_engine_core_process_streams_the_same_tokens(reference_outputs):
    params, ref = reference_outputs
    llm = LLM(TINY, speculative_config=NGRAM, engine_core_process=True)
    try:
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == [ref[p] for p in PROMPTS]
        assert [o.outputs[0].text for o in outs] == [o.outputs[0].text for o in LLM(TINY).generate(
            PROMPTS, params, use_tqdm=False)]
    finally:
        llm.shutdown()


def period_id(llm) -> int:
    return llm.engine.tokenize(" ran home.")[1][-1]


def test_requests_that_want_logprobs_or_stop_strings_get_the_same_answer():
    base, spec = LLM(TINY), LLM(TINY, speculative_config=NGRAM)
    for params in (SamplingParams(temperature=0, max_tokens=40, logprobs=2),
                   SamplingParams(temperature=0, max_tokens=60, stop=["ball"]),
                   SamplingParams(temperature=0, max_tokens=7),
                   SamplingParams(temperature=0, max_tokens=60, min_tokens=45),  # EOS drafts rejected
                   SamplingParams(temperature=0, max_tokens=60, stop_token_ids=[period_id(base)]),
                   SamplingParams(temperature=0, max_tokens=40, n=2)):
        a = base.generate(PROMPTS[1:3], params, use_tqdm=False)
        b = spec.generate(PROMPTS[1:3], params, use_tqdm=False)
        for x, y in zip(a, b, strict=True):
            assert [c.token_ids for c in x.outputs] == [c.token_ids for c in y.outputs]
            assert [c.text for c in x.outputs] == [c.text for c in y.outputs]
            assert [c.finish_reason for c in x.outputs] == [c.finish_reason for c in y.outputs]
            if params.logprobs:
                assert len(y.outputs[0].logprobs) == len(y.outputs[0].token_ids)


def test_a_failing_draft_model_fails_no_request(reference_outputs, caplog):
    """Drafts only change how many tokens a step gains: if the draft model raises, the requests
    go on without drafts and their tokens are the same."""
    params, ref = reference_outputs
    llm = LLM(TINY, speculative_config={"model": str(minivllm.TINY_DRAFT_MODEL_DIR), "num_speculative_tokens": 3, "disable_by_batch_size": None})
    draft = local_core(llm).executor.speculative.draft
    calls = {"n": 0}
    real = draft.propose

    def flaky(items):
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise RuntimeError("the draft model broke")
        return real(items)

    draft.propose = flaky
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [ref[p] for p in PROMPTS]
    assert "the draft model failed" in caplog.text
    assert llm.stats().summary()["spec_accepted_tokens"] > 0
    assert_idle_and_empty(llm)


# --- the engine: the target's distribution at temperature > 0 -------------------------------------
def _exact_marginals(hf, prompt_ids: list[int], top_k: int, depth: int) -> list[torch.Tensor]:
    """P(output token j) for j < depth, each token drawn from the top-k filtered softmax given
    the ones before it (exact: every path through the top-k supports is enumerated)."""
    def dist(ids):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1].double()
        kth = logits.topk(top_k).values[-1]
        return torch.softmax(logits.masked_fill(logits < kth, float("-inf")), dim=0)

    marginals = [torch.zeros(hf.config.vocab_size, dtype=torch.float64) for _ in range(depth)]

    def walk(ids, prob, j):
        d = dist(ids)
        marginals[j] += prob * d
        if j + 1 < depth:
            for t in d.nonzero().flatten().tolist():
                walk(ids + [t], prob * d[t].item(), j + 1)

    walk(prompt_ids, 1.0, 0)
    return marginals


@pytest.mark.parametrize("method", ["ngram", "trained", "random"])
def test_sampled_tokens_follow_the_target_distribution(tiny_hf_model, random_draft, method):
    """The first output token comes from the prompt's last row; the next ones are where drafts
    are verified. Over 2,500 seeded requests, the second and third tokens must be distributed as
    the exact marginals of the target alone (top-k 4 at temperature 1) -- with one-hot n-gram
    drafts, with the trained draft model (q near p: mostly accepted, sometimes the residual) and
    with a random draft (q far from p: nearly always the residual)."""
    prompt = "Tom had a red ball. Tom had a red ball. Tom had a"
    draft = {"trained": str(minivllm.TINY_DRAFT_MODEL_DIR), "random": str(random_draft)}.get(method)
    cfg = ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": None} if draft is None
           else {"model": draft, "num_speculative_tokens": 2, "disable_by_batch_size": None})
    llm = LLM(TINY, speculative_config=cfg, max_num_seqs=256)
    prompt_ids = llm.engine.tokenize(prompt)[1]
    top_k, trials = 4, 2500
    params = [SamplingParams(temperature=1.0, top_k=top_k, max_tokens=4, ignore_eos=True, seed=s)
              for s in range(trials)]
    outs = llm.generate([prompt] * trials, params, use_tqdm=False)
    summary = llm.stats().summary()
    assert summary["spec_draft_tokens"] > trials / 5  # many requests really verified drafts
    if method != "random":
        assert summary["spec_accepted_tokens"] > trials / 20
    exact = _exact_marginals(tiny_hf_model, prompt_ids, top_k, depth=3)
    for j in (1, 2):
        counts = torch.zeros_like(exact[j])
        for o in outs:
            counts[o.outputs[0].token_ids[j]] += 1
        stat, dof = chi2(counts, exact[j])
        assert stat < chi2_threshold(dof), (j, stat, dof, summary["spec_acceptance_rate"])


# --- the KV cache: rollback and the prefix cache ------------------------------------------------
def test_rejected_drafts_give_their_blocks_back_and_never_enter_the_prefix_cache(random_draft):
    """A random draft is mostly rejected. After every step each request holds only the blocks
    its kept tokens (and the lookahead) need, and every block registered in the prefix cache
    holds tokens of a request's final sequence."""
    k = 6
    llm = LLM(TINY, speculative_config={"model": str(random_draft), "num_speculative_tokens": k, "disable_by_batch_size": None},
              block_size=4, debug_checks=True)
    core, kv = local_core(llm), local_core(llm).kv
    seen: list[int] = []

    def check(step_out):
        for req in core.scheduler.running:
            held = len(kv.get_block_ids(req.request_id))
            needed = -(-(req.num_computed_tokens + k) // kv.block_size)
            if step_out.plan.spec_token_ids.get(req.request_id) is not None:
                assert held == needed, (req.request_id, held, needed)
        seen.append(len(step_out.plan.spec_token_ids))

    core.add_step_listener(check)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert sum(seen) > 0
    # every cached block's hash is the hash of a full block of some request's final tokens
    from minivllm.core.block_pool import hash_block

    valid = set()
    for o in outs:
        tokens = list(o.prompt_token_ids) + list(o.outputs[0].token_ids)
        parent = None
        for i in range(len(tokens) // kv.block_size):
            parent = hash_block(parent, tokens[i * 4 : (i + 1) * 4], None)
            valid.add(parent.value)
    cached = set(kv.block_pool.cached_blocks)
    assert cached and cached <= valid
    assert_idle_and_empty(llm)


# --- refused when the engine is built -----------------------------------------------------------
@pytest.mark.parametrize("config, error, match", [
    ({"method": "eagle", "num_speculative_tokens": 2, "disable_by_batch_size": None}, ValueError, "method"),
    ({"method": "ngram", "num_speculative_tokens": 0, "disable_by_batch_size": None}, ValueError, r"\[1, 32\]"),
    ({"method": "ngram", "num_speculative_tokens": 33, "disable_by_batch_size": None}, ValueError, r"\[1, 32\]"),
    ({"method": "ngram", "num_speculative_tokens": 2.0, "disable_by_batch_size": None}, TypeError, "integer"),
    ({"method": "ngram", "num_speculative_tokens": True, "disable_by_batch_size": None}, TypeError, "integer"),
    ({"method": "ngram"}, ValueError, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": None, "lookahead": 3}, ValueError, "unknown"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "disable_by_batch_size": None}, ValueError, "model"),
    ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": None, "model": "x"}, ValueError, "only for"),
    ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": None, "prompt_lookup_min": 5}, ValueError, "prompt_lookup_min"),
    ("{not json", ValueError, "JSON"),
    (["ngram"], TypeError, "dict"),
])
def test_bad_speculative_configs_are_refused(config, error, match):
    with pytest.raises(error, match=match):
        SpeculativeConfig.parse(config)


def test_json_text_is_a_speculative_config():
    cfg = SpeculativeConfig.parse('{"num_speculative_tokens": 3, "disable_by_batch_size": null}')
    assert cfg.method == "ngram" and cfg.num_speculative_tokens == 3
    assert SpeculativeConfig.parse({"model": "/m", "num_speculative_tokens": 2, "disable_by_batch_size": None}).method == "draft_model"


@pytest.mark.parametrize("kwargs, error, match", [
    ({"scheduler": "static"}, TypeError, "StaticBatchScheduler does not implement .*SpeculativeScheduler.*"
                                         "missing update_draft_token_ids"),
    ({"kv_cache": "contiguous"}, TypeError, "ContiguousKVCacheManager does not implement "
                                            ".*SpeculativeKVCacheManager.*missing trim"),
    ({"max_num_batched_tokens": 4}, ValueError, "max_num_batched_tokens=4"),
])
def test_engines_that_cannot_roll_back_drafts_refuse_speculation(kwargs, error, match):
    """The parts must implement speculative decoding's protocols: the error names the member a
    part lacks (the baselines have no rollback), or the budget that cannot hold k drafts."""
    with pytest.raises(error, match=match):
        LLM(TINY, speculative_config={"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": None}, **kwargs)


def test_a_pool_too_small_for_the_lookahead_is_refused():
    # 128 tokens exactly: enough for max_model_len=128 alone, not with a draft model's 4 lookahead slots
    LLM(TINY, max_model_len=128, num_kv_blocks=8, speculative_config=NGRAM)
    with pytest.raises(ValueError, match="lookahead"):
        LLM(TINY, max_model_len=128, num_kv_blocks=8,
            speculative_config={"model": str(TINY), "num_speculative_tokens": 4, "disable_by_batch_size": None})


def test_a_draft_model_must_share_the_vocabulary(tmp_path):
    save_random_checkpoint(tmp_path, "llama", vocab_size=500)
    with pytest.raises(ValueError, match="vocab_size=500"):
        LLM(TINY, speculative_config={"model": str(tmp_path), "num_speculative_tokens": 2, "disable_by_batch_size": None})
    with pytest.raises(ValueError, match="not a checkpoint directory"):
        LLM(TINY, speculative_config={"model": str(tmp_path / "nope"), "num_speculative_tokens": 2, "disable_by_batch_size": None})


def test_the_triton_kernels_verify_drafts_like_the_torch_backend():
    """Verification rows are short prefills over a cached context: the Triton prefill kernel
    (interpreted on a CPU) must give the same greedy tokens; the draft model runs on it too."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = PROMPTS[:2]
    cfg = {"model": str(minivllm.TINY_DRAFT_MODEL_DIR), "num_speculative_tokens": 3, "disable_by_batch_size": None}
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(TINY, attention_backend=backend, speculative_config=cfg, max_model_len=128, num_kv_blocks=16)
        results[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert llm.stats().summary()["spec_accepted_tokens"] > 0
    assert results["triton"] == results["torch"]


def test_parallel_samples_speculate_with_a_draft_model(reference_outputs):
    """n > 1 forks share blocks copy-on-write; the draft model's K/V is copied with the target's.
    Greedy samples all equal the greedy answer; sampled ones finish with their lengths."""
    params, ref = reference_outputs
    llm = LLM(TINY, speculative_config={"model": str(minivllm.TINY_DRAFT_MODEL_DIR), "num_speculative_tokens": 3, "disable_by_batch_size": None},
              debug_checks=True, block_size=4)
    greedy = SamplingParams(temperature=0, max_tokens=80, n=3)
    for out in llm.generate(PROMPTS[:2], greedy, use_tqdm=False):
        assert [c.token_ids for c in out.outputs] == [ref[out.prompt]] * 3
    sampled = SamplingParams(temperature=1.0, max_tokens=30, n=4, seed=5, ignore_eos=True)
    outs = llm.generate(PROMPTS[:2], sampled, use_tqdm=False)
    assert all(len(c.token_ids) == 30 for o in outs for c in o.outputs)
    assert llm.stats().summary()["spec_accepted_tokens"] > 0
    assert_idle_and_empty(llm)


def test_non_finite_logits_fail_only_their_request():
    """A NaN or inf in one request's verification rows fails that request; the others of the
    step are verified as usual."""
    from minivllm.request import Request
    from minivllm.sample.sampler import Sampler
    from minivllm.spec_decode.decoder import SpeculativeDecoder

    decoder = SpeculativeDecoder(SpeculativeConfig.parse(NGRAM), Sampler(seed=0), max_model_len=64)
    reqs = [Request(f"r{i}", [1, 5, 6], SamplingParams(temperature=0, max_tokens=8)) for i in range(3)]
    drafts = [[7, 8], [9], [4, 4, 4]]
    logits = torch.randn(sum(len(d) + 1 for d in drafts), 32, generator=torch.Generator().manual_seed(0))
    logits[3, 5] = float("nan")  # r1's first row
    logits[4, :] = float("-inf")  # r1's bonus row: no token possible
    emitted, failed = decoder.verify(logits, list(zip(reqs, drafts, strict=True)))
    assert set(failed) == {"r1"} and "non-finite" in failed["r1"]
    assert set(emitted) == {"r0", "r2"}
    argmax = logits.argmax(dim=1).tolist()
    for rid, start, d in (("r0", 0, drafts[0]), ("r2", 5, drafts[2])):
        a = 0
        while a < len(d) and d[a] == argmax[start + a]:
            a += 1
        assert emitted[rid] == [*d[:a], argmax[start + a]]


# --- speculating less when the batch is large -------------------------------------------------------
def draft_steps(llm, prompts, params) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """The tokens, and per step (requests in it, drafts it verified)."""
    steps: list[tuple[int, int]] = []
    local_core(llm).add_step_listener(lambda s: steps.append(
        (len(s.plan.requests), sum(len(d) for d in (s.plan.spec_token_ids or {}).values()))))
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], steps


@pytest.mark.parametrize("limit, batch, drafts_expected", [
    ("auto", 4, True),  # on a CPU "auto" is 8 for a draft model: four requests still draft
    ("auto", 12, False),  # twelve decoding together: above it, no step drafts
    ("auto", 40, False),  # forty decoding together: no step drafts
    (2, 4, False),
    (None, 12, True),  # never stops
])
def test_a_batch_above_the_limit_proposes_no_drafts_and_keeps_its_tokens(reference_outputs, limit, batch,
                                                                          drafts_expected):
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [PROMPTS[1]] * batch
    plain = LLM(TINY, max_num_seqs=48).generate(prompts, params, use_tqdm=False)
    cfg = {"model": str(minivllm.TINY_DRAFT_MODEL_DIR), "num_speculative_tokens": 2, "disable_by_batch_size": limit}
    tokens, steps = draft_steps(LLM(TINY, max_num_seqs=48, speculative_config=cfg), prompts, params)
    assert tokens == [o.outputs[0].token_ids for o in plain]
    bound = SpeculativeConfig.parse(cfg).batch_limit("cpu")
    assert (sum(d for _, d in steps) > 0) == drafts_expected, steps
    if bound is not None:  # a step verifies drafts only if the step before it had few enough requests
        for (before, _), (_, drafts) in zip(steps, steps[1:]):
            assert not drafts or before <= bound, steps


@pytest.mark.parametrize("value, error", [(0, ValueError), (-3, ValueError), (True, TypeError), ("8", TypeError),
                                          (2.5, TypeError)])
def test_a_wrong_batch_limit_is_refused_naming_it(value, error):
    with pytest.raises(error, match="disable_by_batch_size"):
        SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": value})


@pytest.mark.parametrize("config", [{"method": "ngram"}, {"model": str(minivllm.TINY_DRAFT_MODEL_DIR)}])
def test_auto_means_the_methods_measured_limit_on_a_cpu_and_none_on_a_gpu(config):
    cfg = SpeculativeConfig.parse({**config, "num_speculative_tokens": 2})
    assert cfg.disable_by_batch_size == "auto"
    assert cfg.batch_limit("cpu") == CPU_DISABLE_BY_BATCH_SIZE[cfg.method] and cfg.batch_limit("cuda") is None
    assert set(CPU_DISABLE_BY_BATCH_SIZE) == {"ngram", "draft_model"}  # every method has its measured limit


def test_the_default_pool_holds_a_draft_models_lookahead_with_one_seat():
    """One seat of max_model_len tokens plus the draft's lookahead slots, by default."""
    llm = LLM(TINY, max_num_seqs=1, max_model_len=256,
              speculative_config={"model": str(minivllm.TINY_DRAFT_MODEL_DIR), "num_speculative_tokens": 4})
    out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) >= 1


def test_a_stop_among_accepted_drafts_ends_the_answer_there_and_the_step_reports_what_was_kept(reference_outputs):
    """A stop token that the target accepted as a draft ends the request at that token: the
    drafts after it and the token sampled after them are dropped, and the step reports only the
    tokens appended (its delta's ``new_token_ids``), which add up to the answer."""
    params, outs = reference_outputs
    prompt = PROMPTS[0]
    reference = outs[prompt]
    llm = LLM(TINY, seed=0, speculative_config={"model": str(minivllm.TINY_DRAFT_MODEL_DIR),
                                                 "num_speculative_tokens": 4, "disable_by_batch_size": None})
    steps = []
    local_core(llm).add_step_listener(steps.append)
    llm.generate([prompt], params, use_tqdm=False)
    # positions of accepted drafts that are not the last token of their step, whose token does
    # not appear earlier in the answer (so the answer with it as a stop ends right there)
    candidates, offset = [], 0
    for step in steps:
        for toks in step.new_token_ids.values():
            candidates += [offset + i for i in range(len(toks) - 1) if reference.index(reference[offset + i]) == offset + i]
            offset += len(toks)
    assert candidates, "no step kept a draft with a fresh token: the test needs one"
    stop_at = candidates[0]
    steps.clear()
    got = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=80, stop_token_ids=[reference[stop_at]]),
                       use_tqdm=False)[0].outputs[0]
    assert got.token_ids == reference[: stop_at + 1] and got.finish_reason == "stop"
    assert [t for step in steps for toks in step.new_token_ids.values() for t in toks] == got.token_ids
    assert_idle_and_empty(llm)
