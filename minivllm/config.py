"""Engine arguments: every keyword ``LLM(model, ...)`` accepts, with checks that name the limit."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from minivllm.attention import ATTENTION_BACKENDS
from minivllm.core.scheduler import SCHEDULING_POLICIES

SCHEDULERS = ("continuous", "static")
KV_CACHES = ("paged", "contiguous")


@dataclass
class EngineArgs:
    block_size: int = 16
    num_kv_blocks: int | None = None  # explicit pool size; else derived from kv_cache_memory
    kv_cache_memory: int | None = None  # bytes for K and V of all layers; default: see engine
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # default: max(2048, max_model_len) unchunked
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    scheduler: str = "continuous"
    kv_cache: str = "paged"
    attention_backend: str = "auto"
    dtype: str = "auto"
    device: str | None = None
    seed: int | None = 0
    scheduling_policy: str = "fcfs"
    debug_checks: bool = False  # verify block-table/ref-count invariants after every step

    @classmethod
    def from_kwargs(cls, **kwargs) -> EngineArgs:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine argument(s) {unknown}; valid: {sorted(known)}")
        return cls(**kwargs)

    def __post_init__(self) -> None:
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(f"block_size must be a power of two from 1 to 256, got {self.block_size}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler={self.scheduler!r} is not one of {SCHEDULERS}")
        if self.kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache={self.kv_cache!r} is not one of {KV_CACHES}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend={self.attention_backend!r} is not one of {ATTENTION_BACKENDS}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy={self.scheduling_policy!r} is not one of {SCHEDULING_POLICIES}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ValueError(f"kv_cache_memory must be a positive number of bytes, got {self.kv_cache_memory}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
