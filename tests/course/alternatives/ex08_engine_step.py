"""Exercise 08: the engine's step loop, with its failure handling.

(An alternative correct answer, for tests/course/test_alternatives.py: the step is cut into
helpers -- a tally object read off the plan, one ending-with-an-error path for a failed step
and failed rows alike, siblings seated by walking the plan's sampling requests -- and the
requests that receive a token are looked up before ``update_from_output`` instead of after.)

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
   the leader's row (``result.new_token_ids`` then holds a token for each).
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
7. **Tokens.** The tokens appended are ``result.new_token_ids`` -- or, with ``choose_tokens`` (beam
   search), ``choose_tokens(plan, result)`` -- less those of failed requests, by one call of
   ``self.scheduler.update_from_output(plan, tokens)`` (it applies the stop rules, frees the blocks of
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
11. **The output**: ``StepOutput(plan, start, end, new_token_ids=<the tokens appended>,
    finished=<every request that ended in the step>, failed=<request id -> message>,
    logprobs=result.logprobs, prompt_logprobs=result.prompt_logprobs)``.
12. **No stall.** A step whose plan schedules no request and preempts none, and that ends
    none, while the scheduler has unfinished requests raises ``EngineStalledError``: nobody
    will ever run.

One step, for example: the plan is ``a`` (decoding), ``p`` (the last token of its prompt; ``n =
2``, its sibling ``p#1`` waiting) and ``c`` (decoding); the executor returns
``new_token_ids = {a: [11], p: [4], p#1: [9]}`` and ``failed = {c: "logits are not finite"}``. After the step ``c`` has ended
with an error and no token, ``p#1`` runs beside ``p`` on ``p``'s blocks, ``a``, ``p`` and ``p#1``
have one more token each (``p`` and ``p#1`` their first: their ``first_token_time`` is the
step's end), the output holds ``new_token_ids = {a: [11], p: [4], p#1: [9]}``, ``finished = [c]``,
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
from minivllm.course.engine_core_base import EngineCoreBase
from minivllm.request import RequestStatus

NOTEBOOK = "notebooks/08_serving_loop.ipynb"

logger = logging.getLogger("minivllm")


class _Tally:
    """What one step tells ``record_step`` besides the plan: read off the plan before the step
    stamps anything, plus the tokens shared by the siblings it seats."""

    def __init__(self, plan) -> None:
        newcomers = [(req, done) for req, done in zip(plan.requests, plan.num_computed, strict=True)
                     if req.first_scheduled_time is None]
        for req, done in newcomers:
            req.num_cached_tokens = done
        self.prefix_cache_queries = sum(req.num_tokens for req, _ in newcomers)
        self.prefix_cache_hits = sum(done for _, done in newcomers)
        self.num_forked_tokens = 0

    def as_kwargs(self) -> dict[str, int]:
        return {"prefix_cache_queries": self.prefix_cache_queries,
                "prefix_cache_hits": self.prefix_cache_hits,
                "num_forked_tokens": self.num_forked_tokens}


class StepLoop(EngineCoreBase):
    """The engine core with your step."""

    def run_step(self, choose_tokens: TokenChooser | None = None) -> StepOutput:
        """Run one engine step by the rules of this module's docstring and return its
        ``StepOutput``.

        ``choose_tokens(plan, result)``, when given (beam search), returns the tokens to append
        in place of ``result.new_token_ids``."""
        t0 = self.clock()
        plan = self.scheduler.schedule()
        self.begin_step(plan)
        self._hand_forks_to(plan)
        tally = _Tally(plan)
        report = StepOutput(plan, t0, t0)
        try:
            result = self.executor.execute(plan)
        except Exception as exc:  # an error: the step is lost, the engine goes on
            logger.error("the executor raised; failing the %d request(s) of the step", len(plan.requests),
                         exc_info=exc)
            self._wreck(plan, exc, report, tally)
            return report
        except BaseException as exc:  # Ctrl-C and the like: clean up the same way, then pass it on
            self._wreck(plan, exc, report, tally)
            raise
        return self._complete(plan, result, report, tally, choose_tokens)

    # --- the parts of a step -------------------------------------------------------------------
    def _hand_forks_to(self, plan) -> None:
        """The executor draws a first token for every sibling whose leader samples now."""
        pending = self.pending_siblings
        pairs = ((req.request_id, pending.get(req.request_id)) for req in plan.sampling_requests)
        plan.forks = {leader: kids for leader, kids in pairs if kids is not None}

    def _end_with_error(self, messages: dict[str, str], report: StepOutput) -> None:
        """End the requests named (and the siblings still waiting on them) with an error."""
        if not messages:
            return
        pending = self.pending_siblings
        for rid, text in messages.items():
            for sibling in pending.get(rid, []):
                report.failed[sibling.request_id] = text
            report.failed[rid] = text
        report.finished += self.finish_requests(list(messages), RequestStatus.FINISHED_ERROR)

    def _close(self, plan, report: StepOutput, tally: _Tally, t_end: float) -> None:
        report.end_time = t_end
        self.stats.record_step(self.scheduler, plan, report.start_time, t_end - report.start_time,
                               **tally.as_kwargs())

    def _wreck(self, plan, exc: BaseException, report: StepOutput, tally: _Tally) -> None:
        """The executor did not return: nothing it did may be shared, its whole plan fails."""
        self.kv.discard_unwritten_blocks()
        text = f"{type(exc).__name__}: {exc}"
        self._end_with_error(dict.fromkeys((req.request_id for req in plan.requests), text), report)
        self._close(plan, report, tally, self.clock())

    def _complete(self, plan, result, report: StepOutput, tally: _Tally,
                  choose_tokens: TokenChooser | None) -> StepOutput:
        sched = self.scheduler
        self.kv.commit_written_blocks()  # written now, and nobody of the step has freed a block yet
        t0 = report.start_time
        for req in plan.requests:
            if req.first_scheduled_time is None:
                req.first_scheduled_time = t0
        report.logprobs = result.logprobs
        report.prompt_logprobs = result.prompt_logprobs
        self._end_with_error(dict(result.failed), report)
        tally.num_forked_tokens = self._seat_siblings(plan, result, report.failed)
        chosen = choose_tokens(plan, result) if choose_tokens is not None else result.new_token_ids
        appended = {rid: tok for rid, tok in chosen.items() if rid not in report.failed}
        # look the receivers up now: one that ends at this token leaves the scheduler below
        known = dict(sched.requests)
        known.update((req.request_id, req) for req in plan.requests)
        for kids in plan.forks.values():
            known.update((kid.request_id, kid) for kid in kids)
        receivers = [known[rid] for rid in appended if rid in known]
        ended = sched.update_from_output(plan, appended)
        t_end = self.clock()
        for req in receivers:
            if req.first_token_time is not None:
                continue
            req.first_token_time = t_end
            if req.first_scheduled_time is None:  # a sibling that forked in this step
                req.first_scheduled_time = t0
        for req in ended:  # its times are all set: the statistics read them now
            self.record_finish(req, t_end)
        report.new_token_ids = appended
        report.finished += ended
        self._close(plan, report, tally, t_end)
        idle = not plan.requests and not plan.preempted and not ended
        if idle and sched.has_unfinished_requests():
            raise EngineStalledError(
                f"nothing was planned, preempted or ended, yet {sched.num_waiting} request(s) wait "
                f"and {len(sched.running)} run ({self.kv.num_free_blocks}/{self.kv.num_blocks} blocks free)")
        return report

    def _seat_siblings(self, plan, result, failed: dict[str, str]) -> int:
        """Fork the waiting siblings of every leader that got its token, leaders in the plan's
        order; returns the prompt tokens the seated ones share with their leaders."""
        shared = 0
        sched, pending = self.scheduler, self.pending_siblings
        for req in plan.sampling_requests:
            leader_id = req.request_id
            if leader_id not in plan.forks or leader_id in failed or leader_id not in result.new_token_ids:
                continue
            pending.pop(leader_id, None)
            leader = sched.requests.get(leader_id, req)
            for kid in plan.forks[leader_id]:
                if kid.is_finished:  # failed with its own row
                    continue
                sched.fork_request(leader, kid)
                shared += leader.num_computed_tokens if kid.status is RequestStatus.RUNNING else 0
        return shared
