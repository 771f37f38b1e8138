"""Whole-block operations on the paged KV cache."""

from __future__ import annotations

import torch


def copy_blocks(kv_caches: list[tuple[torch.Tensor, torch.Tensor]], pairs: list[tuple[int, int]]) -> None:
    """Copy block ``src`` to block ``dst`` in every layer's K and V cache (copy-on-write).

    ``kv_caches``: one ``(k_cache, v_cache)`` per layer, each
    ``[num_blocks, block_size, num_kv_heads, head_dim]``; ``pairs``: ``(src, dst)`` block ids.
    """
    if not pairs:
        return
    device = kv_caches[0][0].device
    src = torch.tensor([s for s, _ in pairs], dtype=torch.long, device=device)
    dst = torch.tensor([d for _, d in pairs], dtype=torch.long, device=device)
    for k_cache, v_cache in kv_caches:
        k_cache[dst] = k_cache[src]
        v_cache[dst] = v_cache[src]
