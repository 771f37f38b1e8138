"""Exercise 03: chunked prefill and preemption by recompute, on your exercise-02 scheduler.

Notebook: notebooks/03_chunked_prefill.ipynb. Check your work with
``course.check(course.load("ex03_chunked_prefill"))`` there, or ``pytest -m ex03``.

``ChunkedScheduler`` *is* your ``ContinuousScheduler`` from exercise 02 -- or, until yours
passes its checks, the reference one (``course.working`` below says which) -- with a new
``schedule()``. It keeps the rest of your class; of it, this exercise may rely only on what
exercise 02's contract promises: ``self.config``, ``self.kv``, ``self.running`` (a list, the
order of admission), ``self.waiting`` (a ``collections.deque``, the order of admission to
come), ``self.requests``, and ``update_from_output`` / ``finish_requests`` for any request in
``running`` or ``waiting``. Add methods of your own as you like. Plug it in with
``LLM(scheduler=ex.ChunkedScheduler)`` (chunked prefill is the engine's default).

The policy (minivllm's ``Scheduler`` with chunked prefill on). The checks compare every step's
decisions with minivllm's -- on pools small enough to force preemptions too -- so these rules
are the specification:

1. **Budget and seats**, as in exercise 02: at most ``max_num_batched_tokens`` tokens computed
   in a step; at most ``max_num_seqs`` requests running, a request in the middle of its prompt
   included.
2. **The running first, the oldest first.** Each running request computes as many of the
   tokens it still has to compute (``num_tokens - num_computed_tokens``) as the budget left
   allows: one for a request that is decoding, the rest of its prompt -- or a chunk of it -- for
   one that is not done with it. A request that would get no token is not in the step.
3. **Then admission, first come, first served**, while a seat is free and budget is left: the
   oldest waiting request gets as many of its tokens as the budget left allows -- a prompt
   longer than that is admitted with a chunk of it. A request whose prompt is not finished
   stays running and samples nothing until the step that computes its last prompt token. A
   waiting request that gets ``None`` from ``allocate_slots`` stops admission for the step
   (nobody overtakes it, and nobody is preempted to make room for it).
4. **A full pool: preempt the newest.** When ``allocate_slots`` returns ``None`` for a running
   request, the running request admitted last gives its memory back: its blocks are freed, its
   ``num_computed_tokens`` goes back to 0 (its K/V is gone), its status becomes ``PREEMPTED``,
   its ``num_preemptions`` grows by one, it is listed in ``out.preempted`` and it goes back to
   the front of the waiting queue. Then ask again for the request that needed room; repeat until
   it fits or it is itself the one preempted -- then it computes nothing in this step.
5. **A request preempted in a step computes nothing in it.**
6. **No admission in a step that preempted**: memory is what is short.
7. **Recompute.** A preempted request keeps its tokens. When it is admitted again it computes
   all of them -- its prompt and the tokens it had generated -- as one prompt (in chunks, by
   rule 3), and then samples its next token.

One step worked out (the notebook's by-hand trace): budget 16, chunked prefill on; ``d0``,
``d1``, ``d2`` are decoding and ``doc``, a 50-token prompt, waits. The plan is
``[('d0', 1), ('d1', 1), ('d2', 1), ('doc', 13)]``: the decodes first, then ``doc`` is admitted
with the 13 tokens left of the budget. It samples nothing in this step; the next steps give it
13, 13 and finally 11 tokens, and it samples its first token in that last one.
"""

from __future__ import annotations

from minivllm import course
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.request import RequestStatus

NOTEBOOK = "notebooks/03_chunked_prefill.ipynb"

ContinuousScheduler = course.working("ex02_continuous").ContinuousScheduler  # your exercise 02


class ChunkedScheduler(ContinuousScheduler):
    """Your exercise-02 scheduler, with chunked prefill and preemption by recompute."""

    def schedule(self) -> SchedulerOutput:
        """Plan one step under rules 1-7 and return it; every request scheduled has its
        ``num_computed_tokens`` advanced by the tokens it computes."""
        # BEGIN SOLUTION
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        for req in list(self.running):  # a copy: preemption edits the list
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this step
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            block_ids = self.kv.allocate_slots(req, num_new)
            while block_ids is None:
                victim = self.running.pop()  # the newest running request
                self.kv.free(victim)
                victim.num_computed_tokens = 0
                victim.status = RequestStatus.PREEMPTED
                victim.num_preemptions += 1
                out.preempted.append(victim)
                self.waiting.appendleft(victim)
                if victim is req:
                    break
                block_ids = self.kv.allocate_slots(req, num_new)
            if block_ids is None:
                continue
            out.add(req, req.num_computed_tokens, num_new, block_ids)
            req.num_computed_tokens += num_new
            budget -= num_new
        if out.preempted:
            return out  # memory is short: admit nobody this step
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            num_new = min(req.num_tokens, budget)
            block_ids = self.kv.allocate_slots(req, num_new)
            if block_ids is None:
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.add(req, 0, num_new, block_ids)
            req.num_computed_tokens = num_new
            budget -= num_new
        return out
        # END SOLUTION


def steps_to_first_token(prompt_len: int, token_budget: int, num_decoding: int) -> int | None:
    """Steps a newly admitted prompt of ``prompt_len`` tokens needs until its first output token,
    when ``num_decoding`` older requests decode in every one of those steps (none finishes) and
    the pool never fills. ``None`` if the prompt would never get a token of the budget."""
    # BEGIN SOLUTION
    per_step = token_budget - num_decoding
    if per_step <= 0:
        return None
    return -(-prompt_len // per_step)
    # END SOLUTION
