"""minivllm's decoder against Hugging Face transformers, in float32.

Logits of a ragged batch prefilled in one flat pass, logits of token-by-token decoding against
the paged cache, and 64 greedy tokens, for the shipped tiny model and random Llama 2/3 (with
llama3 RoPE scaling), Qwen2, Qwen3 and Mistral checkpoints.
"""

from __future__ import annotations

import random

import pytest
import torch
from support import FAMILIES, hf_greedy

import minivllm
from minivllm import LLM, SamplingParams
from minivllm.attention import AttentionMetadata
from minivllm.model import ModelConfig, UnsupportedModelError, load_model

BLOCK = 16
ATOL = 1e-4


def _page_layout(lens: list[int], num_blocks: int, seed: int):
    """Scatter each sequence over a random permutation of physical blocks."""
    perm = random.Random(seed).sample(range(num_blocks), num_blocks)
    tables, k = [], 0
    for n in lens:
        nb = -(-n // BLOCK)
        tables.append(perm[k : k + nb])
        k += nb
    return tables


def _slots(table: list[int], positions) -> list[int]:
    return [table[p // BLOCK] * BLOCK + p % BLOCK for p in positions]


def _prompts(vocab: int, lens: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lens]


def _check_prefill_and_decode(model, hf, vocab: int) -> None:
    lens = [1, 7, 16, 17, 45, 130]
    prompts = _prompts(vocab, lens, seed=1)
    decode_steps = 5
    tables = _page_layout([n + decode_steps for n in lens], 96, seed=2)
    model.allocate_kv_cache(96, BLOCK)
    # 1. one flat prefill of every prompt
    meta = AttentionMetadata.build(
        lens, lens, tables, sum((_slots(t, range(n)) for t, n in zip(tables, lens)), []), BLOCK
    )
    ids = torch.tensor(sum(prompts, []))
    pos = torch.cat([torch.arange(n) for n in lens])
    with torch.no_grad():
        got = model.compute_logits(model(ids, pos, meta))
        want = torch.cat([hf(torch.tensor([p])).logits[0] for p in prompts])
    assert (got - want).abs().max().item() <= ATOL
    # 2. token-by-token decode against the cache, every sequence in one flat batch per step
    seqs = [list(p) for p in prompts]
    for step in range(decode_steps):
        new = [int(torch.randint(3, vocab, (1,), generator=torch.Generator().manual_seed(step * 7 + i)))
               for i in range(len(seqs))]
        cur = [len(s) for s in seqs]
        meta = AttentionMetadata.build(
            [1] * len(seqs), [c + 1 for c in cur], tables,
            [_slots(t, [c])[0] for t, c in zip(tables, cur)], BLOCK,
        )
        with torch.no_grad():
            got = model.compute_logits(model(torch.tensor(new), torch.tensor(cur), meta))
        for s, t in zip(seqs, new):
            s.append(t)
        with torch.no_grad():
            want = torch.stack([hf(torch.tensor([s])).logits[0, -1] for s in seqs])
        assert (got - want).abs().max().item() <= ATOL, f"decode step {step}"


@pytest.mark.parametrize("family", FAMILIES)
def test_random_checkpoint_logits_match_transformers(random_checkpoints, family):
    path, hf = random_checkpoints[family]
    model, _ = load_model(path, dtype="float32", device="cpu", attention_backend="torch")
    _check_prefill_and_decode(model, hf, model.config.vocab_size)


def test_tiny_model_logits_match_transformers(tiny_hf_model):
    model, _ = load_model(minivllm.TINY_MODEL_DIR, dtype="float32", device="cpu")
    _check_prefill_and_decode(model, tiny_hf_model, model.config.vocab_size)


@pytest.mark.parametrize("family", FAMILIES)
def test_random_checkpoint_greedy_64_tokens(random_checkpoints, family):
    path, hf = random_checkpoints[family]
    prompts = _prompts(hf.config.vocab_size, [3, 29, 64, 100], seed=3)
    llm = LLM(str(path), max_model_len=512)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True), use_tqdm=False)
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, 64, eos=None)


def test_tiny_model_greedy_64_tokens(tiny_hf_model):
    llm = LLM()
    texts = ["Once upon a time", "The little fox", "Tom went to the", "Q: What color is the sky?"]
    outs = llm.generate(texts, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True), use_tqdm=False)
    for o in outs:
        assert o.outputs[0].token_ids == hf_greedy(tiny_hf_model, o.prompt_token_ids, 64, eos=None)


def test_config_reads_both_rope_formats():
    base = dict(architectures=["LlamaForCausalLM"], vocab_size=10, hidden_size=8, intermediate_size=16,
                num_hidden_layers=1, num_attention_heads=2)
    old = ModelConfig.from_dict({**base, "rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                 "original_max_position_embeddings": 64}})
    new = ModelConfig.from_dict({**base, "rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0,
                                 "original_max_position_embeddings": 64}})
    assert old.rope_theta == new.rope_theta == 5e5
    assert old.rope_scaling == new.rope_scaling
    assert old.num_kv_heads == 2 and old.head_dim == 4


def test_unsupported_architecture_is_named():
    cfg = dict(architectures=["GPT2LMHeadModel"], vocab_size=10, hidden_size=8, intermediate_size=16,
               num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        ModelConfig.from_dict(cfg)


def test_missing_model_error_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)
