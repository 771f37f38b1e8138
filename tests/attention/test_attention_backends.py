"""The attention backends inside the engine: transformers' greedy tokens, whatever the pool holds.

The workload exercises every kind of row the ragged backend distinguishes: prompts sharing a
prefix (prefix-cache hits: chunks after cached context), a token budget that chunks prompts
and mixes them with decodes, a pool small enough to preempt and recompute, and the static
batching baseline (padding rows with slot -1, idle seats).

Then the contract every backend keeps: attention never lets a slot its sequence does not own
into the result. A freed block keeps its previous owner's values -- NaN or inf after an
overflow -- so a pool filled with NaN (or inf) before a run must give the very tokens a clean
pool gives, in every backend.
"""

from __future__ import annotations

import random

import pytest
import torch
from support import hf_greedy

from minivllm import LLM, SamplingParams, attention
from minivllm.config import ATTENTION_BACKENDS
from minivllm.engine.core_client import local_core

MAX_TOKENS = 12
TORCH_BACKENDS = ["cpp", "torch", "torch_padded"]
SETUPS = {  # float32 on any device: transformers' tokens are computed in float32
    "chunked_prefix_preempt": dict(max_num_batched_tokens=48, num_kv_blocks=22, max_model_len=256,
                                   block_size=16, enable_prefix_caching=True, dtype="float32"),
    "static_batching": dict(scheduler="static", max_num_seqs=4, dtype="float32", num_kv_blocks=64,
                            max_model_len=256),
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
    """The engine's argument accepts exactly the backends the attention package builds."""
    assert ATTENTION_BACKENDS == ("auto", *attention.BACKENDS) == ("auto", "cpp", "torch", "torch_padded", "triton")


@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("backend", TORCH_BACKENDS)
def test_greedy_tokens_match_transformers(backend, setup, prompts, hf_tokens):
    llm = LLM(attention_backend=backend, debug_checks=True, **SETUPS[setup])
    assert local_core(llm).executor.model.attention_layers[0].backend.name == backend
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
    assert local_core(llm).kv.num_used_blocks == 0


# --- a pool that starts poisoned ------------------------------------------------------------
POISON_SETUPS = {
    # chunks of at most 32 tokens next to decodes; later prompts hit the cached shared prefix
    "chunked_prefix": dict(max_num_batched_tokens=32, num_kv_blocks=40, max_model_len=192, block_size=16,
                           enable_prefix_caching=True, max_num_seqs=4),
    # padded prompts (slot -1 rows inside a sequence) and idle seats
    "static_batching": dict(scheduler="static", max_num_seqs=4, num_kv_blocks=40, max_model_len=192),
}


def poison_prompts(tails: tuple[int, ...] = (1, 19, 52)) -> list[list[int]]:
    """Four prompts of mixed lengths; three share a 35-token prefix (two full blocks), with tails
    of ``tails`` tokens (a partial block, a third block, blocks past the shared ones)."""
    rng = random.Random(11)
    shared = [1] + [rng.randrange(3, 1900) for _ in range(34)]
    parts = [[rng.randrange(3, 1900) for _ in range(n)] for n in tails]
    return [shared + parts[0], [1] + [rng.randrange(3, 1900) for _ in range(6)], shared + parts[1], shared + parts[2]]


# the Triton interpreter is slow on a CPU: shorter tails, the same shapes of sharing and padding
TRITON_TAILS = (1, 14, 30)


def serve(backend: str, setup: str, fill: float | None, max_tokens: int, tails: tuple[int, ...] = (1, 19, 52)):
    """Greedy tokens of the four prompts, and the engine's stats, with every slot of every
    layer's K/V cache set to ``fill`` before the run (``None``: the zeroed pool as allocated)."""
    llm = LLM(attention_backend=backend, dtype="float32", **POISON_SETUPS[setup])
    if fill is not None:
        for k_cache, v_cache in local_core(llm).executor.kv_caches:
            k_cache.fill_(fill)
            v_cache.fill_(fill)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate(poison_prompts(tails), params, use_tqdm=False)
    assert all(o.outputs[0].finish_reason == "length" for o in outs), [o.outputs[0].error for o in outs]
    return [o.outputs[0].token_ids for o in outs], llm.stats()


def _poison_cases():
    for backend in ("cpp", "torch", "torch_padded", "triton"):
        for setup in POISON_SETUPS:
            # the slowest case (the Triton interpreter over padded static batches): the kernels'
            # padding rows are held to the contract with NaN by test_backends_vs_sdpa.py, and the
            # engine runs Triton over a poisoned pool in the chunked, prefix-sharing case below
            slow = backend == "triton" and setup == "static_batching"
            yield pytest.param(backend, setup, marks=pytest.mark.slow) if slow else (backend, setup)


@pytest.mark.parametrize("backend, setup", list(_poison_cases()))
def test_a_poisoned_pool_changes_no_token(backend, setup):
    triton = backend == "triton"
    max_tokens, tails = (5, TRITON_TAILS) if triton else (10, (1, 19, 52))
    # Triton's clean tokens are the ragged backend's (tests/attention/test_engine_triton.py: the
    # two give the same greedy tokens), so the slow interpreter runs only the poisoned pool
    clean, stats = serve("torch" if triton else backend, setup, None, max_tokens, tails)
    if setup == "chunked_prefix":
        assert stats.prefix_hit_rate > 0, "later prompts should reuse the shared prefix"
        assert any(s.num_prefill_tokens and s.num_decode_tokens for s in stats.steps), "no mixed step"
        assert max(s.batch_tokens for s in stats.steps) <= 32, "prompts should be chunked"
    else:
        assert stats.summary()["padding_tokens"] > 0
    # NaN alone under the (slow) Triton interpreter here: tests/attention fill the kernels' unowned
    # slots with NaN, inf and -inf directly
    fills = (float("nan"),) if backend == "triton" else (float("nan"), float("inf"))
    for fill in fills:
        poisoned, _ = serve(backend, setup, fill, max_tokens, tails)
        differ = [i for i, (a, b) in enumerate(zip(clean, poisoned, strict=True)) if a != b]
        assert not differ, f"{backend}: prompts {differ} change when the pool starts as {fill}"


# --- the backend is chosen once and says what cache it needs ------------------------------------
def test_triton_refuses_small_blocks_when_the_engine_is_built():
    with pytest.raises(ValueError, match="power-of-two block_size >= 16, got block_size=8"):
        LLM(attention_backend="triton", block_size=8, num_kv_blocks=16, max_model_len=64)


class PickyBackend:
    """A plug-in that serves with the ragged backend but reads only caches of 32-token blocks."""

    name = "picky"

    def __init__(self):
        self.inner = attention.TorchAttentionBackend()
        self.asked = []

    def check_kv_cache(self, block_size, dtype, device):
        self.asked.append((block_size, dtype, device.type))
        if block_size != 32:
            raise ValueError(f"picky needs block_size=32, got block_size={block_size}")

    def forward(self, query, key, value, k_cache, v_cache, meta, scale):
        return self.inner.forward(query, key, value, k_cache, v_cache, meta, scale)


def test_a_plugin_backend_is_used_as_given_and_asked_about_its_cache(monkeypatch):
    """The model is built with the plug-in itself (no built-in backend made first and swapped
    out), and the plug-in's own requirement is checked before anything is served."""
    import minivllm.model.loader as loader

    def no_builtin(*args, **kwargs):
        raise AssertionError("a built-in backend was made for an engine given its own")

    monkeypatch.setattr(loader, "get_attention_backend", no_builtin)
    picky = PickyBackend()
    with pytest.raises(ValueError, match="picky needs block_size=32, got block_size=16"):
        LLM(attention_backend=picky, num_kv_blocks=16, max_model_len=64, device="cpu")
    llm = LLM(attention_backend=picky, block_size=32, num_kv_blocks=8, max_model_len=64, device="cpu",
              dtype="float32")
    assert picky.asked[-1] == (32, torch.float32, "cpu")
    assert all(layer.backend is picky for layer in local_core(llm).executor.model.attention_layers)
    out = llm.generate([[1, 5, 6, 7]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
