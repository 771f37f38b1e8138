# This file is generated from solutions/ex05_paged_attention_ref.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex05` or `pytest -m ex05`. Stuck? `course.hint("ex05")` in the
# notebook (or `minivllm hint ex05`) gives a hint, one at a time.
"""Exercise 05: PagedAttention in plain PyTorch, as an attention backend the engine can use.

Notebook: notebooks/05_paged_attention_torch.ipynb. Check your work with
``course.check(course.load("ex05_paged_attention_ref"))`` there, or ``pytest -m ex05``.

In every step the engine hands each attention layer one *flat batch*: the new tokens of all
scheduled sequences, one sequence after another (a decode brings one token, a prompt or a
prompt chunk several), together with an :class:`AttentionMetadata` that says which rows belong
to which sequence (``query_start_loc``), how many tokens each sequence has once this step's are
in (``seq_lens``), where its blocks are (``block_tables``) and where each new token's K/V goes
(``slot_mapping``). A backend stores the new K/V, then lets each sequence's new tokens attend,
causally, to everything that sequence has in the cache, its own new tokens included.

You write four functions; the backend class at the bottom is given. It checks the shapes,
walks the flat batch one sequence at a time and calls them:

* ``write_kv``: store the step's new K/V rows in the paged cache through the slot mapping;
* ``gather_context``: read one sequence's K (or V) back, in logical order, through its block table;
* ``causal_mask``: which cached positions each new token of a sequence may attend to;
* ``grouped_attention``: softmax attention where several query heads share one KV head
  (grouped-query attention), without copying K/V once per query head.

Then ``PagedAttentionBackend()`` serves the tiny model: ``LLM(attention_backend=...)``.
"""

from __future__ import annotations

import torch

from minivllm.attention.metadata import AttentionMetadata

NOTEBOOK = "notebooks/05_paged_attention_torch.ipynb"


def write_kv(
    key: torch.Tensor,  # [T, KVH, D] this step's new keys, one row per token of the flat batch
    value: torch.Tensor,  # [T, KVH, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D], written in place
    v_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D], written in place
    slot_mapping: torch.Tensor,  # [T] int64: slot = block * block_size + offset; -1 = padding
) -> None:
    """Store row ``t`` of ``key`` and ``value`` at slot ``slot_mapping[t]`` of the caches, cast
    to the cache's dtype. Rows whose slot is ``-1`` (padding that a static batch computes and
    throws away) are not stored anywhere."""
    raise NotImplementedError("ex05 write_kv: Store row ``t`` of ``key`` and ``value`` at slot ``slot_mapping[t]`` of the caches, cast to the cache's dtype. Yours to write; stuck? course.hint('ex05') (notebooks/05_paged_attention_torch.ipynb)")


def gather_context(
    cache: torch.Tensor,  # [num_blocks, block_size, KVH, D] the K cache or the V cache
    block_table: torch.Tensor,  # [max_blocks] int32: logical block j -> physical block
    seq_len: int,  # tokens this sequence has in the cache
) -> torch.Tensor:
    """Return ``[seq_len, KVH, D]``: positions ``0 .. seq_len - 1`` of one sequence, in order.

    Entries of ``block_table`` past the sequence's last block are padding (0), and the slots of
    its last block past ``seq_len`` belong to nobody: they hold whatever was there before.
    """
    raise NotImplementedError("ex05 gather_context: Return ``[seq_len, KVH, D]``: positions ``0 .. seq_len - 1`` of one sequence, in order. Yours to write; stuck? course.hint('ex05') (notebooks/05_paged_attention_torch.ipynb)")


def causal_mask(
    query_len: int, seq_len: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Return ``[query_len, seq_len]`` bool: may new token ``j`` attend to position ``p``?

    The ``query_len`` new tokens are the sequence's *last* positions (the ones before them were
    cached by earlier steps: an earlier chunk of the prompt, a prefix-cache hit, the tokens
    decoded so far). A token attends to every position up to and including its own.
    """
    raise NotImplementedError("ex05 causal_mask: Return ``[query_len, seq_len]`` bool: may new token ``j`` attend to position ``p``? Yours to write; stuck? course.hint('ex05') (notebooks/05_paged_attention_torch.ipynb)")


def grouped_attention(
    q: torch.Tensor,  # [n, H, D] the queries of one sequence's new tokens
    k: torch.Tensor,  # [L, KVH, D] the sequence's keys, positions 0 .. L-1
    v: torch.Tensor,  # [L, KVH, D]
    mask: torch.Tensor,  # [n, L] bool: True where query row i may attend to key position p
    scale: float,  # the softmax scale, usually D ** -0.5
) -> torch.Tensor:
    """``softmax(q k^T * scale, masked) v`` per query head; returns ``[n, H, D]``.

    Grouped-query attention: query head ``h`` reads KV head ``h // (H // KVH)`` (heads
    ``0 .. H/KVH - 1`` share KV head 0, the next ``H/KVH`` share KV head 1, ...). Each KV head
    is used as it is, for all the query heads of its group at once: no copy of K or V per
    query head (that copy is what makes a naive GQA implementation move ``H / KVH`` times the
    bytes). Every query row has at least one position it may attend to.
    """
    raise NotImplementedError("ex05 grouped_attention: ``softmax(q k^T * scale, masked) v`` per query head; returns ``[n, H, D]``. Yours to write; stuck? course.hint('ex05') (notebooks/05_paged_attention_torch.ipynb)")


class PagedAttentionBackend:
    """An attention backend for the engine: ``LLM(attention_backend=PagedAttentionBackend())``.

    Given (not part of the exercise): the shape checks and the walk over the flat batch. Each
    sequence is handled on its own, decode or prompt alike: its rows of the flat batch attend to
    its whole context, gathered through its block table.
    """

    name = "ex05-paged-attention"

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
        """Store the step's new K/V, then attend; returns ``[T, H, D]`` in the query's dtype."""
        query_lens, seq_lens = host_lengths(meta)
        check_shapes(query, key, value, k_cache, v_cache, query_lens, seq_lens)
        write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(query)
        start = 0
        for seq, (query_len, seq_len) in enumerate(zip(query_lens, seq_lens, strict=True)):
            rows = slice(start, start + query_len)  # this sequence's rows of the flat batch
            start += query_len
            if query_len == 0:
                continue
            table = meta.block_tables[seq]
            k = gather_context(k_cache, table, seq_len).to(query.dtype)  # [seq_len, KVH, D]
            v = gather_context(v_cache, table, seq_len).to(query.dtype)
            mask = causal_mask(query_len, seq_len, query.device)  # [query_len, seq_len]
            out[rows] = grouped_attention(query[rows], k, v, mask, scale)
        return out


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
