"""The whole decoder with the "triton" backend gives the logits it gives with the "torch" backend.

A small randomly initialised Llama-family model (GQA, Qwen3-style q/k norms, and a plain
Llama variant with a head_dim that is not a power of two) runs three engine-like steps over
one paged cache: chunked prefill, a mixed step (decode tokens next to a prompt's second
chunk), and a decode-only step, which takes the decode kernel's path.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.attention import AttentionMetadata, TorchAttentionBackend
from minivllm.attention.testing import DEFAULT_DEVICE as DEVICE

model_mod = pytest.importorskip("minivllm.model")
LlamaFamilyModel, ModelConfig = model_mod.LlamaFamilyModel, model_mod.ModelConfig
from minivllm.attention.triton_backend import TritonAttentionBackend  # noqa: E402

BLOCK_SIZE = 16

CONFIGS = {
    "qwen3-gqa4": dict(model_type="qwen3", hidden_size=128, intermediate_size=256, num_attention_heads=4,
                       num_key_value_heads=1, head_dim=64),
    "llama-gqa2-d80": dict(model_type="llama", hidden_size=160, intermediate_size=256, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=80),
}

# Three sequences with prompts of 20, 37 and 5 tokens. Each step: {seq: number of new tokens}.
STEPS = [
    {0: 20, 1: 16, 2: 5},  # prompts; sequence 1 only gets its first chunk
    {0: 1, 1: 21, 2: 1},  # decode tokens next to sequence 1's second chunk
    {0: 1, 1: 1, 2: 1},  # decode only: the decode kernel
]


def make_model(name: str) -> LlamaFamilyModel:
    cfg = ModelConfig.from_dict(dict(CONFIGS[name], vocab_size=300, num_hidden_layers=2, rms_norm_eps=1e-6,
                                     max_position_embeddings=256))
    torch.manual_seed(0)
    return LlamaFamilyModel(cfg, TorchAttentionBackend()).to(DEVICE).eval()


def run_steps(model: LlamaFamilyModel, backend, tokens: dict[int, list[int]], tables: dict[int, list[int]]):
    """Run STEPS with ``backend`` on fresh caches; returns the logits of every step."""
    model.set_attention_backend(backend)
    num_blocks = 1 + max(b for t in tables.values() for b in t)
    model.allocate_kv_cache(num_blocks, BLOCK_SIZE, dtype=torch.float32)
    done = {s: 0 for s in tokens}
    all_logits = []
    for step in STEPS:
        ids, positions, slots, query_lens, seq_lens, step_tables = [], [], [], [], [], []
        for seq, n in step.items():
            for pos in range(done[seq], done[seq] + n):
                ids.append(tokens[seq][pos])
                positions.append(pos)
                slots.append(tables[seq][pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
            done[seq] += n
            query_lens.append(n)
            seq_lens.append(done[seq])
            step_tables.append(tables[seq][: -(-done[seq] // BLOCK_SIZE)])
        meta = AttentionMetadata.build(query_lens, seq_lens, step_tables, slots, BLOCK_SIZE, device=DEVICE)
        with torch.no_grad():
            hidden = model(torch.tensor(ids, device=DEVICE), torch.tensor(positions, device=DEVICE), meta)
            all_logits.append(model.compute_logits(hidden))
    return all_logits


@pytest.mark.parametrize("name", list(CONFIGS))
def test_triton_backend_logits_match_torch_backend(name):
    model = make_model(name)
    gen = torch.Generator().manual_seed(1)
    total = {s: sum(step[s] for step in STEPS) for s in STEPS[0]}  # tokens each sequence ends with
    tokens = {s: torch.randint(0, 300, (n,), generator=gen).tolist() for s, n in total.items()}
    # Random, interleaved physical blocks for each sequence.
    needed = {s: -(-n // BLOCK_SIZE) for s, n in total.items()}
    perm = torch.randperm(sum(needed.values()) + 2, generator=gen).tolist()
    tables, start = {}, 0
    for s in total:
        tables[s] = perm[start : start + needed[s]]
        start += needed[s]

    expected = run_steps(model, TorchAttentionBackend(), tokens, tables)
    got = run_steps(model, TritonAttentionBackend(), tokens, tables)
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=lambda m, step=step: f"step {step}: {m}")
        assert torch.equal(a.argmax(-1), b.argmax(-1))


# The same requests through the whole engine (scheduler, paged KV manager, model runner) with
# each backend. Greedy token ids must be identical.
ENGINE_SETUPS = {  # a small pool: on a GPU the default would take half its memory
    "prefix_caching_chunked": dict(max_num_batched_tokens=24),  # prompts split into chunks
    "static_batching": dict(scheduler="static", max_num_seqs=4),  # padded prompts, padding slots
}
POOL = dict(num_kv_blocks=32, max_model_len=128)


@pytest.mark.parametrize("setup", list(ENGINE_SETUPS))
def test_engine_greedy_tokens_match_torch_backend(setup, tmp_path):
    support = pytest.importorskip("support")
    from minivllm import LLM, SamplingParams

    support.save_random_checkpoint(tmp_path, "qwen3")  # GQA 4:1, head_dim 32
    prefix = [1] + list(range(10, 45))  # 36 tokens shared by two prompts: a prefix-cache hit
    prompts = [[1, 7, 8, 9, 10], prefix + [50, 51, 52], prefix + [60], [1] + list(range(100, 117))]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    tokens = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(tmp_path), attention_backend=backend, device=DEVICE.type, dtype="float32",
                  **ENGINE_SETUPS[setup], **POOL)
        tokens[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens["triton"] == tokens["torch"]
    assert all(len(t) == 6 for t in tokens["triton"])
