"""Iteration-level (continuous-batching) scheduler. Pure Python: no torch, no model.

There is no "prefill phase" and "decode phase". Every request has ``num_computed_tokens``
catching up to ``num_tokens`` (prompt + generated). Each step, under a token budget
(``max_num_batched_tokens``) and a sequence cap (``max_num_seqs``), the scheduler:

1. gives every *running* request its next tokens: one for a request that is decoding, the rest
   of its prompt (or a chunk of it, with chunked prefill) for one still prefilling. If the KV
   cache has no room, it preempts a running request (the newest under FCFS, the least important
   under the priority policy), frees its blocks, and sends it back to the waiting queue to be
   recomputed later;
2. if nothing was preempted, admits *waiting* requests while budget, sequence slots and KV
   blocks last (reusing prefix-cached blocks when it can).

Requests join and leave the batch at every step: that is continuous batching. The same object
drives the real engine (``minivllm.engine``) and the GPU-scale simulator (``minivllm.sim``).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

from minivllm.request import Request, RequestStatus

SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"

    def __post_init__(self) -> None:
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy={self.policy!r} is not one of {SCHEDULING_POLICIES}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                f">= max_model_len ({self.max_model_len}), or a long prompt could never be scheduled"
            )


class ScheduledRequest:
    """One request's share of a step: compute tokens ``[num_computed, num_computed + num_new)``.

    ``num_padding`` extra tokens after them are computed and thrown away (static batching's
    pads and idle slots). ``sample`` says whether a token is sampled from the last real token.
    """

    __slots__ = ("request", "num_computed", "num_new", "num_padding", "sample")

    def __init__(self, request: Request, num_computed: int, num_new: int, num_padding: int = 0):
        self.request = request
        self.num_computed = num_computed
        self.num_new = num_new
        self.num_padding = num_padding
        self.sample = num_new > 0 and num_computed + num_new == request.num_tokens

    def __repr__(self) -> str:
        return (
            f"ScheduledRequest({self.request.request_id}, computed={self.num_computed}, "
            f"new={self.num_new}, pad={self.num_padding}, sample={self.sample})"
        )


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    num_prefill_tokens: int = 0  # tokens of requests that are not yet sampling-ready decodes
    num_decode_tokens: int = 0
    num_padding_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_padding_tokens

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def decisions(self) -> list[tuple[str, int]]:
        """``(request_id, num_new_tokens)`` in batch order: what two schedulers must agree on."""
        return [(s.request.request_id, s.num_new) for s in self.scheduled]


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache_manager):
        self.config = config
        self.kv = kv_cache_manager
        self.running: list[Request] = []
        self._waiting_fifo: deque[Request] = deque()
        self._waiting_heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        # prefix-cache statistics over admitted requests (tokens)
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

    # --- queue helpers -------------------------------------------------------------------
    @property
    def waiting(self) -> list[Request]:
        if self.config.policy == "priority":
            return [item[3] for item in sorted(self._waiting_heap)]
        return list(self._waiting_fifo)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting_heap) + len(self._waiting_fifo)

    def _push_waiting(self, request: Request, front: bool = False) -> None:
        if self.config.policy == "priority":
            key = (request.priority, request.arrival_time, next(self._counter), request)
            heapq.heappush(self._waiting_heap, key)
        elif front:
            self._waiting_fifo.appendleft(request)
        else:
            self._waiting_fifo.append(request)

    def _peek_waiting(self) -> Request:
        return self._waiting_heap[0][3] if self.config.policy == "priority" else self._waiting_fifo[0]

    def _pop_waiting(self) -> Request:
        if self.config.policy == "priority":
            return heapq.heappop(self._waiting_heap)[3]
        return self._waiting_fifo.popleft()

    # --- public API ----------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        request.status = RequestStatus.WAITING
        self._push_waiting(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def _pick_victim(self) -> Request:
        if self.config.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, victim: Request, out: SchedulerOutput, scheduled: dict) -> int:
        """Free the victim's blocks and requeue it for recomputation. If it was already part
        of this step's batch, take it out again; returns the budget tokens that frees."""
        undone = scheduled.pop(victim.request_id, None)
        self.running.remove(victim)
        self.kv.free(victim)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0  # recompute from scratch when readmitted
        victim.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(victim)
        self._push_waiting(victim, front=True)
        return undone.num_new if undone is not None else 0

    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        out = SchedulerOutput()
        budget = cfg.max_num_batched_tokens
        chunked = cfg.enable_chunked_prefill
        scheduled: dict[str, ScheduledRequest] = {}
        kv = self.kv

        # 1. running requests, oldest first
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = req.num_tokens - req.num_computed_tokens
            if num_new <= 0:  # nothing to compute until its next token is sampled
                i += 1
                continue
            if num_new > budget:
                if not chunked:
                    i += 1
                    continue
                num_new = budget
            preempted_any = False
            while True:
                if kv.allocate_slots(req, num_new) is not None:
                    break
                preempted_any = True
                victim = self._pick_victim()
                budget += self._preempt(victim, out, scheduled)
                if victim is req:
                    num_new = 0
                    break
            if num_new == 0:
                continue  # req itself was preempted; running[i] is now the next request
            scheduled[req.request_id] = ScheduledRequest(req, req.num_computed_tokens, num_new)
            req.num_computed_tokens += num_new
            budget -= num_new
            # a victim ahead of req in the list shifts it left
            i = self.running.index(req) + 1 if preempted_any else i + 1

        # 2. admissions (none after a preemption this step: memory is tight)
        if not out.preempted:
            while self.num_waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = self._peek_waiting()
                hit_blocks, num_hit = (
                    kv.get_computed_blocks(req) if req.num_computed_tokens == 0 else ([], 0)
                )
                num_new = req.num_tokens - num_hit
                if num_new > budget:
                    if not chunked:
                        break
                    num_new = budget
                if kv.allocate_slots(req, num_new, hit_blocks) is None:
                    freed = self._preempt_for(req, out, scheduled)
                    if freed is None:
                        break
                    budget += freed
                    continue
                self._pop_waiting()
                if req.first_scheduled_time is None and req.num_preemptions == 0:
                    req.num_cached_tokens = num_hit
                    self.prefix_query_tokens += req.num_tokens
                    self.prefix_hit_tokens += num_hit
                req.status = RequestStatus.RUNNING
                self.running.append(req)
                scheduled[req.request_id] = ScheduledRequest(req, num_hit, num_new)
                req.num_computed_tokens = num_hit + num_new
                budget -= num_new

        for s in scheduled.values():
            if s.sample and s.num_new == 1:
                out.num_decode_tokens += 1
            else:
                out.num_prefill_tokens += s.num_new
        out.scheduled = list(scheduled.values())
        return out

    def _preempt_for(self, req: Request, out: SchedulerOutput, scheduled: dict) -> int | None:
        """Priority policy only: make room for a more important waiting request by preempting
        the least important running one. Returns the budget tokens freed, or None if no running
        request ranks below ``req``."""
        if self.config.policy != "priority" or not self.running:
            return None
        victim = self._pick_victim()
        if (victim.priority, victim.arrival_time) <= (req.priority, req.arrival_time):
            return None
        return self._preempt(victim, out, scheduled)

    def update_from_output(
        self, out: SchedulerOutput, sampled: dict[str, int], max_model_len: int | None = None
    ) -> list[Request]:
        """Append each sampled token, apply stop rules, free finished requests.

        Returns the requests that finished this step.
        """
        max_len = max_model_len or self.config.max_model_len
        finished: list[Request] = []
        for s in out.scheduled:
            req = s.request
            token = sampled.get(req.request_id) if s.sample else None
            if token is None:
                continue
            status = req.append_token(token)
            if status is None and req.num_tokens >= max_len:
                status = RequestStatus.FINISHED_LENGTH_CAPPED
            if status is not None:
                req.status = status
                finished.append(req)
        if finished:
            done = {r.request_id for r in finished}
            self.running = [r for r in self.running if r.request_id not in done]
            for r in finished:
                self._release(r)
        return finished

    def _release(self, req: Request) -> None:
        self.kv.free(req)
        self.requests.pop(req.request_id, None)

    def finish_requests(self, request_ids, status: RequestStatus) -> list[Request]:
        """End requests from outside (abort, or a stop string found by the detokenizer)."""
        ids = {request_ids} if isinstance(request_ids, str) else set(request_ids)
        ended = []
        for rid in ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished:
                continue
            req.status = status
            ended.append(req)
        if not ended:
            return []
        gone = {r.request_id for r in ended}
        self.running = [r for r in self.running if r.request_id not in gone]
        if self._waiting_fifo:
            self._waiting_fifo = deque(r for r in self._waiting_fifo if r.request_id not in gone)
        if self._waiting_heap:
            self._waiting_heap = [e for e in self._waiting_heap if e[3].request_id not in gone]
            heapq.heapify(self._waiting_heap)
        for r in ended:
            self._release(r)
        return ended

    def live_requests(self) -> list[Request]:
        """Requests that hold KV blocks right now."""
        return self.running

    def live_request_ids(self) -> list[str]:
        return [r.request_id for r in self.live_requests()]
