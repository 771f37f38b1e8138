"""``EngineCore``: the one step loop -- schedule, execute, update -- shared by everything.

    schedule()        the scheduler plans the step          (SchedulerOutput)
    execute()         an executor runs it                   (ModelRunnerOutput)
                        the model runner: real tensors, sampled tokens
                        the simulator's cost model: a clock, placeholder tokens
    commit            blocks the step filled join the prefix cache (their K/V now exists)
    fork              n > 1: the siblings of a request that sampled its first token fork off it
    update            the scheduler appends each request's new tokens (accepted drafts first,
                      under speculative decoding), applies the stop rules, frees finished requests
    record            one StepStats, request timestamps: the same code for engine and simulator
    report            the step's StepOutput goes to every step listener

The real engine (``minivllm.engine.LLMEngine``), the GPU-scale simulator
(``minivllm.sim.Simulator``) and beam search all drive this class, so they cannot drift apart.
It is pure Python: the executor is the only part that may touch tensors, and of the scheduler
and the KV cache manager it uses only what their protocols (``minivllm.core.interfaces``)
declare. What the prefix cache saved is read off the step's plan, not asked of the parts.

:class:`EngineCoreBase` is what every step loop stands on and none of them decides: the parts,
taking requests in and ending them from outside, the siblings of ``n > 1`` requests waiting for
their leader (:class:`~minivllm.core.forks.PendingForks`), and reporting. Its :meth:`step
<EngineCoreBase.step>` runs the subclass's :meth:`~EngineCoreBase.run_step` and hands the result
to the step listeners (and, with ``debug_checks``, checks the KV invariants after it).
:class:`EngineCore` is minivllm's loop; exercise 08 writes another on the same base.

Failure semantics (see ``docs/architecture.md``): a request whose row cannot be sampled
(``ModelRunnerOutput.failed``) ends with status ``FINISHED_ERROR`` and its blocks are freed; an
exception from the executor (or an output of the wrong shape) ends every request of that step the same way (the K/V the step may
have half-written is never registered in the prefix cache) and the engine keeps serving the
rest. Nothing waits forever: a step that plans nothing while requests wait raises
:class:`EngineStalledError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from minivllm.core.forks import PendingForks
from minivllm.core.interfaces import (
    Executor,
    ForkingKVCacheManager,
    ForkingScheduler,
    Logprobs,
    ModelRunnerOutput,
    SchedulerInterface,
)
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.metrics import EngineStats
from minivllm.request import Request, RequestStatus

logger = logging.getLogger("minivllm")

TokenChooser = Callable[[SchedulerOutput, ModelRunnerOutput], dict[str, list[int]]]
StepListener = Callable[["StepOutput"], None]


class EngineStalledError(RuntimeError):
    """A step planned nothing although requests are waiting: they can never be scheduled."""


@dataclass
class StepOutput:
    """What one engine step did (vLLM hands the same over as one step's ``EngineCoreOutputs``).

    ``scheduler_output``: the step's plan; ``start_time`` / ``end_time`` on the core's clock;
    ``new_token_ids``: request id -> the tokens appended to it this step (one; under speculative
    decoding the drafts it kept first; a stop rule may have cut them short); ``finished``:
    requests that ended in this step (stop token, length, a failed row, a failed step);
    ``failed``: request id -> error message for those that ended with an error; ``logprobs`` /
    ``prompt_logprobs`` as the executor returned them.
    """

    scheduler_output: SchedulerOutput
    start_time: float
    end_time: float
    new_token_ids: dict[str, list[int]] = field(default_factory=dict)
    finished: list[Request] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    logprobs: dict[str, Logprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, list] = field(default_factory=dict)


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
        self.forks = PendingForks()  # n > 1: siblings waiting for their leader's first token
        self._finished_since_last_step: set[str] = set()
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
        """``n > 1``: leader request id -> its siblings that have not forked off it yet (they
        are in no queue of the scheduler). ``add_request`` fills it; ``finish_requests`` removes
        the siblings it ends; forking them off their leader is the step's."""
        return self.forks.waiting

    # --- the step ------------------------------------------------------------------------------
    def step(self, choose_tokens: TokenChooser | None = None) -> StepOutput:
        """Run one step (:meth:`run_step`) and report it: the :class:`StepOutput` goes to every
        step listener and, with ``debug_checks=True``, the KV cache manager's invariants are
        checked after it. A step that raises (a ``KeyboardInterrupt`` it passes on, an
        :class:`EngineStalledError`) returned no output and is not reported."""
        step_out = self.run_step(choose_tokens)
        if self.debug_checks:
            self.check_invariants()
        for listener in tuple(self._step_listeners):
            listener(step_out)
        return step_out

    def run_step(self, choose_tokens: TokenChooser | None = None) -> StepOutput:
        """One step of the loop: the subclass's. ``choose_tokens`` (beam search) may replace the
        sampled tokens: it gets the plan and the executor's output and returns
        ``{request_id: [token, ...]}`` to append (a request left out gets no token this step)."""
        raise NotImplementedError(f"{type(self).__name__} must define run_step(): the step loop is the subclass's")

    def begin_step(self, out: SchedulerOutput) -> None:
        """What any step loop tells the executor before it runs a plan, once per plan: the
        requests that ended since the last step (``out.finished_req_ids``); with
        ``debug_checks``, check that every K/V slot the step reads holds what was written for
        that very token."""
        out.finished_req_ids, self._finished_since_last_step = self._finished_since_last_step, set()
        if self.kv_write_tracker is not None:
            self.kv_write_tracker.check_step(out)

    # --- observing steps ---------------------------------------------------------------------
    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        """Call ``listener(step_output)`` after every step, a failed one included, with what the
        step planned (``step_output.scheduler_output``) and what it did (tokens, finished and
        failed requests) -- for every step loop alike (:meth:`step` reports what
        :meth:`run_step` returns). Tests, the course and benchmarks watch the scheduler's
        decisions this way instead of wrapping its methods. The engine's state is the one the
        step left (``self.scheduler.running`` holds the requests that go on). A listener must not
        change that state; one that raises propagates out of ``step()``. Returns a function that
        removes the listener."""
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
        for r in (request, *siblings):
            if r.request_id in self.scheduler.requests or self.forks.holds(r.request_id):
                raise ValueError(f"request_id {r.request_id!r} is already in use")
        self.scheduler.add_request(request)
        if siblings and self.can_fork:
            self.forks.add(request.request_id, siblings)
        else:
            for r in siblings:
                self.scheduler.add_request(r)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.scheduler.running) + self.scheduler.num_waiting + len(self.forks)

    def request_ids(self) -> list[str]:
        """Every request the core holds: the scheduler's and the siblings waiting to fork."""
        return [*self.scheduler.requests, *(k.request_id for kids in self.forks.waiting.values() for k in kids)]

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """End requests from outside (an abort, a stop string, an error) with ``status``:
        they leave the scheduler, free their blocks, and their unforked siblings end too.
        Unknown and already finished ids are ignored. Returns the requests that ended."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        now = self.clock()
        ended = self.forks.end(ids, status)  # siblings that never forked are not in the scheduler
        ended.extend(self.scheduler.finish_requests(ids, status))
        for req in ended:
            self.record_finish(req, now)
        return ended

    def abort_requests(self, request_ids: Iterable[str]) -> list[Request]:
        return self.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def record_finish(self, req: Request, now: float) -> None:
        """``req`` ended at ``now``: stamp its finished time, hand it to the statistics (which
        read its times and counts off it: ``EngineStats.record_finish``) and tell the executor
        with the next plan (``SchedulerOutput.finished_req_ids``). Every request that ends goes
        through here once: the step loop calls it for the requests ``update_from_output``
        returns, :meth:`finish_requests` for the others -- after their first-token time is
        stamped, since the statistics keep what they read now."""
        req.finished_time = now
        self.stats.record_finish(req)
        self._finished_since_last_step.add(req.request_id)

    def reset_stats(self) -> None:
        """Start the statistics afresh (after a warm-up, say)."""
        self.stats.reset()

    def check_invariants(self) -> None:
        """The KV manager's own invariants, over the requests the scheduler says are live."""
        self.kv.check_invariants([r.request_id for r in self.scheduler.live_requests()])


class EngineCore(EngineCoreBase):
    """minivllm's step loop (see the module doc)."""

    def run_step(self, choose_tokens: TokenChooser | None = None) -> StepOutput:
        sched = self.scheduler
        start = self.clock()
        out = sched.schedule()
        self.begin_step(out)
        if self.forks:  # siblings draw their first token from a leader sampling now
            waiting = self.forks.waiting
            out.forks = {r.request_id: waiting[r.request_id] for r in out.sampling_requests if r.request_id in waiting}
        counts = _PlanCounts(out)
        for req, computed in counts.first_steps:  # the prefix cache served these
            req.num_cached_tokens = computed
        try:
            result = self.executor.execute(out)
            _check_new_tokens(result)
        except BaseException as err:
            step_out = self._fail_step(out, err, start, counts)
            if not isinstance(err, Exception):  # KeyboardInterrupt: state is clean, re-raise
                raise
            return step_out
        self.kv.commit_written_blocks()
        for req in out.requests:  # the step computed their tokens: a first step stamps its start
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
        step_out = StepOutput(out, start, start, logprobs=result.logprobs, prompt_logprobs=result.prompt_logprobs)
        if result.failed:
            self._fail_requests(result.failed, step_out)
        counts.forked = self._fork_siblings(out, result)
        new = result.new_token_ids if choose_tokens is None else choose_tokens(out, result)
        if step_out.failed:
            new = {rid: t for rid, t in new.items() if rid not in step_out.failed}
        finished = self._update(out, new, step_out, counts)
        if result.draft_token_ids:
            sched.update_draft_token_ids(result.draft_token_ids)
        now = self.clock()
        step_out.end_time = now
        self._stamp_first_tokens(out, new, start, now)
        for req in finished:
            self.record_finish(req, now)
        step_out.finished.extend(finished)
        counts.record(self, start, now)
        if not out.requests and not out.preempted and not finished and sched.has_unfinished_requests():
            raise EngineStalledError(self._stall_message())
        return step_out

    def _update(self, out: SchedulerOutput, new: dict[str, list[int]], step_out: StepOutput,
                counts: _PlanCounts) -> list[Request]:
        """The scheduler appends the step's tokens (``update_from_output``); ``step_out`` reports
        the tokens really appended (a stop rule may cut a request's drafts short). After a step
        that verified drafts, the step counts its drafts and the ones accepted."""
        step_out.new_token_ids = new
        spec = out.spec_token_ids
        if not spec:
            return self.scheduler.update_from_output(out, new)
        verified = [rid for rid in spec if rid in new]
        counts.drafts = sum(len(spec[rid]) for rid in verified)
        counts.accepted = sum(len(new[rid]) - 1 for rid in verified)
        # a request given several tokens: a stop among them may cut the list short
        several = {r.request_id: (r, r.num_tokens) for r in out.requests if len(new.get(r.request_id, ())) > 1}
        finished = self.scheduler.update_from_output(out, new)
        if several:
            step_out.new_token_ids = {**new, **{rid: req.all_token_ids[n:] for rid, (req, n) in several.items()}}
        return finished

    def _fork_siblings(self, out: SchedulerOutput, result: ModelRunnerOutput) -> int:
        """Siblings of each leader that sampled fork off it, in the plan's order; returns the
        prompt tokens the seated ones share with their leader."""
        forked = 0
        for leader_id, kids in out.forks.items():
            leader = self.scheduler.requests.get(leader_id)
            if leader is None or leader_id not in result.new_token_ids:
                continue  # its row failed: the siblings were failed with it
            self.forks.take(leader_id)
            for kid in kids:
                if kid.is_finished:  # its own row failed
                    continue
                self.scheduler.fork_request(leader, kid)
                if kid.status is RequestStatus.RUNNING:  # seated: it shares the leader's prompt
                    forked += leader.num_computed_tokens
        return forked

    def _fail_requests(self, failed: dict[str, str], step_out: StepOutput) -> None:
        """End requests whose rows failed (and their unforked siblings) with an error."""
        for rid, message in failed.items():
            for kid in self.forks.of(rid):
                step_out.failed[kid.request_id] = message
            step_out.failed[rid] = message
        step_out.finished.extend(self.finish_requests(list(failed), RequestStatus.FINISHED_ERROR))

    def _fail_step(self, out: SchedulerOutput, err: BaseException, start: float, counts: _PlanCounts) -> StepOutput:
        """The executor raised: end every request of the step with the error, keep the rest."""
        self.kv.discard_unwritten_blocks()
        message = f"{type(err).__name__}: {err}"
        if isinstance(err, Exception):
            logger.error("a step of %d request(s) failed: %s", len(out.requests), message, exc_info=err)
        step_out = StepOutput(out, start, start)
        self._fail_requests({r.request_id: message for r in out.requests}, step_out)
        step_out.end_time = self.clock()
        counts.record(self, start, step_out.end_time)
        return step_out

    def _stamp_first_tokens(self, out: SchedulerOutput, sampled: dict[str, list[int]], start: float, now: float) -> None:
        """A request that got its first token in this step gets its first-token time (and a
        sibling forked in this step its first-scheduled time), on the request."""
        # the step's requests and the siblings it forked: one that finished at its first token
        # has already left the scheduler (beam search's forks are only in the scheduler)
        by_id = {req.request_id: req for req in out.requests}
        for kids in out.forks.values():
            by_id.update((kid.request_id, kid) for kid in kids)
        requests = self.scheduler.requests
        for rid in sampled:
            req = by_id.get(rid) or requests.get(rid)
            if req is not None and req.first_token_time is None:
                req.first_token_time = now
                if req.first_scheduled_time is None:  # a forked sibling
                    req.first_scheduled_time = start

    def _stall_message(self) -> str:
        sched, kv = self.scheduler, self.kv
        return (
            f"step {self.stats.num_steps - 1}: the scheduler planned nothing while "
            f"{sched.num_waiting} request(s) wait and {len(sched.running)} run; they can never "
            f"be scheduled (KV pool: {kv.num_free_blocks} of {kv.num_blocks} blocks free, "
            f"block_size {kv.block_size})"
        )


def _check_new_tokens(result: ModelRunnerOutput) -> None:
    """Refuse an executor's output whose ``new_token_ids`` holds something other than a list per
    request (a bare token, say), naming the request, before any token of the step is appended:
    the step then fails as a whole, as if the executor had raised."""
    for rid, tokens in result.new_token_ids.items():
        if type(tokens) is not list:
            raise TypeError(f"the executor's new_token_ids[{rid!r}] must be a list of token ids, "
                            f"got {type(tokens).__name__} {tokens!r}")


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

    def record(self, core: EngineCoreBase, start: float, now: float) -> None:
        core.stats.record_step(
            core.scheduler, self.out, start, now - start, prefix_cache_queries=self.queries,
            prefix_cache_hits=self.hits, num_forked_tokens=self.forked, num_draft_tokens=self.drafts,
            num_accepted_tokens=self.accepted,
        )
