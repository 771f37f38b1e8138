"""Building the engine core's side: the model, its KV cache, the model runner, the step loop.

Everything that needs torch or the model's weights is built here, by :func:`build_core`, from
the engine arguments -- in the caller's process (``LLM()``, the default) or in the engine
core's own process (``engine_core_process=True``, ``minivllm/engine/core_process.py``). The
front end (``LLMEngine``: tokenizer, input and output processing) needs none of it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from minivllm.attention.kv_quant import kv_cache_torch_dtype
from minivllm.config import (
    EngineArgs,
    build_engine_core,
    build_scheduler,
    given_kv_cache_manager,
    resolve_max_model_len,
    resolve_num_kv_blocks,
)
from minivllm.core.engine_core import EngineCore
from minivllm.core.messages import CoreReady
from minivllm.engine.cpu_threads import free_cpu_threads
from minivllm.engine.model_runner import ModelRunner
from minivllm.math_utils import cdiv
from minivllm.model.config import ModelConfig
from minivllm.model.llama import LlamaFamilyModel
from minivllm.model.loader import load_model, resolve_dtype
from minivllm.sample.sampler import Sampler
from minivllm.spec_decode.decoder import SpeculativeDecoder
from minivllm.spec_decode.draft_model import DraftModelProposer

_DEFAULT_CPU_KV_BYTES = 256 << 20  # 256 MiB: 128k tokens of the tiny model
_BOOKKEEPING_BYTES_PER_BLOCK = 200  # a KVCacheBlock object and its list entries, roughly
logger = logging.getLogger("minivllm")


@dataclass
class BuiltCore:
    """The engine core and the parts it drives."""

    core: EngineCore
    model: LlamaFamilyModel
    runner: ModelRunner
    sampler: Sampler
    max_model_len: int
    kv_dtype: torch.dtype  # the cache tensors' dtype: the model's, or torch.int8 (kv_cache_dtype="int8")

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    def ready(self) -> CoreReady:
        kv = self.core.kv
        return CoreReady(self.max_model_len, kv.num_blocks, kv.block_size, self.core.can_fork,
                         self.model.config, str(self.device), os.getpid())


def build_core(args: EngineArgs, model_path: Path, pad_token_id: int | None) -> BuiltCore:
    """Load the checkpoint at ``model_path`` and build the KV cache, the model runner and the
    step loop that ``args`` describe. ``pad_token_id`` fills static batching's padding rows."""
    model, _ = load_model(model_path, dtype=args.dtype, device=args.device,
                          attention_backend=args.attention_backend)
    device = model.lm_head.weight.device
    set_cpu_threads(args, device)
    cfg = model.config
    max_model_len = resolve_max_model_len(args, cfg.max_position_embeddings, cfg.sliding_window)
    kv_dtype = kv_cache_torch_dtype(args.kv_cache_dtype, resolve_dtype(args.dtype, device))
    pool = _Pool(args, cfg, device, kv_dtype, max_model_len)
    draft_model = load_draft_model(args, model) if args.speculative_config is not None else None
    if draft_model is not None:
        pool.add_model(draft_model.config)
    given = given_kv_cache_manager(args)
    num_blocks = given.num_blocks if given is not None else pool.num_kv_blocks()
    pool.check_memory(num_blocks)  # before any block of a built-in pool exists
    scheduler = build_scheduler(args, max_model_len, lambda: num_blocks)
    kv = scheduler.kv
    sampler = Sampler(seed=args.seed)
    speculative = None
    if args.speculative_config is not None:
        draft = None
        if draft_model is not None:
            draft = DraftModelProposer(draft_model, kv.num_blocks, kv.block_size, sampler, kv_dtype)
        speculative = SpeculativeDecoder(args.speculative_config, sampler, max_model_len, draft,
                                         device_type=model.lm_head.weight.device.type)
    runner = ModelRunner(model, kv.num_blocks, kv.block_size, sampler,
                         pad_token_id if pad_token_id is not None else 0, kv_dtype, speculative)
    if args.cuda_graphs:  # graph-ready decode steps (engine/graph_decode.py); captured on CUDA
        from minivllm.engine.graph_decode import GraphDecode

        runner.graph_decode = GraphDecode(model, kv.block_size, max_model_len, args.max_num_seqs,
                                          capture=model.lm_head.weight.device.type == "cuda")
    core = build_engine_core(args, scheduler, runner, time.perf_counter)
    return BuiltCore(core, model, runner, sampler, max_model_len, kv_dtype)


def load_draft_model(args: EngineArgs, target: LlamaFamilyModel) -> LlamaFamilyModel | None:
    """The draft model of ``speculative_config`` (method ``draft_model``), on the target's
    device and with its attention backend; it must share the target's vocabulary."""
    spec = args.speculative_config
    if spec.method != "draft_model":
        return None
    path = Path(spec.model)
    if not path.is_dir():
        raise ValueError(f"speculative_config['model']={spec.model!r} is not a checkpoint directory")
    device = target.lm_head.weight.device
    draft, _ = load_model(path, dtype=args.dtype, device=str(device), attention_backend=target.attention_backend)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"the draft model {spec.model!r} has vocab_size={draft.config.vocab_size} but the target has "
            f"{target.config.vocab_size}: a draft model must share the target's tokenizer"
        )
    return draft


def set_cpu_threads(args: EngineArgs, device: torch.device) -> None:
    """On a CPU, set torch's (process-wide) thread count: ``cpu_threads`` when given, else the
    cores the machine has free as the engine is built (``cpu_threads.free_cpu_threads``: a
    thread on a core another process keeps busy makes every parallel operation wait for it)."""
    if device.type != "cpu":
        return
    threads = args.cpu_threads if args.cpu_threads is not None else free_cpu_threads()
    if threads != torch.get_num_threads():
        logger.info("minivllm: torch.set_num_threads(%d) for the CPU engine", threads)
        torch.set_num_threads(threads)


class _Pool:
    """The KV pool's size, and whether it fits in memory."""

    def __init__(self, args: EngineArgs, cfg: ModelConfig, device: torch.device, kv_dtype: torch.dtype,
                 max_model_len: int):
        self.args, self.device, self.max_model_len, self.kv_dtype = args, device, max_model_len, kv_dtype
        self.bytes_per_block = 0
        self.add_model(cfg)

    def add_model(self, cfg: ModelConfig) -> None:
        """A block holds this model's K/V too (a draft model's lives in the target's blocks):
        bytes from the cache's layout, the float format's itemsize or an 8-bit cache's codes
        and scales (``ModelConfig.kv_bytes_per_token``)."""
        quantized = self.kv_dtype == torch.int8
        itemsize = 1 if quantized else torch.finfo(self.kv_dtype).bits // 8
        per_token = cfg.kv_bytes_per_token(itemsize, "int8" if quantized else "auto")
        self.bytes_per_block += per_token * self.args.block_size

    def num_kv_blocks(self) -> int:
        return resolve_num_kv_blocks(self.args, self.max_model_len, self.bytes_per_block, self._default_memory)

    def _default_memory(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * 0.5)
        # Enough for every seat to hold a full-length sequence (and a draft model's lookahead
        # slots past it), capped at 256 MiB, but always at least one such sequence.
        one_sequence = cdiv(self.max_model_len + self.args.num_lookahead_tokens, self.args.block_size)
        one_sequence *= self.bytes_per_block
        return max(min(_DEFAULT_CPU_KV_BYTES, one_sequence * self.args.max_num_seqs), one_sequence)

    def check_memory(self, num_blocks: int) -> None:
        """The pool must fit in memory (checked before the tensors are allocated, so an absurd
        size fails fast instead of swapping)."""
        cache_bytes = num_blocks * self.bytes_per_block
        host_bytes = num_blocks * _BOOKKEEPING_BYTES_PER_BLOCK
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            if cache_bytes > free:
                raise ValueError(
                    f"a KV cache of {num_blocks} blocks needs {cache_bytes / 2**30:.2f} GiB on "
                    f"{self.device} but only {free / 2**30:.2f} GiB are free"
                )
            cache_bytes = 0
        available = available_host_memory()
        if available is not None and cache_bytes + host_bytes > available:
            raise ValueError(
                f"a KV cache of {num_blocks} blocks needs {(cache_bytes + host_bytes) / 2**30:.2f} GiB "
                f"of host memory but only {available / 2**30:.2f} GiB are available; lower "
                f"num_kv_blocks / kv_cache_memory"
            )


def available_host_memory() -> int | None:
    """Bytes of memory the OS says are available (Linux ``MemAvailable``), or ``None``."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
