"""Exercise 08: the engine's step loop -- one step from its parts.

Notebook: notebooks/08_serving_loop.ipynb. Check your work with
``course.check(course.load("ex08_engine_step"))`` there, or ``pytest -m ex08``.

``StepLoop`` is an ``EngineCore`` (``minivllm/core/engine_core.py``): it owns the scheduler
(``self.scheduler``, and through it the KV cache manager ``self.kv``), the executor
(``self.executor``: the model runner on the engine, a fake one in the checks), a clock
(``self.clock()``) and the statistics (``self.stats``). ``LLM(engine_core=ex.StepLoop)`` runs
the engine on it. You write the step; the parts of it that are not the loop itself are given
as helpers in ``minivllm/course/engine_core_base.py`` (``begin_step``, ``fail_step``,
``fail_rows``, ``fork_siblings``, ``record_finish``, ``record_step``, ``end_step``): read them.

What one step does:

1. the scheduler plans it (``SchedulerOutput``), and the plan is completed for the executor;
2. the executor runs it and returns the sampled tokens (``ModelRunnerOutput``). If it raises,
   the step fails as a whole: every request of it ends with an error, none of the K/V it may
   have half-written joins the prefix cache, and the engine goes on with the other requests;
3. the blocks the step filled hold K/V now: they may join the prefix cache -- not earlier;
4. rows that could not be sampled end their requests; siblings of leaders that sampled fork;
5. the sampled tokens (or, for beam search, the ones ``choose_tokens`` picks) are appended by
   the scheduler, which ends the requests that must stop and frees their blocks; a request
   that failed gets no token;
6. the step is recorded: request timestamps, finished requests, one ``StepStats`` that
   describes the engine as the step left it;
7. a step that planned nothing while requests wait is an error (``end_step``).

The checks drive your class with minivllm's scheduler and KV cache manager and a fake executor,
next to minivllm's ``EngineCore``, and compare every step: the plan, the tokens, who finished
and failed, the statistics and the timestamps; then the tiny model is served with it
(``debug_checks=True``), and finally the engine assembled from all your exercises
(``minivllm/course/capstone.py``).
"""

from __future__ import annotations

from minivllm.core.engine_core import StepOutput
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.course.engine_core_base import EngineCoreBase, TokenChooser

NOTEBOOK = "notebooks/08_serving_loop.ipynb"


class StepLoop(EngineCoreBase):
    """The engine core with your step."""

    def step(self, choose_tokens: TokenChooser | None = None) -> StepOutput:
        """Run one step and return what it did: a ``StepOutput`` with the plan, the
        step's start and end time (``self.clock()``), the tokens appended (``sampled``), the
        requests that ended (``finished``; those that failed also in ``failed``) and the
        executor's ``logprobs`` and ``prompt_logprobs``.

        ``choose_tokens(plan, result)``, when given (beam search), returns the tokens to append
        in place of ``result.sampled``."""
        # BEGIN SOLUTION
        start = self.clock()
        out = self.scheduler.schedule()
        self.begin_step(out)
        try:
            result = self.executor.execute(out)
        except BaseException as err:
            core_out = self.fail_step(out, err, start)
            if not isinstance(err, Exception):  # KeyboardInterrupt: the state is clean; go up
                raise
            return core_out
        self.kv.commit_written_blocks()  # the step ran: its full blocks hold K/V now
        core_out = StepOutput(
            out, start, start, logprobs=result.logprobs, prompt_logprobs=result.prompt_logprobs
        )
        self.fail_rows(result.failed, core_out)
        self.fork_siblings(out, result)  # before update: the siblings' tokens are appended too
        tokens = result.sampled if choose_tokens is None else choose_tokens(out, result)
        tokens = {rid: t for rid, t in tokens.items() if rid not in core_out.failed}
        finished = self.scheduler.update_from_output(tokens)
        now = self.clock()
        self.record_request_times(out, tokens, start, now)
        for req in finished:
            self.record_finish(req, now)
        self.record_step(out, start, now)  # after the update: the engine as the step left it
        core_out.end_time, core_out.sampled = now, tokens
        core_out.finished.extend(finished)
        self.end_step(out, finished)
        return core_out
        # END SOLUTION

    def record_request_times(
        self, out: SchedulerOutput, sampled: dict[str, int], start: float, now: float
    ) -> None:
        """Stamp the two times the latency metrics start from, on each request
        (``req.first_scheduled_time``, ``req.first_token_time``) and in ``self.stats``
        (``record_scheduled(request_id, t)``, ``record_first_token(request_id, t)``), only the
        first time each happens:

        * first scheduled: ``start`` of the first step that computed any of its tokens (a
          sibling that forked off its leader: the step in which it got its first token);
        * first token: ``now``, the end of the step that produced its first token.

        ``out`` is the step's plan; ``sampled``: request id -> the token appended this step.
        Each of those requests is in the plan (``out.requests``), or is a sibling that forked
        this step (``out.forks``: leader id -> siblings), or -- beam search forks beams while it
        chooses tokens -- in ``self.scheduler.requests``. The scheduler has already appended the
        tokens, and a request that finished has left ``self.scheduler``."""
        # BEGIN SOLUTION
        stats = self.stats
        by_id = {req.request_id: req for req in out.requests}
        for kids in out.forks.values():
            by_id.update((kid.request_id, kid) for kid in kids)
        for req in out.requests:
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
                stats.record_scheduled(req.request_id, start)
        for rid in sampled:
            req = by_id.get(rid) or self.scheduler.requests.get(rid)
            if req is None or req.first_token_time is not None:
                continue
            if req.first_scheduled_time is None:  # a sibling, forked in this step
                req.first_scheduled_time = start
                stats.record_scheduled(rid, start)
            req.first_token_time = now
            stats.record_first_token(rid, now)
        # END SOLUTION
