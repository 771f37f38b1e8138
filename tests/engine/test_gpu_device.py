"""On a CUDA GPU: the engine against transformers, and the Triton backend against the PyTorch one.

* float32: greedy tokens identical to transformers' ``generate`` on the same GPU, for the
  ``torch`` and the ``triton`` backend (chunked prefill, decodes, prefix-cache hits);
* the GPU's own number format (``dtype="auto"``: bfloat16 from sm_80, float16 below): two
  attention implementations, or two engines, round differently and a near tie can flip a
  greedy token, so the check is on the next-token distributions over every prompt position:
  the top token agrees at almost every position and the log-probabilities stay close.

Skipped without a GPU (``scripts/gpu_check.sh`` runs it on one); the CPU suite checks the same
against transformers in float32 (``test_model_parity.py``, ``test_attention_backends.py``).
``MINIVLLM_TEST_DEVICE=cpu`` runs it on the CPU, to check the checks themselves.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pytest
import torch

import minivllm
from minivllm import LLM, SamplingParams
from minivllm.model.loader import auto_dtype

DEVICE = os.environ.get("MINIVLLM_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
pytestmark = pytest.mark.skipif(DEVICE is None, reason="needs a CUDA GPU (or MINIVLLM_TEST_DEVICE)")

MAX_TOKENS = 16
SETUP = dict(max_num_batched_tokens=48, max_model_len=256, num_kv_blocks=64, block_size=16,
             enable_prefix_caching=True, max_num_seqs=8)
# 16-bit against a reference: the share of prompt positions whose most likely next token must
# agree, and the largest allowed difference of a log-probability of that token (nats). A wrong
# kernel (a missed block, a wrong scale, a stale slot) moves both far beyond these.
MIN_TOP1_AGREEMENT = 0.95
MAX_LOGPROB_DIFF = 0.5


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(3)
    shared = [1] + [rng.randrange(3, 1900) for _ in range(36)]
    with_prefix = [shared + [rng.randrange(3, 1900) for _ in range(n)] for n in (1, 30, 75)]
    alone = [[1] + [rng.randrange(3, 1900) for _ in range(n)] for n in (0, 8, 17, 120)]
    return with_prefix + alone


def hf_model(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(minivllm.TINY_MODEL_DIR, dtype=dtype).to(DEVICE).eval()


def hf_greedy(model, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt], device=DEVICE)
    with torch.no_grad():
        # no EOS at all, as ignore_eos=True (min_new_tokens with an EOS id would mask EOS out)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                             min_new_tokens=MAX_TOKENS, eos_token_id=None, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def engine_greedy(backend: str, dtype: str, prompts: list[list[int]]) -> list[list[int]]:
    llm = LLM(attention_backend=backend, device=DEVICE, dtype=dtype, **SETUP)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats().prefix_hit_rate > 0, "later prompts should reuse the shared prefix"
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_float32_greedy_tokens_equal_transformers(backend, prompts):
    model = hf_model(torch.float32)
    want = [hf_greedy(model, p) for p in prompts]
    got = engine_greedy(backend, "float32", prompts)
    differ = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    assert not differ, f"{backend} on {DEVICE}: prompts {differ} differ from transformers"


@dataclass
class PromptScores:
    """Per prompt position ``p >= 1``: the log-probability of the prompt's token ``p`` and the
    most likely token at ``p`` (what the model would have said there)."""

    token_logprob: torch.Tensor  # [positions] float64
    top_token: torch.Tensor  # [positions] int64


def engine_scores(backend: str, dtype: str, prompts: list[list[int]]) -> PromptScores:
    """Through the engine's ``prompt_logprobs`` (prompts chunked under the token budget and
    mixed with other requests' steps)."""
    llm = LLM(attention_backend=backend, device=DEVICE, dtype=dtype, **SETUP)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    token_lp, top = [], []
    for prompt, out in zip(prompts, llm.generate(prompts, params, use_tqdm=False), strict=True):
        for token, position in zip(prompt[1:], out.prompt_logprobs[1:], strict=True):
            token_lp.append(position[token].logprob)
            top.append(next(t for t, lp in position.items() if lp.rank == 1))
    return PromptScores(torch.tensor(token_lp, dtype=torch.float64), torch.tensor(top))


def hf_scores(model, prompts: list[list[int]]) -> PromptScores:
    token_lp, top = [], []
    with torch.no_grad():
        for prompt in prompts:
            logprobs = model(torch.tensor([prompt], device=DEVICE)).logits[0, :-1].double().log_softmax(-1).cpu()
            token_lp.append(logprobs.gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1))
            top.append(logprobs.argmax(-1))
    return PromptScores(torch.cat(token_lp), torch.cat(top))


def compare(got: PromptScores, want: PromptScores, what: str) -> None:
    agreement = (got.top_token == want.top_token).double().mean().item()
    diff = (got.token_logprob - want.token_logprob).abs().max().item()
    print(f"{what}: top-1 agreement {agreement:.4f} over {len(want.top_token)} positions, largest "
          f"difference of a prompt token's log-probability {diff:.4f}")
    assert agreement >= MIN_TOP1_AGREEMENT and diff <= MAX_LOGPROB_DIFF, what


def test_backends_agree_in_this_gpus_number_format(prompts):
    dtype = str(auto_dtype(torch.device(DEVICE))).removeprefix("torch.")
    compare(engine_scores("triton", dtype, prompts), engine_scores("torch", dtype, prompts),
            f"triton vs torch backend, {dtype} on {DEVICE}")


def test_engine_agrees_with_transformers_in_this_gpus_number_format(prompts):
    dtype = auto_dtype(torch.device(DEVICE))
    want = hf_scores(hf_model(dtype), prompts)
    name = str(dtype).removeprefix("torch.")
    for backend in ("torch", "triton"):
        compare(engine_scores(backend, name, prompts), want, f"minivllm ({backend}) vs transformers, {name}")


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_decoding_keeps_the_greedy_tokens(prompts, method, kv_cache_dtype):
    """The Triton kernels verify drafts (short prefills over a cached context) and run the draft
    model: greedy tokens equal the same engine's without drafts, in float32, with either cache."""
    config = ({"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": None} if method == "ngram"
              else {"model": str(minivllm.TINY_DRAFT_MODEL_DIR), "num_speculative_tokens": 4, "disable_by_batch_size": None})
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    runs = {}
    for spec in (None, config):
        llm = LLM(attention_backend="triton", device=DEVICE, dtype="float32", kv_cache_dtype=kv_cache_dtype,
                  speculative_config=spec, **SETUP)
        runs[spec is None] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        if spec is not None:
            summary = llm.stats().summary()
            print(f"{method}, {kv_cache_dtype} cache on {DEVICE}: acceptance {summary['spec_acceptance_rate']:.3f}, "
                  f"{summary['output_tokens_per_step']:.2f} tokens per step")
    assert runs[False] == runs[True]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_decode_step_synchronises_within_its_budget_on_the_gpu(backend, prompts):
    """The GPU's own count of what ``tests/engine/test_host_syncs.py`` counts on the CPU: with
    ``torch.cuda.set_sync_debug_mode("warn")`` every synchronising CUDA call of a decode step
    warns once. Printed per backend; held to the same budget as the CPU count."""
    import warnings

    from minivllm.engine.host_syncs import DECODE_SYNC_BUDGET

    if not str(DEVICE).startswith("cuda"):
        pytest.skip("counts CUDA synchronisations")
    llm = LLM(attention_backend=backend, device=DEVICE, dtype="float32", **SETUP)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i, prompt in enumerate(prompts[:4]):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    for _ in range(3):  # the prompts, then decodes
        engine.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    print(f"{backend}: {len(syncs)} synchronising CUDA calls in a decode step of 4 requests")
    for text in syncs:
        print("   ", text.splitlines()[0][:160])
    assert len(syncs) <= DECODE_SYNC_BUDGET, syncs
