"""The whole decoder stack in one C++ call (``minivllm/model/decoder_stack.py``) against the same
model run module by module.

The kernel calls the operators the modules call, in their order, so the hidden states and
every byte written to the caches must be the module path's to the bit. It must also decline
every step it does not cover (a prompt, a padding slot, an 8-bit cache, a backend other than
``"cpp"`` itself), which then runs the modules; and a model built with PyTorch's layer ops
never gets it.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import minivllm
from minivllm.attention import AttentionMetadata, get_attention_backend
from minivllm.attention.cpp_backend import CppAttentionBackend
from minivllm.cpu_kernels import kernel_status
from minivllm.model import load_model
from minivllm.model.decoder_stack import CpuDecoderStack
from minivllm.model.layer_ops import TorchLayerOps, layer_ops_for
from minivllm.model.llama import LlamaFamilyModel

pytestmark = pytest.mark.skipif(kernel_status() is not None,
                                reason=f"the CPU kernels do not build here: {kernel_status()}")

BLOCK = 16


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _step(query_lens, seq_lens, seed=0, pad_last=0):
    """A step's metadata and inputs: each sequence's last ``query_lens[i]`` positions of
    ``seq_lens[i]``, in blocks of its own; ``pad_last`` padding rows (slot -1) at the end."""
    tables, slots, positions, first = [], [], [], 1
    for q, s in zip(query_lens, seq_lens, strict=True):
        n = -(-s // BLOCK)
        tables.append(list(range(first, first + n)))
        first += n
        slots += [tables[-1][p // BLOCK] * BLOCK + p % BLOCK for p in range(s - q, s)]
        positions += range(s - q, s)
    slots[len(slots) - pad_last:] = [-1] * pad_last
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, slots, BLOCK)
    ids = torch.randint(3, 1976, (len(positions),), generator=_gen(seed))
    return ids, torch.tensor(positions), meta, first


def _both_ways(model, query_lens, seq_lens, cache_dtype=None, pad_last=0):
    """(hidden, caches) with the stack as it is, then with the modules, from the same random
    caches; and whether the stack took the step."""
    ids, positions, meta, num_blocks = _step(query_lens, seq_lens, pad_last=pad_last)
    caches = model.allocate_kv_cache(num_blocks + 1, BLOCK, dtype=cache_dtype)
    start = []
    for i, (k, v) in enumerate(caches):
        if k.dtype.is_floating_point:
            k.normal_(generator=_gen(2 * i)), v.normal_(generator=_gen(2 * i + 1))
        start.append((k.clone(), v.clone()))
    stack, results, taken = model.decoder_stack, [], []
    for use in (stack, None):
        for (k, v), (k0, v0) in zip(caches, start, strict=True):
            k.copy_(k0), v.copy_(v0)
        model.decoder_stack = use
        meta.backend_cache.clear()
        if use is not None:
            x = model.model.embed_tokens(ids)
            cos, sin = model.rotary.cos_sin(positions, x.dtype)
            taken.append(use.forward(model, x, cos, sin, meta) is not None)
            for (k, v), (k0, v0) in zip(caches, start, strict=True):
                k.copy_(k0), v.copy_(v0)
            meta.backend_cache.clear()
        with torch.inference_mode():
            hidden = model(ids, positions, meta)
        results.append((hidden, [(k.clone(), v.clone()) for k, v in caches]))
    model.decoder_stack = stack
    return results[0], results[1], taken[0]


def _same(a, b) -> bool:
    (ha, ca), (hb, cb) = a, b
    return torch.equal(ha, hb) and all(torch.equal(x, y) and torch.equal(u, w) for (x, u), (y, w) in zip(ca, cb))


@pytest.fixture(scope="module", params=["target", "draft"])
def model(request):
    path = minivllm.TINY_MODEL_DIR if request.param == "target" else minivllm.TINY_DRAFT_MODEL_DIR
    net, _ = load_model(path, dtype="float32", device="cpu", attention_backend="cpp")
    assert isinstance(net.decoder_stack, CpuDecoderStack)
    return net


@pytest.mark.parametrize("query_lens, seq_lens", [
    ([1], [1]),  # the first decode of a one-token prompt
    ([1], [50]),  # one decode
    ([1, 1, 1], [17, 33, 200]),  # a decode batch
    ([5], [23]),  # a verification of 4 drafts
    ([1, 5, 3], [40, 23, 70]),  # a decode, a verification, a short chunk over a cached context
])
def test_the_stack_equals_the_modules_to_the_bit(model, query_lens, seq_lens):
    with_stack, with_modules, taken = _both_ways(model, query_lens, seq_lens)
    assert taken
    assert _same(with_stack, with_modules)


def test_a_family_with_biases_and_qk_norms_too():
    """Qwen2's q/k/v biases and Qwen3's per-head q and k norms, on a random model with
    biases everywhere and 4 query heads per KV head."""
    tiny, _ = load_model(minivllm.TINY_MODEL_DIR, dtype="float32", device="cpu")
    cfg = dataclasses.replace(tiny.config, qkv_bias=True, o_bias=True, mlp_bias=True, qk_norm=True,
                              num_heads=8, num_kv_heads=2, head_dim=16, num_layers=2)
    net = LlamaFamilyModel(cfg, get_attention_backend("cpp", "cpu"), layer_ops_for(torch.device("cpu"), torch.float32))
    with torch.no_grad():
        for i, p in enumerate(net.parameters()):
            p.copy_(torch.randn(p.shape, generator=_gen(i)) * 0.2 + (1.0 if p.dim() == 1 and p.shape[0] <= 64 else 0.0))
    with_stack, with_modules, taken = _both_ways(net, [1, 4], [30, 12])
    assert taken
    assert _same(with_stack, with_modules)


def test_half_precision_caches(model):
    """A float32 model over a bfloat16 cache: rows are cast as the modules cast them."""
    with_stack, with_modules, taken = _both_ways(model, [1, 3], [20, 41], cache_dtype=torch.bfloat16)
    assert taken
    assert _same(with_stack, with_modules)


@pytest.mark.parametrize("case", ["prompt", "padding", "int8"])
def test_steps_it_does_not_cover_run_the_modules(model, case):
    """A prompt needs SDPA, a padding slot is not stored, an 8-bit cache is quantised as it is
    written: the stack declines, and the step is the module path's."""
    query_lens, seq_lens = ([1, 40], [30, 40]) if case == "prompt" else ([1, 2], [30, 12])
    with_stack, with_modules, taken = _both_ways(model, query_lens, seq_lens,
                                                 cache_dtype=torch.int8 if case == "int8" else None,
                                                 pad_last=1 if case == "padding" else 0)
    assert not taken
    assert _same(with_stack, with_modules)


def test_another_backend_runs_its_own_forward(model):
    """A subclass of the ``"cpp"`` backend (a student's, a counting wrapper) must be called:
    the stack never takes its steps."""
    calls = []

    class Counting(CppAttentionBackend):
        def forward(self, *args, **kwargs):
            calls.append(1)
            return super().forward(*args, **kwargs)

    backend = model.attention_backend
    model.set_attention_backend(Counting())
    try:
        ids, positions, meta, num_blocks = _step([1], [9])
        model.allocate_kv_cache(num_blocks + 1, BLOCK)
        with torch.inference_mode():
            model(ids, positions, meta)
    finally:
        model.set_attention_backend(backend)
    assert len(calls) == model.config.num_layers


def test_weights_changed_after_the_first_step_are_the_ones_used(model):
    """The stack finds each tensor's place once, but reads the tensor at every call."""
    ids, positions, meta, num_blocks = _step([1], [9])
    model.allocate_kv_cache(num_blocks + 1, BLOCK)
    with torch.inference_mode():
        before = model(ids, positions, meta)
    weight = model.model.layers[-1].mlp.down_proj.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(2.0)
        meta.backend_cache.clear()
        with torch.inference_mode():
            after = model(ids, positions, meta)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert not torch.equal(before, after)


def _passes_one_by_one(model, feeds, starts, tables, num_steps):
    """What a greedy draft model's proposer does without the chain: a forward pass per token."""
    tokens: list[list[int]] = [[] for _ in feeds]
    for j in range(num_steps):
        now = feeds if j == 0 else [[t[-1]] for t in tokens]
        firsts = starts if j == 0 else [s + len(f) + j - 1 for s, f in zip(starts, feeds, strict=True)]
        lens = [len(f) for f in now]
        pos = [p for s, n in zip(firsts, lens, strict=True) for p in range(s, s + n)]
        slots = [t[p // BLOCK] * BLOCK + p % BLOCK
                 for t, s, n in zip(tables, firsts, lens, strict=True) for p in range(s, s + n)]
        meta = AttentionMetadata.build(lens, [s + n for s, n in zip(firsts, lens, strict=True)], tables, slots, BLOCK)
        with torch.inference_mode():
            hidden = model(torch.tensor([t for f in now for t in f]), torch.tensor(pos), meta)
        last = torch.tensor(lens).cumsum(0) - 1
        for i, tok in enumerate(model.compute_logits(hidden[last]).argmax(-1).tolist()):
            tokens[i].append(tok)
    return tokens


@pytest.mark.parametrize("feeds, num_steps", [
    ([[7]], 1),  # one pass: only the first
    ([[7]], 6),
    ([[7, 9], [4], [11, 12]], 4),  # the last token and a kept draft, or the corrected token alone
])
def test_greedy_draft_steps_are_the_passes_one_by_one(model, feeds, num_steps):
    """The chained passes give the tokens and the cache bytes of a forward pass per token."""
    starts = [21, 40, 3][: len(feeds)]
    tables = [list(range(1 + 4 * i, 5 + 4 * i)) for i in range(len(feeds))]
    caches = model.allocate_kv_cache(4 * len(feeds) + 1, BLOCK)
    for i, (k, v) in enumerate(caches):
        k.normal_(generator=_gen(2 * i)), v.normal_(generator=_gen(2 * i + 1))
    start = [(k.clone(), v.clone()) for k, v in caches]
    with torch.inference_mode():
        chained = model.decoder_stack.greedy_steps(model, feeds, starts, tables, BLOCK, num_steps)
    after_chain = [(k.clone(), v.clone()) for k, v in caches]
    for (k, v), (k0, v0) in zip(caches, start, strict=True):
        k.copy_(k0), v.copy_(v0)
    assert chained == _passes_one_by_one(model, feeds, starts, tables, num_steps)
    assert all(torch.equal(k, k1) and torch.equal(v, v1) for (k, v), (k1, v1) in zip(caches, after_chain, strict=True))


def test_greedy_draft_steps_decline_a_prompt(model):
    """A first feed long enough to be a prompt needs SDPA: the caller runs the passes itself."""
    model.allocate_kv_cache(8, BLOCK)
    assert model.decoder_stack.greedy_steps(model, [list(range(3, 40))], [0], [[1, 2, 3]], BLOCK, 3) is None


def test_a_model_with_pytorch_layer_ops_has_no_stack():
    tiny, _ = load_model(minivllm.TINY_MODEL_DIR, dtype="float32", device="cpu")
    assert LlamaFamilyModel(tiny.config, tiny.attention_backend, TorchLayerOps()).decoder_stack is None


def test_the_kernel_names_what_it_refuses(model):
    kernels = model.decoder_stack.kernels
    x = torch.zeros(1, model.config.hidden_size)
    with pytest.raises(RuntimeError, match="expected 12 tensors and one K and one V cache per layer"):
        kernels.decoder_stack(x, x, x, [], [torch.zeros(1)], [], torch.zeros(1, dtype=torch.long),
                              x, x, x, 1, 1, 1, 1.0, 1e-6, x)
    with pytest.raises(RuntimeError, match="one int64 slot per row"):
        kernels.decoder_stack(x, x, x, [], [], [], torch.zeros(2, dtype=torch.long), x, x, x, 1, 1, 1, 1.0, 1e-6, x)
