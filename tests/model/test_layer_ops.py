"""The decoder layer's per-token operations in C++ (``minivllm/csrc/layer_ops_cpu.h``) against
their PyTorch forms (``TorchLayerOps``, Hugging Face's arithmetic).

The rotation must equal PyTorch's to the bit (each product is rounded before the sum, as there);
RMSNorm sums its squares in another order and SiLU has its own ``exp``, so they are held to a
few float32 ulps. The whole model is then held to transformers by ``test_model_parity.py``,
which builds it with these kernels on a CPU.
"""

from __future__ import annotations

import pytest
import torch

import minivllm
from minivllm.attention import AttentionMetadata
from minivllm.cpu_kernels import kernel_status
from minivllm.model import load_model
from minivllm.model.layer_ops import CpuLayerOps, TorchLayerOps, layer_ops_for
from minivllm.model.llama import LlamaFamilyModel
from minivllm.model.rope import RotaryEmbedding

pytestmark = pytest.mark.skipif(kernel_status() is not None,
                                reason=f"the CPU kernels do not build here: {kernel_status()}")

REF = TorchLayerOps()
ULPS = dict(rtol=4e-7 * 4, atol=1e-6)  # a few float32 ulps of the values at hand


@pytest.fixture(scope="module")
def cpu_ops():
    ops = layer_ops_for(torch.device("cpu"), torch.float32)
    assert isinstance(ops, CpuLayerOps)
    return ops


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _cos_sin(rows: int, head_dim: int, seed: int):
    positions = torch.randint(0, 4096, (rows,), generator=_gen(seed))
    return RotaryEmbedding(head_dim, 10000.0).cos_sin(positions, torch.float32)


@pytest.mark.parametrize("rows, hidden", [(1, 192), (7, 13), (128, 192), (33, 4096)])
def test_rms_norm_matches_pytorch(cpu_ops, rows, hidden):
    x = torch.randn(rows, hidden, generator=_gen(rows)) * 3
    w = torch.randn(hidden, generator=_gen(hidden))
    torch.testing.assert_close(cpu_ops.rms_norm(x, w, 1e-5), REF.rms_norm(x, w, 1e-5), **ULPS)


def test_rms_norm_of_a_strided_and_a_3d_input(cpu_ops):
    """A view of some columns of a wider tensor (rows far apart), and Qwen3's per-head norm
    over ``[T, heads, head_dim]`` views of the projection."""
    wide = torch.randn(9, 320, generator=_gen(1))
    w = torch.randn(64, generator=_gen(2))
    view = wide[:, 64:128]
    torch.testing.assert_close(cpu_ops.rms_norm(view, w, 1e-6), REF.rms_norm(view, w, 1e-6), **ULPS)
    heads = wide[:, :256].view(9, 4, 64)
    got = cpu_ops.rms_norm(heads, w, 1e-6)
    assert got.shape == (9, 4, 64)
    torch.testing.assert_close(got, REF.rms_norm(heads, w, 1e-6), **ULPS)


@pytest.mark.parametrize("heads, head_dim", [(6, 32), (2, 32), (3, 128), (1, 6)])
def test_rotary_equals_pytorch_to_the_bit(cpu_ops, heads, head_dim):
    rows = 37
    x = torch.randn(rows, heads, head_dim, generator=_gen(heads * head_dim)) * 4
    cos, sin = _cos_sin(rows, head_dim, seed=head_dim)
    want = REF.rotary(x, cos, sin)
    got = cpu_ops.rotary(x.clone(), cos, sin)
    assert torch.equal(got, want)


def test_rotary_rotates_the_view_in_place_and_nothing_else(cpu_ops):
    """q and k are views of the fused q/k/v projection's output: rotating them writes their
    columns of that tensor, leaves v's alone, and gives what PyTorch gives for each."""
    rows, heads, kv_heads, d = 11, 6, 2, 32
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=_gen(3))
    before = qkv.clone()
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k = q.view(rows, heads, d), k.view(rows, kv_heads, d)
    cos, sin = _cos_sin(rows, d, seed=4)
    want_q, want_k = REF.rotary(q, cos, sin), REF.rotary(k, cos, sin)
    got_q, got_k = cpu_ops.rotary(q, cos, sin), cpu_ops.rotary(k, cos, sin)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(v, before[:, (heads + kv_heads) * d:])


@pytest.mark.parametrize("rows, inter", [(1, 512), (128, 512), (5, 13), (3, 8)])
def test_silu_and_mul_matches_pytorch(cpu_ops, rows, inter):
    gate_up = torch.randn(rows, 2 * inter, generator=_gen(inter)) * 6
    torch.testing.assert_close(cpu_ops.silu_and_mul(gate_up), REF.silu_and_mul(gate_up), **ULPS)


def test_silu_and_mul_at_the_edges(cpu_ops):
    """Where exp under- or overflows, at zero, and NaN / inf as PyTorch has them."""
    gate = torch.tensor([[0.0, -0.0, 1e-8, -1e-8, 80.0, -80.0, 100.0, -100.0,
                          88.0, -88.0, 1e4, -1e4, float("nan"), float("inf"), 3.0, -3.0]])
    up = torch.full_like(gate, 1.5)
    gate_up = torch.cat([gate, up], dim=1)
    torch.testing.assert_close(cpu_ops.silu_and_mul(gate_up), REF.silu_and_mul(gate_up), **ULPS,
                               equal_nan=True)


def test_the_kernels_name_what_they_refuse():
    from minivllm.cpu_kernels import load_kernels

    kernels = load_kernels()
    with pytest.raises(RuntimeError, match="float32"):
        kernels.rms_norm(torch.ones(2, 4, dtype=torch.float64), torch.ones(4, dtype=torch.float64), 1e-5)
    with pytest.raises(RuntimeError, match=r"weight must be float32 \[4\]"):
        kernels.rms_norm(torch.ones(2, 4), torch.ones(5), 1e-5)
    with pytest.raises(RuntimeError, match="head_dim 5 is odd"):
        kernels.rotary_(torch.ones(2, 1, 5), torch.ones(2, 5), torch.ones(2, 5))
    with pytest.raises(RuntimeError, match=r"cos and sin must be float32 \[2, 4\]"):
        kernels.rotary_(torch.ones(2, 1, 4), torch.ones(3, 4), torch.ones(3, 4))
    with pytest.raises(RuntimeError, match="odd number of columns, 7"):
        kernels.silu_and_mul(torch.ones(2, 7))


def test_which_ops_a_model_gets():
    """The kernels for float32 on a CPU; PyTorch's for any other dtype or device."""
    assert layer_ops_for(torch.device("cpu"), torch.float32).name == "cpu"
    assert layer_ops_for(torch.device("cpu"), torch.bfloat16).name == "torch"
    assert layer_ops_for(torch.device("cuda"), torch.float32).name == "torch"
    assert load_model(minivllm.TINY_MODEL_DIR, dtype="float32", device="cpu")[0].layer_ops.name == "cpu"


def test_the_model_gives_the_same_greedy_tokens_with_either_ops():
    """The tiny model over a mixed batch (prompts, then decodes), once with each set of ops:
    the logits agree to float32 noise and every row's greedy token is the same."""
    model, _ = load_model(minivllm.TINY_MODEL_DIR, dtype="float32", device="cpu", attention_backend="torch")
    assert model.layer_ops.name == "cpu"
    lens, block = [5, 40, 1, 17], 16
    tables = [[i * 4 + j for j in range(4)] for i in range(len(lens))]
    slots = [t[p // block] * block + p % block for t, n in zip(tables, lens) for p in range(n)]
    meta = AttentionMetadata.build(lens, lens, tables, slots, block)
    ids = torch.randint(3, model.config.vocab_size, (sum(lens),), generator=_gen(5))
    pos = torch.cat([torch.arange(n) for n in lens])
    reference = LlamaFamilyModel(model.config, model.attention_backend, REF)
    reference.load_state_dict(model.state_dict())
    reference.rotary.reset_parameters()
    logits = {}
    for net in (model, reference.eval()):
        net.allocate_kv_cache(16, block)
        with torch.no_grad():
            logits[net.layer_ops.name] = net.compute_logits(net(ids, pos, meta))
    torch.testing.assert_close(logits["cpu"], logits["torch"], rtol=1e-5, atol=1e-5)
    assert torch.equal(logits["cpu"].argmax(-1), logits["torch"].argmax(-1))
