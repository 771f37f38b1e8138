"""Exercise 02: a continuous-batching scheduler, written from its protocol.

Notebook: notebooks/02_continuous_batching.ipynb. Check your work with
``course.check(course.load("ex02_continuous"))`` there, or ``pytest -m ex02``.

You write ``ContinuousScheduler``: every member of minivllm's ``SchedulerInterface`` protocol
(``minivllm/core/interfaces.py``). Once it passes the checks the engine runs it:
``LLM(scheduler=ex.ContinuousScheduler, enable_chunked_prefill=False)`` builds it with the
engine's ``SchedulerConfig`` and KV cache manager, calls ``schedule()`` at every step, runs the
model on the plan, and hands the sampled tokens to ``update_from_output``.

What you are given
------------------
* ``config`` (a ``SchedulerConfig``): ``max_num_seqs`` (the seats), ``max_num_batched_tokens``
  (the token budget of one step), ``max_model_len`` (the longest a request may get).
* ``kv``, the KV cache manager, to be used through its protocol only
  (``KVCacheManagerInterface``): ``kv.allocate_slots(request, n)`` makes room for the request's
  next ``n`` tokens (those after its ``num_computed_tokens``) and returns its whole block table,
  or returns ``None`` and changes nothing when the pool cannot supply the blocks;
  ``kv.free(request)`` gives back every block the request holds.
* ``Request`` (``minivllm/request.py``): ``request_id``, ``num_tokens`` (prompt and generated
  so far), ``num_computed_tokens`` (tokens whose K/V is in the cache: yours to advance when you
  schedule them), ``all_token_ids``, ``status`` (a ``RequestStatus``), and
  ``check_stop(token, max_model_len)``, which returns the status to finish with, or ``None``.
* ``SchedulerOutput`` (``minivllm/core/scheduler_output.py``), the plan of a step:
  ``out.add(request, num_computed, num_new, block_ids)`` records that the step computes the
  request's tokens ``num_computed .. num_computed + num_new - 1`` into the blocks of
  ``block_ids``; the step samples a token for the request when those reach its last token.

The policy (minivllm's ``Scheduler`` with chunked prefill off). The checks compare every
step's decisions with minivllm's, so these rules are the specification:

1. **Budget and seats.** A step computes at most ``max_num_batched_tokens`` tokens. At most
   ``max_num_seqs`` requests run at any time: a request holds a seat from the step that admits
   it until it finishes.
2. **The running first.** Every running request computes its next token, in the order the
   requests were admitted (the oldest first).
3. **Then admission, first come, first served.** Waiting requests are admitted in the order
   they arrived, each with its whole prompt computed in the step that admits it, while a seat
   is free and the prompt fits in the budget that is left. The first waiting request that does
   not fit stops admission for the step: nobody behind it is admitted (no overtaking).
4. **KV room.** Before scheduling ``n`` tokens of a request, get their room from
   ``kv.allocate_slots(request, n)``. A waiting request that gets ``None`` does not fit (rule
   3). In this exercise's checks a running request always finds room; what to do when it does
   not is exercise 03 (raising an error that names the request is a fine answer here).
5. **Retire.** ``update_from_output(sampled)`` appends each sampled token to its request and
   applies the stop rules (``check_stop`` with ``config.max_model_len``). A request that is done
   gets the status ``check_stop`` returned, leaves the scheduler and frees its blocks at once,
   so that its seat and its memory are free in the next step. The others keep their order.
6. **End from outside.** ``finish_requests(ids, status)`` ends requests that are waiting or
   running (an abort, a stop string, a failed row) the same way, with ``status``; ids it does
   not know (or that already ended) are ignored.
7. **Statuses.** A waiting request is ``WAITING``, a running one ``RUNNING``.

What exercise 03 builds on (keep these, whatever else your design has): ``self.config``,
``self.kv``; ``self.running``, a list of the running requests in the order they were admitted;
``self.waiting``, a ``collections.deque`` of the waiting requests in the order they are to be
admitted (exercise 03 puts a preempted request back at its left end); ``self.requests``,
request id -> request for every request not finished; and ``update_from_output`` and
``finish_requests`` working for any request in ``running`` or ``waiting``.

One step worked out (the notebook's section 2): budget 16, 4 seats; ``a``, ``b``, ``c`` are
running (one token each to compute), ``d`` (a 10-token prompt) and ``e`` (2 tokens) wait. The
plan is ``[('a', 1), ('b', 1), ('c', 1), ('d', 10)]``: the decodes first, then ``d`` fits in the
13 tokens left and takes the last seat, so ``e`` waits although its 2 tokens would fit the
budget. All four sample a token in this step (``d`` its first).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from minivllm.core.interfaces import KVCacheManagerInterface
from minivllm.core.scheduler import SchedulerConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.request import Request, RequestStatus

NOTEBOOK = "notebooks/02_continuous_batching.ipynb"


class ContinuousScheduler:
    """Continuous batching with whole prompts, first come first served (the rules above)."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManagerInterface):
        """Keep ``config`` and ``kv`` and start with empty queues (``waiting``, ``running``,
        ``requests``)."""
        # BEGIN SOLUTION
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        # END SOLUTION

    @property
    def num_waiting(self) -> int:
        """How many requests wait to be admitted."""
        # BEGIN SOLUTION
        return len(self.waiting)
        # END SOLUTION

    def add_request(self, request: Request) -> None:
        """Queue a new request behind every request queued before it (rule 7: it is waiting)."""
        # BEGIN SOLUTION
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)
        # END SOLUTION

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running."""
        # BEGIN SOLUTION
        return bool(self.waiting or self.running)
        # END SOLUTION

    def live_requests(self) -> list[Request]:
        """The requests that hold KV blocks right now (the engine checks the pool against them)."""
        # BEGIN SOLUTION
        return self.running
        # END SOLUTION

    def schedule(self) -> SchedulerOutput:
        """Plan one step under rules 1-4 and return it; every request scheduled has its
        ``num_computed_tokens`` advanced by the tokens it computes."""
        # BEGIN SOLUTION
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        for req in self.running:  # one token each, the oldest first
            block_ids = self.kv.allocate_slots(req, 1)
            if block_ids is None:
                raise RuntimeError(f"no KV room for the next token of {req.request_id}: this scheduler "
                                   "does not preempt (exercise 03 does)")
            out.add(req, req.num_computed_tokens, 1, block_ids)
            req.num_computed_tokens += 1
            budget -= 1
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if req.num_tokens > budget:
                break  # first come, first served: nobody overtakes the head of the queue
            block_ids = self.kv.allocate_slots(req, req.num_tokens)
            if block_ids is None:
                break  # no room for its prompt yet: it waits, and everyone behind it too
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.add(req, 0, req.num_tokens, block_ids)
            req.num_computed_tokens = req.num_tokens
            budget -= req.num_tokens
        return out
        # END SOLUTION

    def update_from_output(self, sampled_token_ids: dict[str, int]) -> list[Request]:
        """Append each sampled token (request id -> token) to its request, retire the requests
        that are done (rule 5) and return them."""
        # BEGIN SOLUTION
        finished = []
        for rid, token in sampled_token_ids.items():
            req = self.requests[rid]
            req.all_token_ids.append(token)
            status = req.check_stop(token, self.config.max_model_len)
            if status is not None:
                req.status = status
                finished.append(req)
        for req in finished:
            self.running.remove(req)
            self.kv.free(req)
            del self.requests[req.request_id]
        return finished
        # END SOLUTION

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """End the waiting or running requests named in ``request_ids`` with ``status`` (rule 6)
        and return them."""
        # BEGIN SOLUTION
        ended = [self.requests.pop(rid) for rid in dict.fromkeys(request_ids) if rid in self.requests]
        for req in ended:
            if req in self.running:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            self.kv.free(req)
            req.status = status
        return ended
        # END SOLUTION
