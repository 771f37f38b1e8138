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

:class:`SchedulerBase` holds what every minivllm scheduler shares (the queues, the stop rules,
ending requests); :class:`Scheduler` adds the plan above and forking, which the static baseline
(``minivllm.core.static_scheduler``) does not have.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any

from minivllm.core.forks import PendingForks
from minivllm.core.interfaces import ForkingKVCacheManager
from minivllm.core.messages import RequestDelta
from minivllm.core.policies import POLICIES, FCFSPolicy, make_policy
from minivllm.core.scheduler_output import ScheduledRequest, SchedulerOutput
from minivllm.request import Request, RequestStatus

SCHEDULING_POLICIES = tuple(POLICIES)


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    policy: Any = "fcfs"  # a name from SCHEDULING_POLICIES or a SchedulingPolicy object (kept as the object)
    # speculative decoding: a step may verify up to this many drafts per request ...
    num_speculative_tokens: int = 0
    # ... and reserves this many slots past them (a draft model's own K/V for the next drafts)
    num_lookahead_tokens: int = 0

    def __post_init__(self) -> None:
        self.policy = make_policy(self.policy)  # a name becomes its policy object, once
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.num_speculative_tokens >= self.max_num_batched_tokens:
            raise ValueError(
                f"num_speculative_tokens={self.num_speculative_tokens} drafts plus the token they follow "
                f"do not fit in max_num_batched_tokens={self.max_num_batched_tokens}; lower "
                f"num_speculative_tokens or raise max_num_batched_tokens"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                f">= max_model_len ({self.max_model_len}), or a long prompt could never be scheduled"
            )


class SchedulerBase:
    """The bookkeeping every minivllm scheduler shares: the waiting queue in the policy's
    order, the running list, the requests by id, appending sampled tokens under the stop rules,
    and ending requests. ``schedule()`` is the subclass's."""

    def __init__(self, config: SchedulerConfig, kv_cache_manager):
        self.config = config
        self.kv = kv_cache_manager
        self.policy = config.policy
        # FCFS keeps a deque (preempted requests go back to its front); any other policy a
        # heap ordered by its waiting_key
        self._fifo = isinstance(self.policy, FCFSPolicy)
        self.running: list[Request] = []
        self._waiting_fifo: deque[Request] = deque()
        self._waiting_heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()
        self.requests: dict[str, Request] = {}
        self._ended_ids: set[str] = set()  # ended since the last plan (its finished_req_ids)

    # --- queue helpers -------------------------------------------------------------------
    @property
    def waiting(self) -> list[Request]:
        if self._fifo:
            return list(self._waiting_fifo)
        return [item[-1] for item in sorted(self._waiting_heap, key=lambda e: e[:-1])]

    @property
    def num_waiting(self) -> int:
        return len(self._waiting_heap) + len(self._waiting_fifo)

    def _push_waiting(self, request: Request, front: bool = False) -> None:
        if not self._fifo:
            entry = (tuple(self.policy.waiting_key(request)), next(self._counter), request)
            heapq.heappush(self._waiting_heap, entry)
        elif front:
            self._waiting_fifo.appendleft(request)
        else:
            self._waiting_fifo.append(request)

    def _peek_waiting(self) -> Request:
        return self._waiting_fifo[0] if self._fifo else self._waiting_heap[0][-1]

    def _pop_waiting(self) -> Request:
        return self._waiting_fifo.popleft() if self._fifo else heapq.heappop(self._waiting_heap)[-1]

    # --- public API ----------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        request.status = RequestStatus.WAITING
        self._push_waiting(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def schedule(self) -> SchedulerOutput:
        raise NotImplementedError

    def update_from_output(self, plan: SchedulerOutput, new_token_ids: dict[str, list[int]]) -> list[RequestDelta]:
        """Append each request's new tokens, apply stop rules, free finished requests, and return
        what changed: one :class:`RequestDelta` per request in ``new_token_ids``.

        ``new_token_ids`` maps request id -> the tokens it got this step (one; under speculative
        decoding the drafts it accepted, then the token sampled after them), for the requests
        that sampled in ``plan``. The stop rules apply to each token in turn: a token that ends
        the request is its last, and the ones after it are dropped. A delta holds the tokens
        appended and, for a request that ended, its ``finish_reason`` and ``stop_reason``. A
        request that verified drafts (``plan.spec_token_ids``) keeps only the K/V of the tokens
        it kept: its ``num_computed_tokens`` goes back to its last kept token and the blocks past
        what its next step needs are trimmed (:meth:`_roll_back`). (Committing the step's filled
        blocks to the prefix cache is the step loop's: ``EngineCore.step``, or whoever drives a
        scheduler by hand.)
        """
        max_len = self.config.max_model_len
        requests = self.requests
        deltas: list[RequestDelta] = []
        finished: list[Request] = []
        for rid, tokens in new_token_ids.items():
            req = requests[rid]
            all_tokens = req.all_token_ids
            delta = RequestDelta(rid, tokens)
            for i, token in enumerate(tokens):
                all_tokens.append(token)
                # cheap test first (a stop token, or the length limit); check_stop has the details
                n = len(all_tokens)
                if token in req.stop_token_set or n >= req.length_limit or n >= max_len:
                    status = req.check_stop(token, max_len)
                    if status is not None:
                        if req.status is RequestStatus.WAITING:  # a fork that is waiting for a seat
                            self._remove_waiting({rid})
                        req.status = status
                        finished.append(req)
                        delta = RequestDelta(rid, tokens[: i + 1], status.finish_reason, req.stop_reason)
                        break
            deltas.append(delta)
        if plan.spec_token_ids:
            self._roll_back(plan.spec_token_ids)
        if finished:
            done = {r.request_id for r in finished}
            self.running = [r for r in self.running if r.request_id not in done]
            for r in finished:
                self._release(r)
        return deltas

    def _roll_back(self, verified: dict[str, list[int]]) -> None:
        """After a step that verified drafts: a request's K/V is valid up to its last kept token
        (the token sampled last has none yet), so ``num_computed_tokens`` goes back to there
        (the rejected drafts' slots are written again later) and the blocks past what its next
        step needs return to the pool (``SpeculativeKVCacheManager.trim``)."""
        keep = max(1, self.config.num_lookahead_tokens)
        for rid in verified:
            req = self.requests.get(rid)
            if req is None or req.is_finished:
                continue
            req.num_computed_tokens = len(req.all_token_ids) - 1
            self.kv.trim(req, req.num_computed_tokens + keep)

    def _release(self, req: Request) -> None:
        self.kv.free(req)
        self.requests.pop(req.request_id, None)
        self._ended_ids.add(req.request_id)

    def _take_ended_ids(self) -> set[str]:
        """The requests that ended since the last plan (a plan's ``finished_req_ids``)."""
        ended, self._ended_ids = self._ended_ids, set()
        return ended

    def _remove_waiting(self, gone: set[str]) -> None:
        if self._waiting_fifo:
            self._waiting_fifo = deque(r for r in self._waiting_fifo if r.request_id not in gone)
        if self._waiting_heap:
            self._waiting_heap = [e for e in self._waiting_heap if e[-1].request_id not in gone]
            heapq.heapify(self._waiting_heap)

    def finish_requests(self, request_ids, status: RequestStatus) -> list[Request]:
        """End requests from outside (abort, a stop string found by the detokenizer, an error):
        they leave the queues and free their blocks. Unknown or finished ids are ignored."""
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
        self._remove_waiting(gone)
        for r in ended:
            self._release(r)
        return ended

    def live_requests(self) -> list[Request]:
        """Requests that hold KV blocks right now."""
        return self.running

    def live_request_ids(self) -> list[str]:
        return [r.request_id for r in self.live_requests()]


class Scheduler(SchedulerBase):
    """Continuous batching with chunked prefill, preemption by recompute and prefix caching
    (see the module doc); forks requests for parallel sampling and beam search."""

    def __init__(self, config: SchedulerConfig, kv_cache_manager):
        super().__init__(config, kv_cache_manager)
        self.num_preemptions = 0
        # copy-on-write copies exist only for a KV manager that can share blocks
        self._forking_kv = isinstance(kv_cache_manager, ForkingKVCacheManager)
        self.forks = PendingForks()  # n > 1: siblings waiting for their leader's first token

    @property
    def pending_siblings(self) -> dict[str, list[Request]]:
        """``n > 1``: leader request id -> its siblings that have not forked off it yet (they are
        in no queue: only the leader computes the prompt)."""
        return self.forks.waiting

    def add_request(self, request: Request, siblings=()) -> None:
        """Queue ``request``. ``siblings`` (parallel sampling, ``n > 1``): requests with the same
        prompt that wait, in no queue, until ``request`` samples its first token; the plan of that
        step names them (``SchedulerOutput.forks``) and the step loop then forks each off it
        (:meth:`fork_request`)."""
        super().add_request(request)
        self.forks.add(request.request_id, siblings)

    def finish_requests(self, request_ids, status: RequestStatus) -> list[Request]:
        """As :meth:`SchedulerBase.finish_requests`; the waiting siblings of a leader that ends,
        and the waiting siblings named, end too."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        ended = self.forks.end(ids, status) if self.forks else []
        ended.extend(super().finish_requests(ids, status))
        return ended

    def _pick_victim(self) -> Request:
        return self.policy.choose_victim(self.running)

    def _preempt(self, victim: Request, out: SchedulerOutput) -> int:
        """Free the victim's blocks and requeue it for recomputation. If it was already part
        of this step's batch, take it out again; returns the budget tokens that frees."""
        undone = out.remove(victim)
        self.running.remove(victim)
        self.kv.free(victim)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0  # recompute from scratch when readmitted
        victim.spec_token_ids = []
        victim.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(victim)
        self._push_waiting(victim, front=True)
        return undone

    def schedule(self) -> SchedulerOutput:
        """Plan one step: the running requests first, then admissions (see the module doc)."""
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:  # memory is tight after a preemption: admit nobody this step
            self._schedule_waiting(out, budget)
        if self._forking_kv:
            out.blocks_to_copy = self.kv.take_pending_copies()
        if self.forks:  # the siblings of a leader sampling now draw their first token from its row
            waiting = self.forks.waiting
            out.forks = {r.request_id: list(waiting[r.request_id])
                         for r in out.sampling_requests if r.request_id in waiting}
        out.finished_req_ids = self._take_ended_ids()
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Give each running request its next tokens, oldest first; preempt when out of blocks.
        Returns the budget left."""
        chunked = self.config.enable_chunked_prefill
        allocate = self.kv.allocate_slots
        # Local aliases of the output's lists: this loop runs for every running request at
        # every step (see benchmarks/scheduler_overhead.py).
        out_reqs, out_new, out_done, out_blocks, out_sample = (
            out.requests, out.num_new, out.num_computed, out.block_ids, out.sample
        )
        preempted = out.preempted
        lookahead = self.config.num_lookahead_tokens
        for req in tuple(self.running):  # a snapshot: preemption edits the list
            if preempted and req.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this step to make room
            computed = req.num_computed_tokens
            num_tokens = len(req.all_token_ids)
            num_new = num_tokens - computed
            if not 0 < num_new <= budget:
                if num_new <= 0:  # nothing to compute until its next token is sampled
                    continue
                if budget <= 0:
                    break
                if not chunked:
                    continue
                num_new = budget
            drafts = req.spec_token_ids
            if drafts:  # speculative decoding: verify the drafts in the same pass
                req.spec_token_ids = []
                drafts = drafts[: budget - num_new] if num_new == 1 else []
            block_ids = allocate(req, num_new + len(drafts), (), lookahead)
            if block_ids is None:
                block_ids, budget = self._make_room(req, num_new + len(drafts), out, budget)
                if block_ids is None:
                    continue
            out_reqs.append(req)
            out_new.append(num_new + len(drafts))
            out_done.append(computed)
            out_blocks.append(block_ids)
            out_sample.append(computed + num_new == num_tokens)
            if drafts:
                out.spec_token_ids[req.request_id] = drafts
                num_new += len(drafts)
            req.num_computed_tokens = computed + num_new
            budget -= num_new
        return budget

    def _make_room(self, req: Request, num_new: int, out: SchedulerOutput, budget: int) -> tuple[list[int] | None, int]:
        """Out of blocks for ``req``: preempt (newest first under FCFS) until it fits or is
        itself the victim; a victim already in this step's batch gives its budget back.
        Returns ``(req's block table or None, the budget)``."""
        while True:
            victim = self._pick_victim()
            budget += self._preempt(victim, out)
            if victim is req:
                return None, budget
            block_ids = self.kv.allocate_slots(req, num_new, (), self.config.num_lookahead_tokens)
            if block_ids is not None:
                return block_ids, budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        """Admit waiting requests while budget, seats and KV blocks last (prefix hits first)."""
        cfg = self.config
        admitted: list[Request] = []  # never preempted again in the step that admitted them
        while self.num_waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = self._peek_waiting()
            # prompt log-probabilities need every prompt row computed: no cache hits for them
            lookup = req.num_computed_tokens == 0 and req.sampling_params.prompt_logprobs is None
            hit_blocks, num_hit = self.kv.get_computed_blocks(req) if lookup else ((), 0)
            num_new = req.num_tokens - num_hit
            if num_new > budget:
                if not cfg.enable_chunked_prefill:
                    break
                num_new = budget
            block_ids = self.kv.allocate_slots(req, num_new, hit_blocks, cfg.num_lookahead_tokens)
            if block_ids is None:
                freed = self._preempt_for(req, out, admitted)
                if freed is None:
                    break
                budget += freed
                continue
            self._pop_waiting()
            admitted.append(req)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.add(req, num_hit, num_new, block_ids)
            req.num_computed_tokens = num_hit + num_new
            budget -= num_new

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:
        """Keep the drafts proposed for each running request's next step; its next plan
        verifies them (:meth:`Scheduler._schedule_running`). Each proposal already fits the
        request's length limits (``SpeculativeConfig.num_drafts``)."""
        requests = self.requests
        for rid, proposal in draft_token_ids.items():
            req = requests.get(rid)
            if req is not None and proposal and req.status is RequestStatus.RUNNING:
                req.spec_token_ids = list(proposal)

    def fork_request(self, parent: Request, child: Request) -> None:
        """``child`` continues from ``parent``'s tokens (parallel sampling, beam search); call
        it before ``parent``'s next token is appended. A fork takes a seat like any sequence:
        with one free (fewer than ``max_num_seqs`` running) it runs at once as a copy of
        ``parent`` -- same computed prefix, every KV block shared copy-on-write; without one it
        waits at the front of the queue holding no block, and once admitted computes its tokens
        like a preempted request (the prefix cache, when on, holds the prompt's full blocks)."""
        self.forks.discard(parent.request_id, child)  # a waiting sibling waits no longer
        child.all_token_ids = list(parent.all_token_ids)
        self.requests[child.request_id] = child
        if len(self.running) < self.config.max_num_seqs:
            self.kv.fork(parent, child)
            child.num_computed_tokens = parent.num_computed_tokens
            child.status = RequestStatus.RUNNING
            self.running.append(child)
        else:
            child.num_computed_tokens = 0
            child.status = RequestStatus.WAITING
            self._push_waiting(child, front=True)

    def _preempt_for(self, req: Request, out: SchedulerOutput, admitted: list[Request]) -> int | None:
        """Make room for a waiting request by preempting a running one, if the policy allows
        (the priority policy does when ``req`` outranks the least important running request).
        Requests admitted in this same step are not candidates: two requests that may each
        preempt the other would otherwise take turns forever. Returns the budget tokens freed,
        or None."""
        candidates = [r for r in self.running if r not in admitted] if admitted else self.running
        if not candidates:
            return None
        victim = self.policy.choose_victim(candidates)
        if not self.policy.may_preempt(req, victim):
            return None
        return self._preempt(victim, out)


__all__ = ["Scheduler", "SchedulerBase", "SchedulerConfig", "SchedulerOutput", "ScheduledRequest", "SCHEDULING_POLICIES"]
