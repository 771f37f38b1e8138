"""The ``"triton"`` attention backend: the PagedAttention kernels behind the backend protocol.

Same contract as ``TorchAttentionBackend``: write the new K/V through ``meta.slot_mapping``,
then attend. A decode-only step (every sequence has exactly one new token) runs the decode
kernel, which may split long contexts across programs; any step with a longer query (prompts,
prompt chunks, or a mix of those with decode tokens) runs the prefill kernel, which handles
every query length including 1.
"""

from __future__ import annotations

import torch

from minivllm._triton_env import check_interpreter_ready
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.triton_kernels import (
    paged_decode_attention,
    paged_prefill_attention,
    reshape_and_cache,
)


class TritonAttentionBackend:
    """``reshape_and_cache`` then ``paged_decode_attention`` or ``paged_prefill_attention``."""

    name = "triton"

    def __init__(self) -> None:
        check_interpreter_ready()  # fail here, with advice, rather than inside the first step

    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,  # [T, KVH, D]
        value: torch.Tensor,  # [T, KVH, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        if k_cache.shape[1] != meta.block_size:
            raise ValueError(f"cache block size {k_cache.shape[1]} != meta.block_size {meta.block_size}")
        reshape_and_cache(key, value, k_cache, v_cache, meta.slot_mapping)
        if meta.max_query_len == 1 and query.shape[0] == meta.num_seqs:
            return paged_decode_attention(
                query, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, max_seq_len=meta.max_seq_len
            )
        return paged_prefill_attention(
            query, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, scale,
            meta.max_query_len,
        )
