"""The ``"triton"`` attention backend: the PagedAttention kernels behind the backend protocol.

Same contract as ``TorchAttentionBackend``: write the new K/V through ``meta.slot_mapping``,
then attend, never loading a slot the sequence has not written. A decode-only step (every
sequence has exactly one new token) runs the decode kernel, which may split long contexts
across programs; any step with a longer query (prompts, prompt chunks, or a mix of those with
decode tokens) runs the prefill kernel, which handles every query length including 1.

An 8-bit cache (``kv_cache_dtype="int8"``, ``kv_quant.py``) goes through the same three kernels:
``reshape_and_cache`` quantises, decode and prefill dequantise the blocks they load.

The kernels need a power-of-two block size of at least 16: the backend says so when the model
allocates the cache (:meth:`TritonAttentionBackend.check_kv_cache`), before anything is served.
"""

from __future__ import annotations

import os

import torch

from minivllm.attention.kv_quant import check_cache_dtype
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.triton_decode import check_block_size
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

    def check_kv_cache(self, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        """Refuse a block size the kernels cannot tile. A float cache or an 8-bit one
        (``kv_quant.py``, dequantised inside the kernels); any device."""
        check_block_size(block_size)
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
        if k_cache.shape[1] != meta.block_size:
            raise ValueError(f"cache block size {k_cache.shape[1]} != meta.block_size {meta.block_size}")
        reshape_and_cache(key, value, k_cache, v_cache, meta.slot_mapping)
        if meta.max_query_len == 1 and query.shape[0] == meta.num_seqs:
            # Each program reads one sequence for its own row only: a padding row (an idle seat)
            # reads its own blocks and is thrown away, so seq_lens is enough here.
            return paged_decode_attention(
                query, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, max_seq_len=meta.max_seq_len
            )
        return paged_prefill_attention(
            query, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, scale,
            meta.max_query_len, readable_lens=meta.readable_lens(),
        )


def check_interpreter_ready() -> None:
    """Raise a clear error if interpreted kernels would call compiled Triton functions.

    With ``TRITON_INTERPRET=1`` every ``@triton.jit`` function that our kernels reach (Triton's
    library and our own kernels) must be an interpreted one (see ``triton_env.py``). Called when
    a Triton backend is created, so a broken setup fails at ``LLM(attention_backend="triton")``,
    not mid-step.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    from minivllm.attention import triton_cache, triton_decode, triton_prefill

    functions = {
        "triton.language.zeros": tl.zeros,
        "triton.language.sum": tl.sum,
        "triton.language.max": tl.max,
        "_reshape_and_cache_kernel": triton_cache._reshape_and_cache_kernel,
        "_reshape_and_cache_int8_kernel": triton_cache._reshape_and_cache_int8_kernel,
        "_paged_decode_kernel": triton_decode._paged_decode_kernel,
        "_merge_splits_kernel": triton_decode._merge_splits_kernel,
        "online_softmax_step": triton_decode.online_softmax_step,
        "_paged_prefill_kernel": triton_prefill._paged_prefill_kernel,
    }
    compiled = [name for name, fn in functions.items() if not isinstance(fn, InterpretedFunction)]
    if compiled:
        raise RuntimeError(
            f"TRITON_INTERPRET=1, but {compiled} were defined as compiled GPU functions: Triton "
            "read the flag before it was set (it is read when a @triton.jit function is defined, "
            "e.g. when `import triton`, `import torch._inductor` or a transformers `generate` call "
            "ran before `import minivllm`). Fix: `import minivllm` first, or start Python with "
            "TRITON_INTERPRET=1 in the environment."
        )
