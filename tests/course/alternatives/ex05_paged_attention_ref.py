"""Exercise 05: a ragged attention backend over the paged KV cache, in plain PyTorch.

(An alternative correct answer, for tests/course/test_alternatives.py: the cache is written and
read by (block, offset) index pairs rather than flat slots; decodes are grouped greedily by
length, longest first, with the padding positions clamped onto the last owned one; products
are batched ``matmul``s, the query heads of a group folded into the rows of their KV head.)

Notebook: notebooks/05_paged_attention_torch.ipynb. Check your work with
``course.check(course.load("ex05_paged_attention_ref"))`` there, or ``pytest -m ex05``.

You write ``PagedAttentionBackend.forward``: the ``AttentionBackend`` protocol of
``minivllm/attention/__init__.py``. ``LLM(attention_backend=PagedAttentionBackend())`` then
calls it in every attention layer of every step, with

* ``query [T, H, D]``, ``key [T, KVH, D]``, ``value [T, KVH, D]``: the step's *flat batch*, the
  new tokens of every scheduled sequence one sequence after another, no padding between them
  (a decode brings one token, a prompt or a prompt chunk several);
* ``k_cache``, ``v_cache [num_blocks, block_size, KVH, D]``: this layer's paged cache;
* ``meta`` (:class:`AttentionMetadata`): sequence ``i`` owns rows
  ``query_start_loc[i] .. query_start_loc[i + 1] - 1``; ``seq_lens[i]`` counts its tokens once
  this step's are stored, so its new tokens are its *last* ``query_len`` positions; its logical
  block ``j`` is physical block ``block_tables[i, j]``; row ``t``'s K/V goes to slot
  ``slot_mapping[t] = block * block_size + offset`` (``-1``: a padding row, stored nowhere);
  ``query_lens_cpu`` / ``seq_lens_cpu`` hold the lengths as Python lists;
* ``scale``: the softmax scale.

**What forward must do.** Store every row's K/V at its slot (cast to the cache's dtype; rows
with slot ``-1`` nowhere), then return ``[T, H, D]`` in the query's dtype: row ``t``, the new
token at position ``p`` of sequence ``i``, is causal softmax attention of ``query[t]`` over
positions ``0 .. p`` of sequence ``i``, wherever their K/V lie (earlier steps, a prefix-cache
hit, earlier in this step). Query head ``h`` reads KV head ``h // (H // KVH)``. A padding row's
output is thrown away and never compared: it may be anything, NaN included.

**Precision.** The step cases run in float64 and compare with a tolerance of ``1e-9``: compute
in the inputs' dtype and never down-cast (a softmax in float32 is off by ~1e-7). Up-casting
half or bfloat16 to float32 for the softmax is fine. The engine cases serve the model in
float32, the work counts run float32 steps.

**Invariants the checks hold you to.**

1. Only what a sequence owns reaches its rows. Sequence ``i`` owns the first
   ``meta.readable_lens()[i]`` positions of its table (``seq_len`` less its padding rows, whose
   slots are never written). Every other slot may hold anything, NaN and inf included: the rest
   of a last block, blocks past a sequence's table (the table's padding entries are 0, and block
   0 may belong to nobody), other sequences' and free blocks, the positions of padding rows.
   A score masked to ``-inf`` is not enough when the value it masks still gets multiplied:
   ``0 * NaN`` is NaN.
2. Decode rows are computed together: the PyTorch operations one call runs do not grow with the
   number of decode rows of similar length (a loop over sequences runs its operations once per
   sequence; a handful of groups by length is fine). Sequences with several new tokens
   (prompts, chunks) may be handled one at a time.
3. The work follows each row's own context. The multiply-adds a step's rows need are
   ``needed = sum over sequences of 2 * H * D * query_len * seq_len``, ``seq_len`` rounded up to
   whole blocks (the 2: one product for the scores, one for the weighted sum of values); a call
   does at most ``2 * needed``. A prompt in the step must not stretch the decodes, nor one long
   decode the short ones. Compute scores and weighted sums with matrix products
   (``@``, ``matmul``, ``einsum``, ``bmm``) or ``scaled_dot_product_attention``: the checks count
   those (``minivllm/course/work.py``).
4. Grouped-query attention without copies: K and V are never repeated once per query head, for
   decode rows and for prompts and chunks alike (a copy ``H / KVH`` times the size of what the
   step reads, in every layer).
5. Your own code, in PyTorch: none of minivllm's attention backends or their helpers
   (``minivllm.attention``'s ``cache_ops``, ``torch_ragged``, ``torch_padded``, the Triton
   kernels) in this file.

**One step, worked.** Blocks of 4 slots, two sequences. Sequence 0 decodes one token after 5
cached (``seq_len`` 6, block table ``[3, 0]``); sequence 1 brings a chunk of 3 tokens after 2
cached (``seq_len`` 5, table ``[1, 4]``). Then ``T = 4``, ``query_start_loc = [0, 1, 4]``,
``seq_lens = [6, 5]`` and ``slot_mapping = [1, 6, 7, 16]`` (sequence 0's position 5 is logical
block 1, offset 1: physical block 0, slot 1; sequence 1's positions 2, 3, 4 are slots 6, 7 of
block 1 and slot 16 of block 4). Row 0 attends to sequence 0's positions 0..5, slots
``[12, 13, 14, 15, 0, 1]``; row 2 (position 3 of sequence 1) to positions 0..3, slots
``[4, 5, 6, 7]``, and not to position 4 (slot 16), which comes after it. Slots 2 and 3 (the tail
of sequence 0's last block) and 17..19 belong to nobody.
"""

from __future__ import annotations

import torch

from minivllm.attention.metadata import AttentionMetadata

NOTEBOOK = "notebooks/05_paged_attention_torch.ipynb"


def _decode_groups(lengths: dict[int, int]) -> list[list[int]]:
    """Sequence indices grouped so that in each group every member's length (in whole blocks'
    tokens, ``lengths``) is more than half the group's longest: padding a member to the longest
    costs it less than twice its own work. Longest first; a handful of groups for any spread."""
    order = sorted(lengths, key=lengths.__getitem__, reverse=True)
    groups: list[list[int]] = []
    ceiling = 0
    for seq in order:
        if not groups or 2 * lengths[seq] <= ceiling:
            groups.append([])
            ceiling = lengths[seq]
        groups[-1].append(seq)
    return groups


class PagedAttentionBackend:
    """An attention backend for the engine: ``LLM(attention_backend=PagedAttentionBackend())``."""

    name = "ex05-paged-attention"

    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,  # [T, KVH, D]
        value: torch.Tensor,  # [T, KVH, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D], written in place
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Store the step's new K/V through ``meta.slot_mapping``, then return every row's
        causal attention over its own sequence: ``[T, H, D]`` in the query's dtype.

        The contract, its invariants and a worked step are in this module's docstring. Given:
        ``query_lens`` and ``seq_lens`` as Python lists, and the inputs' shapes checked.
        """
        query_lens, seq_lens = host_lengths(meta)
        check_shapes(query, key, value, k_cache, v_cache, query_lens, seq_lens)
        bs = k_cache.shape[1]
        dev = query.device

        # 1. store: slot -> (block, offset), padding rows (slot < 0) dropped
        slot = meta.slot_mapping.to(dev).long()
        stored = torch.nonzero(slot >= 0).squeeze(1)
        slot = slot.index_select(0, stored)
        where = (torch.div(slot, bs, rounding_mode="floor"), torch.remainder(slot, bs))
        k_cache.index_put_(where, key.index_select(0, stored).to(k_cache.dtype))
        v_cache.index_put_(where, value.index_select(0, stored).to(v_cache.dtype))

        table = meta.block_tables.to(dev).long()
        first_row = [0] * len(query_lens)
        for i in range(1, len(query_lens)):
            first_row[i] = first_row[i - 1] + query_lens[i - 1]
        result = torch.empty_like(query)

        # 2. decode rows, a few length groups at a time
        decodes = {i: -(-seq_lens[i] // bs) * bs for i, n in enumerate(query_lens) if n == 1}
        if decodes:
            readable = meta.readable_lens().to(dev).long()
            for members in _decode_groups(decodes):
                self._decode(result, query, k_cache, v_cache, table, readable, first_row, seq_lens,
                             members, scale)

        # 3. prompts and chunks, sequence by sequence
        for i, n in enumerate(query_lens):
            if n > 1:
                lo = first_row[i]
                result[lo:lo + n] = self._prefill(query[lo:lo + n], key[lo:lo + n], value[lo:lo + n],
                                                  k_cache, v_cache, table[i], seq_lens[i] - n, scale)
        return result

    @staticmethod
    def _decode(result, query, k_cache, v_cache, table, readable, first_row, seq_lens, members, scale):
        """One new token each for the sequences ``members``, attended together."""
        dev, dtype = query.device, query.dtype
        bs, kv_heads = k_cache.shape[1], k_cache.shape[2]
        seqs = torch.tensor(members, device=dev)
        rows = torch.tensor([first_row[i] for i in members], device=dev)
        width = max(seq_lens[i] for i in members)
        span = torch.arange(width, device=dev).unsqueeze(0)  # [1, W]
        limit = readable.index_select(0, seqs).unsqueeze(1)  # [m, 1]
        visible = span < limit  # [m, W]
        # a position the sequence did not write reads its last written one: always a real value
        pos = torch.minimum(span, (limit - 1).clamp(min=0))
        blocks = table[seqs.unsqueeze(1), torch.div(pos, bs, rounding_mode="floor")]
        offsets = torch.remainder(pos, bs)
        keys = k_cache[blocks, offsets].to(dtype).permute(0, 2, 3, 1)  # [m, KVH, D, W]
        vals = v_cache[blocks, offsets].to(dtype).transpose(1, 2)  # [m, KVH, W, D]
        q = query.index_select(0, rows).unflatten(1, (kv_heads, -1))  # [m, KVH, G, D]
        logits = torch.matmul(q, keys).mul_(scale)  # [m, KVH, G, W]
        logits.masked_fill_(visible.logical_not()[:, None, None, :], float("-inf"))
        mixed = torch.matmul(torch.softmax(logits, dim=-1), vals)  # [m, KVH, G, D]
        result.index_copy_(0, rows, mixed.flatten(1, 2))

    @staticmethod
    def _prefill(q_rows, k_rows, v_rows, k_cache, v_cache, seq_table, cached, scale):
        """``n`` new rows after ``cached`` stored tokens of one sequence: the context read from
        the cache, the new tokens taken from the step itself (a padding row is never stored)."""
        n, heads, dim = q_rows.shape
        bs, kv_heads = k_cache.shape[1], k_cache.shape[2]
        dev = q_rows.device
        group = heads // kv_heads
        total = cached + n
        keys = q_rows.new_empty(total, kv_heads, dim)
        vals = q_rows.new_empty(total, kv_heads, dim)
        if cached:
            past = torch.arange(cached, device=dev)
            at = (seq_table[torch.div(past, bs, rounding_mode="floor")], torch.remainder(past, bs))
            keys[:cached] = k_cache[at]
            vals[:cached] = v_cache[at]
        # the step's rows, rounded through the cache's dtype as a cached token would be
        keys[cached:] = k_rows.to(k_cache.dtype)
        vals[cached:] = v_rows.to(v_cache.dtype)
        # [KVH, G * n, D]: every query head of a KV head's group stacked into its rows
        q = q_rows.view(n, kv_heads, group, dim).permute(1, 2, 0, 3).reshape(kv_heads, group * n, dim)
        logits = torch.bmm(q, keys.permute(1, 2, 0)).mul_(scale)  # [KVH, G * n, total]
        mine = torch.arange(n, device=dev).add_(cached).unsqueeze(1)  # each row's own position
        future = torch.arange(total, device=dev).unsqueeze(0) > mine  # [n, total]
        logits.view(kv_heads, group, n, total).masked_fill_(future, float("-inf"))
        mixed = torch.bmm(torch.softmax(logits, dim=-1), vals.transpose(0, 1))  # [KVH, G * n, D]
        return mixed.view(kv_heads, group, n, dim).permute(2, 0, 1, 3).reshape(n, heads, dim)

def host_lengths(meta: AttentionMetadata) -> tuple[list[int], list[int]]:
    """``(query_lens, seq_lens)`` as Python lists. The engine's metadata carries host copies;
    metadata built from tensors alone is read back from them once."""
    if meta.query_lens_cpu is not None and meta.seq_lens_cpu is not None:
        return list(meta.query_lens_cpu), list(meta.seq_lens_cpu)
    starts = meta.query_start_loc.tolist()
    return [b - a for a, b in zip(starts, starts[1:])], meta.seq_lens.tolist()


def check_shapes(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_lens: list[int],
    seq_lens: list[int],
) -> None:
    """Refuse inputs that do not describe one step, naming the value and what it should be."""
    if query.dim() != 3 or key.dim() != 3 or key.shape != value.shape:
        raise ValueError(
            f"query must be [T, H, D] and key, value [T, KVH, D]; got {tuple(query.shape)}, "
            f"{tuple(key.shape)}, {tuple(value.shape)}"
        )
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must both be "
            "[num_blocks, block_size, KVH, D]"
        )
    num_tokens, num_heads, head_dim = query.shape
    if key.shape[0] != num_tokens or key.shape[2] != head_dim or k_cache.shape[2:] != key.shape[1:]:
        raise ValueError(
            f"query {tuple(query.shape)}, key {tuple(key.shape)} and cache {tuple(k_cache.shape)} "
            "disagree on T, KVH or D"
        )
    if num_heads % key.shape[1]:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={key.shape[1]}")
    if sum(query_lens) != num_tokens:
        raise ValueError(f"the metadata's query lengths add up to {sum(query_lens)} rows, "
                         f"the batch has {num_tokens}")
    for seq, (query_len, seq_len) in enumerate(zip(query_lens, seq_lens, strict=True)):
        if not 0 <= query_len <= seq_len:
            raise ValueError(
                f"sequence {seq}: query_len {query_len} must be in 0..seq_len ({seq_len})"
            )
