"""Exercise 08: the engine's step loop, with its failure handling.

Notebook: notebooks/08_serving_loop.ipynb. Check your work with
``course.check(course.load("ex08_engine_step"))`` there, or ``pytest -m ex08``.

``StepLoop`` is an engine core (``EngineCoreBase``, ``minivllm/course/engine_core_base.py``):
the base class holds the parts -- ``self.scheduler`` (and its KV cache manager ``self.kv``),
``self.executor``, ``self.clock()``, ``self.stats`` -- takes requests in (the siblings of an
``n > 1`` request wait in ``self.pending_siblings``) and ends them from outside
(``self.finish_requests(ids, status)``), and its ``step()`` runs your ``run_step()`` and
reports the step it returns to the step listeners. ``LLM(engine_core=ex.StepLoop)`` serves the
model with it. The step is yours: it must leave the engine exactly as the rules below say,
whatever happens inside it.

The rules (``plan`` is what ``self.scheduler.schedule()`` returned; ``start`` is the clock
before that call, ``end`` the clock once the step's last token is appended or, for a failed
step, once its requests have ended):

1. **Plan and run.** Each step plans once and runs the plan once (``self.executor.execute``).
   The executor gets the plan completed: ``self.begin_step(plan)`` has seen it, and
   ``plan.forks`` maps every leader that samples in this step and still has siblings waiting
   (``self.pending_siblings``) to those siblings: the executor draws their first tokens from
   the leader's row (``result.sampled`` then holds a token for each).
2. **Written blocks.** The blocks a step filled join the prefix cache
   (``self.kv.commit_written_blocks()``) only once the executor has returned -- and before
   any request of the step gives its blocks back, for whatever reason it ends, so it leaves
   them cached for the next request with the same prefix.
3. **The executor raises** (any ``Exception``): nothing is known to have been written, so
   nothing of the step may join the prefix cache (``self.kv.discard_unwritten_blocks()``);
   every request of the plan ends with status ``FINISHED_ERROR``, and so do the siblings
   waiting on them; each one's entry in ``failed`` is ``"<type of the error>: <the error>"``
   (``"RuntimeError: out of memory"``); the step is recorded (rule 8) and returns its output;
   requests not in the plan are not touched, and the engine goes on with them. (Log the error
   with ``logger.error(..., exc_info=err)``: a server must say why its requests failed.)
4. **An interrupt** (``KeyboardInterrupt``: a ``BaseException`` that is not an ``Exception``)
   does everything rule 3 says, including recording the step, but re-raises the interrupt
   instead of returning.
5. **A row fails** (``result.failed``: request id -> message): that request and the siblings
   waiting on it end with ``FINISHED_ERROR``, and each gets that message in ``failed``; they get
   no token even if the executor drew one, and fork nothing; the other requests of the step go
   on untouched.
6. **Forks.** A leader that got its token forks each of its waiting siblings that has not
   ended, once (``self.scheduler.fork_request(leader, sibling)``: the sibling runs beside it
   sharing its blocks if a seat is free, else waits for one), leaders in the plan's order and
   siblings in theirs, all before any token of the step is appended. A sibling forked no longer
   waits in ``self.pending_siblings``.
7. **Tokens.** The tokens appended are ``result.sampled`` -- or, with ``choose_tokens`` (beam
   search), ``choose_tokens(plan, result)`` -- less those of failed requests, by one call of
   ``self.scheduler.update_from_output(StepTokens(tokens))`` (it applies the stop rules, frees the blocks of
   the requests that end and returns those).
8. **Statistics**: one ``self.stats.record_step`` per step, failed or not (its signature says
   what it takes), describing the engine as the step left it. The step's figures: a request of
   the plan scheduled for the first time (no ``first_scheduled_time`` yet when the step was
   planned) counts its ``num_tokens`` as prefix-cache queries and its tokens already computed
   in the plan (``plan.num_computed``) as hits, and those become its ``num_cached_tokens``;
   each sibling that forked *and got a seat* counts its leader's ``num_computed_tokens`` as
   forked tokens. These figures are read off the plan, so a failed step reports them too.
9. **Timestamps** live on the request, stamped once each: ``first_scheduled_time`` = ``start``
   of the first step that computed any of its tokens (a failed step computed nothing; a
   sibling's is the step that gave it its first token); ``first_token_time`` = ``end`` of the
   step that appended its first token.
10. **Finished.** Every request the step ends is recorded, once, with ``self.record_finish(req,
    end)``, which stamps its finished time and hands the request to the statistics: they keep
    the times it holds then, so by then it holds every time rule 9 gives it. ``finish_requests``
    does this for the requests it ends, with its own reading of the clock: the finished time of
    a failed request is the clock when it ended.
11. **The output**: ``StepOutput(plan, start, end, sampled=<the tokens appended>,
    finished=<every request that ended in the step>, failed=<request id -> message>,
    logprobs=result.logprobs, prompt_logprobs=result.prompt_logprobs)``.
12. **No stall.** A step whose plan schedules no request and preempts none, and that ends
    none, while the scheduler has unfinished requests raises ``EngineStalledError``: nobody
    will ever run.

One step, for example: the plan is ``a`` (decoding), ``p`` (the last token of its prompt; ``n =
2``, its sibling ``p#1`` waiting) and ``c`` (decoding); the executor returns ``sampled = {a: 11,
p: 4, p#1: 9}`` and ``failed = {c: "logits are not finite"}``. After the step ``c`` has ended
with an error and no token, ``p#1`` runs beside ``p`` on ``p``'s blocks, ``a``, ``p`` and ``p#1``
have one more token each (``p`` and ``p#1`` their first: their ``first_token_time`` is the
step's end), the output holds ``sampled = {a: 11, p: 4, p#1: 9}``, ``finished = [c]``,
``failed = {c: "logits are not finite"}``, and one ``StepStats`` describes the engine after it.

The checks run your class and minivllm's ``EngineCore`` side by side over minivllm's scheduler
and KV cache manager with a fake executor that can fail rows, raise, or be interrupted, and
compare every step (the calls made, the plan, the tokens, who ended and how, the statistics,
the times) and every request's timestamps; then they serve the tiny model with your loop
(``debug_checks=True``), and finally the engine assembled from all your exercises
(``minivllm/course/capstone.py``).
"""

from __future__ import annotations

import logging

from minivllm.core.engine_core import EngineStalledError, StepOutput, TokenChooser
from minivllm.core.interfaces import StepTokens
from minivllm.course.engine_core_base import EngineCoreBase
from minivllm.request import RequestStatus

NOTEBOOK = "notebooks/08_serving_loop.ipynb"

logger = logging.getLogger("minivllm")


class StepLoop(EngineCoreBase):
    """The engine core with your step."""

    def run_step(self, choose_tokens: TokenChooser | None = None) -> StepOutput:
        """Run one engine step by the rules of this module's docstring and return its
        ``StepOutput``.

        ``choose_tokens(plan, result)``, when given (beam search), returns the tokens to append
        in place of ``result.sampled``."""
        # BEGIN SOLUTION
        sched, kv, waiting = self.scheduler, self.kv, self.pending_siblings
        start = self.clock()
        plan = sched.schedule()
        self.begin_step(plan)
        plan.forks = {r.request_id: waiting[r.request_id] for r in plan.sampling_requests if r.request_id in waiting}
        queries = hits = forked = 0
        for req, computed in zip(plan.requests, plan.num_computed, strict=True):
            if req.first_scheduled_time is None:  # scheduled for the first time: from the cache
                req.num_cached_tokens = computed
                queries += req.num_tokens
                hits += computed
        step_out = StepOutput(plan, start, start)

        def fail(failed: dict[str, str]) -> None:
            for rid, message in failed.items():
                step_out.failed.update((kid.request_id, message) for kid in waiting.get(rid, ()))
                step_out.failed[rid] = message
            step_out.finished.extend(self.finish_requests(list(failed), RequestStatus.FINISHED_ERROR))

        def record(end: float) -> None:
            step_out.end_time = end
            self.stats.record_step(sched, plan, start, end - start, prefix_cache_queries=queries,
                                   prefix_cache_hits=hits, num_forked_tokens=forked)

        try:
            result = self.executor.execute(plan)
        except BaseException as err:
            kv.discard_unwritten_blocks()  # nobody knows what the step wrote
            message = f"{type(err).__name__}: {err}"
            if isinstance(err, Exception):
                logger.error("a step of %d request(s) failed: %s", len(plan.requests), message, exc_info=err)
            fail({r.request_id: message for r in plan.requests})
            record(self.clock())
            if not isinstance(err, Exception):  # Ctrl-C: the engine is consistent; pass it on
                raise
            return step_out
        kv.commit_written_blocks()  # the K/V exists now, and nothing of the step is freed yet
        for req in plan.requests:
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
        step_out.logprobs, step_out.prompt_logprobs = result.logprobs, result.prompt_logprobs
        fail(result.failed)
        for leader_id, kids in plan.forks.items():
            if leader_id not in result.sampled or leader_id in step_out.failed:
                continue
            waiting.pop(leader_id, None)
            leader = sched.requests[leader_id]
            for kid in kids:
                if kid.is_finished:
                    continue
                sched.fork_request(leader, kid)
                if kid.status is RequestStatus.RUNNING:  # seated: it shares the leader's prompt
                    forked += leader.num_computed_tokens
        tokens = result.sampled if choose_tokens is None else choose_tokens(plan, result)
        tokens = {rid: token for rid, token in tokens.items() if rid not in step_out.failed}
        finished = sched.update_from_output(StepTokens(tokens))
        end = self.clock()
        # a request that finished at its first token has left the scheduler: find it here
        stepped = {r.request_id: r for r in plan.requests}
        stepped.update((kid.request_id, kid) for kids in plan.forks.values() for kid in kids)
        for rid in tokens:
            req = stepped.get(rid) or sched.requests.get(rid)  # beam search forks in choose_tokens
            if req is not None and req.first_token_time is None:
                req.first_token_time = end
                if req.first_scheduled_time is None:  # a sibling, forked in this step
                    req.first_scheduled_time = start
        for req in finished:  # after the first-token times: the statistics keep what they read
            self.record_finish(req, end)
        step_out.sampled = tokens
        step_out.finished.extend(finished)
        record(end)
        if not (plan.requests or plan.preempted or finished) and sched.has_unfinished_requests():
            raise EngineStalledError(f"the scheduler planned nothing while {sched.num_waiting} request(s) wait "
                                     f"({kv.num_free_blocks} of {kv.num_blocks} KV blocks free)")
        return step_out
        # END SOLUTION
