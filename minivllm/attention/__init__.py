"""Attention backends over a paged KV cache.

Every backend has one method::

    forward(query [T, H, D], key [T, KVH, D], value [T, KVH, D],
            k_cache [num_blocks, block_size, KVH, D], v_cache (same), meta, scale) -> [T, H, D]

which writes the new K/V rows into the cache through ``meta.slot_mapping`` and then computes
causal attention of the new tokens over everything cached for their sequence, reading only
slots the sequence owns (see :class:`AttentionBackend`).

=================  ==================================================================
``"cpp"``          a C++ kernel that reads the cache in place for the step's decode rows,
                   SDPA for its prompts (``cpp_backend.py``): the CPU default where the
                   kernel builds (a C++ compiler with OpenMP)
``"torch"``        plain PyTorch, decode rows batched, prefill rows one sequence each
                   (``torch_ragged.py``): the readable reference, and the CPU default
                   where the kernel does not build
``"torch_padded"`` plain PyTorch over one padded ``[seqs, max_query, max_context]``
                   rectangle (``torch_padded.py``): the teaching baseline
``"triton"``       the PagedAttention kernels (``triton_*.py``): the CUDA default
=================  ==================================================================

A cache is in the model's float format, or 8-bit (``kv_cache_dtype="int8"``): ``torch.int8`` rows
of ``head_dim`` codes and a float32 scale, ``[num_blocks, block_size, KVH, head_dim + 4]``
(``kv_quant.py``); ``"cpp"``, ``"torch"`` and ``"triton"`` read it, ``"torch_padded"`` refuses it.

``testing.py`` builds random paged problems with their float64 answers, for the kernels' tests
and the course's checks. The package imports nothing from ``minivllm.core`` or the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

# First, before any kernel module of this package defines a Triton kernel: pick compiled or
# interpreted Triton (triton_env.py). Importing any module of the package runs this file
# before the module, so this line is the one place where the order matters.
import minivllm.attention.triton_env  # noqa: F401, I001
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.torch_padded import PaddedTorchAttentionBackend
from minivllm.attention.torch_ragged import TorchAttentionBackend


@runtime_checkable
class AttentionBackend(Protocol):
    """The attention plug-in point (``LLM(attention_backend=<instance>)``): write the new K/V
    rows through ``meta.slot_mapping``, then attend; returns ``[T, H, D]`` in the query's dtype.

    **Only owned slots reach the result.** The output row of a token at position ``p`` of
    sequence ``i`` depends only on the K/V at positions ``0 .. p`` of that sequence, found at
    ``block_tables[i, q // block_size]``, offset ``q % block_size``. Every other slot may hold
    anything, NaN and inf included, and must not change a real row's output: the rest of a
    partly filled last block, the blocks past a sequence's table, other sequences' blocks, and
    the positions of padding rows (slot ``-1``), which are never written. A freed block keeps
    its previous owner's values, so one request's overflow would otherwise poison the next
    request that gets its block. Masking such a slot's score is not enough when its value is
    multiplied by the resulting weight 0: ``0 * NaN`` is NaN. Padding rows' own outputs are
    thrown away by the engine and may be anything.
    """

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


@runtime_checkable
class KVCacheRequirements(Protocol):
    """What a backend may add to :class:`AttentionBackend`: a say over the cache it is given.

    The model asks before it allocates the KV cache (``LlamaFamilyModel.allocate_kv_cache``), so a
    block size or number format the backend cannot read is refused when the engine is built,
    with a message naming the value and the limit, not in the middle of the first step."""

    def check_kv_cache(self, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        """Raise ``ValueError`` if this backend cannot read such a cache."""
        ...


def _cpp_backend() -> AttentionBackend:
    from minivllm.attention.cpp_backend import CppAttentionBackend  # builds its kernel when asked

    return CppAttentionBackend()


def _triton_backend() -> AttentionBackend:
    from minivllm.attention.triton_backend import TritonAttentionBackend  # loads Triton itself

    return TritonAttentionBackend()


# The backends minivllm builds by name. ``minivllm.config.ATTENTION_BACKENDS`` (the engine
# argument's choices, checked without torch) lists the same names after "auto".
BACKENDS: dict[str, Callable[[], AttentionBackend]] = {
    "cpp": _cpp_backend,
    "torch": TorchAttentionBackend,
    "torch_padded": PaddedTorchAttentionBackend,
    "triton": _triton_backend,
}


def get_attention_backend(name: str = "auto", device: str = "cpu") -> AttentionBackend:
    """Return a backend instance. ``auto``: compiled Triton on CUDA; on a CPU the C++ kernel
    where it builds, else the ragged PyTorch backend (the Triton interpreter is for learning and
    testing, not for speed); on any other device the ragged PyTorch backend."""
    if not isinstance(name, str):
        raise TypeError(f"attention_backend must be a name, got {name!r} ({type(name).__name__})")
    if name == "auto":
        if str(device).startswith("cuda"):
            name = "triton"
        elif str(device).startswith("cpu"):
            from minivllm.attention.cpp_backend import auto_cpu_backend

            name = auto_cpu_backend()
        else:  # another device (a test's "meta" among them): the plain PyTorch backend
            name = "torch"
    if name not in BACKENDS:
        raise ValueError(f"attention_backend={name!r} is not one of {('auto', *BACKENDS)}")
    return BACKENDS[name]()


__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "BACKENDS",
    "KVCacheRequirements",
    "PaddedTorchAttentionBackend",
    "TorchAttentionBackend",
    "get_attention_backend",
]
