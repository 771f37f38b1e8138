"""``LLMEngine``: the serving loop. One ``step()`` = schedule, run the model, apply the results.

    add_request ──> Scheduler.waiting
    step():  Scheduler.schedule()            which requests, how many tokens each
             ModelRunner.execute()           one flat forward pass + sampling
             Scheduler.update_from_output()  append tokens, EOS / max_tokens, free blocks
             detokenize, stop strings        text, finish on a stop string
             -> RequestOutput for every request that made progress
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import torch

from minivllm.config import EngineArgs
from minivllm.core.contiguous_kv import ContiguousKVCacheManager
from minivllm.core.kv_cache_manager import KVCacheManager, cdiv
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.core.static_scheduler import StaticBatchScheduler
from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.engine.model_runner import ModelRunner
from minivllm.engine.sampler import Sampler
from minivllm.metrics import EngineStats
from minivllm.model.loader import load_model, load_tokenizer, resolve_dtype
from minivllm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams

_DEFAULT_CPU_KV_BYTES = 256 << 20  # 256 MiB: 128k tokens of the tiny model


class _Parent:
    """Bookkeeping for a user request with ``n > 1``: it runs as n child requests."""

    def __init__(self, request_id: str, children: list[Request]):
        self.request_id = request_id
        self.children = children


class LLMEngine:
    def __init__(self, model: str | None = None, **engine_args):
        self.args = args = EngineArgs.from_kwargs(**engine_args)
        self.model, self.model_path = load_model(
            model, dtype=args.dtype, device=args.device, attention_backend=args.attention_backend
        )
        self.model_config = cfg = self.model.config
        self.device = self.model.lm_head.weight.device
        self.tokenizer = load_tokenizer(self.model_path)
        self.eos_token_ids = self._eos_ids()
        self.max_model_len = args.max_model_len or cfg.max_position_embeddings
        if self.max_model_len > cfg.max_position_embeddings:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's max_position_embeddings="
                f"{cfg.max_position_embeddings}"
            )
        if cfg.sliding_window is not None and cfg.sliding_window < self.max_model_len:
            raise ValueError(
                f"this model uses sliding-window attention (window {cfg.sliding_window}) which minivllm "
                f"does not implement; pass max_model_len <= {cfg.sliding_window}"
            )
        backend = self.model.attention_layers[0].backend.name
        if backend == "triton" and args.block_size < 16:
            raise ValueError(
                f"block_size={args.block_size} is below the Triton kernels' minimum of 16; use "
                f"block_size >= 16 or attention_backend='torch'"
            )
        self.kv_dtype = resolve_dtype(args.dtype, cfg, self.device)
        num_blocks = self._num_kv_blocks()
        if args.kv_cache == "contiguous":
            self.kv = ContiguousKVCacheManager(num_blocks, args.block_size, self.max_model_len)
        else:
            self.kv = KVCacheManager(num_blocks, args.block_size, args.enable_prefix_caching)
        chunked = args.enable_chunked_prefill
        budget = args.max_num_batched_tokens or (2048 if chunked else max(2048, self.max_model_len))
        sched_cfg = SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=chunked,
            policy=args.scheduling_policy,
        )
        sched_cls = StaticBatchScheduler if args.scheduler == "static" else Scheduler
        self.scheduler = sched_cls(sched_cfg, self.kv)
        self.sampler = Sampler(seed=args.seed)
        pad = self.tokenizer.pad_token_id
        self.runner = ModelRunner(self.model, self.kv, self.sampler, pad if pad is not None else 0, self.kv_dtype)
        self.stats = EngineStats()
        self._requests: dict[str, Request] = {}  # every live (child) request, by id
        self._fork_pending: dict[str, list[Request]] = {}  # n > 1: leader id -> its siblings
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._parents: dict[str, _Parent] = {}
        self._child_to_parent: dict[str, str] = {}
        self._ids = itertools.count()

    # --- set-up helpers --------------------------------------------------------------------
    def _eos_ids(self) -> tuple[int, ...]:
        ids = set(self.model_config.eos_token_ids)
        gen_cfg = self.model_path / "generation_config.json"
        if gen_cfg.is_file():
            import json

            eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else ([] if eos is None else [eos]))
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return tuple(sorted(ids))

    def _num_kv_blocks(self) -> int:
        args, cfg = self.args, self.model_config
        bytes_per_block = cfg.kv_bytes_per_token(torch.finfo(self.kv_dtype).bits // 8) * args.block_size
        if args.num_kv_blocks is not None:
            num_blocks = args.num_kv_blocks
            source = f"num_kv_blocks={num_blocks}"
        else:
            memory = args.kv_cache_memory or self._default_kv_memory()
            num_blocks = memory // bytes_per_block
            source = f"kv_cache_memory={memory} bytes ({bytes_per_block} bytes per block)"
        needed = cdiv(self.max_model_len, args.block_size)
        if num_blocks < needed:
            raise ValueError(
                f"the KV cache holds {num_blocks} blocks ({num_blocks * args.block_size} tokens, from "
                f"{source}) but one max_model_len={self.max_model_len} sequence needs {needed} blocks"
            )
        return int(num_blocks)

    def _default_kv_memory(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * 0.5)
        # Enough for every seat to hold a full-length sequence, capped at 256 MiB, but always
        # at least one full-length sequence.
        per_token = self.model_config.kv_bytes_per_token(torch.finfo(self.kv_dtype).bits // 8)
        wanted = per_token * self.max_model_len * self.args.max_num_seqs
        return max(min(_DEFAULT_CPU_KV_BYTES, wanted), per_token * self.max_model_len)

    # --- requests --------------------------------------------------------------------------
    def tokenize(self, prompt: str | Sequence[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, list(self.tokenizer(prompt).input_ids)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        ids = list(prompt)
        if not all(isinstance(t, int) for t in ids):
            raise ValueError("a prompt must be a string or a list of integer token ids")
        return None, ids

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

    def add_request(
        self,
        request_id: str | None,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Validate and queue a request. Raises ``ValueError`` before anything is queued."""
        params = params or SamplingParams()
        text, ids = self.tokenize(prompt)
        self.check_prompt(ids)
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self.scheduler.requests or request_id in self._parents:
            raise ValueError(f"request_id {request_id!r} is already in use")
        now = time.perf_counter() if arrival_time is None else arrival_time
        children = []
        for i in range(params.n):
            child_params = params
            child_id = request_id
            if params.n > 1:
                child_id = f"{request_id}#{i}"
                child_params = SamplingParams(**{**params.__dict__, "n": 1})
                if params.seed is not None:
                    child_params.seed = params.seed + i
            req = Request(
                child_id, ids, child_params, arrival_time=now, priority=priority,
                eos_token_ids=self.eos_token_ids, cache_salt=cache_salt, prompt=text,
            )
            children.append(req)
        for req in children:
            self._detok[req.request_id] = IncrementalDetokenizer(self.tokenizer, ids, req.sampling_params)
            self._requests[req.request_id] = req
            self.stats.requests[req.request_id] = RequestMetrics(arrival_time=now)
        if params.n > 1 and self.can_fork:
            # Parallel sampling: compute the prompt once (the first child), then fork the
            # others off it when it samples, sharing its blocks copy-on-write.
            self.scheduler.add_request(children[0])
            self._fork_pending[children[0].request_id] = children[1:]
        else:
            for req in children:
                self.scheduler.add_request(req)
        if params.n > 1:
            self._parents[request_id] = _Parent(request_id, children)
            for c in children:
                self._child_to_parent[c.request_id] = request_id
        return request_id

    @property
    def can_fork(self) -> bool:
        """Forking shares blocks: only the continuous scheduler over the paged cache does it."""
        return self.args.scheduler == "continuous" and self.args.kv_cache == "paged"

    def abort_request(self, request_ids: str | Sequence[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        expanded = []
        for rid in ids:
            parent = self._parents.get(rid)
            expanded.extend([c.request_id for c in parent.children] if parent else [rid])
        now = time.perf_counter()
        for rid in expanded:  # siblings that were never forked are not in the scheduler
            for kid in self._fork_pending.pop(rid, []):
                kid.status = RequestStatus.FINISHED_ABORTED
                self._stamp_finish(kid, now)
        for req in self.scheduler.finish_requests(expanded, RequestStatus.FINISHED_ABORTED):
            self._stamp_finish(req, now)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.running) + self.scheduler.num_waiting

    # --- the loop --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        sched_out = self.scheduler.schedule()
        pending = self._fork_pending
        sampled = self.runner.execute(sched_out, pending or None)
        now = time.perf_counter()
        for leader_id in [lid for lid in pending if lid in sampled]:
            leader = self._requests[leader_id]
            for kid in pending.pop(leader_id):
                self.scheduler.fork_request(leader, kid)
        finished = self.scheduler.update_from_output(sched_out, sampled)
        for req in sched_out.requests:
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
                self.stats.requests[req.request_id].first_scheduled_time = start
        touched: list[Request] = []
        for rid, token in sampled.items():
            req = self._requests[rid]
            if req.first_token_time is None:
                req.first_token_time = now
                metrics = self.stats.requests[rid]
                metrics.first_token_time = now
                if metrics.first_scheduled_time is None:  # a forked sibling
                    req.first_scheduled_time = metrics.first_scheduled_time = start
            stop_hit = self._detok[rid].add_tokens([token])
            if stop_hit is not None and not req.is_finished:
                req.stop_reason = stop_hit
                self.scheduler.finish_requests([rid], RequestStatus.FINISHED_STOPPED)
                finished.append(req)
            touched.append(req)
        for req in finished:
            self._stamp_finish(req, now)
        self.stats.record_step(self.scheduler, sched_out, start, time.perf_counter() - start)
        if self.args.debug_checks:
            self.check_invariants()
        return self._make_outputs(touched)

    def _stamp_finish(self, req: Request, now: float) -> None:
        self.stats.record_finish(req, now)
        self.sampler.forget(req.request_id)

    def check_invariants(self) -> None:
        self.kv.check_invariants(self.scheduler.live_request_ids())

    # --- outputs ---------------------------------------------------------------------------
    def _completion(self, req: Request, index: int) -> CompletionOutput:
        finished = req.is_finished
        return CompletionOutput(
            index=index,
            text=self._detok[req.request_id].visible_text(finished),
            token_ids=req.output_token_ids,
            finish_reason=req.status.finish_reason,
            stop_reason=req.stop_reason,
        )

    def _make_outputs(self, touched: list[Request]) -> list[RequestOutput]:
        outputs, seen_parents = [], set()
        for req in touched:
            parent_id = self._child_to_parent.get(req.request_id)
            if parent_id is None:
                outputs.append(self._request_output(req.request_id, [req]))
            elif parent_id not in seen_parents:
                seen_parents.add(parent_id)
                outputs.append(self._request_output(parent_id, self._parents[parent_id].children))
        for out in outputs:
            if out.finished:
                self._forget(out.request_id)
        return outputs

    def _request_output(self, request_id: str, reqs: list[Request]) -> RequestOutput:
        first = reqs[0]
        return RequestOutput(
            request_id=request_id,
            prompt=first.prompt,
            prompt_token_ids=first.prompt_token_ids,
            outputs=[self._completion(r, i) for i, r in enumerate(reqs)],
            finished=all(r.is_finished for r in reqs),
            num_cached_tokens=first.num_cached_tokens,
            metrics=self.stats.requests.get(first.request_id),
        )

    def _forget(self, request_id: str) -> None:
        parent = self._parents.pop(request_id, None)
        reqs = parent.children if parent else None
        ids = [c.request_id for c in reqs] if reqs else [request_id]
        for rid in ids:
            self._detok.pop(rid, None)
            self._child_to_parent.pop(rid, None)
            self._requests.pop(rid, None)

    def get_stats(self) -> EngineStats:
        self.stats.prefix_hit_rate = self.scheduler.prefix_hit_rate
        self.stats.prefill_tokens_skipped = (
            self.scheduler.prefix_hit_tokens + self.scheduler.num_forked_tokens
        )
        return self.stats
