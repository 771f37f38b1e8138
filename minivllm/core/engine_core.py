"""``EngineCore``: the one step loop -- schedule, execute, update -- shared by everything.

A step's result takes three shapes on its way to the user, each made once:

    schedule()        the scheduler plans the step          (SchedulerOutput, never edited after)
    execute()         an executor runs it                   (ModelRunnerOutput: tokens per request)
                        the model runner: real tensors, sampled tokens
                        the simulator's cost model: a clock, placeholder tokens
    commit            blocks the step filled join the prefix cache (their K/V now exists)
    fork              n > 1: the siblings of a request that sampled its first token fork off it
    update            the scheduler appends each request's new tokens (accepted drafts first,
                      under speculative decoding), applies the stop rules, frees finished
                      requests, and returns what changed: one RequestDelta per request
    record            one StepStats, request timestamps: the same code for engine and simulator
    report            the step's EngineCoreOutputs (its deltas, the state it left, its figures)
                      goes to every step listener and on to the front end, whose output
                      processor turns the deltas into RequestOutputs

The real engine (``minivllm.engine.LLMEngine``), the GPU-scale simulator
(``minivllm.sim.Simulator``) and beam search all drive this class, so they cannot drift apart.
It is pure Python: the executor is the only part that may touch tensors, and of the scheduler
and the KV cache manager it uses only what their protocols (``minivllm.core.interfaces``)
declare. What the prefix cache saved is read off the step's plan, not asked of the parts.

:class:`EngineCoreBase` is what every step loop stands on and none of them decides: the parts,
taking requests in and ending them from outside, and reporting. Its :meth:`step
<EngineCoreBase.step>` runs the subclass's :meth:`~EngineCoreBase.run_step` and hands the result
to the step listeners (and, with ``debug_checks``, checks the KV invariants after it).
:class:`EngineCore` is minivllm's loop; exercise 08 writes another on the same base.

Failure semantics (see ``docs/architecture.md``): a request whose row cannot be sampled
(``ModelRunnerOutput.failed``) ends with status ``FINISHED_ERROR`` and its blocks are freed; an
exception from the executor (or an output of the wrong shape) ends every request of that step
the same way (the K/V the step may have half-written is never registered in the prefix cache)
and the engine keeps serving the rest. Nothing waits forever: a step that plans nothing while requests wait raises
:class:`EngineStalledError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

from minivllm.core.interfaces import (
    Executor,
    ForkingKVCacheManager,
    ForkingScheduler,
    ModelRunnerOutput,
    SchedulerInterface,
)
from minivllm.core.messages import CoreState, EngineCoreOutputs, RequestDelta, StepSummary
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.metrics import EngineStats
from minivllm.outputs import RequestMetrics
from minivllm.request import Request, RequestStatus

logger = logging.getLogger("minivllm")

TokenChooser = Callable[[SchedulerOutput, ModelRunnerOutput], dict[str, list[int]]]
StepListener = Callable[[EngineCoreOutputs], None]


class EngineStalledError(RuntimeError):
    """A step planned nothing although requests are waiting: they can never be scheduled."""


class EngineCoreBase:
    """The parts and the bookkeeping every step loop needs, none of the step's decisions.

    Owns a scheduler (and through it the KV cache manager), an executor, a clock (wall-clock for
    the engine, the simulated clock for the simulator) and the statistics; takes requests in and
    ends them from outside; runs one step at a time: :meth:`step` calls the subclass's
    :meth:`run_step` and reports what it returns."""

    def __init__(
        self,
        scheduler: SchedulerInterface,
        executor: Executor,
        *,
        clock: Callable[[], float] = time.perf_counter,
        stats: EngineStats | None = None,
        debug_checks: bool = False,
    ):
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        self.stats = stats if stats is not None else EngineStats()
        self.debug_checks = debug_checks
        self._ended_in_step: dict[str, Request] = {}  # the requests the current step ended
        self._step_listeners: list[StepListener] = []
        self.kv_write_tracker = None
        if debug_checks:
            from minivllm.core.kv_write_tracker import KVWriteTracker

            self.kv_write_tracker = KVWriteTracker(scheduler.kv.block_size)

    @property
    def kv(self):
        return self.scheduler.kv

    @property
    def can_fork(self) -> bool:
        """Sharing blocks copy-on-write needs a forking scheduler over a forking KV manager
        (the static baseline and the contiguous cache cannot share)."""
        return isinstance(self.scheduler, ForkingScheduler) and isinstance(self.kv, ForkingKVCacheManager)

    @property
    def pending_siblings(self) -> dict[str, list[Request]]:
        """``n > 1``: leader request id -> its siblings that have not forked off it yet (the
        forking scheduler keeps them, in no queue, and names them in the plan of their leader's
        sampling step: ``SchedulerOutput.forks``). Empty when this engine cannot fork."""
        return self.scheduler.pending_siblings if self.can_fork else {}

    # --- the step ------------------------------------------------------------------------------
    def step(self, choose_tokens: TokenChooser | None = None) -> EngineCoreOutputs:
        """Run one step (:meth:`run_step`) and report it: its :class:`EngineCoreOutputs` gets the
        state the step left and the step's figures, then goes to every step listener and, with
        ``debug_checks=True``, the KV cache manager's invariants are checked after it. A step that
        raises (a ``KeyboardInterrupt`` it passes on, an :class:`EngineStalledError`) returned no
        output and is not reported."""
        steps_before = self.stats.num_steps
        self._ended_in_step = {}
        outputs = self.run_step(choose_tokens)
        outputs.state = self.core_state()
        outputs.step = self.step_summary(steps_before)
        if self.debug_checks:
            self.check_invariants()
        for listener in tuple(self._step_listeners):
            listener(outputs)
        return outputs

    def run_step(self, choose_tokens: TokenChooser | None = None) -> EngineCoreOutputs:
        """One step of the loop: the subclass's. ``choose_tokens`` (beam search) may replace the
        sampled tokens: it gets the plan and the executor's output and returns
        ``{request_id: [token, ...]}`` to append (a request left out gets no token this step)."""
        raise NotImplementedError(f"{type(self).__name__} must define run_step(): the step loop is the subclass's")

    def begin_step(self, plan: SchedulerOutput) -> None:
        """What any step loop does with a plan before the executor runs it, once per plan: with
        ``debug_checks``, check that every K/V slot the step reads holds what was written for
        that very token (:class:`~minivllm.core.kv_write_tracker.KVWriteTracker`)."""
        if self.kv_write_tracker is not None:
            self.kv_write_tracker.check_step(plan)

    def fail_requests(self, failed: dict[str, str]) -> list[RequestDelta]:
        """End the requests in ``failed`` (request id -> message), and the siblings waiting on
        them, with ``FINISHED_ERROR``; returns a delta for each with its message."""
        messages = dict(failed)
        waiting = self.pending_siblings
        for rid, message in failed.items():
            messages.update((kid.request_id, message) for kid in waiting.get(rid, ()))
        ended = self.finish_requests(list(failed), RequestStatus.FINISHED_ERROR)
        return [RequestDelta(r.request_id, [], "error", error=messages[r.request_id]) for r in ended]

    def step_outputs(self, plan: SchedulerOutput, start: float, end: float, deltas: list[RequestDelta],
                     result: ModelRunnerOutput | None = None) -> EngineCoreOutputs:
        """The step's :class:`EngineCoreOutputs` from its ``deltas`` (``update_from_output``'s and
        those of the requests it failed): each delta gets its request's ``num_cached_tokens``,
        its log-probabilities from ``result`` (a delta is added for a request that has only
        prompt log-probabilities) and, for one that ended, the times stamped on it. A delta's
        request is live in the scheduler or, if it ended, was recorded finished in this step."""
        ended, live = self._ended_in_step, self.scheduler.requests
        if result is not None and result.prompt_logprobs:
            have = {d.request_id for d in deltas}
            deltas.extend(RequestDelta(rid, []) for rid in result.prompt_logprobs if rid not in have)
        logprobs = result.logprobs if result is not None else {}
        prompt_logprobs = result.prompt_logprobs if result is not None else {}
        for d in deltas:
            rid = d.request_id
            req = ended.get(rid) or live.get(rid)
            if req is not None:
                d.num_cached_tokens = req.num_cached_tokens
                if d.finish_reason is not None:
                    d.metrics = RequestMetrics.from_request(req)  # the times the core stamped on it
            if d.new_token_ids and rid in logprobs:
                d.new_logprobs = [logprobs[rid]]
            if rid in prompt_logprobs:
                d.prompt_logprobs = prompt_logprobs[rid]
        return EngineCoreOutputs(deltas, timestamp=end, plan=plan, start_time=start)

    def core_state(self) -> CoreState:
        """The core as it is now: what the gauges show."""
        sched, kv = self.scheduler, self.kv
        return CoreState(len(sched.running), sched.num_waiting, kv.num_used_blocks, kv.num_blocks,
                         self.num_unfinished_requests)

    def step_summary(self, steps_before: int) -> StepSummary | None:
        """The figures of the step just recorded (``None`` if the step loop recorded none)."""
        stats = self.stats
        if stats.num_steps == steps_before or not stats.steps:
            return None
        s = stats.steps[-1]
        return StepSummary(s.num_batched_seqs, s.num_preemptions, s.prefix_cache_queries, s.prefix_cache_hits,
                           s.num_draft_tokens, s.num_accepted_tokens)

    # --- observing steps ---------------------------------------------------------------------
    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        """Call ``listener(outputs)`` after every step, a failed one included, with the step's
        :class:`EngineCoreOutputs`: what it planned (``outputs.plan``), what it did (its
        deltas: tokens appended, requests ended and how), the state it left -- for every step
        loop alike (:meth:`step` reports what :meth:`run_step` returns). Tests, the course and
        benchmarks watch the scheduler's decisions this way instead of wrapping its methods. The
        engine's state is the one the step left (``self.scheduler.running`` holds the requests
        that go on). A listener must not change that state; one that raises propagates out of
        ``step()``. Returns a function that removes the listener."""
        if not callable(listener):
            raise TypeError(f"a step listener must be callable, got {type(listener).__name__}")
        self._step_listeners.append(listener)

        def remove() -> None:
            if listener in self._step_listeners:
                self._step_listeners.remove(listener)

        return remove

    # --- requests --------------------------------------------------------------------------
    def add_request(self, request: Request, siblings: Sequence[Request] = ()) -> None:
        """Queue ``request``. ``siblings`` (parallel sampling): requests with the same prompt
        that fork off ``request`` once it samples its first token, sharing its KV blocks (each
        needs a seat; one that finds none waits for it, see ``ForkingScheduler.fork_request``);
        if this engine cannot fork they are queued as independent requests."""
        held = set(self.request_ids())
        for r in (request, *siblings):
            if r.request_id in held:
                raise ValueError(f"request_id {r.request_id!r} is already in use")
        if siblings and self.can_fork:
            self.scheduler.add_request(request, siblings)
            return
        self.scheduler.add_request(request)
        for r in siblings:
            self.scheduler.add_request(r)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    @property
    def num_unfinished_requests(self) -> int:
        waiting_siblings = sum(len(kids) for kids in self.pending_siblings.values())
        return len(self.scheduler.running) + self.scheduler.num_waiting + waiting_siblings

    def request_ids(self) -> list[str]:
        """Every request the core holds: the scheduler's and the siblings waiting to fork."""
        return [*self.scheduler.requests, *(k.request_id for kids in self.pending_siblings.values() for k in kids)]

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """End requests from outside (an abort, a stop string, an error) with ``status``:
        they leave the scheduler, free their blocks, and their unforked siblings end too.
        Unknown and already finished ids are ignored. Returns the requests that ended."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        now = self.clock()
        ended = self.scheduler.finish_requests(ids, status)
        for req in ended:
            self.record_finish(req, now)
        return ended

    def abort_requests(self, request_ids: Iterable[str]) -> list[Request]:
        return self.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def record_finish(self, req: Request, now: float) -> None:
        """``req`` ended at ``now``: stamp its finished time and hand it to the statistics (which
        read its times and counts off it: ``EngineStats.record_finish``). Every request that
        ends goes through here once: the step loop calls it for the requests
        ``update_from_output`` ends, :meth:`finish_requests` for the others -- after their
        first-token time is stamped, since the statistics keep what they read now."""
        req.finished_time = now
        self.stats.record_finish(req)
        self._ended_in_step[req.request_id] = req
        if self.kv_write_tracker is not None:
            self.kv_write_tracker.forget(req.request_id)

    def reset_stats(self) -> None:
        """Start the statistics afresh (after a warm-up, say)."""
        self.stats.reset()

    def check_invariants(self) -> None:
        """The KV manager's own invariants, over the requests the scheduler says are live."""
        self.kv.check_invariants([r.request_id for r in self.scheduler.live_requests()])


class EngineCore(EngineCoreBase):
    """minivllm's step loop (see the module doc)."""

    def run_step(self, choose_tokens: TokenChooser | None = None) -> EngineCoreOutputs:
        sched = self.scheduler
        start = self.clock()
        plan = sched.schedule()
        self.begin_step(plan)
        counts = _PlanCounts(plan)
        for req, computed in counts.first_steps:  # the prefix cache served these
            req.num_cached_tokens = computed
        try:
            result = self.executor.execute(plan)
            _check_new_tokens(plan, result)
        except BaseException as err:
            outputs = self._fail_step(plan, err, start, counts)
            if not isinstance(err, Exception):  # KeyboardInterrupt: state is clean, re-raise
                raise
            return outputs
        self.kv.commit_written_blocks()
        for req in plan.requests:  # the step computed their tokens: a first step stamps its start
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
        deltas = self.fail_requests(result.failed) if result.failed else []
        counts.forked = self._fork_siblings(plan, result)
        new = result.new_token_ids if choose_tokens is None else choose_tokens(plan, result)
        if deltas:
            failed = {d.request_id for d in deltas}
            new = {rid: t for rid, t in new.items() if rid not in failed}
        counts.count_drafts(plan, new)
        requests = sched.requests
        stepped = {rid: requests[rid] for rid in new}  # an ended one leaves the scheduler now
        appended = sched.update_from_output(plan, new)
        if result.draft_token_ids:
            sched.update_draft_token_ids(result.draft_token_ids)
        now = self.clock()
        for req in stepped.values():  # a first token: its time (a sibling forked now: its start)
            if req.first_token_time is None:
                req.first_token_time = now
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = start
        ended = [d for d in appended if d.finish_reason is not None]
        for d in ended:  # after the first-token times: the statistics keep what they read
            self.record_finish(stepped[d.request_id], now)
        deltas.extend(appended)
        counts.record(self, start, now)
        if not plan.requests and not plan.preempted and not ended and sched.has_unfinished_requests():
            raise EngineStalledError(self._stall_message())
        return self.step_outputs(plan, start, now, deltas, result)

    def _fork_siblings(self, plan: SchedulerOutput, result: ModelRunnerOutput) -> int:
        """Siblings of each leader that sampled fork off it, in the plan's order; returns the
        prompt tokens the seated ones share with their leader."""
        forked = 0
        for leader_id, kids in plan.forks.items():
            leader = self.scheduler.requests.get(leader_id)
            if leader is None or leader_id not in result.new_token_ids:
                continue  # its row failed: the siblings were failed with it
            for kid in kids:
                if kid.is_finished:  # its own row failed
                    continue
                self.scheduler.fork_request(leader, kid)
                if kid.status is RequestStatus.RUNNING:  # seated: it shares the leader's prompt
                    forked += leader.num_computed_tokens
        return forked

    def _fail_step(self, plan: SchedulerOutput, err: BaseException, start: float,
                   counts: _PlanCounts) -> EngineCoreOutputs:
        """The executor raised: end every request of the step with the error, keep the rest."""
        self.kv.discard_unwritten_blocks()
        message = f"{type(err).__name__}: {err}"
        if isinstance(err, Exception):
            logger.error("a step of %d request(s) failed: %s", len(plan.requests), message, exc_info=err)
        deltas = self.fail_requests({r.request_id: message for r in plan.requests})
        end = self.clock()
        counts.record(self, start, end)
        return self.step_outputs(plan, start, end, deltas)

    def _stall_message(self) -> str:
        sched, kv = self.scheduler, self.kv
        return (
            f"step {self.stats.num_steps - 1}: the scheduler planned nothing while "
            f"{sched.num_waiting} request(s) wait and {len(sched.running)} run; they can never "
            f"be scheduled (KV pool: {kv.num_free_blocks} of {kv.num_blocks} blocks free, "
            f"block_size {kv.block_size})"
        )


def _check_new_tokens(plan: SchedulerOutput, result: ModelRunnerOutput) -> None:
    """Refuse an executor's output whose ``new_token_ids`` holds something other than a list per
    request (a bare token, say), or tokens for a request that does not sample in ``plan`` (nor
    is a sibling it names in ``forks``), naming the request, before any token of the step is
    appended: the step then fails as a whole, as if the executor had raised."""
    new = result.new_token_ids
    for rid, tokens in new.items():
        if type(tokens) is not list:
            raise TypeError(f"the executor's new_token_ids[{rid!r}] must be a list of token ids, "
                            f"got {type(tokens).__name__} {tokens!r}")
    sampling = {r.request_id for r, s in zip(plan.requests, plan.sample, strict=True) if s}
    if len(sampling) < len(new) or not sampling.issuperset(new):
        sampling.update(kid.request_id for kids in plan.forks.values() for kid in kids)
        stray = [rid for rid in new if rid not in sampling]
        if stray:
            raise ValueError(f"the executor returned tokens for request(s) {stray} that do not sample in this "
                             f"step's plan (its sampling requests and the siblings in plan.forks)")


class _PlanCounts:
    """One step's figures for its ``StepStats``: what the prefix cache saved the requests the plan
    schedules for the first time (read off the plan before the step stamps them: their tokens
    already computed are the hits), the prompt tokens forked siblings share, the drafts verified
    and accepted. It only reads: what the step writes to a request, the step does itself."""

    __slots__ = ("first_steps", "queries", "hits", "forked", "drafts", "accepted", "out")

    def __init__(self, out: SchedulerOutput):
        self.out = out
        # (request, its tokens already computed) for the requests in their first step
        self.first_steps = [(req, computed) for req, computed in zip(out.requests, out.num_computed, strict=True)
                            if req.first_scheduled_time is None]
        self.queries = sum(req.num_tokens for req, _ in self.first_steps)
        self.hits = sum(computed for _, computed in self.first_steps)
        self.forked = self.drafts = self.accepted = 0

    def count_drafts(self, plan: SchedulerOutput, new: dict[str, list[int]]) -> None:
        """Speculative decoding: the drafts the step verified, and how many the target kept
        (a request's new tokens are its accepted drafts, then one sampled token)."""
        spec = plan.spec_token_ids
        if spec:
            verified = [rid for rid in spec if rid in new]
            self.drafts = sum(len(spec[rid]) for rid in verified)
            self.accepted = sum(len(new[rid]) - 1 for rid in verified)

    def record(self, core: EngineCoreBase, start: float, now: float) -> None:
        core.stats.record_step(
            core.scheduler, self.out, start, now - start, prefix_cache_queries=self.queries,
            prefix_cache_hits=self.hits, num_forked_tokens=self.forked, num_draft_tokens=self.drafts,
            num_accepted_tokens=self.accepted,
        )
