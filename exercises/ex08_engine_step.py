# This file is generated from solutions/ex08_engine_step.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex08` or `pytest -m ex08`. Stuck? `course.hint("ex08")` in the
# notebook (or `minivllm hint ex08`) gives a hint, one at a time.
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
        raise NotImplementedError("ex08 StepLoop.step: What it must do is in its docstring. Yours to write; stuck? course.hint('ex08') (notebooks/08_serving_loop.ipynb)")

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
        raise NotImplementedError("ex08 StepLoop.record_request_times: What it must do is in its docstring. Yours to write; stuck? course.hint('ex08') (notebooks/08_serving_loop.ipynb)")
