"""``LLMEngine``: a model, a tokenizer and an :class:`~minivllm.core.engine_core.EngineCore`.

    add_request  -> InputProcessor: validate everything, tokenize; then queue (nothing is
                    queued if anything is wrong)
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
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from minivllm.config import (
    EngineArgs,
    build_engine_core,
    build_scheduler,
    resolve_max_model_len,
    resolve_num_kv_blocks,
)
from minivllm.engine.input_processor import InputProcessor
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
        cfg = self.model_config
        self.max_model_len = resolve_max_model_len(args, cfg.max_position_embeddings, cfg.sliding_window)
        self.input_processor = InputProcessor(
            self.max_model_len, cfg.vocab_size, self.tokenizer, self.eos_token_ids
        )
        self.kv_dtype = resolve_dtype(args.dtype, self.device)
        scheduler = build_scheduler(args, self.max_model_len, self._num_kv_blocks)
        kv = scheduler.kv
        self._check_memory(kv.num_blocks)
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
        small to gain much from a second thread, while threads that compete with other work for
        the cores lose badly (a parallel operation waits for its slowest thread): measured by
        ``benchmarks/vs_vllm.py`` and ``benchmarks/throughput.py``, see "Threads" in
        docs/benchmarks.md. So small models (hidden size < 1024) get 1 thread unless
        ``cpu_threads`` says otherwise; larger models keep torch's default."""
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

    @property
    def bytes_per_block(self) -> int:
        itemsize = torch.finfo(self.kv_dtype).bits // 8
        return self.model_config.kv_bytes_per_token(itemsize) * self.args.block_size

    def _num_kv_blocks(self) -> int:
        num_blocks = resolve_num_kv_blocks(
            self.args, self.max_model_len, self.bytes_per_block, self._default_kv_memory
        )
        self._check_memory(num_blocks)  # before any block object exists
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

    def _check_memory(self, num_blocks: int) -> None:
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
        available = _available_host_memory()
        if available is not None and cache_bytes + host_bytes > available:
            raise ValueError(
                f"a KV cache of {num_blocks} blocks needs {(cache_bytes + host_bytes) / 2**30:.2f} GiB "
                f"of host memory but only {available / 2**30:.2f} GiB are available; lower "
                f"num_kv_blocks / kv_cache_memory"
            )

    # --- requests --------------------------------------------------------------------------
    def tokenize(self, prompt) -> tuple[str | None, list[int]]:
        """``(text or None, token ids)``: the engine's :class:`InputProcessor` at work."""
        return self.input_processor.tokenize(prompt)

    def check_prompt(self, ids: list[int]) -> None:
        """``ValueError`` for a prompt this engine cannot serve (see :class:`InputProcessor`)."""
        self.input_processor.check_prompt(ids)

    def caller_input_processor(self) -> InputProcessor:
        """The same checks with a tokenizer of its own, for a front end that tokenizes on
        another thread than the one stepping the engine (``AsyncLLM``)."""
        tokenizer = None if self.tokenizer is None else self._load_tokenizer()
        return self.input_processor.with_tokenizer(tokenizer)

    def add_request(
        self,
        request_id: str | None,
        prompt,
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Validate and queue a request; returns its id. Raises before anything is queued.
        ``cache_salt`` (or a prompt dict's ``"cache_salt"``, as in vLLM) keeps this request's
        prefix-cache blocks apart from those of requests with another salt or none."""
        inputs = self.input_processor.process(
            prompt, params, priority=priority, arrival_time=arrival_time, cache_salt=cache_salt
        )
        params, text, ids = inputs.params, inputs.prompt, inputs.prompt_token_ids
        request_id = self._new_request_id(params.n) if request_id is None else str(request_id)
        child_ids = sample_ids(request_id, params.n)
        self._check_ids_free(request_id, child_ids)
        now = time.perf_counter() if arrival_time is None else arrival_time
        child_params = [params] if params.n == 1 else [params.for_sample(i) for i in range(params.n)]
        children = [
            Request(rid, ids, sp, arrival_time=now, priority=priority,
                    eos_token_ids=self.eos_token_ids, cache_salt=inputs.cache_salt, prompt=text)
            for rid, sp in zip(child_ids, child_params, strict=True)
        ]
        self.core.add_request(children[0], children[1:])
        self.output_processor.add_request(request_id, text, children)
        return request_id

    def _in_use(self, request_id: str) -> bool:
        """A user request's id, or the id of one of its samples, while it is unfinished."""
        op = self.output_processor
        return request_id in op.families or request_id in op.children or request_id in self.scheduler.requests

    def _new_request_id(self, n: int) -> str:
        while True:  # skip the ids callers chose themselves
            request_id = str(next(self._ids))
            if not any(map(self._in_use, {request_id, *sample_ids(request_id, n)})):
                return request_id

    def _check_ids_free(self, request_id: str, child_ids: list[str]) -> None:
        """The user's id and its samples' ids (``id#0``, ``id#1``, ... when ``n > 1``) must not
        name a request or a sample in flight: two states under one id would mix their outputs
        and leave one caller waiting forever."""
        if self._in_use(request_id):
            raise ValueError(f"request_id {request_id!r} is already in use")
        clash = next((cid for cid in child_ids if cid != request_id and self._in_use(cid)), None)
        if clash is not None:
            raise ValueError(
                f"request_id {request_id!r} names its {len(child_ids)} samples {child_ids[0]!r}..."
                f"{child_ids[-1]!r}, but {clash!r} is already in use"
            )

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
        try:
            core_out = self.core.step()
        except BaseException:  # Ctrl-C: the core ended the step's requests; forget them here too
            self.output_processor.forget_finished()
            raise
        return self.output_processor.process(core_out)

    def check_invariants(self) -> None:
        self.core.check_invariants()

    def get_stats(self) -> EngineStats:
        return self.core.stats

    def reset_stats(self) -> None:
        """Start the statistics afresh (e.g. after a warm-up run)."""
        self.core.reset_stats()


def sample_ids(request_id: str, n: int) -> list[str]:
    """The engine-level ids of a user request's ``n`` samples: the id itself when ``n == 1``."""
    return [request_id] if n == 1 else [f"{request_id}#{i}" for i in range(n)]


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
