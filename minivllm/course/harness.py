"""One way to run a request trace through an engine and compare two runs: what every check uses.

A *trace* is a list of :class:`TraceRequest`: a prompt (text, token ids, or a length), sampling
settings, and the step at which the request arrives (and, if ever, is aborted).
:func:`run_trace` adds each request before its arrival step, steps the engine until every
request has ended, and returns a :class:`TraceResult`: each completion's tokens, text and finish
reason, and one :class:`StepRecord` per engine step -- the state before the step, the plan, what
the step did, the KV cache after it. The records come from the engine's step listener
(``EngineCore.add_step_listener``), never from wrapping the scheduler.

The same loop serves two kinds of engine, the difference being the executor:

* an ``LLM`` (or ``LLMEngine``): the real model, with whatever parts were plugged in;
* an ``EngineCore`` over the simulator's :class:`~minivllm.sim.executor.ModelFreeExecutor`: no
  model, seeded tokens (and, on request, failing rows, a raising step, a Ctrl-C), for replaying
  schedulers, KV cache managers and step loops in milliseconds. :class:`ReplaySetup` builds it,
  for every grader alike (``reference``: schedulers; ``kv_replay``: KV cache managers;
  ``core_replay``: step loops).

After every step the run checks, through the protocols only, that queued requests have the
status of their queue and (unless ``check_pool=False``: minivllm's own manager) that the pool's
count of blocks in use is the number of distinct blocks live requests hold; after the last one,
that no block is still in use. A run that does not end within ``max_steps`` steps stops with a
:class:`Mismatch`.

:func:`expect_same_steps` compares two runs step by step and raises :class:`StepMismatch` at the
first step and field that differ, with the state before that step; given a live
:class:`TraceRun` it compares as the run goes, so a run that goes wrong stops there.
:func:`expect_same_tokens` names the first completion (and token) that differs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from minivllm.core.engine_core import EngineCore, EngineCoreBase
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.core.static_scheduler import StaticBatchScheduler
from minivllm.course.grading import Mismatch
from minivllm.engine.core_client import local_core
from minivllm.metrics import EngineStats, StepStats
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams
from minivllm.sim.executor import Faults, InjectedInterrupt, ModelFreeExecutor

WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
NO_LENGTH_CAP = 1 << 40  # a max_model_len no request reaches: each stops on its max_tokens


# --- the trace ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace. It joins the engine before step ``arrival_step`` of the trace
    (the trace's clock counts one per step, idle ones included) and, if ``abort_step`` is set,
    is aborted before that step.

    ``prompt``: text (an engine with a tokenizer), token ids, or a length -- that many made-up,
    distinct token ids, for traces whose prompts only need a length. ``stop``: token ids that
    end the request (``SamplingParams.stop_token_ids``). ``n > 1``: samples ``id#0 .. id#n-1``.
    """

    request_id: str
    prompt: str | tuple[int, ...] | int
    max_tokens: int = 16
    arrival_step: int = 0
    n: int = 1
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = True
    stop: tuple[int, ...] = ()
    priority: int = 0
    cache_salt: str | None = None
    abort_step: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty string, got {self.request_id!r}")
        for name in ("arrival_step", "abort_step"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"{self.request_id}: {name} must be an int >= 0, got {value!r}")
        prompt = self.prompt
        if isinstance(prompt, int) and not isinstance(prompt, bool):
            if prompt < 1:
                raise ValueError(f"{self.request_id}: a prompt length must be >= 1, got {prompt}")
        elif isinstance(prompt, (list, tuple)):
            if not prompt or any(type(t) is not int or t < 0 for t in prompt):
                raise ValueError(f"{self.request_id}: token ids must be a non-empty list of ints >= 0, got {prompt!r}")
            object.__setattr__(self, "prompt", tuple(prompt))
        elif not isinstance(prompt, str):
            raise TypeError(f"{self.request_id}: prompt must be text, token ids or a length, got {prompt!r}")
        self.sampling_params()  # refuses bad settings (max_tokens, n, temperature, seed...) now

    @property
    def prompt_len(self) -> int:
        """Tokens in the prompt (a text prompt's length is known only to a tokenizer)."""
        if isinstance(self.prompt, str):
            raise TypeError(f"{self.request_id}: the length of a text prompt depends on the tokenizer")
        return self.prompt if isinstance(self.prompt, int) else len(self.prompt)

    @property
    def output_len(self) -> int:
        """``max_tokens``, by the name a trace of lengths gives it (every request here ends on
        its length unless it has ``stop`` tokens)."""
        return self.max_tokens

    def token_ids(self, index: int) -> list[int]:
        """The prompt as token ids; a length becomes ids that differ from every other request's
        (``index``: the request's position in its trace)."""
        if isinstance(self.prompt, int):
            return [(index * 7919 + j) % 30000 + 1 for j in range(self.prompt)]
        if isinstance(self.prompt, str):
            raise TypeError(f"{self.request_id}: a text prompt needs an engine with a tokenizer")
        return list(self.prompt)

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(n=self.n, temperature=self.temperature, seed=self.seed,
                              max_tokens=self.max_tokens, ignore_eos=self.ignore_eos,
                              stop_token_ids=list(self.stop))

    @property
    def child_ids(self) -> list[str]:
        """The ids of its samples: itself, or ``id#0 .. id#n-1``."""
        return [self.request_id] if self.n == 1 else [f"{self.request_id}#{i}" for i in range(self.n)]


# --- what a run records ---------------------------------------------------------------------------
_STATUS_OF_REASON = {status.finish_reason: status.name for status in RequestStatus if status.is_finished}


@dataclass(slots=True)
class StepRecord:
    """One engine step. ``running`` / ``waiting``: the queues before the step was planned, as
    ``(request, tokens left to compute)``; the plan (``batch`` and, per entry, ``computed`` tokens
    already cached and its block ``tables``); what the step did; the KV cache after it."""

    step: int  # the engine's step number in this run (0: the first step it ran)
    running: list[tuple[str, int]]
    waiting: list[tuple[str, int]]
    batch: list[tuple[str, int]]  # (request, tokens computed this step), batch order
    computed: list[int]
    tables: list[list[int]]
    copies: list[tuple[int, int]]  # copy-on-write (src, dst) block copies before the step
    tokens: dict[str, list[int]]  # request -> the tokens appended (its delta's new_token_ids)
    preempted: list[str]
    finished: list[str]  # requests that ended in this step, in the order they ended
    statuses: dict[str, str]  # finished request -> its status
    failed: dict[str, str]  # request that ended with an error -> its message, sorted by request
    logprobs: dict[str, Any]
    prompt_logprobs: dict[str, Any]
    times: tuple[float, float]  # (start, end), on the engine's clock
    stats: StepStats | None  # the StepStats the engine recorded for the step (None: none, or several)
    num_prefill_tokens: int
    num_decode_tokens: int
    num_padding_tokens: int
    kv_blocks_used: int  # after the step
    blocks_held: dict[str, int]  # after the step: running request -> blocks in its table
    num_waiting: int  # after the step
    raised: str | None = None  # the exception step() raised, by type name
    events: list[str] = field(default_factory=list)  # what the parts logged during the step

    @property
    def sampled(self) -> list[str]:
        """The requests that got a token, in the order the executor sampled them."""
        return list(self.tokens)

    @property
    def ended(self) -> list[tuple[str, str]]:
        """``(request, status)`` of the requests that ended, sorted."""
        return sorted(self.statuses.items())

    @property
    def scheduled(self) -> list[tuple[str, int, int, list[int]]]:
        """``(request, tokens already cached, new tokens, block table)`` per batch entry."""
        return [(r, c, n, t) for (r, n), c, t in zip(self.batch, self.computed, self.tables, strict=True)]


@dataclass
class TraceResult:
    """What a run produced. Completions are keyed by request id (``id#i`` for sample ``i`` of
    an ``n > 1`` request)."""

    steps: list[StepRecord] = field(default_factory=list)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)  # an engine with a tokenizer only
    finish_reasons: dict[str, str | None] = field(default_factory=dict)
    cached: dict[str, int] = field(default_factory=dict)  # request -> prompt tokens from the prefix cache
    joined: dict[str, int] = field(default_factory=dict)  # request -> the engine step it joined before
    aborted_at: dict[str, float] = field(default_factory=dict)  # request -> engine clock at its abort
    requests: dict[str, Request] = field(default_factory=dict)  # an EngineCore target: the requests built
    stats: EngineStats | None = None  # the engine's statistics at the end
    blocks_in_use: int = 0  # KV blocks in use when the run ended (a run that leaves any raises)

    @property
    def decisions(self) -> list[list[tuple[str, int]]]:
        """Every step's batch: ``(request, tokens)``."""
        return [s.batch for s in self.steps]

    @property
    def preemptions(self) -> dict[str, int]:
        """Request -> how often it was preempted (in the order of first preemption)."""
        counts: dict[str, int] = {}
        for s in self.steps:
            for rid in s.preempted:
                counts[rid] = counts.get(rid, 0) + 1
        return counts

    @property
    def num_preemptions(self) -> int:
        return sum(len(s.preempted) for s in self.steps)

    def first_token_step(self, request_id: str) -> int | None:
        return next((s.step for s in self.steps if request_id in s.tokens), None)

    def finished_step(self, request_id: str) -> int | None:
        return next((s.step for s in self.steps if request_id in s.statuses), None)

    def wait(self, request_id: str) -> int:
        """Engine steps from the request's arrival to its first token (0: its first step made it)."""
        return self.first_token_step(request_id) - self.joined[request_id]


# --- an engine core without a model --------------------------------------------------------------
def scheduler_config(max_num_seqs: int, max_num_batched_tokens: int, enable_chunked_prefill: bool,
                     max_model_len: int | None = None, policy: str = "fcfs") -> SchedulerConfig:
    """A config whose length cap is ``max_model_len`` (``None``: no cap, requests stop on their
    ``max_tokens``). Without chunked prefill the budget must cover the cap, as the engine
    requires; with no cap it is not checked."""
    cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_num_batched_tokens if max_model_len is None else max_model_len,
        enable_chunked_prefill=enable_chunked_prefill,
        policy=policy,
    )
    if max_model_len is None:
        cfg.max_model_len = NO_LENGTH_CAP
    return cfg


@dataclass(frozen=True)
class ReplaySetup:
    """The settings of an engine core without a model, and :meth:`core`, which builds it.

    The core runs a scheduler (minivllm's ``scheduler``, ``"continuous"`` or ``"static"``, or
    any factory given to :meth:`core`) over a KV cache manager (minivllm's paged one, or any
    given to :meth:`core`) and a :class:`~minivllm.sim.executor.ModelFreeExecutor` that draws
    seeded tokens below ``vocab`` (``vocab=1``: every token is 0) and injects the failures
    ``fail_rows`` / ``raise_at`` name (keyed by the executor's call: the engine's step number).
    It runs on the executor's clock and keeps the statistics of every step. Two cores built from
    one setup differ only in the parts given to :meth:`core`, so two runs of a trace over them
    (:func:`run_trace`) differ only where those parts decide differently.
    ``max_model_len=None``: no length cap (see :func:`scheduler_config`)."""

    num_blocks: int = 40
    block_size: int = 4
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 16
    max_model_len: int | None = 64
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"
    scheduler: str = "continuous"  # or "static" (each request reserves its worst case up front)
    prefix_caching: bool = True
    debug_checks: bool = True  # every K/V read checked against what was written for that token
    vocab: int = 4
    seed: int = 0
    logprobs: bool = True  # the executor returns (made-up) logprobs and prompt logprobs
    fail_rows: Mapping[int, Sequence[str]] = field(default_factory=dict)
    raise_at: Mapping[int, str] = field(default_factory=dict)
    token_for_failed_rows: bool = False

    def scheduler_config(self) -> SchedulerConfig:
        return scheduler_config(self.max_num_seqs, self.max_num_batched_tokens, self.enable_chunked_prefill,
                                self.max_model_len, self.policy)

    def kv(self, caching: bool | None = None) -> KVCacheManager:
        """minivllm's paged KV cache manager over this pool (prefix caching as set, unless
        ``caching`` says)."""
        return KVCacheManager(self.num_blocks, self.block_size, self.prefix_caching if caching is None else caching)

    def core(self, kv=None, *, scheduler: Callable | None = None, core_class: Callable[..., EngineCoreBase] = EngineCore,
             log: list[str] | None = None) -> EngineCoreBase:
        """``core_class(scheduler(config, kv), executor, ...)``: ``kv`` defaults to :meth:`kv`,
        ``scheduler`` to minivllm's; ``log``: the executor appends ``execute`` to it each call."""
        if scheduler is None:
            scheduler = StaticBatchScheduler if self.scheduler == "static" else Scheduler
        faults = Faults(self.fail_rows, self.raise_at, self.token_for_failed_rows)
        executor = ModelFreeExecutor(vocab=self.vocab, seed=self.seed, faults=faults, logprobs=self.logprobs, log=log)
        return core_class(scheduler(self.scheduler_config(), self.kv() if kv is None else kv), executor,
                          clock=executor.clock, stats=EngineStats(window=None), debug_checks=self.debug_checks)


# --- the run --------------------------------------------------------------------------------------
class TraceRun:
    """Drive ``target`` (an ``LLM``, ``LLMEngine`` or ``EngineCore``) through ``trace``, one
    engine step per iteration; iterating yields each step's :class:`StepRecord`, and
    :attr:`result` holds everything recorded so far. :func:`run_trace` runs it to the end.

    A trace step at which the engine has nothing unfinished runs no engine step (the trace's
    clock moves on). ``catch``: exceptions from ``step()`` that are part of the trace (an
    injected Ctrl-C, an ``EngineStalledError``): the step is recorded with ``raised`` and the
    run goes on (a stalled engine ends it). ``events``: a log the engine's parts write to; each
    record keeps what was written during its step. ``check_pool=False`` skips the per-step check
    of the pool's accounting, for a run over minivllm's own KV cache manager. ``checks``: each is
    called with every record before the run yields it; one that raises stops the run there."""

    def __init__(
        self,
        target,
        trace: Sequence[TraceRequest],
        *,
        max_steps: int = 100_000,
        catch: tuple[type[BaseException], ...] = (),
        events: list[str] | None = None,
        choose_tokens: Callable | None = None,
        check_pool: bool = True,
        checks: Sequence[Callable[[StepRecord], None]] = (),
        label: str = "",
    ):
        engine = getattr(target, "engine", target)
        if isinstance(engine, EngineCoreBase):
            self.engine, self.core = None, engine
        else:
            self.engine, self.core = engine, local_core(engine)
        ids = [cid for r in trace for cid in r.child_ids]
        if len(set(ids)) != len(ids):
            raise ValueError(f"request ids must be unique in a trace: {sorted(ids)}")
        self.trace = list(trace)
        self.index = {r.request_id: i for i, r in enumerate(self.trace)}
        self.pending = sorted(self.trace, key=lambda r: r.arrival_step)  # stable: list order within a step
        self.max_steps, self.catch, self.events = max_steps, catch, events
        self.choose_tokens, self.check_pool, self.checks = choose_tokens, check_pool, checks
        self.aborts: dict[int, list[TraceRequest]] = {}
        for r in self.trace:
            if r.abort_step is not None:
                self.aborts.setdefault(r.abort_step, []).append(r)
        self.where = f"{label}: " if label else ""
        self.result = TraceResult(stats=self.core.stats)
        self.t = 0  # the trace's clock
        self._run = self._steps()

    @property
    def steps(self) -> list[StepRecord]:
        return self.result.steps

    @property
    def done(self) -> bool:
        """Every request has arrived and ended."""
        return not self.pending and not self.core.has_unfinished_requests()

    def unfinished(self) -> list[str]:
        sched = self.core.scheduler
        return [r.request_id for r in sched.running] + [r.request_id for r in _waiting(sched)] + [
            r.request_id for r in self.pending]

    def __iter__(self) -> Iterator[StepRecord]:
        return self

    def finish(self) -> TraceResult:
        """Run to the end (the steps not taken yet); return the result."""
        for _ in self:
            pass
        return self.result

    def __next__(self) -> StepRecord:
        rec = next(self._run)
        for check in self.checks:
            check(rec)
        return rec

    def _steps(self) -> Iterator[StepRecord]:
        remove = self.core.add_step_listener(self._record)
        try:
            while not self.done:
                self._arrive_and_abort()
                self.t += 1
                if not self.core.has_unfinished_requests():
                    continue
                if len(self.steps) >= self.max_steps:
                    raise Mismatch("every request finished", f"still unfinished: {self.unfinished()}",
                                   f"{self.where}after {self.max_steps} steps")
                self._before = self._queues()
                yield from self._one_step()
                if self.check_pool:
                    self._check_pool(self.steps[-1])
                if self.steps[-1].raised == "EngineStalledError":
                    return
            self.result.blocks_in_use = self.core.kv.num_used_blocks
            if self.result.blocks_in_use:
                raise Mismatch(0, self.result.blocks_in_use, f"{self.where}KV blocks in use after every request ended")
            self._collect()
        finally:
            remove()

    def _queues(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """The queues before a step, ``(request, tokens left to compute)``; every request in them
        must have its queue's status (what the step before left them in)."""
        sched = self.core.scheduler
        running, waiting = sched.running, _waiting(sched)
        wrong = [(r.request_id, r.status.name) for r in running if r.status is not RequestStatus.RUNNING]
        wrong += [(r.request_id, r.status.name) for r in waiting if r.status not in WAITING]
        if wrong and self.steps:
            raise StepMismatch(self.where.rstrip(": "), "", self.steps[-1], "status of the requests in running / "
                               "waiting after the step", "RUNNING / WAITING or PREEMPTED", wrong)
        if wrong:
            raise Mismatch("RUNNING / WAITING or PREEMPTED", wrong, f"{self.where}status of the requests queued")
        return ([(r.request_id, r.num_tokens - r.num_computed_tokens) for r in running],
                [(r.request_id, r.num_tokens - r.num_computed_tokens) for r in waiting])

    def _one_step(self) -> Iterator[StepRecord]:
        self._num_stats, start, count = self.core.stats.num_steps, self.core.clock(), len(self.steps)
        live = [r for r in self.result.requests.values() if not r.is_finished] if self.catch else []
        if self.events is not None:
            del self.events[:]
        try:
            self._step()
        except self.catch as err:
            del self.steps[count:]  # a core that reported the failed step: keep one record shape
            ended = {r.request_id: r.status.name for r in live if r.is_finished}
            name = "KeyboardInterrupt" if isinstance(err, InjectedInterrupt) else type(err).__name__
            self.steps.append(self._make_record([], {}, [], ended, {}, (start, self.core.clock()), name))
        except Exception:
            if len(self.steps) > count:  # compare what the step did before what it raised after
                yield self.steps[-1]
            raise
        if len(self.steps) != count + 1:  # EngineCore reports every step loop's step exactly once
            raise RuntimeError(f"{type(self.core).__name__} reported {len(self.steps) - count} steps to "
                               f"its step listeners for step {count}; one step() must report one")
        if self.events is not None:
            self.steps[-1].events = list(self.events)
        yield self.steps[-1]

    def _step(self) -> None:
        if self.engine is None:
            self.core.step(self.choose_tokens) if self.choose_tokens else self.core.step()
            return
        for out in self.engine.step():
            if out.finished:
                self._finished_output(out)

    def _record(self, outputs) -> None:
        """The step listener: one record from what the step planned and did (its
        ``EngineCoreOutputs``)."""
        plan, deltas, known = outputs.plan, outputs.deltas, self.result.requests
        # an ended request's status as it holds it (driving an engine, the requests are not at hand)
        statuses = {d.request_id: known[d.request_id].status.name if d.request_id in known
                    else _STATUS_OF_REASON[d.finish_reason] for d in deltas if d.finish_reason is not None}
        tokens = {d.request_id: list(d.new_token_ids) for d in deltas if d.new_token_ids}
        rec = self._make_record(plan.decisions(), tokens, [r.request_id for r in plan.preempted], statuses,
                                outputs.failed, (outputs.start_time, outputs.timestamp), None, plan, deltas)
        self.steps.append(rec)

    def _make_record(self, batch, tokens, preempted, statuses, failed, times, raised, out=None, deltas=()):
        sched, kv, stats = self.core.scheduler, self.core.kv, self.core.stats
        return StepRecord(
            step=len(self.steps), running=self._before[0], waiting=self._before[1], batch=batch,
            computed=list(out.num_computed) if out else [],
            tables=[list(b) for b in out.block_ids] if out else [],
            copies=list(out.blocks_to_copy) if out else [], tokens=tokens, preempted=preempted,
            finished=list(statuses), statuses=statuses, failed=dict(sorted(failed.items())),
            logprobs={d.request_id: d.new_logprobs[-1] for d in deltas if d.new_logprobs},
            prompt_logprobs={d.request_id: d.prompt_logprobs for d in deltas if d.prompt_logprobs is not None},
            times=times,
            stats=stats.steps[-1] if stats.num_steps == self._num_stats + 1 else None,
            num_prefill_tokens=out.num_prefill_tokens if out else 0,
            num_decode_tokens=out.num_decode_tokens if out else 0,
            num_padding_tokens=out.num_padding_tokens if out else 0,
            kv_blocks_used=kv.num_used_blocks,
            blocks_held={r.request_id: len(kv.get_block_ids(r.request_id)) for r in sched.running},
            num_waiting=sched.num_waiting, raised=raised,
        )

    def _arrive_and_abort(self) -> None:
        core, res = self.core, self.result
        while self.pending and self.pending[0].arrival_step <= self.t:
            r = self.pending.pop(0)
            for cid in r.child_ids:
                res.joined[cid] = len(self.steps)
            if self.engine is not None:
                prompt = r.prompt if isinstance(r.prompt, str) else r.token_ids(self.index[r.request_id])
                self.engine.add_request(r.request_id, prompt, r.sampling_params(), priority=r.priority,
                                        cache_salt=r.cache_salt)
                continue
            params, ids = r.sampling_params(), r.token_ids(self.index[r.request_id])
            kids = [Request(cid, ids, params if r.n == 1 else params.for_sample(i), arrival_time=core.clock(),
                            priority=r.priority, cache_salt=r.cache_salt) for i, cid in enumerate(r.child_ids)]
            res.requests.update((k.request_id, k) for k in kids)
            core.add_request(kids[0], kids[1:])
        for r in self.aborts.get(self.t, ()):
            if self.engine is not None:
                for out in self.engine.abort_request(r.request_id):
                    self._finished_output(out)
                    res.aborted_at[out.request_id] = core.clock()
            else:
                for req in core.abort_requests(r.child_ids):
                    res.aborted_at[req.request_id] = core.clock()

    def _finished_output(self, out) -> None:
        res, n = self.result, len(out.outputs)
        res.cached[out.request_id] = out.num_cached_tokens
        for c in out.outputs:
            key = out.request_id if n == 1 else f"{out.request_id}#{c.index}"
            res.tokens[key], res.texts[key], res.finish_reasons[key] = list(c.token_ids), c.text, c.finish_reason

    def _collect(self) -> None:
        """An EngineCore target: the completions, read off the requests the run built."""
        res = self.result
        if self.engine is not None:
            return
        for r in self.trace:
            res.cached[r.request_id] = res.requests[r.child_ids[0]].num_cached_tokens
            for cid in r.child_ids:
                req = res.requests[cid]
                res.tokens[cid], res.finish_reasons[cid] = req.output_token_ids, req.status.finish_reason

    def _check_pool(self, rec: StepRecord) -> None:
        """Through the protocol only: the blocks in use are the distinct blocks live requests hold."""
        sched, kv = self.core.scheduler, self.core.kv
        held = {b for r in sched.live_requests() for b in kv.get_block_ids(r.request_id)}
        if kv.num_used_blocks != len(held):
            raise AssertionError(f"{self.where}step {rec.step}: the pool says {kv.num_used_blocks} blocks are in "
                                 f"use, but live requests hold {len(held)} distinct blocks")
        if kv.num_free_blocks != kv.num_blocks - kv.num_used_blocks:
            raise AssertionError(f"{self.where}step {rec.step}: {kv.num_free_blocks} free + "
                                 f"{kv.num_used_blocks} used blocks != {kv.num_blocks}")


def _waiting(scheduler) -> list[Request]:
    """The waiting queue in its order, if the scheduler shows it (the protocol asks only for
    ``num_waiting``)."""
    return list(getattr(scheduler, "waiting", ()))


def run_trace(target, trace: Sequence[TraceRequest], **options) -> TraceResult:
    """Run ``trace`` on ``target`` to the end (options: those of :class:`TraceRun`)."""
    return TraceRun(target, trace, **options).finish()


def beam_search(llm, prompts: Sequence, width: int, max_tokens: int, max_steps: int = 200) -> list[list[list[int]]]:
    """``llm.beam_search`` (a loop of its own, not a trace) stopped by a step listener after
    ``max_steps`` steps, so that a broken part fails a check instead of searching forever.
    Returns each prompt's beams, best first, as token ids."""
    from minivllm import BeamSearchParams

    steps = iter(range(max_steps))

    def bounded(_step_output) -> None:
        if next(steps, None) is None:
            raise Mismatch(f"at most {max_steps} steps", "more", "beam search did not finish")

    remove = local_core(llm).add_step_listener(bounded)
    try:
        outs = llm.beam_search(list(prompts), BeamSearchParams(beam_width=width, max_tokens=max_tokens))
    finally:
        remove()
    return [[list(s.token_ids) for s in out.sequences] for out in outs]


# --- comparing ------------------------------------------------------------------------------------
WHAT = {
    "raised": "the exception step() raised",
    "batch": "batch (request, tokens)",
    "scheduled": "scheduled (request, tokens cached, new tokens, block table)",
    "computed": "tokens each batch entry had computed (or found in the prefix cache) before the step",
    "copies": "copy-on-write (src, dst) block copies",
    "sampled": "requests that sample a token",
    "tokens": "the tokens appended (each delta's new_token_ids)",
    "preempted": "requests preempted",
    "failed": "the requests that failed (request id -> the error of its delta)",
    "ended": "requests that ended, (request, status)",
    "logprobs": "each delta's new_logprobs",
    "prompt_logprobs": "each delta's prompt_logprobs",
    "times": "(start_time, end_time) of the step",
    "stats": "the StepStats recorded for the step",
    "events": "the calls the step made, in order",
    "kv_blocks_used": "KV blocks in use after the step",
    "blocks_held": "blocks in each running request's table after the step",
}


class StepMismatch(Mismatch):
    """Two runs differ at one step: the message shows the settings, the state before the step,
    and what differed."""

    def __init__(self, label: str, settings: str, rec: StepRecord, what: str, expected, got):
        self.expected, self.got, self.note = expected, got, label
        head = f"before step {rec.step}: "
        lines = [
            ": ".join(x for x in (label, settings) if x),
            f"{head}running {rec.running}",
            f"{' ' * len(head)}waiting {rec.waiting}   (request, tokens left to compute)",
            f"step {rec.step}, {what}:",
            f"  expected {expected}",
            f"  got      {got}",
            "(the state before that step is shown above)",
        ]
        AssertionError.__init__(self, "\n".join(line for line in lines if line))


def _difference(name: str, want, got) -> tuple[Any, Any]:
    """What to show of a field that differs: only the differing entries of a StepStats."""
    if name != "stats" or want is None or got is None:
        return want, got
    a, b = dataclasses.asdict(want), dataclasses.asdict(got)
    keys = [k for k in a if a[k] != b.get(k)]
    return {k: a[k] for k in keys}, {k: b.get(k) for k in keys}


def expect_same_steps(
    expected: TraceResult,
    got: TraceRun | TraceResult,
    fields: Sequence[str],
    label: str = "",
    settings: str = "",
) -> list[StepRecord]:
    """Raise :class:`StepMismatch` at the first step where a field in ``fields`` differs, then
    :class:`Mismatch` if ``got`` ran more or fewer steps. A live :class:`TraceRun` is compared as
    it runs and never runs longer than ``expected``. Returns ``got``'s steps."""
    seen: list[StepRecord] = []
    for want, have in zip(expected.steps, got.steps if isinstance(got, TraceResult) else got):
        seen.append(have)
        for name in fields:
            a, b = getattr(want, name), getattr(have, name)
            if a != b:
                a, b = _difference(name, a, b)
                raise StepMismatch(label, settings, have, WHAT.get(name, name), a, b)
    where = ", ".join(x for x in (label, settings) if x)
    if len(seen) < len(expected.steps):
        raise Mismatch(f"{len(expected.steps)} steps", f"{len(seen)} steps", where or "the trace")
    if isinstance(got, TraceRun):
        left = got.unfinished()
        if next(got, None) is not None:  # None: the run ended here too, and its final checks passed
            raise Mismatch("every request finished", f"still unfinished: {left}",
                           f"{where + ': ' if where else ''}after {len(expected.steps)} steps")
    elif len(got.steps) != len(expected.steps):
        raise Mismatch(f"{len(expected.steps)} steps", f"{len(got.steps)} steps", where or "the trace")
    return seen


def first_difference(want: Sequence[int], got: Sequence[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))


def expect_same_tokens(expected: Mapping[str, list[int]], got: Mapping[str, list[int]], what: str) -> None:
    """Raise :class:`Mismatch` naming the first completion (and token) that differs."""
    for rid, want in expected.items():
        have = got.get(rid)
        if have != want:
            i = first_difference(want, have or [])
            raise Mismatch(want, have, f"{what}: request {rid!r}, first difference at generated token {i}")

