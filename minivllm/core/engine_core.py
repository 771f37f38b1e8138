"""``EngineCore``: the one step loop -- schedule, execute, update -- shared by everything.

    schedule()        the scheduler plans the step          (SchedulerOutput)
    execute()         an executor runs it                   (ModelRunnerOutput)
                        the model runner: real tensors, sampled tokens
                        the simulator's cost model: a clock, placeholder tokens
    commit            blocks the step filled join the prefix cache (their K/V now exists)
    fork              n > 1: the siblings of a request that sampled its first token fork off it
    update            tokens appended, stop rules, finished requests free their blocks
    record            one StepStats, request timestamps: the same code for engine and simulator
    report            the step's StepOutput goes to every step listener

The real engine (``minivllm.engine.LLMEngine``), the GPU-scale simulator
(``minivllm.sim.Simulator``) and beam search all drive this class, so they cannot drift apart.
It is pure Python: the executor is the only part that may touch tensors, and of the scheduler
and the KV cache manager it uses only what their protocols (``minivllm.core.interfaces``)
declare. What the prefix cache saved is read off the step's plan, not asked of the parts.

Failure semantics (see ``docs/architecture.md``): a request whose row cannot be sampled
(``ModelRunnerOutput.failed``) ends with status ``FINISHED_ERROR`` and its blocks are freed; an
exception from the executor ends every request of that step the same way (the K/V the step may
have half-written is never registered in the prefix cache) and the engine keeps serving the
rest. Nothing waits forever: a step that plans nothing while requests wait raises
:class:`EngineStalledError`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

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

TokenChooser = Callable[[SchedulerOutput, ModelRunnerOutput], dict[str, int]]
StepListener = Callable[["StepOutput"], None]


class EngineStalledError(RuntimeError):
    """A step planned nothing although requests are waiting: they can never be scheduled."""


@dataclass
class StepOutput:
    """What one engine step did (vLLM hands the same over as one step's ``EngineCoreOutputs``).

    ``scheduler_output``: the step's plan; ``start_time`` / ``end_time`` on the core's clock;
    ``sampled``: request id -> the token appended this step; ``finished``: requests that ended
    in this step (stop token, length, a failed row, a failed step); ``failed``: request id ->
    error message for those that ended with an error; ``logprobs`` / ``prompt_logprobs`` as the
    executor returned them; ``accepted``: speculative decoding, request id -> the tokens appended
    before ``sampled[request id]`` this step (accepted drafts), so that a request's new tokens are
    ``accepted.get(rid, []) + [sampled[rid]]``.
    """

    scheduler_output: SchedulerOutput
    start_time: float
    end_time: float
    sampled: dict[str, int] = field(default_factory=dict)
    finished: list[Request] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    logprobs: dict[str, Logprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, list] = field(default_factory=dict)
    accepted: dict[str, list[int]] = field(default_factory=dict)


def reports_to_listeners(step: Callable[..., StepOutput]) -> Callable[..., StepOutput]:
    """Wrap a step loop's ``step`` so that the :class:`StepOutput` it returns reaches the step
    listeners (:meth:`EngineCore.add_step_listener`) and, with ``debug_checks=True``, the KV
    cache manager's invariants are checked after it -- whatever the loop does inside.
    ``EngineCore.step`` is wrapped here, and the ``step`` of every subclass when the class is
    created (``EngineCore.__init_subclass__``), so a plug-in loop (``LLM(engine_core=MyCore)``)
    is reported and checked exactly like minivllm's own. A step that raises (a ``KeyboardInterrupt``
    it passes on, an :class:`EngineStalledError`) returned no output and is not reported. A
    ``step`` that calls ``super().step()`` reports once, from the outer call."""

    @functools.wraps(step)
    def step_and_report(self: EngineCore, *args, **kwargs) -> StepOutput:
        if self._in_step:  # an inner call (super().step()): the outer one reports
            return step(self, *args, **kwargs)
        self._in_step = True
        try:
            step_out = step(self, *args, **kwargs)
        finally:
            self._in_step = False
        if self.debug_checks:
            self.check_invariants()
        self._notify(step_out)
        return step_out

    return step_and_report


class EngineCore:
    """Owns a scheduler (and through it the KV cache manager), an executor, the step loop and
    the statistics. ``clock`` gives the time: wall-clock for the engine, the simulated clock
    for the simulator."""

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
        # n > 1: leader request id -> siblings to fork off it when it samples its first token
        self._pending_forks: dict[str, list[Request]] = {}
        self._finished_since_last_step: set[str] = set()
        self._step_listeners: list[StepListener] = []
        self._in_step = False
        # what the prefix cache and forking saved in the current step (prompt tokens):
        # looked up, found in the cache, shared by forked siblings
        self._prefix_queries = self._prefix_hits = self._forked_tokens = 0
        # speculative decoding in the current step: drafts verified, drafts accepted
        self._spec_counts = (0, 0)
        self.kv_write_tracker = None
        if debug_checks:
            from minivllm.core.kv_write_tracker import KVWriteTracker

            self.kv_write_tracker = KVWriteTracker(scheduler.kv.block_size)

    def __init_subclass__(cls, **kwargs) -> None:
        """A subclass's own ``step`` (a plug-in step loop) reports to the step listeners too."""
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:
            cls.step = reports_to_listeners(cls.__dict__["step"])

    @property
    def kv(self):
        return self.scheduler.kv

    @property
    def can_fork(self) -> bool:
        """Sharing blocks copy-on-write needs a forking scheduler over a forking KV manager
        (the static baseline and the contiguous cache cannot share)."""
        return isinstance(self.scheduler, ForkingScheduler) and isinstance(self.kv, ForkingKVCacheManager)

    # --- observing steps ---------------------------------------------------------------------
    def add_step_listener(self, listener: StepListener) -> Callable[[], None]:
        """Call ``listener(step_output)`` after every step, a failed one included, with what the
        step planned (``step_output.scheduler_output``) and what it did (tokens, finished and
        failed requests) -- for minivllm's step loop and for a subclass's alike (see
        :func:`reports_to_listeners`). Tests, the course and benchmarks watch the scheduler's
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

    def _notify(self, step_out: StepOutput) -> None:
        for listener in tuple(self._step_listeners):
            listener(step_out)

    # --- requests --------------------------------------------------------------------------
    def add_request(self, request: Request, siblings: Sequence[Request] = ()) -> None:
        """Queue ``request``. ``siblings`` (parallel sampling): requests with the same prompt
        that fork off ``request`` once it samples its first token, sharing its KV blocks (each
        needs a seat; one that finds none waits for it, see ``ForkingScheduler.fork_request``);
        if this engine cannot fork they are queued as independent requests."""
        for r in (request, *siblings):
            if r.request_id in self.scheduler.requests or self._is_pending_sibling(r.request_id):
                raise ValueError(f"request_id {r.request_id!r} is already in use")
        self.scheduler.add_request(request)
        if siblings and self.can_fork:
            self._pending_forks[request.request_id] = list(siblings)
        else:
            for r in siblings:
                self.scheduler.add_request(r)

    def _is_pending_sibling(self, request_id: str) -> bool:
        return any(request_id == s.request_id for kids in self._pending_forks.values() for s in kids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    @property
    def num_unfinished_requests(self) -> int:
        pending = sum(len(kids) for kids in self._pending_forks.values())
        return len(self.scheduler.running) + self.scheduler.num_waiting + pending

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """End requests from outside (an abort, a stop string, an error) with ``status``:
        they leave the scheduler, free their blocks, and their unforked siblings end too.
        Unknown and already finished ids are ignored. Returns the requests that ended."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        now = self.clock()
        ended: list[Request] = []
        for rid in ids:  # siblings that never forked are not in the scheduler
            for kid in self._pending_forks.pop(rid, []):
                kid.status = status
                ended.append(kid)
        ended.extend(self._end_pending_siblings(set(ids), status))
        ended.extend(self.scheduler.finish_requests(ids, status))
        for req in ended:
            self.record_finish(req, now)
        return ended

    def _end_pending_siblings(self, ids: set[str], status: RequestStatus) -> list[Request]:
        """Siblings named themselves (not through their leader) leave their leader's list."""
        ended = []
        for leader_id, kids in list(self._pending_forks.items()):
            if any(k.request_id in ids for k in kids):
                ended.extend(k for k in kids if k.request_id in ids)
                left = [k for k in kids if k.request_id not in ids]
                if left:
                    self._pending_forks[leader_id] = left
                else:
                    del self._pending_forks[leader_id]
        for kid in ended:
            kid.status = status
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

    # --- the loop ----------------------------------------------------------------------------
    @reports_to_listeners
    def step(self, choose_tokens: TokenChooser | None = None) -> StepOutput:
        """Run one step. ``choose_tokens`` (beam search) may replace the sampled tokens: it gets
        the plan and the executor's output and returns ``{request_id: token}`` to append
        (a request left out gets no token this step and waits)."""
        sched = self.scheduler
        start = self.clock()
        out = sched.schedule()
        self._begin_step(out)
        try:
            result = self.executor.execute(out)
        except BaseException as err:
            step_out = self._fail_step(out, err, start)
            if not isinstance(err, Exception):  # KeyboardInterrupt: state is clean, re-raise
                raise
            return step_out
        self.kv.commit_written_blocks()
        self._stamp_scheduled(out, start)  # the step computed its requests' tokens
        step_out = StepOutput(
            out, start, start, logprobs=result.logprobs, prompt_logprobs=result.prompt_logprobs,
        )
        if result.failed:
            self._fail_requests(result.failed, step_out)
        self._fork_siblings(out, result)
        tokens = result.sampled if choose_tokens is None else choose_tokens(out, result)
        if step_out.failed:
            tokens = {rid: t for rid, t in tokens.items() if rid not in step_out.failed}
        if result.accepted_draft_tokens or result.draft_token_ids:
            finished = self._update_speculative(out, result, tokens, step_out)
        else:
            finished = sched.update_from_output(tokens)
        now = self.clock()
        step_out.end_time = now
        step_out.sampled = tokens
        self._stamp_first_tokens(out, tokens, start, now)
        for req in finished:
            self.record_finish(req, now)
        step_out.finished.extend(finished)
        self._record_step(out, start, now)
        self._check_stall(out, finished)
        return step_out

    def _update_speculative(
        self, out: SchedulerOutput, result: ModelRunnerOutput, tokens: dict[str, int], step_out: StepOutput
    ) -> list[Request]:
        """``update_from_output`` for a step that verified drafts: the scheduler appends each
        request's accepted drafts before its sampled token (stopping where a stop rule says), and
        keeps the drafts proposed for the next step. ``step_out`` then reports the tokens that
        were really appended: ``accepted[rid]`` and, last, ``sampled[rid]``."""
        accepted = {rid: a for rid, a in result.accepted_draft_tokens.items() if rid in tokens}
        by_id = {r.request_id: r for r in out.requests if r.request_id in accepted}
        before = {rid: req.num_tokens for rid, req in by_id.items()}
        finished = self.scheduler.update_from_output(tokens, accepted, result.draft_token_ids)
        for rid, req in by_id.items():
            appended = req.all_token_ids[before[rid]:]
            tokens[rid] = appended[-1]
            step_out.accepted[rid] = appended[:-1]
        num_drafts = sum(len(out.spec_token_ids.get(rid, ())) for rid in accepted)
        self._spec_counts = (num_drafts, sum(len(a) for a in accepted.values()))
        return finished

    def _begin_step(self, out: SchedulerOutput) -> None:
        """Complete the plan for the executor (:meth:`_prepare_plan`; siblings that fork off a
        leader sampling now) and note what the prefix cache saved the requests scheduled for
        the first time."""
        self._prepare_plan(out)
        if self._pending_forks:
            self._attach_forks(out)
        self._count_prefix_hits(out)

    def _prepare_plan(self, out: SchedulerOutput) -> None:
        """What any step loop tells the executor before it runs: the requests that ended since
        the last step (``out.finished_req_ids``); with ``debug_checks``, check that every K/V
        slot the step reads holds what was written for that very token."""
        out.finished_req_ids, self._finished_since_last_step = self._finished_since_last_step, set()
        if self.kv_write_tracker is not None:
            self.kv_write_tracker.check_step(out)

    def _count_prefix_hits(self, out: SchedulerOutput) -> None:
        """A request scheduled for the first time starts from what the prefix cache held: its
        tokens already computed when the step was planned (``num_computed``) are the hits.
        Read off the plan, so every scheduler and KV manager is counted the same way; the
        request's ``num_cached_tokens`` (reported in its output) is set here too."""
        queries = hits = 0
        for req, computed in zip(out.requests, out.num_computed, strict=True):
            if req.first_scheduled_time is None:
                queries += req.num_tokens
                hits += computed
                req.num_cached_tokens = computed
        self._prefix_queries += queries
        self._prefix_hits += hits

    def _check_stall(self, out: SchedulerOutput, finished: list[Request]) -> None:
        """A step that planned, preempted and ended nothing while requests wait is a stall."""
        if not out.requests and not out.preempted and not finished and self.scheduler.has_unfinished_requests():
            raise EngineStalledError(self._stall_message())

    def _attach_forks(self, out: SchedulerOutput) -> None:
        """Tell the executor which siblings draw their first token from a leader's row."""
        pending = self._pending_forks
        out.forks = {r.request_id: pending[r.request_id] for r in out.sampling_requests if r.request_id in pending}

    def _fork_siblings(self, out: SchedulerOutput, result: ModelRunnerOutput) -> None:
        """Siblings of each leader that sampled fork off it, in the plan's order."""
        for leader_id, kids in out.forks.items():
            leader = self.scheduler.requests.get(leader_id)
            if leader is None or leader_id not in result.sampled:
                continue  # its row failed: the siblings were failed with it
            self._pending_forks.pop(leader_id, None)
            for kid in kids:
                if kid.is_finished:  # its own row failed
                    continue
                self.scheduler.fork_request(leader, kid)
                if kid.status is RequestStatus.RUNNING:  # seated: it shares the leader's prompt
                    self._forked_tokens += leader.num_computed_tokens

    def _fail_requests(self, failed: dict[str, str], step_out: StepOutput) -> None:
        """End requests whose rows failed (and their unforked siblings) with an error."""
        for rid, message in failed.items():
            for kid in self._pending_forks.get(rid, []):
                step_out.failed[kid.request_id] = message
            step_out.failed[rid] = message
        ended = self.finish_requests(list(failed), RequestStatus.FINISHED_ERROR)
        step_out.finished.extend(ended)

    def _fail_step(self, out: SchedulerOutput, err: BaseException, start: float) -> StepOutput:
        """The executor raised: end every request of the step with the error, keep the rest."""
        self.kv.discard_unwritten_blocks()
        message = f"{type(err).__name__}: {err}"
        if isinstance(err, Exception):
            logger.error("a step of %d request(s) failed: %s", len(out.requests), message, exc_info=err)
        step_out = StepOutput(out, start, start)
        self._fail_requests({r.request_id: message for r in out.requests}, step_out)
        step_out.end_time = self.clock()
        self._record_step(out, start, step_out.end_time)
        return step_out

    def _stamp_scheduled(self, out: SchedulerOutput, start: float) -> None:
        """The step computed its requests' tokens: a request's first step stamps its
        first-scheduled time (on the request, the times' one home)."""
        for req in out.requests:
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start

    def _stamp_first_tokens(self, out: SchedulerOutput, sampled: dict[str, int], start: float, now: float) -> None:
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

    def _record_step(self, out: SchedulerOutput, start: float, now: float) -> None:
        self.stats.record_step(
            self.scheduler, out, start, now - start, prefix_cache_queries=self._prefix_queries,
            prefix_cache_hits=self._prefix_hits, num_forked_tokens=self._forked_tokens,
            num_draft_tokens=self._spec_counts[0], num_accepted_tokens=self._spec_counts[1],
        )
        self._prefix_queries = self._prefix_hits = self._forked_tokens = 0
        self._spec_counts = (0, 0)

    def _stall_message(self) -> str:
        sched, kv = self.scheduler, self.kv
        return (
            f"step {self.stats.num_steps - 1}: the scheduler planned nothing while "
            f"{sched.num_waiting} request(s) wait and {len(sched.running)} run; they can never "
            f"be scheduled (KV pool: {kv.num_free_blocks} of {kv.num_blocks} blocks free, "
            f"block_size {kv.block_size})"
        )

    def reset_stats(self) -> None:
        """Start the statistics afresh (after a warm-up, say)."""
        self.stats.reset()

    def check_invariants(self) -> None:
        """The KV manager's own invariants, over the requests the scheduler says are live."""
        self.kv.check_invariants([r.request_id for r in self.scheduler.live_requests()])
