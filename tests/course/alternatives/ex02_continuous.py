"""Exercise 02: a continuous-batching scheduler, written from its protocol.

(An alternative correct answer, for tests/course/test_alternatives.py: admission is
planned first -- how many of the queue's head fit the seats and the budget -- then the KV
room is asked for; retired requests leave by rebuilding the queues, not by removal; a delta's
tokens are cut by counting the ones appended.)

Notebook: notebooks/02_continuous_batching.ipynb. Check your work with
``course.check(course.load("ex02_continuous"))`` there, or ``pytest -m ex02``.

You write ``ContinuousScheduler``: every member of minivllm's ``SchedulerInterface`` protocol
(``minivllm/core/interfaces.py``). Once it passes the checks the engine runs it:
``LLM(scheduler=ex.ContinuousScheduler, enable_chunked_prefill=False)`` builds it with the
engine's ``SchedulerConfig`` and KV cache manager, calls ``schedule()`` at every step, runs the
model on the plan, and hands the sampled tokens to ``update_from_output``.

What you are given
------------------
* ``config`` (a ``SchedulerConfig``, a dataclass): ``max_num_seqs`` (the seats),
  ``max_num_batched_tokens`` (the token budget of one step), ``max_model_len`` (the longest a
  request may get), ``enable_chunked_prefill`` (always ``False`` for this scheduler: chunking is
  exercise 03's) and ``policy`` (always ``"fcfs"``, first come first served, here; the priority
  policy is notebook 09's). Build one yourself with
  ``SchedulerConfig(max_num_seqs=..., max_num_batched_tokens=..., max_model_len=...,
  enable_chunked_prefill=False)``; without chunking it refuses a budget below ``max_model_len``.
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
  Its ``finished_req_ids`` may stay empty here (minivllm's scheduler fills it for speculative
  decoding's sake).
* ``RequestDelta`` (``minivllm/core/messages.py``), what one step did for one request:
  ``RequestDelta(request_id, new_token_ids, finish_reason, stop_reason)``; leave
  ``finish_reason`` and ``stop_reason`` out (``None``) for a request that goes on. For one that
  ended, ``finish_reason`` is its status's (``status.finish_reason``: ``"stop"``, ``"length"``)
  and ``stop_reason`` the request's own (``req.stop_reason``, which ``check_stop`` sets: the stop
  token that ended it, or ``None``).

The policy (minivllm's ``Scheduler`` with chunked prefill off). The checks compare every
step's plan, who ends and the blocks in use with minivllm's, so these statements are the
specification. Each says what must be true of a step, not how to get there:

1. **Limits.** A plan computes at most ``max_num_batched_tokens`` tokens. A request is running
   from the step whose plan first includes it until it ends; at most ``max_num_seqs`` requests
   are running at any time.
2. **The plan.** Every running request computes its next token in every step. A waiting request
   computes nothing, or its whole prompt (it is admitted: running from this step on). The plan
   lists the requests that were running before the step, in the order they were admitted, then
   the ones it admits, in the order they arrived. (The running ones always fit: every step since
   its admission has computed a token of each, within the budget.)
3. **First come, first served.** A step admits as many waiting requests as it can within 1 and
   4, and never admits a request while one that arrived before it is left waiting.
4. **KV room.** Every token a plan computes has its room from ``kv.allocate_slots``, which is
   all or nothing: a request that cannot get room for all the tokens it needs does not fit. A
   waiting request holds no blocks. In this exercise's checks a running request always finds
   room; what to do when it does not is exercise 03 (raising an error that names it is fine).
5. **Ends.** ``update_from_output(plan, new_token_ids)`` appends each request's new tokens
   (``new_token_ids``: request id -> the list of tokens it got from the step -- one token here;
   speculative decoding's steps give some requests several; ``plan``: the step's own plan, which
   minivllm's scheduler reads the verified drafts off and yours may ignore) to
   its request, in order; a request ends when ``check_stop(token, config.max_model_len)``
   returns a status for a token it appended, with that status (``req.status = status``: the
   scheduler sets it), and the tokens after that one are dropped. A request that has ended
   holds no blocks and no seat, and is in none of the scheduler's collections, from the moment
   the call that ended it returns. The others keep their order. It returns one
   ``RequestDelta`` per request in ``new_token_ids``, in that order: the tokens it appended (up
   to and including the token that ended it) and, for a request that ended, its
   ``finish_reason`` and ``stop_reason``. Every id in ``new_token_ids`` names a request the
   scheduler holds (the engine leaves out the ones that ended meanwhile).
6. **Ended from outside.** ``finish_requests(ids, status)`` ends the waiting or running
   requests among ``ids`` (an abort, a stop string, a failed row) with ``status``, as in 5, and
   returns them, in any order; other ids (unknown, or ended already) are ignored.
7. **Statuses.** Between steps every waiting request is ``WAITING``, every running one
   ``RUNNING``.

What exercise 03 builds on (keep these, whatever else your design has): ``self.config``,
``self.kv``; ``self.running``, a list of the running requests in the order they were admitted;
``self.waiting``, a ``collections.deque`` of the waiting requests in the order they are to be
admitted (exercise 03 puts a preempted request back at its left end); ``self.requests``,
request id -> request for every request not finished; and ``update_from_output`` and
``finish_requests`` working for any request in ``running`` or ``waiting``.

One step worked out (the notebook's section 2): budget 16, 4 seats; ``a``, ``b``, ``c`` are
running (one token each to compute), ``d`` (a 10-token prompt) and ``e`` (2 tokens) wait. The
plan is ``[('a', 1), ('b', 1), ('c', 1), ('d', 10)]``: ``d``'s prompt fits the 13 tokens the
decodes leave and takes the last seat, so ``e`` waits although its 2 tokens would fit the
budget. All four sample a token in this step (``d`` its first).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from minivllm.core.interfaces import KVCacheManagerInterface
from minivllm.core.messages import RequestDelta
from minivllm.core.scheduler import SchedulerConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.request import Request, RequestStatus

NOTEBOOK = "notebooks/02_continuous_batching.ipynb"


class ContinuousScheduler:
    """Continuous batching with whole prompts, first come first served (the policy above)."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManagerInterface):
        """Keep ``config`` and ``kv`` and start with empty queues (``waiting``, ``running``,
        ``requests``)."""
        self.config, self.kv = config, kv
        self.requests = {}
        self.running = []
        self.waiting = deque()

    @property
    def num_waiting(self) -> int:
        """How many requests wait to be admitted."""
        return sum(1 for _ in self.waiting)

    def add_request(self, request: Request) -> None:
        """Queue a new request behind every request queued before it (policy 7: it is waiting)."""
        self.waiting.extend([request])
        self.requests.update({request.request_id: request})
        request.status = RequestStatus.WAITING

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running."""
        return len(self.running) + len(self.waiting) > 0

    def live_requests(self) -> list[Request]:
        """The requests that hold KV blocks right now (the engine checks the pool against them)."""
        return list(self.running)

    # --- one step ------------------------------------------------------------------------------
    def _decode_all(self, out: SchedulerOutput) -> int:
        """Give each running request its next token, oldest first; return the tokens spent."""
        for position, req in enumerate(self.running):
            table = self.kv.allocate_slots(req, 1)
            if table is None:
                raise RuntimeError(
                    f"request {req.request_id!r} (running, #{position}) has no KV room for its next "
                    "token, and this scheduler cannot preempt")
            out.add(req, req.num_computed_tokens, 1, table)
            req.num_computed_tokens = req.num_computed_tokens + 1
        return len(self.running)

    def _candidates(self, tokens_left: int) -> int:
        """How many requests at the head of the queue the free seats and ``tokens_left`` admit,
        before asking the pool."""
        seats = self.config.max_num_seqs - len(self.running)
        count = 0
        for req in self.waiting:
            if count == seats or req.num_tokens > tokens_left:
                break
            tokens_left -= req.num_tokens
            count += 1
        return count

    def schedule(self) -> SchedulerOutput:
        """Plan one step under policies 1-4 and return it; every request scheduled has its
        ``num_computed_tokens`` advanced by the tokens it computes."""
        out = SchedulerOutput()
        spent = self._decode_all(out)
        for _ in range(self._candidates(self.config.max_num_batched_tokens - spent)):
            head = self.waiting[0]
            prompt = head.num_tokens
            table = self.kv.allocate_slots(head, prompt)
            if table is None:
                break  # the pool is short: the head waits, and so does everyone behind it
            self.waiting.popleft()
            self.running.append(head)
            head.status = RequestStatus.RUNNING
            out.add(head, head.num_computed_tokens, prompt, table)
            head.num_computed_tokens += prompt
        return out

    # --- ends ----------------------------------------------------------------------------------
    def _retire(self, ended: list[Request]) -> None:
        """Take ``ended`` out of every collection and give back their blocks."""
        if not ended:
            return
        gone = {id(req) for req in ended}
        self.running = [req for req in self.running if id(req) not in gone]
        if any(id(req) in gone for req in self.waiting):
            self.waiting = deque(req for req in self.waiting if id(req) not in gone)
        for req in ended:
            self.requests.pop(req.request_id, None)
            self.kv.free(req)

    def update_from_output(self, plan: SchedulerOutput, new_token_ids: dict[str, list[int]]) -> list[RequestDelta]:
        """Append each request's new tokens (``new_token_ids``: request id -> tokens) to it,
        retire the requests that are done (policy 5) and return one ``RequestDelta`` per request
        in ``new_token_ids``: the tokens appended and, for one that ended, how it ended."""
        done, report = [], []
        for request_id in new_token_ids:
            req = self.requests[request_id]
            verdict, kept = None, 0
            for token in new_token_ids[request_id]:
                req.all_token_ids.append(token)
                kept += 1
                verdict = req.check_stop(token, self.config.max_model_len)
                if verdict is not None:
                    break
            appended = new_token_ids[request_id][:kept]
            if verdict is None:
                report.append(RequestDelta(request_id, appended))
                continue
            req.status = verdict
            done.append(req)
            report.append(RequestDelta(request_id, appended, finish_reason=verdict.finish_reason,
                                       stop_reason=req.stop_reason))
        self._retire(done)
        return report

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """End the waiting or running requests named in ``request_ids`` with ``status`` (policy 6)
        and return them."""
        picked: dict[str, Request] = {}
        for request_id in request_ids:
            req = self.requests.get(request_id)
            if req is not None:
                picked[request_id] = req
        ended = list(picked.values())
        for req in ended:
            req.status = status
        self._retire(ended)
        return ended
