"""Notebook 00's answers: the KV cache and the roofline."""

from __future__ import annotations

from minivllm.course.answers import question


@question("nb00.kv_bytes", "from the cache's shape alone: how many bytes does one token occupy, in one layer "
          "and in all of them, and which of the shape's four numbers does not enter?")
def kv_bytes(k_cache, num_layers: int) -> str:
    """``k_cache``: one layer's key cache, ``[blocks, tokens per block, KV heads, head dim]``."""
    blocks, per_block, kv_heads, head_dim = k_cache.shape
    width = k_cache.element_size()
    layer = 2 * kv_heads * head_dim * width
    return (
        f"One token leaves a key and a value vector for each of the {kv_heads} KV heads, {head_dim} "
        f"numbers each, {width} bytes per number ({k_cache.dtype}): 2 x {kv_heads} x {head_dim} x {width} "
        f"= **{layer:,} bytes per layer**, and x {num_layers} layers = **{layer * num_layers:,} bytes** "
        f"in all.\n\n"
        f"The first two numbers of the shape, {blocks:,} blocks and {per_block} tokens per block, do not "
        "enter: they say how many tokens the cache can hold, not what one token costs. (Your "
        "`kv_bytes_per_token` gets the same from the model's `config.json`.)"
    )
