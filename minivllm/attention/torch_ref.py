"""PagedAttention in plain PyTorch: gather each sequence's K/V through its block table.

This is the reference every faster backend is tested against, and the version the course
builds first (notebook 05). It does exactly what the Triton kernels do, in the most readable
way: write the new K/V rows into the paged cache, gather every sequence's blocks into a padded
``[num_seqs, max_seq_len, num_kv_heads, head_dim]`` tensor, and run masked softmax attention.
The gather costs memory traffic and padding that a real kernel avoids; it is vectorised so that
it stays usable as the CPU default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.attention.metadata import AttentionMetadata


def write_kv_to_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    """Store each token's K/V at its slot (``block * block_size + offset``)."""
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    num_blocks, block_size = k_cache.shape[:2]
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:])[slot_mapping] = key.to(k_cache.dtype)
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:])[slot_mapping] = value.to(v_cache.dtype)


def gather_kv(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    max_seq_len: int,
) -> torch.Tensor:
    """Return ``[num_seqs, max_seq_len, num_kv_heads, head_dim]``: every sequence's logical
    positions 0..max_seq_len-1, read through its block table (positions past a sequence's
    length hold whatever its table's unused entries point at and must be masked)."""
    block_size = cache.shape[1]
    num_logical = (max_seq_len + block_size - 1) // block_size
    blocks = cache[block_tables[:, :num_logical].long()]  # [S, nb, bs, KVH, D]
    s, nb, bs, h, d = blocks.shape
    return blocks.reshape(s, nb * bs, h, d)[:, :max_seq_len]


def paged_attention_reference(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its cached context + itself.

    Returns ``[num_tokens, num_heads, head_dim]`` in the query's dtype.
    """
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    num_seqs = meta.num_seqs
    if num_tokens == 0 or num_seqs == 0:
        return torch.empty_like(query)
    device = query.device
    starts = meta.query_start_loc.long()
    query_lens = starts[1:] - starts[:-1]  # [S]
    seq_lens = meta.seq_lens.long()
    context_lens = seq_lens - query_lens
    max_q, max_k = meta.max_query_len, meta.max_seq_len

    # Scatter the flat queries into [S, max_q, H, D] (padding rows stay zero).
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=device), query_lens)
    row_in_seq = torch.arange(num_tokens, device=device) - starts[seq_of_token]
    q = query.new_zeros(num_seqs, max_q, num_heads, head_dim)
    q[seq_of_token, row_in_seq] = query

    k = gather_kv(k_cache, meta.block_tables, max_k).to(query.dtype)
    v = gather_kv(v_cache, meta.block_tables, max_k).to(query.dtype)
    # Slots past a sequence's length may hold anything (even NaN in an uninitialised cache);
    # a masked score has zero weight, but 0 * NaN is NaN, so clear them.
    beyond = torch.arange(max_k, device=device)[None, :] >= seq_lens[:, None]  # [S, max_k]
    if bool(beyond.any()):
        k = k.masked_fill(beyond[:, :, None, None], 0)
        v = v.masked_fill(beyond[:, :, None, None], 0)

    # Query row j of sequence s sits at absolute position context_len + j.
    q_pos = context_lens[:, None] + torch.arange(max_q, device=device)[None, :]  # [S, max_q]
    k_pos = torch.arange(max_k, device=device)  # [max_k]
    mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos[None, None, :] < seq_lens[:, None, None])
    # Padding query rows would have an all-False mask row -> NaN; give them key 0.
    mask[:, :, 0] = True

    group = num_heads // num_kv_heads
    q = q.transpose(1, 2)  # [S, H, max_q, D]
    k = k.transpose(1, 2).repeat_interleave(group, dim=1)  # [S, H, max_k, D]
    v = v.transpose(1, 2).repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=scale)
    out = out.transpose(1, 2)  # [S, max_q, H, D]
    return out[seq_of_token, row_in_seq]


class TorchAttentionBackend:
    """Reference backend: ``write_kv_to_cache`` then ``paged_attention_reference``."""

    name = "torch"

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
        write_kv_to_cache(key, value, k_cache, v_cache, meta.slot_mapping)
        return paged_attention_reference(query, k_cache, v_cache, meta, scale)
