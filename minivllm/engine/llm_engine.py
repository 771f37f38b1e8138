"""``LLMEngine``: a model, a tokenizer and an :class:`~minivllm.core.engine_core.EngineCore`.

    add_request  -> validate everything, tokenize, queue (nothing is queued if anything is wrong)
    step()       -> EngineCore.step()            schedule, run the model, sample, update
                    OutputProcessor.process()     text, stop strings, n > 1, logprobs
                 -> a RequestOutput for every request that made progress or ended
    abort_request-> the requests end now, their blocks are freed, final outputs returned

The engine owns the parts that need torch (the model, its KV cache tensors, the model runner)
and the tokenizer; scheduling, block bookkeeping and the step loop are in ``minivllm.core``.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from minivllm.config import EngineArgs, build_engine_core, build_scheduler, check_int
from minivllm.core.kv_cache_manager import cdiv
from minivllm.engine.model_runner import ModelRunner
from minivllm.engine.output_processor import OutputProcessor
from minivllm.engine.sampler import Sampler
from minivllm.metrics import EngineStats
from minivllm.model.loader import load_model, load_tokenizer, resolve_dtype
from minivllm.outputs import RequestOutput
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams

_DEFAULT_CPU_KV_BYTES = 256 << 20  # 256 MiB: 128k tokens of the tiny model
SMALL_MODEL_HIDDEN_SIZE = 1024  # below it, one CPU thread (see LLMEngine._set_cpu_threads)
logger = logging.getLogger("minivllm")
_BOOKKEEPING_BYTES_PER_BLOCK = 200  # a KVCacheBlock object and its list entries, roughly


class LLMEngine:
    def __init__(self, model: str | None = None, **engine_args):
        self.args = args = EngineArgs.from_kwargs(**engine_args)
        self.model, self.model_path = load_model(
            model, dtype=args.dtype, device=args.device, attention_backend=args.attention_backend,
        )
        self.model_config = self.model.config
        self.device = self.model.lm_head.weight.device
        self._set_cpu_threads()
        self.tokenizer = self._load_tokenizer()
        self.eos_token_ids = self._eos_ids()
        self.max_model_len = self._max_model_len()
        self.kv_dtype = resolve_dtype(args.dtype, self.device)
        scheduler = build_scheduler(args, self.max_model_len, self._num_kv_blocks)
        kv = scheduler.kv
        self._check_pool(kv.num_blocks, kv.block_size)
        self.sampler = Sampler(seed=args.seed)
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else None
        self.runner = ModelRunner(
            self.model, kv.num_blocks, kv.block_size, self.sampler, pad if pad is not None else 0,
            self.kv_dtype,
        )
        self.core = build_engine_core(args, scheduler, self.runner, time.perf_counter)
        self.output_processor = OutputProcessor(self.core, self.tokenizer)
        self._ids = itertools.count()

    @property
    def scheduler(self):
        return self.core.scheduler

    @property
    def kv(self):
        return self.core.kv

    @property
    def stats(self) -> EngineStats:
        return self.core.stats

    @property
    def can_fork(self) -> bool:
        """Whether ``n > 1`` and beam search can share KV blocks (continuous + paged)."""
        return self.core.can_fork

    # --- set-up helpers --------------------------------------------------------------------
    def _set_cpu_threads(self) -> None:
        """On a CPU, choose torch's (process-wide) thread count. A small model's matmuls are too
        small to gain much from a second thread (+16 % on the tiny model on an idle 2-core
        machine), while threads that compete with other work for the cores lose badly (the
        tiny model at 2 threads fell to a fifth with another process busy; at 1 thread it kept
        nearly all): see docs/benchmarks.md. So small models (hidden size < 1024) get 1 thread
        unless ``cpu_threads`` says otherwise; larger models keep torch's default."""
        if self.device.type != "cpu":
            return
        threads = self.args.cpu_threads
        if threads is None and self.model.config.hidden_size < SMALL_MODEL_HIDDEN_SIZE:
            threads = 1
        if threads is not None and threads != torch.get_num_threads():
            logger.info("minivllm: torch.set_num_threads(%d) for the CPU engine", threads)
            torch.set_num_threads(threads)

    def _load_tokenizer(self):
        if self.args.skip_tokenizer_init:
            return None
        path = Path(self.args.tokenizer) if self.args.tokenizer is not None else self.model_path
        try:
            return load_tokenizer(path)
        except Exception as err:  # noqa: BLE001 - say which directory and how to go on
            raise ValueError(
                f"could not load a tokenizer from {path} ({type(err).__name__}: {err}); give "
                "tokenizer=<directory> or skip_tokenizer_init=True to serve token-id prompts"
            ) from err

    def _eos_ids(self) -> tuple[int, ...]:
        ids = set(self.model_config.eos_token_ids)
        gen_cfg = self.model_path / "generation_config.json"
        if gen_cfg.is_file():
            try:
                eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
            except json.JSONDecodeError as err:
                raise ValueError(f"{gen_cfg} is not valid JSON: {err}") from err
            ids.update(eos if isinstance(eos, list) else ([] if eos is None else [eos]))
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return tuple(sorted(ids))

    def _max_model_len(self) -> int:
        cfg = self.model_config
        max_len = self.args.max_model_len or cfg.max_position_embeddings
        if max_len > cfg.max_position_embeddings:
            raise ValueError(
                f"max_model_len={max_len} exceeds the model's max_position_embeddings="
                f"{cfg.max_position_embeddings}"
            )
        if cfg.sliding_window is not None and cfg.sliding_window < max_len:
            raise ValueError(
                f"this model uses sliding-window attention (window {cfg.sliding_window}) which minivllm "
                f"does not implement; pass max_model_len <= {cfg.sliding_window}"
            )
        return max_len

    @property
    def bytes_per_block(self) -> int:
        itemsize = torch.finfo(self.kv_dtype).bits // 8
        return self.model_config.kv_bytes_per_token(itemsize) * self.args.block_size

    def _num_kv_blocks(self) -> int:
        args = self.args
        if args.num_kv_blocks is not None:
            num_blocks = args.num_kv_blocks
        else:
            memory = args.kv_cache_memory or self._default_kv_memory()
            num_blocks = int(memory // self.bytes_per_block)
        self._check_pool(num_blocks, args.block_size)  # before any block object exists
        return num_blocks

    def _default_kv_memory(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * 0.5)
        # Enough for every seat to hold a full-length sequence, capped at 256 MiB, but always
        # at least one full-length sequence.
        per_token = self.bytes_per_block // self.args.block_size
        wanted = per_token * self.max_model_len * self.args.max_num_seqs
        return max(min(_DEFAULT_CPU_KV_BYTES, wanted), per_token * self.max_model_len)

    def _check_pool(self, num_blocks: int, block_size: int) -> None:
        """The pool must hold one full-length sequence, and fit in memory (checked before the
        tensors are allocated, so an absurd size fails fast instead of swapping)."""
        needed = cdiv(self.max_model_len, block_size)
        if num_blocks < needed:
            raise ValueError(
                f"the KV cache holds {num_blocks} blocks ({num_blocks * block_size} tokens) but one "
                f"max_model_len={self.max_model_len} sequence needs {needed} blocks; raise "
                f"num_kv_blocks / kv_cache_memory or lower max_model_len"
            )
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
        available = _available_host_memory()
        if available is not None and cache_bytes + host_bytes > available:
            raise ValueError(
                f"a KV cache of {num_blocks} blocks needs {(cache_bytes + host_bytes) / 2**30:.2f} GiB "
                f"of host memory but only {available / 2**30:.2f} GiB are available; lower "
                f"num_kv_blocks / kv_cache_memory"
            )

    # --- requests --------------------------------------------------------------------------
    def tokenize(self, prompt) -> tuple[str | None, list[int]]:
        """``(text or None, token ids)`` of a prompt: a string, a list of token ids, or a
        dict ``{"prompt_token_ids": [...]}`` / ``{"prompt": "..."}`` (vLLM's prompt dicts)."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), self._token_ids(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return self.tokenize(prompt["prompt"])
            raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got keys {sorted(prompt)}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer (skip_tokenizer_init=True): pass token ids")
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ValueError(f"the prompt is not valid Unicode text: {err}") from None
            return prompt, list(self.tokenizer(prompt).input_ids)
        if isinstance(prompt, (bytes, bytearray)):
            raise TypeError("a prompt must be a str or a list of token ids, not bytes: decode it first")
        if isinstance(prompt, (list, tuple)):
            return None, self._token_ids(prompt)
        raise TypeError(
            f"a prompt must be a str, a list of token ids or a prompt dict, got {type(prompt).__name__}"
        )

    @staticmethod
    def _token_ids(ids) -> list[int]:
        if not isinstance(ids, (list, tuple)):
            raise TypeError(f"prompt_token_ids must be a list of integers, got {type(ids).__name__}")
        bad = next((t for t in ids if not isinstance(t, int) or isinstance(t, bool)), None)
        if bad is not None:
            raise TypeError(f"prompt token ids must be integers, got {bad!r} ({type(bad).__name__})")
        return list(ids)

    def check_prompt(self, ids: list[int]) -> None:
        """``ValueError`` naming the value and the limit for a prompt the engine cannot serve."""
        if not ids:
            raise ValueError("the prompt is empty (0 tokens); a request needs at least 1 prompt token")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens but max_model_len={self.max_model_len} "
                f"(a prompt may have at most {self.max_model_len - 1} tokens, leaving room to generate)"
            )
        vocab = self.model_config.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")

    def check_params(self, params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer (this engine has skip_tokenizer_init=True)")
        vocab = self.model_config.vocab_size
        bad = next((t for t in params.stop_token_ids if t >= vocab), None)
        if bad is not None:
            raise ValueError(f"stop token id {bad} is outside the vocabulary [0, {vocab})")

    def add_request(
        self,
        request_id: str | None,
        prompt,
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Validate and queue a request; returns its id. Raises before anything is queued."""
        params = SamplingParams() if params is None else params
        self.check_params(params)
        check_int("priority", priority)
        if arrival_time is not None and (
            not isinstance(arrival_time, (int, float)) or not math.isfinite(arrival_time)
        ):
            raise ValueError(f"arrival_time must be a finite number of seconds, got {arrival_time!r}")
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise TypeError(f"cache_salt must be a string, got {type(cache_salt).__name__}")
        text, ids = self.tokenize(prompt)
        self.check_prompt(ids)
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self.output_processor.families or request_id in self.scheduler.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        now = time.perf_counter() if arrival_time is None else arrival_time
        if params.n == 1:
            samples = [(request_id, params)]
        else:
            samples = [(f"{request_id}#{i}", params.for_sample(i)) for i in range(params.n)]
        children = [
            Request(rid, ids, sp, arrival_time=now, priority=priority,
                    eos_token_ids=self.eos_token_ids, cache_salt=cache_salt, prompt=text)
            for rid, sp in samples
        ]
        self.core.add_request(children[0], children[1:])
        self.output_processor.add_request(request_id, text, children)
        return request_id

    def abort_request(self, request_ids: str | Sequence[str]) -> list[RequestOutput]:
        """End requests now (``finish_reason="abort"``), free their blocks, and return their
        final outputs. Unknown or already finished ids are ignored."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        child_ids = [cid for rid in ids for cid in self.output_processor.family_child_ids(str(rid))]
        ended = self.core.abort_requests(child_ids)
        return self.output_processor.finished_outputs(ended)

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        """User requests (an ``n > 1`` request counts once) not finished yet."""
        return len(self.output_processor)

    # --- the loop --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine step; a :class:`RequestOutput` for every request that got a token or
        ended (a request that failed ends with ``finish_reason="error"``)."""
        return self.output_processor.process(self.core.step())

    def check_invariants(self) -> None:
        self.core.check_invariants()

    def get_stats(self) -> EngineStats:
        return self.core.stats

    def reset_stats(self) -> None:
        """Start the statistics afresh (e.g. after a warm-up run)."""
        self.core.reset_stats()


def _available_host_memory() -> int | None:
    """Bytes of memory the OS says are available (Linux ``MemAvailable``), or ``None``."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
