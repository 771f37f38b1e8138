"""PagedAttention in plain PyTorch with no padding across sequences: the ``"torch"`` backend.

A step's flat batch mixes two kinds of rows that want different shapes of work:

* **decode rows** (one new token, or a few over a cached context: a decode that verifies
  speculative drafts, a short chunk; at most ``MAX_BATCHED_QUERY_LEN``): batched by their number
  of new tokens, in a few buckets of similar context length.
  Sorted by length, a bucket holds sequences whose contexts are within a factor of 1.5 of
  each other, and each gathers keys only up to the longest context *of its bucket* (a prompt
  in the same step does not stretch them, nor does one long decode stretch 63 short ones).
  A shorter sequence's positions past its end are gathered from its own first slot
  (:func:`~minivllm.attention.cache_ops.owned_slots`) and masked, so no slot it does not own
  enters the product. The query heads that share a KV head become the rows of one small
  attention per (sequence, KV head), ``[group, keys]``, so K/V are never repeated per query head;
* **prefill rows** (a prompt, a prompt chunk, a chunk after a prefix-cache hit): one sequence
  at a time, causal attention of its ``q`` new tokens over its ``c`` cached positions (exactly
  those, sliced from its blocks) and itself, ``[q, c + q]`` per head.

So a step costs what its tokens cost: a 1,000-token prompt next to 63 decodes costs the prompt
plus the decodes, not 64 padded prompts (``torch_padded.py`` is that padded version, kept as a
baseline). Which rows are which, and every index tensor and mask, is worked out once per step
from the host-side lengths in :class:`AttentionMetadata` and reused by every layer; no layer
reads a value back from the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minivllm.attention.cache_ops import gather_blocks, gather_slots, owned_slots, store_kv
from minivllm.attention.kv_quant import as_cached, check_cache_dtype, read_rows
from minivllm.attention.metadata import AttentionMetadata
from minivllm.transfer import to_device


@dataclass
class DecodeRows:
    """Sequences of the step with the same small number ``q`` of new tokens (one, for a decode;
    a few, for a decode that verifies speculative drafts) and similar context lengths, batched
    together (one bucket of :attr:`RaggedStepPlan.decode`)."""

    token_rows: torch.Tensor | None  # [n * q] int64 rows of the flat batch; None: all rows, in order
    key_slots: torch.Tensor  # [n, L] int32 slot of each key position, L = the bucket's longest
    #                          sequence; positions >= seq_len repeat the sequence's first slot
    key_bias: torch.Tensor  # [n, 1, q, L]: 0 where new token j may read position l, else -inf
    query_len: int = 1  # q


@dataclass
class PrefillRows:
    """One sequence with more than one new token: rows ``start:stop`` of the flat batch."""

    start: int
    stop: int
    context_len: int  # positions already cached before this step
    context_blocks: torch.Tensor | None  # [ceil(context_len / block_size)] int64; None: no context
    causal_bias: torch.Tensor | None  # [q, context_len + q]: 0 where it may attend, else -inf; None: is_causal


@dataclass
class RaggedStepPlan:
    """What every layer of one step needs, derived once (see :func:`plan_step`)."""

    decode: list[DecodeRows]  # buckets of decode rows, shortest contexts first
    prefills: list[PrefillRows]
    kept_rows: torch.Tensor | None  # [num_kept] rows whose slot is not -1; None: every row
    kept_slots: torch.Tensor  # [num_kept] their slots


def host_lengths(meta: AttentionMetadata) -> tuple[list[int], list[int]]:
    """``(query_lens, seq_lens)`` as Python lists: the host copies when the metadata has them,
    else read back from the tensors (once per step, since the plan is cached)."""
    if meta.query_lens_cpu is not None and meta.seq_lens_cpu is not None:
        return meta.query_lens_cpu, meta.seq_lens_cpu
    starts = meta.query_start_loc.tolist()
    return [b - a for a, b in zip(starts, starts[1:])], meta.seq_lens.tolist()


# Sequences with at most this many new tokens over a cached context (a decode verifying
# speculative drafts, a short chunk) are batched like decodes instead of one by one.
MAX_BATCHED_QUERY_LEN = 16


def plan_step(meta: AttentionMetadata, device: torch.device, dtype: torch.dtype) -> RaggedStepPlan:
    """Sort the step's sequences into decode rows and prefill rows; build their index tensors
    on ``device`` and their masks as additive biases in ``dtype`` (what SDPA would otherwise
    rebuild from a boolean mask in every layer). Cached in ``meta.backend_cache``: every layer
    reuses it."""
    cached = meta.backend_cache.get("torch_ragged")
    if cached is not None:
        return cached
    short, prefills = sort_sequences(meta, device, dtype)
    seq_lens = host_lengths(meta)[1]
    num_tokens = int(meta.slot_mapping.shape[0])
    decode = []
    for q, (seqs, rows) in sorted(short.items()):
        only = q == 1 and len(seqs) == len(seq_lens) == num_tokens
        decode.extend(
            _decode_rows(meta, [seqs[i] for i in bucket], [rows[i] for i in bucket], seq_lens, device, dtype,
                         all_rows=only and len(bucket) == len(seqs), query_len=q)
            for bucket in length_buckets([seq_lens[s] for s in seqs])
        )
    kept_rows, kept_slots = kept_rows_of(meta)
    plan = RaggedStepPlan(decode, prefills, kept_rows, kept_slots)
    meta.backend_cache["torch_ragged"] = plan
    return plan


def sort_sequences(
    meta: AttentionMetadata, device: torch.device, dtype: torch.dtype
) -> tuple[dict[int, tuple[list[int], list[int]]], list[PrefillRows]]:
    """The step's sequences in two kinds: ``short`` maps ``q`` to the sequences with ``q`` new
    tokens that are read from the cache like decodes (one new token, or at most
    ``MAX_BATCHED_QUERY_LEN`` over a cached context) and their first rows of the flat batch; the
    others are prefills, one :class:`PrefillRows` each. Shared by the backends that attend the
    short sequences together (``plan_step`` here, ``cpp_backend.plan_cpp_step``)."""
    query_lens, seq_lens = host_lengths(meta)
    num_tokens = int(meta.slot_mapping.shape[0])
    short: dict[int, tuple[list[int], list[int]]] = {}
    # a few new tokens read from the cache like a decode, once all of them are stored there
    # (static batching's padding rows are not: they keep the one-sequence path)
    max_short = MAX_BATCHED_QUERY_LEN if meta.num_skipped_slots == 0 else 1
    prefills: list[PrefillRows] = []
    row = 0
    for seq, (query_len, seq_len) in enumerate(zip(query_lens, seq_lens, strict=True)):
        context_len = seq_len - query_len
        if context_len < 0:
            raise ValueError(f"sequence {seq}: query_len {query_len} > seq_len {seq_len}")
        if query_len == 1 or (query_len <= max_short and context_len > 0):
            seqs, rows = short.setdefault(query_len, ([], []))
            seqs.append(seq)
            rows.append(row)
        elif query_len > 1:
            prefills.append(prefill_rows(meta, seq, row, query_len, context_len, device, dtype))
        row += query_len
    if row != num_tokens:
        raise ValueError(f"query lengths add up to {row} tokens but slot_mapping has {num_tokens}")
    return short, prefills


def length_buckets(lengths: list[int], spread: float = 1.5) -> list[list[int]]:
    """Indices of ``lengths`` grouped so that within a group the longest is at most ``spread``
    times the shortest: sorted ascending, a new group starts when a length exceeds that bound.
    Padding each group to its own longest wastes less than ``spread`` x its keys, in a handful
    of groups (about log(max / min) / log(spread)): more groups cost more calls, wider ones more
    padded keys. ``benchmarks/mixed_steps.py`` measures the trade-off on the tiny model."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    buckets: list[list[int]] = []
    for i in order:
        if buckets and lengths[i] <= spread * lengths[buckets[-1][0]]:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


def _decode_rows(
    meta: AttentionMetadata,
    seqs: list[int],
    token_rows: list[int],
    seq_lens: list[int],
    device: torch.device,
    dtype: torch.dtype,
    all_rows: bool = False,
    query_len: int = 1,
) -> DecodeRows:
    """``token_rows``: each sequence's first new row (its ``query_len`` rows follow it)."""
    lens = [seq_lens[s] for s in seqs]
    length = max(lens)
    num_blocks = -(-length // meta.block_size)
    if all_rows and seqs == list(range(len(seqs))):  # decode only, one bucket: sequence i is row i
        (lens_t,) = to_device([(lens, torch.long)], device)
        rows, tables = None, meta.block_tables[:, :num_blocks]
    else:  # one copy to the device for the bucket's row numbers, sequences and lengths
        first, seq_index, lens_t = to_device([(token_rows, torch.long), (seqs, torch.long), (lens, torch.long)],
                                             device)
        rows = (first[:, None] + torch.arange(query_len, device=device)).reshape(-1)
        tables = meta.block_tables[seq_index, :num_blocks]
    positions = torch.arange(length, device=device)
    readable = positions[None, :] < lens_t[:, None]
    key_slots = owned_slots(tables, readable, meta.block_size)
    if query_len == 1:
        return DecodeRows(rows, key_slots, additive_bias(readable, dtype)[:, None, None, :])
    # new token j of a sequence of length s sits at position s - q + j and reads positions <= it
    last = lens_t[:, None] - query_len + torch.arange(query_len, device=device)  # [n, q]
    allowed = positions[None, None, :] <= last[:, :, None]  # [n, q, L]
    return DecodeRows(rows, key_slots, additive_bias(allowed, dtype)[:, None], query_len)


def prefill_rows(
    meta: AttentionMetadata,
    seq: int,
    start: int,
    query_len: int,
    context_len: int,
    device: torch.device,
    dtype: torch.dtype,
) -> PrefillRows:
    if context_len == 0:  # a whole prompt: plain causal attention among the new tokens
        return PrefillRows(start, start + query_len, 0, None, None)
    blocks = meta.block_tables[seq, : -(-context_len // meta.block_size)].long()
    # new token j sits at position context_len + j and sees keys at positions <= that
    query_pos = context_len + torch.arange(query_len, device=device)
    key_pos = torch.arange(context_len + query_len, device=device)
    bias = additive_bias(key_pos[None, :] <= query_pos[:, None], dtype)
    return PrefillRows(start, start + query_len, context_len, blocks, bias)


def additive_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``allowed``, -inf elsewhere, in ``dtype``: added to the scores before softmax."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def kept_rows_of(meta: AttentionMetadata) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Rows to store in the cache: all of them unless some slots are -1 (static batching's
    padding). Knowing the count on the host spares every layer a device read-back."""
    slots = meta.slot_mapping
    if meta.num_skipped_slots == 0:
        return None, slots
    kept = (slots >= 0).nonzero().squeeze(1)
    if meta.num_skipped_slots is None and kept.shape[0] == slots.shape[0]:
        return None, slots
    return kept, slots[kept]


def decode_attention(
    query: torch.Tensor,  # [num_decodes, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    rows: DecodeRows,
    scale: float,
) -> torch.Tensor:
    """``q`` query tokens per sequence (one, for a decode) over its cached context (their own
    K/V already written), causal among themselves.

    The ``group = num_heads / num_kv_heads`` query heads that read one KV head are viewed as
    ``group`` query rows of that head: ``[num_decodes, KVH, group, D]`` against keys
    ``[num_decodes, KVH, L, D]``, gathered slot by slot from what each sequence owns; with
    ``q > 1`` new tokens the rows are ``(token, group member)`` pairs, ``q * group`` per KV head.
    An int8 cache's gathered rows are dequantised to the query's dtype (``kv_quant.read_rows``).
    Returns ``[num_decodes, num_heads, head_dim]``.
    """
    num_rows, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    group, q_len = num_heads // num_kv_heads, rows.query_len
    k = read_rows(gather_slots(k_cache, rows.key_slots), query.dtype).transpose(1, 2)  # [N, KVH, L, D]
    v = read_rows(gather_slots(v_cache, rows.key_slots), query.dtype).transpose(1, 2)
    if q_len == 1:
        q = query.view(num_rows, num_kv_heads, group, head_dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=rows.key_bias, scale=scale)
        return out.reshape(num_rows, num_heads, head_dim)
    # q new tokens per sequence: query row (j, g) of a KV head is new token j, head g of the group
    n = num_rows // q_len
    q = query.view(n, q_len, num_kv_heads, group, head_dim).permute(0, 2, 1, 3, 4)
    q = q.reshape(n, num_kv_heads, q_len * group, head_dim)
    bias = rows.key_bias.repeat_interleave(group, dim=2)  # [n, 1, q * group, L]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    out = out.view(n, num_kv_heads, q_len, group, head_dim).permute(0, 2, 1, 3, 4)
    return out.reshape(num_rows, num_heads, head_dim)


def prefill_attention(
    query: torch.Tensor,  # [q, num_heads, head_dim]
    key: torch.Tensor,  # [q, num_kv_heads, head_dim]: this step's new keys
    value: torch.Tensor,  # [q, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    rows: PrefillRows,
    scale: float,
) -> torch.Tensor:
    """Causal attention of one sequence's new tokens over its cached context and themselves.

    The context comes from the cache; the new tokens' K/V come straight from this step's rows,
    rounded exactly as the cache holds them (its float dtype, or int8 codes and a scale), so
    padding rows, which are never stored, still see their own keys. Returns ``[q, num_heads, head_dim]``.
    """
    k = as_cached(key, k_cache, query.dtype)
    v = as_cached(value, v_cache, query.dtype)
    if rows.context_blocks is not None:
        n = rows.context_len
        k = torch.cat([read_rows(gather_blocks(k_cache, rows.context_blocks)[:n], query.dtype), k])
        v = torch.cat([read_rows(gather_blocks(v_cache, rows.context_blocks)[:n], query.dtype), v])
    # [1, heads, tokens, D]; enable_gqa lets query head h read KV head h // group without a copy
    out = F.scaled_dot_product_attention(
        query.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=rows.causal_bias, is_causal=rows.causal_bias is None, scale=scale, enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def paged_attention_ragged(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], new K/V written
    v_cache: torch.Tensor,
    plan: RaggedStepPlan,
    scale: float,
) -> torch.Tensor:
    """Attention for every row of the flat batch, decode rows together and prefill sequences one
    by one. Returns ``[num_tokens, num_heads, head_dim]`` in the query's dtype."""
    if len(plan.decode) == 1 and plan.decode[0].token_rows is None:  # one bucket, no prefill
        return decode_attention(query, k_cache, v_cache, plan.decode[0], scale)
    out = torch.empty_like(query)
    for bucket in plan.decode:
        rows = bucket.token_rows
        out[rows] = decode_attention(query[rows], k_cache, v_cache, bucket, scale)
    for rows in plan.prefills:
        span = slice(rows.start, rows.stop)
        out[span] = prefill_attention(query[span], key[span], value[span], k_cache, v_cache, rows, scale)
    return out


class TorchAttentionBackend:
    """The CPU default: store the new K/V, then ``paged_attention_ragged``. Reads float caches
    and 8-bit ones (``kv_quant.py``)."""

    name = "torch"

    def check_kv_cache(self, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        """Any block size; a floating-point cache or an int8 one."""
        check_cache_dtype(self.name, dtype, int8=True)

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
        if query.shape[0] == 0:
            return torch.empty_like(query)
        plan = plan_step(meta, query.device, query.dtype)
        if plan.kept_rows is None:
            store_kv(key, value, k_cache, v_cache, plan.kept_slots)
        else:
            store_kv(key[plan.kept_rows], value[plan.kept_rows], k_cache, v_cache, plan.kept_slots)
        return paged_attention_ragged(query, key, value, k_cache, v_cache, plan, scale)

