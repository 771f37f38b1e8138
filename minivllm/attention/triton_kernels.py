"""The Triton PagedAttention kernels, in one import.

* ``reshape_and_cache`` (``triton_cache.py``): write the step's new K/V rows into the paged cache.
* ``paged_decode_attention`` (``triton_decode.py``): one query token per sequence, with an
  optional split-KV ("flash-decoding") pass for long contexts at small batch.
* ``paged_prefill_attention`` (``triton_prefill.py``): ragged query chunks attending causally to
  their cached context and to themselves (prefill, chunked prefill, prefix-cache hits).

All three take the cache layout ``[num_blocks, block_size, num_kv_heads, head_dim]`` and
support fp32, fp16 and bf16 (fp32 accumulation), any head_dim (padded to a power of two and
masked) and any GQA ratio; and an 8-bit cache (``torch.int8`` rows of ``head_dim`` codes and a
float32 scale, ``kv_quant.py``): quantised as it is written, dequantised as blocks are loaded. ``docs/triton_kernels.md`` walks through how they work.
"""

from __future__ import annotations

from minivllm.attention.triton_cache import reshape_and_cache
from minivllm.attention.triton_decode import choose_num_splits, paged_decode_attention
from minivllm.attention.triton_prefill import paged_prefill_attention

__all__ = ["reshape_and_cache", "paged_decode_attention", "paged_prefill_attention", "choose_num_splits"]
