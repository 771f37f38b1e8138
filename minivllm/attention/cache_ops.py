"""Reading and writing the paged KV cache in plain PyTorch: token rows in, blocks out, block copies.

Each layer's cache is ``[num_blocks, block_size, num_kv_heads, head_dim]`` (or, for an 8-bit cache,
``head_dim + 4`` int8 bytes per row: codes and a scale, see ``kv_quant.py``); token ``t`` lives at
slot ``block * block_size + offset``. The PyTorch attention backends and copy-on-write share
these helpers; the Triton backend has its own writer (``triton_cache.reshape_and_cache``).
"""

from __future__ import annotations

import torch

from minivllm.attention.kv_quant import to_cache_rows


def write_kv_to_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    """Store each token's K/V at its slot; rows whose slot is ``-1`` (padding) are skipped.

    Asking whether any slot is ``-1`` reads a value back from the device; a backend that knows
    the answer for the whole step calls :func:`store_kv` with the kept rows instead.
    """
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    store_kv(key, value, k_cache, v_cache, slot_mapping)


def store_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slots: torch.Tensor,  # [num_tokens] int64, every entry a real slot (no -1)
) -> None:
    """Store row ``t`` of ``key``/``value`` at slot ``slots[t]`` (``block * block_size + offset``),
    cast to the cache's dtype, or quantised for an int8 cache (codes and scale per row)."""
    num_blocks, block_size = k_cache.shape[:2]
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:])[slots] = to_cache_rows(key, k_cache)
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:])[slots] = to_cache_rows(value, v_cache)


def gather_blocks(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_ids: torch.Tensor,  # [..., num_logical_blocks] integer block numbers
) -> torch.Tensor:
    """Copy the listed blocks out, logical block after logical block.

    Returns ``[..., num_logical_blocks * block_size, num_kv_heads, head_dim]``: position ``p`` of
    a row is its block ``p // block_size`` at offset ``p % block_size``. Positions past a
    sequence's length hold whatever the block holds, NaN included: slice them off (a mask on
    the scores is not enough, since ``0 * NaN`` is NaN), or gather :func:`owned_slots` instead.
    """
    # index_select on the flat list of ids: on a CPU about twice as fast as cache[block_ids]
    blocks = cache.index_select(0, block_ids.reshape(-1).long())  # [n * nb, block_size, KVH, D]
    return blocks.view(*block_ids.shape[:-1], block_ids.shape[-1] * cache.shape[1], *cache.shape[2:])


def owned_slots(
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] integer block numbers
    readable: torch.Tensor,  # [num_seqs, num_positions] bool: True at positions the sequence wrote
    block_size: int,
) -> torch.Tensor:
    """``[num_seqs, num_positions]``, the tables' integer type: the cache slot of each sequence's positions
    ``0 .. num_positions - 1``, read through its block table; a position where ``readable`` is
    False gets the slot of the sequence's position 0 instead.

    A gather through these slots copies only K/V that the sequence wrote: the positions a
    batch is padded to hold a copy of its first token rather than whatever the slot holds
    (the tail of a last block, another sequence's block, a freed block's stale values, NaN
    included). They must still be masked out of the softmax, which gives them weight 0; and
    ``0 * finite`` is 0, where ``0 * NaN`` would have been NaN. ``block_tables`` must cover
    ``num_positions`` (``AttentionMetadata.build`` makes it wide enough).
    """
    num_seqs, num_positions = readable.shape
    num_blocks = -(-num_positions // block_size)
    offsets = torch.arange(block_size, dtype=block_tables.dtype, device=block_tables.device)
    # block * block_size + offset, [S, nb, bs], in the tables' integer type (index_select takes
    # int32 too; a pool of 2^31 slots would not fit in any memory)
    slots = torch.add(offsets, block_tables[:, :num_blocks, None], alpha=block_size)
    slots = slots.view(num_seqs, num_blocks * block_size)[:, :num_positions]
    return torch.where(readable, slots, slots[:, :1])


def gather_slots(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slots: torch.Tensor,  # [...] int32 or int64 slot numbers (block * block_size + offset)
) -> torch.Tensor:
    """Copy the listed slots out: ``[..., num_kv_heads, head_dim]``."""
    flat = cache.view(cache.shape[0] * cache.shape[1], *cache.shape[2:])
    return flat.index_select(0, slots.reshape(-1)).view(*slots.shape, *cache.shape[2:])


def copy_blocks(kv_caches: list[tuple[torch.Tensor, torch.Tensor]], pairs: list[tuple[int, int]]) -> None:
    """Copy block ``src`` to block ``dst`` in every layer's K and V cache (copy-on-write).

    ``kv_caches``: one ``(k_cache, v_cache)`` per layer, each
    ``[num_blocks, block_size, num_kv_heads, head_dim]`` (an int8 cache's rows, scales included,
    are copied whole); ``pairs``: ``(src, dst)`` block ids.
    """
    if not pairs:
        return
    device = kv_caches[0][0].device
    src = torch.tensor([s for s, _ in pairs], dtype=torch.long, device=device)
    dst = torch.tensor([d for _, d in pairs], dtype=torch.long, device=device)
    for k_cache, v_cache in kv_caches:
        k_cache[dst] = k_cache[src]
        v_cache[dst] = v_cache[src]
