"""Replay request traces through an engine core without a model, and compare two cores step by step.

Exercise 08's unit cases run the student's step loop and minivllm's ``EngineCore`` side by side
over the same minivllm scheduler and KV cache manager, with a fake executor, and compare every
step: the plan, the tokens appended, who finished and who failed, the log-probabilities passed
through, the step's ``StepStats`` and its times; then every request's timestamps against the
definitions of the latency metrics. Everything is pure Python and takes milliseconds.

* :class:`StepClock` -- the time; only the executor moves it, by one second per step, so a step
  that starts at ``t`` ends at ``t + 1`` whoever reads the clock how often;
* :class:`FakeExecutor` -- a seeded random token for every row that samples (and every sibling
  that forks), log-probabilities for each, and the failures a trace asks for: rows that cannot
  be sampled, a step whose execution raises, a ``KeyboardInterrupt`` in the middle of a step;
* :class:`CoreCommitsScheduler` -- minivllm's ``Scheduler``, except that committing written
  blocks to the prefix cache is left to the engine core, as the course's own schedulers do
  (minivllm's commits in ``update_from_output`` too, for code that drives it by hand); it and
  its KV cache manager log the calls the step makes, in order;
* :func:`run_core` and :func:`compare_with_engine_core`.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from minivllm.core.engine_core import EngineCore, EngineStalledError
from minivllm.core.interfaces import Logprobs, ModelRunnerOutput
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.course.grading import Mismatch
from minivllm.metrics import EngineStats
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams

VOCAB = 4  # the fake executor draws token ids 0..3; a trace's stop tokens come from them
LOGGED = ("schedule", "execute", "commit", "discard", "update")  # the calls whose order is checked


class InjectedInterrupt(KeyboardInterrupt):
    """A Ctrl-C the fake executor raises in the middle of a step (a subclass, so that the
    driver never swallows a real one)."""


# --- the parts the cores run on ----------------------------------------------------------------
class StepClock:
    """Seconds that pass only while the executor runs: one per step."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class LoggedKV(KVCacheManager):
    """minivllm's paged KV cache manager that logs ``commit`` and ``discard`` (into ``log``,
    if given) and ignores commits while ``paused``."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        log: list[str] | None = None,
    ):
        super().__init__(num_blocks, block_size, enable_caching)
        self.log = log
        self.paused = False

    def commit_written_blocks(self) -> None:
        if self.paused:  # called from inside update_from_output: left to the engine core
            return
        if self.log is not None:
            self.log.append("commit")
        super().commit_written_blocks()

    def discard_unwritten_blocks(self) -> None:
        if self.log is not None:
            self.log.append("discard")
        super().discard_unwritten_blocks()


class CoreCommitsScheduler(Scheduler):
    """minivllm's ``Scheduler``, whose ``update_from_output`` does not commit written blocks to
    the prefix cache itself: the engine core must (right after the step ran). Runs over a
    :class:`LoggedKV`, into whose log it writes ``schedule`` and ``update``."""

    def __init__(self, config: SchedulerConfig, kv_cache_manager: LoggedKV):
        if not isinstance(kv_cache_manager, LoggedKV):
            raise TypeError(
                f"{type(self).__name__} runs over a LoggedKV, got {type(kv_cache_manager).__name__}"
            )
        super().__init__(config, kv_cache_manager)

    def _log(self, what: str) -> None:
        if self.kv.log is not None:
            self.kv.log.append(what)

    def schedule(self) -> SchedulerOutput:
        self._log("schedule")
        return super().schedule()

    def update_from_output(self, sampled_token_ids: dict[str, int]) -> list[Request]:
        self._log("update")
        self.kv.paused = True
        try:
            return super().update_from_output(sampled_token_ids)
        finally:
            self.kv.paused = False


class NeverSchedules(CoreCommitsScheduler):
    """A scheduler that plans nothing, ever: an engine core must report the stall."""

    def schedule(self) -> SchedulerOutput:
        self._log("schedule")
        return SchedulerOutput()


@dataclass
class FakeExecutor:
    """Runs a plan without a model. Each step moves ``clock`` by one second, then:

    * steps in ``raise_at`` raise (``RuntimeError``, or :class:`InjectedInterrupt`);
    * every row that samples gets a token from a generator seeded with ``(seed, step)``, in
      batch order, then every sibling forking off a leader that sampled;
    * rows named in ``fail_rows[step]`` fail (with their unforked siblings), as rows with
      non-finite logits do; with ``token_for_failed_rows`` a failed row without siblings comes
      with a token anyway (an executor that drew one before it noticed);
    * every sampled token gets ``Logprobs``, every request starting its prompt a
      ``prompt_logprobs`` entry, so that one can check they reach the output.
    """

    clock: StepClock
    seed: int = 0
    fail_rows: Mapping[int, Sequence[str]] = field(default_factory=dict)
    raise_at: Mapping[int, str] = field(default_factory=dict)  # step -> "error" | "interrupt"
    token_for_failed_rows: bool = False
    log: list[str] | None = None
    steps: int = 0

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        step, self.steps = self.steps, self.steps + 1
        self.clock.now += 1.0
        if self.log is not None:
            self.log.append("execute")
        kind = self.raise_at.get(step)
        if kind == "interrupt":
            raise InjectedInterrupt(f"interrupted in step {step}")
        if kind is not None:
            raise RuntimeError(f"the executor failed in step {step}")
        rng = random.Random(self.seed * 100_003 + step)
        result = ModelRunnerOutput()
        failing = set(self.fail_rows.get(step, ()))
        for req in out.sampling_requests:
            kids = out.forks.get(req.request_id, ())
            for rid in [req.request_id] + [kid.request_id for kid in kids]:
                token = rng.randrange(VOCAB)
                if req.request_id in failing:
                    result.failed[rid] = f"row of {req.request_id} is not finite (step {step})"
                    if kids or not self.token_for_failed_rows:
                        continue
                result.sampled[rid] = token
                result.logprobs[rid] = Logprobs(
                    token, -0.25 * (token + 1), token + 1, [(token, -0.25)]
                )
        for req, computed in zip(out.requests, out.num_computed, strict=True):
            if computed == 0:
                result.prompt_logprobs[req.request_id] = (0, [None])
        return result


# --- traces ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CoreRequest:
    """One request of a trace: it joins before step ``arrival_step`` with ``n`` samples, wants
    ``max_tokens`` tokens, stops early on any token in ``stop`` (the fake executor draws
    0..3), and is aborted before step ``abort_step`` if that is set."""

    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    arrival_step: int = 0
    n: int = 1
    stop: tuple[int, ...] = ()
    priority: int = 0
    abort_step: int | None = None


@dataclass(frozen=True)
class CoreSetup:
    """The engine's settings and the failures the fake executor injects."""

    num_blocks: int = 40
    block_size: int = 4
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 16
    max_model_len: int = 64
    prefix_caching: bool = True
    policy: str = "fcfs"
    seed: int = 0
    fail_rows: Mapping[int, Sequence[str]] = field(default_factory=dict)
    raise_at: Mapping[int, str] = field(default_factory=dict)
    token_for_failed_rows: bool = False
    never_schedules: bool = False

    def describe(self) -> str:
        parts = [
            f"{self.num_blocks} blocks of {self.block_size}",
            f"{self.max_num_seqs} seats",
            f"budget {self.max_num_batched_tokens}",
            f"prefix caching {'on' if self.prefix_caching else 'off'}",
            self.policy,
        ]
        if self.fail_rows:
            parts.append(f"failing rows {dict(self.fail_rows)}")
        if self.raise_at:
            parts.append(f"the executor raises {dict(self.raise_at)}")
        return ", ".join(parts)


# --- running one core --------------------------------------------------------------------------
@dataclass
class StepRecord:
    """What one step did, as the driver saw it."""

    plan: list[tuple[str, int]]
    preempted: list[str]
    sampled: dict[str, int]
    finished: list[tuple[str, str]]  # (request id, status name), sorted
    failed: list[str]  # request ids, sorted
    logprobs: dict[str, Logprobs]
    prompt_logprobs: dict[str, Any]
    times: tuple[float, float]  # (start, end) the core reported
    stats: dict[str, Any] | None  # the StepStats recorded for this step, None if none was
    raised: str | None = None  # the exception step() raised, by type name
    events: list[str] = field(default_factory=list)


@dataclass
class CoreRun:
    steps: list[StepRecord]
    requests: dict[str, Request]
    stats: EngineStats
    aborted_at: dict[str, float]  # request id -> clock when the driver aborted it
    blocks_in_use: int


def _requests_of(item: CoreRequest, now: float) -> list[Request]:
    params = SamplingParams(max_tokens=item.max_tokens, temperature=0.0)
    ids = [item.request_id] if item.n == 1 else [f"{item.request_id}#{i}" for i in range(item.n)]
    return [
        Request(
            rid,
            list(item.prompt),
            params,
            arrival_time=now,
            priority=item.priority,
            eos_token_ids=item.stop,
        )
        for rid in ids
    ]


def build_core(
    core_class: Callable[..., EngineCore],
    setup: CoreSetup,
    log: list[str] | None = None,
    clock: StepClock | None = None,
) -> tuple[EngineCore, StepClock]:
    """``core_class(scheduler, executor, clock=..., stats=..., debug_checks=True)`` over
    minivllm's scheduler (leaving commits to the core) and paged KV cache manager."""
    clock = clock or StepClock()
    log = [] if log is None else log
    kv = LoggedKV(setup.num_blocks, setup.block_size, setup.prefix_caching, log)
    config = SchedulerConfig(
        max_num_seqs=setup.max_num_seqs,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        max_model_len=setup.max_model_len,
        policy=setup.policy,
    )
    scheduler = (NeverSchedules if setup.never_schedules else CoreCommitsScheduler)(config, kv)
    executor = FakeExecutor(
        clock, setup.seed, setup.fail_rows, setup.raise_at, setup.token_for_failed_rows, log
    )
    core = core_class(
        scheduler, executor, clock=clock, stats=EngineStats(window=None), debug_checks=True
    )
    return core, clock


def run_core(
    core_class: Callable[..., EngineCore],
    trace: Sequence[CoreRequest],
    setup: CoreSetup,
    choose_tokens: Callable | None = None,
    max_steps: int = 400,
) -> CoreRun:
    """Serve ``trace`` with ``core_class``; one :class:`StepRecord` per step. The engine's log
    of the failures the executor injects is kept quiet."""
    engine_log = logging.getLogger("minivllm")
    level = engine_log.level
    engine_log.setLevel(logging.CRITICAL)
    try:
        return _run(core_class, trace, setup, choose_tokens, max_steps)
    finally:
        engine_log.setLevel(level)


def _run(core_class, trace, setup, choose_tokens, max_steps) -> CoreRun:
    log: list[str] = []
    core, clock = build_core(core_class, setup, log)
    requests: dict[str, Request] = {}
    aborted_at: dict[str, float] = {}
    pending = sorted(trace, key=lambda r: r.arrival_step)
    records: list[StepRecord] = []
    step = 0
    while pending or core.has_unfinished_requests():
        if step >= max_steps:
            raise Mismatch(
                "every request finished",
                f"{core.num_unfinished_requests} unfinished",
                f"after {max_steps} steps",
            )
        while pending and pending[0].arrival_step <= step:
            reqs = _requests_of(pending.pop(0), clock.now)
            requests.update((r.request_id, r) for r in reqs)
            core.add_request(reqs[0], reqs[1:])
        for item in trace:
            if item.abort_step == step:
                ids = (
                    [item.request_id]
                    if item.n == 1
                    else [f"{item.request_id}#{i}" for i in range(item.n)]
                )
                for req in core.abort_requests(ids):
                    aborted_at[req.request_id] = clock.now
        if not core.has_unfinished_requests():
            step += 1
            continue
        records.append(_one_step(core, choose_tokens, log, requests, clock))
        step += 1
        if records[-1].raised == "EngineStalledError":
            break
    return CoreRun(records, requests, core.stats, aborted_at, core.kv.num_used_blocks)


def _one_step(
    core: EngineCore, choose_tokens, log: list[str], requests: dict[str, Request], clock: StepClock
) -> StepRecord:
    num_stats = core.stats.num_steps
    live = [r for r in requests.values() if not r.is_finished]
    start = clock.now
    del log[:]
    try:
        core_out = core.step(choose_tokens) if choose_tokens is not None else core.step()
    except (InjectedInterrupt, EngineStalledError) as err:
        name = "KeyboardInterrupt" if isinstance(err, InjectedInterrupt) else type(err).__name__
        ended = sorted((r.request_id, r.status.name) for r in live if r.is_finished)
        return StepRecord(
            [],
            [],
            {},
            ended,
            [],
            {},
            {},
            (start, clock.now),
            _new_stats(core, num_stats),
            raised=name,
            events=[e for e in log if e in LOGGED],
        )
    out = core_out.scheduler_output
    return StepRecord(
        plan=out.decisions(),
        preempted=[r.request_id for r in out.preempted],
        sampled=dict(core_out.sampled),
        finished=sorted((r.request_id, r.status.name) for r in core_out.finished),
        failed=sorted(core_out.failed),
        logprobs=dict(core_out.logprobs),
        prompt_logprobs=dict(core_out.prompt_logprobs),
        times=(core_out.start_time, core_out.end_time),
        stats=_new_stats(core, num_stats),
        events=[e for e in log if e in LOGGED],
    )


def _new_stats(core: EngineCore, before: int) -> dict[str, Any] | None:
    """The step's ``StepStats`` as a dict, or None if the step recorded none (or several)."""
    if core.stats.num_steps != before + 1:
        return None
    return dataclasses.asdict(core.stats.steps[-1])


# --- comparing ---------------------------------------------------------------------------------
STEP_FIELDS = (
    "raised",
    "plan",
    "preempted",
    "failed",
    "sampled",
    "finished",
    "logprobs",
    "prompt_logprobs",
    "times",
    "stats",
)
WHAT = {
    "raised": "the exception step() raised",
    "plan": "the plan, (request, tokens)",
    "preempted": "requests preempted",
    "failed": "EngineCoreOutput.failed (request ids)",
    "sampled": "EngineCoreOutput.sampled (the tokens appended)",
    "finished": "EngineCoreOutput.finished, (request, status)",
    "logprobs": "EngineCoreOutput.logprobs",
    "prompt_logprobs": "EngineCoreOutput.prompt_logprobs",
    "times": "(start_time, end_time) of the step",
    "stats": "the StepStats recorded for the step",
    "events": "the calls the step made, in order",
}


def _stats_difference(want: dict | None, got: dict | None) -> tuple[Any, Any]:
    """Only the fields that differ, so that the message says which."""
    if want is None or got is None:
        return want and "one StepStats", got and "one StepStats"
    keys = [k for k in want if want[k] != got.get(k)]
    return {k: want[k] for k in keys}, {k: got.get(k) for k in keys}


def compare_runs(
    expected: CoreRun, got: CoreRun, label: str = "", fields: Sequence[str] = STEP_FIELDS
) -> None:
    """Raise :class:`Mismatch` at the first step and field where ``got`` differs."""
    where = f"{label}: " if label else ""
    for t, (want, have) in enumerate(zip(expected.steps, got.steps, strict=False)):
        for name in fields:
            a, b = getattr(want, name), getattr(have, name)
            if a != b:
                if name == "stats":
                    a, b = _stats_difference(a, b)
                raise Mismatch(a, b, f"{where}step {t}, {WHAT[name]}")
    if len(expected.steps) != len(got.steps):
        raise Mismatch(
            f"{len(expected.steps)} steps", f"{len(got.steps)} steps", f"{where}the trace"
        )
    if got.blocks_in_use != expected.blocks_in_use:
        raise Mismatch(
            expected.blocks_in_use, got.blocks_in_use, f"{where}KV blocks in use after the trace"
        )


def expected_times(run: CoreRun) -> dict[str, dict[str, float | None]]:
    """Each request's timestamps by the definitions of the latency metrics, read off the steps
    of ``run``: first scheduled = the start of the first step that computed any of its tokens
    (or, for a forked sibling, gave it its first token; a step that failed computed nothing);
    first token = the end of the first step that gave it a token; finished = the end of the
    step it ended in (or when it was aborted)."""
    times: dict[str, dict[str, float | None]] = {
        rid: {"first_scheduled_time": None, "first_token_time": None, "finished_time": None}
        for rid in run.requests
    }
    for rec in run.steps:
        start, end = rec.times
        if "discard" in rec.events:  # the step failed as a whole: it computed nothing
            for rid, _ in rec.finished:
                times[rid]["finished_time"] = end
            continue
        for rid in [r for r, _ in rec.plan] + list(rec.sampled):
            t = times[rid]
            if t["first_scheduled_time"] is None:
                t["first_scheduled_time"] = start
        for rid in rec.sampled:
            if times[rid]["first_token_time"] is None:
                times[rid]["first_token_time"] = end
        for rid, _ in rec.finished:
            times[rid]["finished_time"] = end
    for rid, when in run.aborted_at.items():
        times[rid]["finished_time"] = when
    return times


def compare_times(expected: CoreRun, got: CoreRun, label: str = "") -> None:
    """Every request's timestamps in ``got`` (on the request and in ``got.stats``) must be the
    ones the definitions give on ``expected``'s steps."""
    where = f"{label}: " if label else ""
    want_all = expected_times(expected)
    for rid, want in want_all.items():
        metrics = got.stats.requests.get(rid)
        req = got.requests.get(rid)
        for name, value in want.items():
            stamped = getattr(metrics, name, "missing")
            if stamped != value:
                raise Mismatch(
                    value, stamped, f"{where}request {rid!r}: stats.requests[{rid!r}].{name}"
                )
            if name != "finished_time" and getattr(req, name, "missing") != value:
                raise Mismatch(
                    value, getattr(req, name, "missing"), f"{where}request {rid!r}: request.{name}"
                )
        if (
            metrics is not None
            and req is not None
            and req.is_finished
            and metrics.num_output_tokens != req.num_output_tokens
        ):
            raise Mismatch(
                req.num_output_tokens,
                metrics.num_output_tokens,
                f"{where}request {rid!r}: output tokens recorded when it finished",
            )


def compare_with_engine_core(
    module: ModuleType | Callable[..., EngineCore],
    trace: Sequence[CoreRequest],
    setup: CoreSetup,
    label: str = "",
    fields: Sequence[str] = STEP_FIELDS,
    times: bool = True,
    choose_tokens: Callable[[], Callable] | None = None,
) -> tuple[CoreRun, CoreRun]:
    """Run ``trace`` through minivllm's ``EngineCore`` and through the student's ``StepLoop``
    (``module.StepLoop``, or a core class) and compare; returns ``(expected, got)``.
    ``choose_tokens``: a factory of a fresh token chooser for each run."""
    core_class = getattr(module, "StepLoop", module)
    label = label or setup.describe()
    expected = run_core(EngineCore, trace, setup, choose_tokens() if choose_tokens else None)
    got = run_core(core_class, trace, setup, choose_tokens() if choose_tokens else None)
    compare_runs(expected, got, label, fields)
    if times:
        compare_times(expected, got, label)
    return expected, got


def random_core_trace(
    seed: int,
    num_requests: int,
    *,
    prefixes: Sequence[tuple[int, ...]] = (),
    max_n: int = 1,
    aborts: bool = False,
    priorities: int = 1,
    max_prompt: int = 14,
    max_tokens: int = 10,
) -> list[CoreRequest]:
    """A seeded random trace: ragged prompts (some after a shared prefix), arrivals over the
    first steps, stop tokens, ``n`` up to ``max_n``, priorities and aborts."""
    rng = random.Random(seed)
    trace = []
    for i in range(num_requests):
        prefix = rng.choice(list(prefixes)) if prefixes and rng.random() < 0.6 else ()
        prompt = prefix + tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, max_prompt)))
        trace.append(
            CoreRequest(
                f"r{i}",
                prompt,
                rng.randint(1, max_tokens),
                arrival_step=rng.randint(0, 6),
                n=rng.randint(1, max_n),
                stop=(3,) if rng.random() < 0.4 else (),
                priority=rng.randrange(priorities),
                abort_step=rng.choice([None, None, None, 2, 5]) if aborts else None,
            )
        )
    return trace
