"""PagedAttention that reads the paged KV cache where it lies, on a CPU: the ``"cpp"`` backend.

The ``"torch"`` backend (``torch_ragged.py``) is the readable reference: per layer it copies each
decode bucket's keys and values out of the cache (``gather_slots``, an ``index_select`` for K
and one for V), builds a mask, and runs SDPA over the copy. The copy is as large as what
attention then reads, and for a small model the calls around it cost more than the
arithmetic. This backend hands every short sequence of the step (a decode, a decode verifying
speculative drafts, a short chunk over a cached context: ``torch_ragged.sort_sequences``) to one
C++ kernel per layer, ``minivllm/csrc/paged_attention_cpu.h``, which walks each sequence's block table
and reads the K/V rows in place, block by block, with an online softmax: no gather, no mask, no
bucket, and no slot the sequence does not own is read. Prompts and long chunks keep SDPA
(``torch_ragged.prefill_attention``), whose blocked matrix products beat a loop over keys there.

The kernel is built on first use with minivllm's other CPU kernels (:mod:`minivllm.cpu_kernels`:
about a minute once per machine, then cached on disk). ``kernel_status`` tells whether it
builds here; ``attention_backend="auto"`` takes this backend on a CPU when it does, and the
``"torch"`` backend otherwise.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch

from minivllm.attention.cache_ops import store_kv
from minivllm.attention.kv_quant import check_cache_dtype
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.torch_ragged import (
    PrefillRows,
    host_lengths,
    kept_rows_of,
    prefill_attention,
    sort_sequences,
)
from minivllm.cpu_kernels import kernel_status, load_kernels
from minivllm.transfer import to_device


def auto_cpu_backend() -> str:
    """What ``attention_backend="auto"`` means on a CPU: ``"cpp"`` where its kernel builds,
    ``"torch"`` (with a warning saying why) where it does not."""
    reason = kernel_status()
    if reason is None:
        return "cpp"
    if os.environ.get("MINIVLLM_NO_CPP") != "1":
        warnings.warn(f"{reason}; using attention_backend='torch'", RuntimeWarning, stacklevel=3)
    return "torch"


def paged_attention_cpu(
    query: torch.Tensor,  # [T, H, D]: the rows of the listed sequences, sequence after sequence
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D] (int8: D + 4)
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [S, W] int32
    seq_lens: torch.Tensor,  # [S] int32
    query_start: torch.Tensor,  # [S + 1] int32: sequence s owns rows query_start[s] .. [s + 1]
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens (its last positions) over its cache, read
    through its block table; K/V of the new tokens must already be stored. ``[T, H, D]``."""
    return load_kernels().paged_attention(query, k_cache, v_cache, block_tables, seq_lens, query_start, scale)


@dataclass
class CppStepPlan:
    """What every layer of one step needs (see :func:`plan_cpp_step`)."""

    short_rows: torch.Tensor | None  # [n] int64 rows of the short sequences; None: every row, in order
    tables: torch.Tensor | None  # [S, W] int32 block tables of the short sequences; None: no short sequence
    seq_lens: torch.Tensor | None  # [S] int32
    query_start: torch.Tensor | None  # [S + 1] int32, over the short rows
    prefills: list[PrefillRows]
    kept_rows: torch.Tensor | None  # rows whose slot is not -1; None: every row
    kept_slots: torch.Tensor

    @property
    def one_call(self) -> bool:
        """Every row of the step is in the one kernel call, in order: no prompt, no row left out."""
        return self.tables is not None and self.short_rows is None and not self.prefills


def plan_cpp_step(meta: AttentionMetadata, device: torch.device, dtype: torch.dtype) -> CppStepPlan:
    """The short sequences as one kernel call's arguments, the others as prefills; once per step
    (cached in ``meta.backend_cache``)."""
    cached = meta.backend_cache.get("cpp")
    if cached is not None:
        return cached
    short, prefills = sort_sequences(meta, device, dtype)
    query_lens = host_lengths(meta)[0]
    kept_rows, kept_slots = kept_rows_of(meta)
    seqs = sorted(s for group, _ in short.values() for s in group)
    if not seqs:
        plan = CppStepPlan(None, None, None, None, prefills, kept_rows, kept_slots)
    elif len(seqs) == meta.num_seqs:  # every sequence short: the metadata's tensors as they are
        plan = CppStepPlan(None, meta.block_tables, meta.seq_lens, meta.query_start_loc, prefills,
                           kept_rows, kept_slots)
    else:
        firsts = [0]
        for q in query_lens:
            firsts.append(firsts[-1] + q)
        rows = [r for s in seqs for r in range(firsts[s], firsts[s] + query_lens[s])]
        starts = [0]
        for s in seqs:
            starts.append(starts[-1] + query_lens[s])
        rows_t, seqs_t, starts_t = to_device([(rows, torch.long), (seqs, torch.long), (starts, torch.int32)],
                                             device)
        plan = CppStepPlan(rows_t, meta.block_tables.index_select(0, seqs_t),
                           meta.seq_lens.index_select(0, seqs_t), starts_t, prefills, kept_rows, kept_slots)
    meta.backend_cache["cpp"] = plan
    return plan


class CppAttentionBackend:
    """Store the new K/V, then one C++ kernel call for the step's short sequences (reading the
    cache in place) and SDPA for its prompts. Float caches and 8-bit ones; CPU only."""

    name = "cpp"

    def check_kv_cache(self, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        """Any block size; a float32, bfloat16 or float16 cache, or an int8 one; on the CPU."""
        if torch.device(device).type != "cpu":
            raise ValueError(f"attention_backend='cpp' runs on the CPU, not on {device}; use 'triton' or 'torch'")
        check_cache_dtype(self.name, dtype, int8=True)
        if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.int8):
            raise ValueError(f"attention_backend='cpp' reads float32, bfloat16, float16 or int8 caches, not {dtype}")
        load_kernels()  # a machine that cannot build it fails here, when the engine is built

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
        plan = plan_cpp_step(meta, query.device, query.dtype)
        if plan.kept_rows is None:
            store_kv(key, value, k_cache, v_cache, plan.kept_slots)
        else:
            store_kv(key[plan.kept_rows], value[plan.kept_rows], k_cache, v_cache, plan.kept_slots)
        if plan.one_call:
            return paged_attention_cpu(query, k_cache, v_cache, plan.tables, plan.seq_lens, plan.query_start, scale)
        out = torch.empty_like(query)
        if plan.tables is not None:
            if plan.short_rows is None:
                out = paged_attention_cpu(query, k_cache, v_cache, plan.tables, plan.seq_lens, plan.query_start,
                                          scale)
            else:
                out[plan.short_rows] = paged_attention_cpu(query.index_select(0, plan.short_rows), k_cache, v_cache,
                                                           plan.tables, plan.seq_lens, plan.query_start, scale)
        for rows in plan.prefills:
            span = slice(rows.start, rows.stop)
            out[span] = prefill_attention(query[span], key[span], value[span], k_cache, v_cache, rows, scale)
        return out
