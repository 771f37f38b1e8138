"""Both PyTorch attention backends inside the engine give transformers' greedy tokens.

The workload exercises every kind of row the ragged backend distinguishes: prompts sharing a
prefix (prefix-cache hits: chunks after cached context), a token budget that chunks prompts
and mixes them with decodes, a pool small enough to preempt and recompute, and the static
batching baseline (padding rows with slot -1, idle seats).
"""

from __future__ import annotations

import random

import pytest
from support import hf_greedy

from minivllm import LLM, SamplingParams
from minivllm.attention import ATTENTION_BACKENDS

MAX_TOKENS = 12
BACKENDS = ["torch", "torch_padded"]
SETUPS = {
    "chunked_prefix_preempt": dict(max_num_batched_tokens=48, num_kv_blocks=22, max_model_len=256,
                                   block_size=16, enable_prefix_caching=True),
    "static_batching": dict(scheduler="static", max_num_seqs=4),
}


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(7)
    shared = [1] + [rng.randrange(3, 1900) for _ in range(40)]  # two full blocks and a bit
    with_prefix = [shared + [rng.randrange(3, 1900) for _ in range(rng.randint(1, 60))] for _ in range(6)]
    alone = [[1] + [rng.randrange(3, 1900) for _ in range(n)] for n in (0, 15, 16, 90)]
    return with_prefix + alone


@pytest.fixture(scope="module")
def hf_tokens(tiny_hf_model, prompts):
    return [hf_greedy(tiny_hf_model, p, MAX_TOKENS, eos=None) for p in prompts]


def test_backend_names():
    assert ATTENTION_BACKENDS == ("auto", "torch", "torch_padded", "triton")


@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_tokens_match_transformers(backend, setup, prompts, hf_tokens):
    llm = LLM(attention_backend=backend, debug_checks=True, **SETUPS[setup])
    assert llm.engine.model.attention_layers[0].backend.name == backend
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    mismatched = [i for i, (g, want) in enumerate(zip(got, hf_tokens, strict=True)) if g != want]
    assert not mismatched, f"prompts {mismatched} differ from transformers with {backend}"
    stats = llm.stats()
    if setup == "chunked_prefix_preempt":
        assert stats.summary()["preemptions"] > 0, "the pool should be small enough to preempt"
        assert stats.prefix_hit_rate > 0, "the shared prefix should be reused"
        mixed = [s for s in stats.steps if s.num_prefill_tokens and s.num_decode_tokens]
        assert mixed, "some steps should mix prompt chunks with decodes"
    else:
        assert stats.summary()["padding_tokens"] > 0
    assert llm.engine.kv.num_used_blocks == 0
