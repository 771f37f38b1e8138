"""Exercise 03: chunked prefill and preemption by recompute, on your exercise-02 scheduler.

(An alternative correct answer, for tests/course/test_alternatives.py: the running list is
walked by index against a shrinking boundary -- the victims are its tail, cut off once at the
end of the step -- and the victims join the waiting queue in one ``extendleft``.)

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
plan, the requests it samples and preempts, the blocks in use and the length of the waiting
queue with minivllm's -- on pools small enough to force preemptions too -- and every request's
``num_preemptions`` at the end, so these statements are the specification. Each says what must
be true of a step, or of the state it leaves behind, not how to get there:

1. **Limits**, as in exercise 02: a plan computes at most ``max_num_batched_tokens`` tokens,
   and at most ``max_num_seqs`` requests are running. A request in the middle of its prompt is
   running: it holds a seat.
2. **What a request computes.** A request in the plan computes the next ``n`` of the tokens it
   has not computed yet (there are ``num_tokens - num_computed_tokens`` of them): all of them,
   or as many as the budget still has when its turn comes, if that is fewer; never none. That is
   one token for a request that is decoding, and its prompt or the next chunk of it for one that
   is not done with it. ``schedule()`` returns with its ``num_computed_tokens`` advanced by
   ``n``. The plan samples a request only in the step that computes its last token, so a request
   in the middle of its prompt samples nothing. ``n`` is the budget's to decide, not the pool's:
   a request is never given fewer tokens because the pool is short of room (rules 3 and 5 say
   what happens then).
3. **Whose turn.** The running requests come first, in the order they were admitted, then
   waiting ones, in the order of the queue; the plan lists them in that order, and each gets its
   tokens from the budget the ones before it left. A running request is in the plan unless no
   budget is left for it or it is preempted. Admission is first come, first served: a step
   admits from the head of the queue while a seat is free and budget is left, and stops at the
   first request the pool cannot hold -- nobody behind it is admitted, and nobody running is
   preempted for it. A step that preempted admits nobody at all: memory is what is short.
4. **Room.** Every token a plan computes has its room from ``kv.allocate_slots`` (all or
   nothing, as in exercise 02), asked for the tokens of this step only. When ``schedule()``
   returns, every running request holds the blocks for its ``num_computed_tokens`` tokens and no
   more, and every waiting request holds none and has computed nothing.
5. **A full pool: the newest gives way.** When a running request's tokens do not fit, running
   requests are preempted, newest first (the newest is the one admitted, or admitted again,
   last), and no more of them than it takes: preemption stops as soon as the request fits, or
   once the request is itself the newest and has been preempted. A request preempted in a step
   computes nothing in it; the older requests are served as usual.
6. **What a preempted request is** (preemption by recompute: its K/V is thrown away, its tokens
   are kept). From its preemption on, and until it is admitted again: it holds no blocks, its
   ``num_computed_tokens`` is 0, its status is ``PREEMPTED``, and its ``num_tokens`` and tokens
   are what they were. Its ``num_preemptions`` is one more than before, and the step's
   ``out.preempted`` lists it (the step's victims in the order they were preempted). It is not
   in ``running``, and it is at the front of ``waiting``: after the step, the queue holds the
   step's victims first, in the order they had been admitted (the oldest at the head), then the
   requests that were waiting before.
7. **Recompute.** A preempted request is admitted again like any waiting request (rule 3), as
   if all its tokens -- its prompt and the ones it had generated -- were its prompt: it computes
   them from the first, in chunks if the budget says so (rule 2), and samples its next token in
   the step that computes the last of them.

Between steps every running request is ``RUNNING``; a waiting one is ``WAITING``, or
``PREEMPTED`` if it was preempted and has not been admitted since.

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

    def _give_way(self, victim, out: SchedulerOutput) -> None:
        """Preemption by recompute: drop the victim's K/V, keep its tokens, note it in ``out``."""
        self.kv.free(victim)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_preemptions = victim.num_preemptions + 1
        out.preempted.append(victim)

    def _serve_running(self, out: SchedulerOutput, budget: int) -> int:
        """The running requests' share of the step, oldest first, preempting from the newest end
        when the pool is short. Returns the budget left."""
        queue = self.running
        alive = len(queue)  # queue[:alive] are still running; queue[alive:] gave way this step
        idx = 0
        while idx < alive and budget:
            req = queue[idx]
            todo = min(budget, req.num_tokens - req.num_computed_tokens)
            table = self.kv.allocate_slots(req, todo)
            while table is None:
                alive -= 1
                self._give_way(queue[alive], out)
                if alive == idx:
                    break  # it was the newest itself: it computes nothing this step
                table = self.kv.allocate_slots(req, todo)
            if table is None:
                break
            out.add(req, req.num_computed_tokens, todo, table)
            req.num_computed_tokens = req.num_computed_tokens + todo
            budget -= todo
            idx += 1
        victims = queue[alive:]
        del queue[alive:]
        # out.preempted lists them newest first; extendleft reverses that, oldest at the head
        self.waiting.extendleft(victims[::-1])
        return budget

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        """First come, first served from the head of the queue, while seats and budget last."""
        seats = self.config.max_num_seqs - len(self.running)
        while seats > 0 and budget > 0 and len(self.waiting) > 0:
            head = self.waiting[0]
            chunk = head.num_tokens if head.num_tokens < budget else budget
            table = self.kv.allocate_slots(head, chunk)
            if table is None:
                return  # the pool cannot hold it: nobody behind it goes first
            self.waiting.popleft()
            head.status = RequestStatus.RUNNING
            self.running.append(head)
            out.add(head, head.num_computed_tokens, chunk, table)
            head.num_computed_tokens += chunk
            budget -= chunk
            seats -= 1

    def schedule(self) -> SchedulerOutput:
        """Plan one step by rules 1-7 above and return the plan, leaving the requests, the
        queues and the pool in the state those rules describe."""
        out = SchedulerOutput()
        left = self._serve_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:  # a step that had to preempt admits nobody
            self._admit(out, left)
        return out


def steps_to_first_token(prompt_len: int, token_budget: int, num_decoding: int) -> int | None:
    """Steps a newly admitted prompt of ``prompt_len`` tokens needs until its first output token,
    when ``num_decoding`` older requests decode in every one of those steps (none finishes) and
    the pool never fills. ``None`` if the prompt would never get a token of the budget."""
    share = token_budget - num_decoding
    if share < 1:
        return None
    whole, rest = divmod(prompt_len, share)
    return whole + (1 if rest else 0)
