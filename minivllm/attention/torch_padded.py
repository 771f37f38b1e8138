"""PagedAttention in plain PyTorch, padded: every sequence of the step as long as the longest.

The first version the course builds (notebook 05), kept as the ``"torch_padded"`` backend so
that its cost can be measured next to the others. It writes the new K/V rows into the paged
cache, gathers every sequence's positions into one ``[num_seqs, max_seq_len, num_kv_heads,
head_dim]`` tensor, scatters the flat queries into ``[num_seqs, max_query_len, ...]``, and runs
one masked softmax attention over the rectangle. Easy to read and fully vectorised, but the
rectangle is sized by the *longest* query and the *longest* context of the step: a 400-token
prompt chunk next to 63 decode tokens makes 64 rows of 400 queries. ``torch_ragged.py`` (the
``"torch"`` backend) computes the same result without that padding.
"""

from __future__ import annotations

import torch

from minivllm.attention.cache_ops import gather_slots, owned_slots, write_kv_to_cache
from minivllm.attention.kv_quant import check_cache_dtype
from minivllm.attention.metadata import AttentionMetadata


def _step_layout(meta: AttentionMetadata, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-step index tensors and the additive attention bias, shared by every layer.

    Returns ``seq_of_token [T]``, ``row_in_seq [T]`` (where each flat token sits in the padded
    ``[S, max_q]`` layout), ``key_slots [S, max_k]`` (the cache slot of each key position) and
    ``bias [S, 1, 1, max_q, max_k]`` (0 where a query may attend, -inf elsewhere).
    """
    cached = meta.backend_cache.get("torch_padded")
    if cached is not None:
        return cached
    num_seqs, max_q, max_k = meta.num_seqs, meta.max_query_len, meta.max_seq_len
    starts = meta.query_start_loc.long()
    query_lens = starts[1:] - starts[:-1]  # [S]
    seq_lens = meta.seq_lens.long()
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=device), query_lens)
    row_in_seq = torch.arange(int(starts[-1]), device=device) - starts[seq_of_token]
    # Query row j of sequence s sits at absolute position context_len + j; it may see keys at
    # positions <= its own (causal) that exist (< seq_len). The rectangle reaches past a
    # sequence's end, and the slots there hold whatever their block held (NaN included): the
    # gather reads the sequence's first slot for them instead (owned_slots), and the bias
    # gives them weight 0. The same goes for the positions of padding rows, never written.
    k_pos = torch.arange(max_k, device=device)
    readable = k_pos[None, :] < meta.readable_lens().to(device)[:, None]
    key_slots = owned_slots(meta.block_tables, readable, meta.block_size)
    q_pos = (seq_lens - query_lens)[:, None] + torch.arange(max_q, device=device)[None, :]
    allowed = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos[None, None, :] < seq_lens[:, None, None])
    allowed[:, :, 0] = True  # padding query rows would see no key at all -> NaN; give them key 0
    bias = torch.zeros(allowed.shape, device=device).masked_fill_(~allowed, float("-inf"))
    layout = (seq_of_token, row_in_seq, key_slots, bias[:, None, None])
    meta.backend_cache["torch_padded"] = layout
    return layout


def paged_attention_padded(
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
    max_q, max_k = meta.max_query_len, meta.max_seq_len
    seq_of_token, row_in_seq, key_slots, bias = _step_layout(meta, query.device)

    # Scatter the flat queries into [S, max_q, H, D] (padding rows stay zero).
    q = query.new_zeros(num_seqs, max_q, num_heads, head_dim)
    q[seq_of_token, row_in_seq] = query
    k = gather_slots(k_cache, key_slots).to(query.dtype)  # [S, max_k, KVH, D]
    v = gather_slots(v_cache, key_slots).to(query.dtype)

    # Grouped-query attention without copying K/V per query head: the G = H / KVH query heads
    # that share a KV head are stacked with the query rows, so each (sequence, KV head) pair is
    # one plain matmul: [G * max_q, D] @ [D, max_k].
    group = num_heads // num_kv_heads
    q = q.view(num_seqs, max_q, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    q = q.reshape(num_seqs, num_kv_heads, group * max_q, head_dim)
    scores = torch.matmul(q, k.permute(0, 2, 3, 1)).float() * scale  # [S, KVH, G*max_q, max_k]
    scores = scores.view(num_seqs, num_kv_heads, group, max_q, max_k) + bias
    probs = scores.softmax(dim=-1).to(query.dtype).view(num_seqs, num_kv_heads, group * max_q, max_k)
    out = torch.matmul(probs, v.permute(0, 2, 1, 3))  # [S, KVH, G*max_q, D]
    out = out.view(num_seqs, num_kv_heads, group, max_q, head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(num_seqs, max_q, num_heads, head_dim)[seq_of_token, row_in_seq]


class PaddedTorchAttentionBackend:
    """Teaching baseline: ``write_kv_to_cache`` then ``paged_attention_padded``. Float caches
    only: it refuses an 8-bit one when the engine is built."""

    name = "torch_padded"

    def check_kv_cache(self, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        check_cache_dtype(self.name, dtype, int8=False)

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
        return paged_attention_padded(query, k_cache, v_cache, meta, scale)
