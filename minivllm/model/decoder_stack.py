"""Every decoder layer of a step in one C++ call, when the step allows it (a float32 model on a CPU).

``LlamaFamilyModel.forward`` runs its layers one module at a time: per layer, a dozen operators,
each reached through a module call, an attribute look-up and a dispatch that cost a few
microseconds of Python. For a small model at a few sequences per step that is most of the step
(a 2-layer draft model cost about half a pass of the 4-layer target whatever their widths).
:class:`CpuDecoderStack` hands the whole stack to ``decoder_stack`` in
``minivllm/csrc/decoder_stack_cpu.h``, which calls the same operators in the same order from
C++ (the same ``at::linear`` as ``nn.Linear``, the kernels of :class:`~minivllm.model.layer_ops.CpuLayerOps`
and of the ``"cpp"`` attention backend), so the hidden states are the module path's to the bit.

It takes a step only when that step is what the one kernel call covers: the ``"cpp"`` attention
backend itself (not a subclass or another backend, whose own ``forward`` must run), every
sequence short (no prompt for SDPA), no padding slot, a float cache. Any other step, and every
step of a model built with PyTorch's layer ops, runs the modules (``forward`` returns ``None``).
The modules stay the model's definition: this is the same computation with the interpreter left
out.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Protocol

import torch

from minivllm.attention.cpp_backend import CppAttentionBackend, plan_cpp_step
from minivllm.attention.metadata import AttentionMetadata
from minivllm.transfer import to_device
from minivllm.withheld import check_available

# the model is a minivllm.model.llama.LlamaFamilyModel (not imported: llama imports this module)
LlamaFamilyModel = torch.nn.Module


class DecoderStackKernel(Protocol):
    """What ``LlamaFamilyModel.forward`` asks first: the final hidden states of the whole stack
    for this step, or ``None`` to run the layers module by module."""

    name: str

    def forward(self, model: LlamaFamilyModel, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor | None: ...


_NONE = torch.empty(0)  # a missing bias or q/k norm, as the kernel expects it

# What the kernel reads, per layer and in its order (``LayerTensor`` in the C++ header): the
# submodule that holds each tensor, and the tensor's name there; None: absent in this family.
_LAYER_TENSORS = [
    ("input_layernorm", "weight"), ("self_attn.qkv_proj", "weight"), ("self_attn.qkv_proj", "bias"),
    ("self_attn.q_norm", "weight"), ("self_attn.k_norm", "weight"),
    ("self_attn.o_proj", "weight"), ("self_attn.o_proj", "bias"), ("post_attention_layernorm", "weight"),
    ("mlp.gate_up_proj", "weight"), ("mlp.gate_up_proj", "bias"), ("mlp.down_proj", "weight"), ("mlp.down_proj", "bias"),
]


class _StackView:
    """Where one model's tensors live: each one's module's parameter dict and name, found once
    (walking the modules costs more per step than the kernel saves on a small model), read at
    every call (so weights loaded or moved later are the ones used)."""

    def __init__(self, model: LlamaFamilyModel):
        self.refs: list[tuple[dict, str] | None] = []
        for layer in model.model.layers:
            for path, name in _LAYER_TENSORS:
                module = _submodule(layer, path)
                self.refs.append(None if module is None else (module._parameters, name))
        self.norm = (model.model.norm._parameters, "weight")
        self.attention = model.attention_layers

    def tensors(self) -> list[torch.Tensor]:
        out = []
        for ref in self.refs:
            tensor = None if ref is None else ref[0].get(ref[1])
            out.append(_NONE if tensor is None else tensor)
        return out


def _submodule(module, path: str):
    """``module``'s submodule at ``path``, or ``None`` (a family without q/k norms)."""
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


class CpuDecoderStack:
    """The float32 CPU stack as one call of the C++ kernel (see the module's docstring)."""

    name = "cpu"

    def __init__(self, kernels):
        self.kernels = kernels
        self._views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> _StackView

    def _view(self, model: LlamaFamilyModel) -> _StackView:
        view = self._views.get(model)
        if view is None:
            view = self._views[model] = _StackView(model)
        return view

    def _covers(self, attn, x: torch.Tensor) -> bool:
        """The model side of what the kernel covers: the ``"cpp"`` backend itself in every
        layer, float32 rows on the CPU, a float cache."""
        return not (x.shape[0] == 0 or x.dtype != torch.float32 or x.device.type != "cpu"
                    or any(type(a.backend) is not CppAttentionBackend for a in attn)
                    or attn[0].k_cache is None or attn[0].k_cache.dtype == torch.int8)

    def forward(self, model: LlamaFamilyModel, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor | None:
        view = self._view(model)
        attn = view.attention
        if not self._covers(attn, x):
            return None
        plan = plan_cpp_step(meta, x.device, x.dtype)
        if not plan.one_call or plan.kept_rows is not None:
            return None
        check_available("attention", "CppAttentionBackend.forward")
        cfg = model.config
        return self.kernels.decoder_stack(
            x, cos, sin, view.tensors(), [a.k_cache for a in attn], [a.v_cache for a in attn],
            plan.kept_slots, plan.tables, plan.seq_lens, plan.query_start, cfg.num_heads, cfg.num_kv_heads,
            cfg.head_dim, attn[0].scale, cfg.rms_norm_eps, view.norm[0][view.norm[1]])

    def greedy_steps(self, model: LlamaFamilyModel, feeds: list[list[int]], starts: list[int],
                     block_tables: list[list[int]], block_size: int, num_steps: int) -> list[list[int]] | None:
        """The ``num_steps`` passes with which a greedy draft model proposes, in one call: the
        first feeds sequence ``i`` its tokens ``feeds[i]`` at positions ``starts[i]`` onwards
        (those whose K/V it lacks), each next pass the previous one's argmax at the next
        position. Returns each sequence's ``num_steps`` tokens, or ``None`` where the kernel does
        not cover the passes (a feed long enough to be a prompt, a model or cache it does not
        take): then the caller runs them one by one. The block tables must already hold every
        position written."""
        view = self._view(model)
        attn, weight = view.attention, model.model.embed_tokens.weight
        if num_steps < 1 or not feeds or not self._covers(attn, weight):
            return None
        def slot(table: list[int], position: int) -> int:
            return table[position // block_size] * block_size + position % block_size

        device, num_seqs = weight.device, len(feeds)
        first_lens = [len(f) for f in feeds]
        ends = [s + n for s, n in zip(starts, first_lens, strict=True)]  # positions after pass 0
        first_pos = [p for s, e in zip(starts, ends, strict=True) for p in range(s, e)]
        first_slots = [slot(t, p) for t, s, e in zip(block_tables, starts, ends, strict=True) for p in range(s, e)]
        meta = AttentionMetadata.build(first_lens, ends, block_tables, first_slots, block_size, device)
        plan = plan_cpp_step(meta, device, weight.dtype)
        if not plan.one_call or plan.kept_rows is not None:
            return None
        check_available("attention", "CppAttentionBackend.forward")
        later = [[e + j - 1 for e in ends] for j in range(1, num_steps)]  # [steps - 1, S] positions
        later_slots = [slot(t, p) for row in later for t, p in zip(block_tables, row, strict=True)]
        flat_later = [p for row in later for p in row]
        last_rows = [e - 1 for e in itertools.accumulate(first_lens)]
        tokens_t, first_pos_t, last_t, later_t, later_slots_t, later_lens_t = to_device(
            [([t for f in feeds for t in f], torch.long), (first_pos, torch.long), (last_rows, torch.long),
             (flat_later, torch.long), (later_slots, torch.long), ([p + 1 for p in flat_later], torch.int32)], device)
        first_cos, first_sin = model.rotary.cos_sin(first_pos_t, weight.dtype)
        cos, sin = model.rotary.cos_sin(later_t, weight.dtype)
        shape, cfg = (num_steps - 1, num_seqs), model.config
        out = self.kernels.greedy_draft_steps(
            tokens_t, first_cos, first_sin, plan.kept_slots, plan.seq_lens, plan.query_start, last_t,
            cos.view(*shape, cfg.head_dim), sin.view(*shape, cfg.head_dim), later_slots_t.view(shape), later_lens_t.view(shape),
            plan.tables, weight, model.lm_head.weight, view.tensors(), [a.k_cache for a in attn],
            [a.v_cache for a in attn], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, attn[0].scale,
            cfg.rms_norm_eps, view.norm[0][view.norm[1]])
        return out.t().tolist()


def decoder_stack_for(layer_ops) -> DecoderStackKernel | None:
    """:class:`CpuDecoderStack` for a model with the CPU's C++ layer ops, else ``None``."""
    from minivllm.model.layer_ops import CpuLayerOps

    if isinstance(layer_ops, CpuLayerOps):
        return CpuDecoderStack(layer_ops.kernels)
    return None
