"""Attention backends over a paged KV cache.

Every backend has one method::

    forward(query [T, H, D], key [T, KVH, D], value [T, KVH, D],
            k_cache [num_blocks, block_size, KVH, D], v_cache (same), meta, scale) -> [T, H, D]

which writes the new K/V rows into the cache through ``meta.slot_mapping`` and then computes
causal attention of the new tokens over everything cached for their sequence.

=================  ==================================================================
``"torch"``        plain PyTorch, decode rows batched, prefill rows one sequence each
                   (``torch_ref.py``): the CPU default
``"torch_padded"`` plain PyTorch over one padded ``[seqs, max_query, max_context]``
                   rectangle (``torch_padded.py``): the teaching baseline
``"triton"``       the PagedAttention kernels (``triton_*.py``): the CUDA default
=================  ==================================================================
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

# Must run before any kernel module of this package defines a Triton kernel: it picks compiled
# or interpreted Triton (see minivllm/_triton_env.py).
import minivllm._triton_env  # noqa: F401, I001
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.torch_padded import PaddedTorchAttentionBackend
from minivllm.attention.torch_ref import TorchAttentionBackend
from minivllm.config import ATTENTION_BACKENDS


@runtime_checkable
class AttentionBackend(Protocol):
    """The attention plug-in point (``LLM(attention_backend=<instance>)``): write the new K/V
    rows through ``meta.slot_mapping``, then attend; returns ``[T, H, D]`` in the query's dtype."""

    name: str

    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,  # [T, KVH, D]
        value: torch.Tensor,  # [T, KVH, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor: ...


def get_attention_backend(name: str = "auto", device: str = "cpu"):
    """Return a backend instance. ``auto``: compiled Triton on CUDA, the ragged PyTorch backend
    on CPU (the Triton interpreter is for learning and testing, not for speed)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend={name!r} is not one of {ATTENTION_BACKENDS}")
    if name == "auto":
        name = "triton" if str(device).startswith("cuda") else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if name == "torch_padded":
        return PaddedTorchAttentionBackend()
    from minivllm.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()


__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "TorchAttentionBackend",
    "PaddedTorchAttentionBackend",
    "get_attention_backend",
    "ATTENTION_BACKENDS",
]
