"""Exercise 08: the engine's step loop, with its failure handling.

Notebook: notebooks/08_serving_loop.ipynb. Check your work with
``course.check(course.load("ex08_engine_step"))`` there, or ``pytest -m ex08``.

``StepLoop`` is an engine core (``EngineCoreBase``, ``minivllm/course/engine_core_base.py``):
the base class holds the parts -- ``self.scheduler`` (and its KV cache manager ``self.kv``),
``self.executor``, ``self.clock()``, ``self.stats`` -- takes requests in and ends them from
outside, and its ``step()`` runs your ``run_step()`` and reports the step it returns to the step
listeners. ``LLM(engine_core=ex.StepLoop)`` serves the model with it. The step is yours: it must
leave the engine as the guarantees below say, whatever happens inside it; the order of its calls
follows from them.

What the parts offer -- everything the step needs, with its signature (how to combine them is
yours; their docstrings say more):

- ``self.scheduler.schedule() -> SchedulerOutput``: the step's plan, ``plan``, the scheduler's
  alone (nothing edits it afterwards). Of it, a step reads ``plan.requests`` (the requests it
  runs, in order), ``plan.num_computed`` (parallel to it: each one's tokens already computed when
  the step was planned, prefix-cache hits included), ``plan.sampling_requests`` (those that
  sample a token in this step), ``plan.preempted`` and ``plan.forks`` (``n > 1``: leader id ->
  its waiting siblings, a ``list[Request]``, for each leader that samples in this step; the
  executor draws their first tokens from the leader's row).
- ``self.scheduler.update_from_output(plan, tokens) -> list[RequestDelta]`` (``tokens``: request
  id -> the list of tokens it gets): appends the tokens, applies the stop rules, frees the blocks
  of the requests that end, and returns one delta per request of ``tokens``: its
  ``request_id``, the ``new_token_ids`` appended, and ``finish_reason`` (``None`` unless it
  ended). A request that ended has left ``self.scheduler.requests`` by then.
  ``self.scheduler.fork_request(leader, sibling)``: starts a waiting sibling beside its leader, on
  the leader's blocks, ``RUNNING`` if a seat is free, else ``WAITING``; it waits no longer.
  ``self.scheduler.requests`` (id -> request, the live ones), ``has_unfinished_requests()``,
  ``num_waiting``.
- ``self.kv.commit_written_blocks()``: the blocks the step filled join the prefix cache;
  ``self.kv.discard_unwritten_blocks()``: they never will. ``self.kv.num_free_blocks``,
  ``num_blocks``.
- ``self.executor.execute(plan) -> ModelRunnerOutput``, which may raise; the result has
  ``new_token_ids`` (request id -> its new tokens, a list: one token sampled from its row;
  siblings in ``plan.forks`` included), ``failed`` (request id -> message: rows that could not be
  sampled), ``logprobs`` and ``prompt_logprobs``.
- ``self.begin_step(plan)``: the debug checks every plan goes through before it runs.
  ``self.fail_requests(failed) -> list[RequestDelta]`` (``failed``: request id -> message): ends
  those requests and the siblings waiting on them with ``FINISHED_ERROR``, frees their blocks,
  records them finished; returns a delta for each, carrying its message.
  ``self.record_finish(req, now)``: records one request the step ended itself. ``self.clock() ->
  float``.
- ``self.stats.record_step(self.scheduler, plan, start, duration, *, prefix_cache_queries=0,
  prefix_cache_hits=0, num_forked_tokens=0)``: the step's ``StepStats``, read off the scheduler
  and its KV cache manager as they are when it is called (C2).
- ``self.step_outputs(plan, start, end, deltas, result=None) -> EngineCoreOutputs``: what
  ``run_step`` returns (C1); it adds to each delta what the requests and ``result`` hold (cached
  tokens, log-probabilities, the times of one that ended).
  ``EngineStalledError(message)`` (S4). A request's ``request_id``, ``num_tokens``,
  ``num_computed_tokens``, ``status``, ``is_finished``, ``num_cached_tokens``,
  ``first_scheduled_time`` and ``first_token_time``.

What a step guarantees. ``start`` is the clock before the step is planned; ``end`` the clock
once the step's last token is appended or, for a failed step, once its requests have ended.

To the prefix cache
K1. A block the step filled becomes findable by a later request only if the executor returned
    (only then is its K/V known to be written), and then it does, even when the request that
    filled it ends in this same step, for whatever reason. After an executor that raised, no
    block of the step ever becomes findable.

To the scheduler
S1. One plan per step, run once, and ``begin_step`` has seen it before it runs.
S2. Each request of the step that got a token has it appended, once, and the step's tokens
    reach the scheduler together: the tokens are ``result.new_token_ids`` or, with ``choose_tokens``
    (beam search), ``choose_tokens(plan, result)``, less those of every request the step failed,
    the siblings F1 ends with their leader included (they ended, and the scheduler no longer
    holds them).
S3. Before any token of the step is appended, every sibling in ``plan.forks`` of a leader that
    got its token has started beside it, once (leaders in the plan's order, siblings in theirs),
    unless it has ended.
S4. No stall: a step that schedules no request, preempts none and ends none while the scheduler
    holds unfinished requests raises ``EngineStalledError``: nobody would ever run.

What a failure leaves behind
F1. A failed row: its request and the siblings waiting on it end with ``FINISHED_ERROR``, each
    with the row's message; they get no token and start nobody; the rest of the step goes on
    untouched.
F2. An executor that raises an ``Exception``: every request of the plan ends with
    ``FINISHED_ERROR``, and so do the siblings waiting on them, each with ``"<type of the
    error>: <the error>"`` (``"RuntimeError: out of memory"``); the step is recorded (C2) and
    returns its output; requests not in the plan are untouched, and the engine goes on with
    them. (Log the error with ``logger.error(..., exc_info=err)``: a server must say why its
    requests failed.)
F3. An interrupt (``KeyboardInterrupt``, or any other ``BaseException`` that is not an
    ``Exception``) leaves everything as F2 does, the step recorded, and then goes on up.

To the caller
C1. The output: ``self.step_outputs(plan, start, end, deltas, result)``, ``deltas`` the deltas of
    the requests the step failed, then those ``update_from_output`` returned (a failed step: its
    failed requests' deltas, and no ``result``).
C2. Statistics: one ``record_step`` per step, failed or not, describing the engine as the step
    left it. The step's own figures: a request of the plan scheduled for the first time (no
    ``first_scheduled_time`` yet when the step was planned) counts its ``num_tokens`` as
    prefix-cache queries and its tokens already computed in the plan (``plan.num_computed``) as
    hits, and those become its ``num_cached_tokens``; each sibling that started *and got a
    seat* counts its leader's ``num_computed_tokens`` as forked tokens. The queries, the hits
    and ``num_cached_tokens`` are read off the plan before the executor runs, so a failed step
    has them too (a failed step forks nobody).
C3. Timestamps live on the request, stamped once each: ``first_scheduled_time`` = ``start`` of
    the first step that computed any of its tokens (a failed step computed nothing; a
    sibling's is the step that gave it its first token); ``first_token_time`` = ``end`` of the
    step that appended its first token.
C4. Every request the step ends is recorded once as finished (``record_finish(req, end)``
    stamps its finished time and hands it to the statistics, which keep the times it holds
    then: by then it holds every time C3 gives it). ``fail_requests`` does this for the
    requests it ends, with its own reading of the clock: the finished time of a failed
    request is the clock when it ended.

One step, for example: the plan is ``a`` (decoding), ``p`` (the last token of its prompt; ``n =
2``, its sibling ``p#1`` waiting: ``plan.forks == {p: [p#1]}``) and ``c`` (decoding); the executor
returns ``new_token_ids = {a: [11], p: [4], p#1: [9]}`` and ``failed = {c: "logits are not
finite"}``. After the step ``c`` has ended with an error and no token, ``p#1`` runs beside ``p``
on ``p``'s blocks, ``a``, ``p`` and ``p#1`` have one more token each (``p`` and ``p#1`` their
first: their ``first_token_time`` is the step's end), the output's deltas are ``c``'s (``"error"``,
its message) and then ``a: [11]``, ``p: [4]``, ``p#1: [9]``, and one ``StepStats`` describes the
engine after it.

The checks run your class and minivllm's ``EngineCore`` side by side over minivllm's scheduler
and KV cache manager with a fake executor that can fail rows, raise, or be interrupted, and
compare every step (the calls made, the plan, the tokens, who ended and how, the statistics,
the times) and every request's timestamps; then they serve the tiny model with your loop
(``debug_checks=True``). The engine assembled from all your exercises
(``minivllm/course/capstone.py``) is a line of its own on the scoreboard, once every exercise
passes.
"""

from __future__ import annotations

import logging

from minivllm.course.engine_core_base import (
    EngineCoreBase,
    EngineCoreOutputs,
    EngineStalledError,
    TokenChooser,
)
from minivllm.request import RequestStatus

NOTEBOOK = "notebooks/08_serving_loop.ipynb"

logger = logging.getLogger("minivllm")


class StepLoop(EngineCoreBase):
    """The engine core with your step."""

    def run_step(self, choose_tokens: TokenChooser | None = None) -> EngineCoreOutputs:
        """Run one engine step, keeping the guarantees of this module's docstring, and return its
        ``EngineCoreOutputs``.

        ``choose_tokens(plan, result)``, when given (beam search), returns the tokens to append
        in place of ``result.new_token_ids``."""
        # BEGIN SOLUTION
        sched, kv = self.scheduler, self.kv
        start = self.clock()
        plan = sched.schedule()
        self.begin_step(plan)
        queries = hits = forked = 0
        for req, computed in zip(plan.requests, plan.num_computed, strict=True):
            if req.first_scheduled_time is None:  # scheduled for the first time: from the cache
                req.num_cached_tokens = computed
                queries += req.num_tokens
                hits += computed

        def record(end: float) -> None:
            self.stats.record_step(sched, plan, start, end - start, prefix_cache_queries=queries,
                                   prefix_cache_hits=hits, num_forked_tokens=forked)

        try:
            result = self.executor.execute(plan)
        except BaseException as err:
            kv.discard_unwritten_blocks()  # nobody knows what the step wrote
            message = f"{type(err).__name__}: {err}"
            if isinstance(err, Exception):
                logger.error("a step of %d request(s) failed: %s", len(plan.requests), message, exc_info=err)
            deltas = self.fail_requests({r.request_id: message for r in plan.requests})
            end = self.clock()
            record(end)
            if not isinstance(err, Exception):  # Ctrl-C: the engine is consistent; pass it on
                raise
            return self.step_outputs(plan, start, end, deltas)
        kv.commit_written_blocks()  # the K/V exists now, and nothing of the step is freed yet
        for req in plan.requests:
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
        deltas = self.fail_requests(result.failed)
        failed = {d.request_id for d in deltas}
        for leader_id, kids in plan.forks.items():
            if leader_id not in result.new_token_ids:  # its row failed: its siblings ended with it
                continue
            leader = sched.requests[leader_id]
            for kid in kids:
                if kid.is_finished:
                    continue
                sched.fork_request(leader, kid)
                if kid.status is RequestStatus.RUNNING:  # seated: it shares the leader's prompt
                    forked += leader.num_computed_tokens
        tokens = result.new_token_ids if choose_tokens is None else choose_tokens(plan, result)
        tokens = {rid: token for rid, token in tokens.items() if rid not in failed}
        # the requests that get tokens: one that ends now leaves the scheduler in the update
        stepped = {rid: sched.requests[rid] for rid in tokens}
        appended = sched.update_from_output(plan, tokens)
        end = self.clock()
        for req in stepped.values():
            if req.first_token_time is None:
                req.first_token_time = end
                if req.first_scheduled_time is None:  # a sibling, forked in this step
                    req.first_scheduled_time = start
        ended = [d for d in appended if d.finish_reason is not None]
        for d in ended:  # after the first-token times: the statistics keep what they read
            self.record_finish(stepped[d.request_id], end)
        record(end)
        if not (plan.requests or plan.preempted or ended) and sched.has_unfinished_requests():
            raise EngineStalledError(f"the scheduler planned nothing while {sched.num_waiting} request(s) wait "
                                     f"({kv.num_free_blocks} of {kv.num_blocks} KV blocks free)")
        return self.step_outputs(plan, start, end, deltas + appended, result)
        # END SOLUTION
