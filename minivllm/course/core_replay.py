"""Replay request traces through an engine core without a model, and compare two cores step by step.

Exercise 08's unit cases run the student's step loop and minivllm's ``EngineCore`` side by side
over the same minivllm scheduler and KV cache manager, with
:class:`~minivllm.sim.executor.ModelFreeExecutor` (which can fail rows, raise, or be interrupted),
and compare every step: the calls made and their order, the plan, the tokens appended, who
finished and who failed, the log-probabilities passed through, the step's ``StepStats`` and its
times; then every request's timestamps against the definitions of the latency metrics, and the
run's statistics. Everything is pure Python and takes milliseconds.

* :func:`log_calls` -- makes the scheduler and the KV cache manager log the calls a step
  makes, in order (a step listener sees a step only once it is over, not the order of its calls);
* :class:`CoreSetup`, :func:`run_core` and :func:`compare_with_engine_core`.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

from minivllm.core.engine_core import EngineCore, EngineStalledError
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.course.grading import Mismatch
from minivllm.course.harness import (
    ReplaySetup,
    TraceRequest,
    TraceResult,
    expect_same_steps,
    expect_same_tokens,
    run_trace,
)
from minivllm.sim.executor import InjectedInterrupt

VOCAB = 4  # the fake executor draws token ids 0..3; a trace's stop tokens come from them
CoreRequest = TraceRequest  # the name the exercise's tests use
# what must agree at every step, in the order a difference is reported
STEP_FIELDS = ("raised", "batch", "preempted", "failed", "tokens", "ended", "logprobs", "prompt_logprobs",
               "times", "stats")
SUMMARY = ("output_tokens", "mean_ttft_s", "mean_tpot_s", "mean_e2e_s")  # compared after every run


# --- the cores ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class CoreSetup(ReplaySetup):
    """A :class:`~minivllm.course.harness.ReplaySetup` over minivllm's scheduler (which leaves
    committing written blocks to the prefix cache to the engine core) and paged KV cache manager,
    with ``VOCAB`` tokens and logprobs; ``never_schedules``: a scheduler that plans nothing, ever
    (an engine core must report the stall)."""

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


def log_calls(part, log: list[str], **entries: str) -> None:
    """Make every call of ``part.<method>`` append ``entries[method]`` to ``log`` before it runs
    (on this object only: its class is untouched)."""
    def logged(call, entry: str):
        def wrapper(*args, **kwargs):
            log.append(entry)
            return call(*args, **kwargs)

        return wrapper

    for method, entry in entries.items():
        setattr(part, method, logged(getattr(part, method), entry))


def run_core(
    core_class: Callable[..., EngineCore],
    trace: Sequence[TraceRequest],
    setup: CoreSetup,
    choose_tokens: Callable | None = None,
    max_steps: int = 400,
) -> TraceResult:
    """Serve ``trace`` with ``core_class``; one record per step, with the calls it made
    (``events``). An injected Ctrl-C or a stall is recorded on its step (``raised``); the
    engine's log of the failures the executor injects is kept quiet."""
    engine_log = logging.getLogger("minivllm")
    level = engine_log.level
    engine_log.setLevel(logging.CRITICAL)
    log: list[str] = []  # "execute" from the executor, the rest from the scheduler and the KV cache manager

    def logged_scheduler(config, kv) -> Scheduler:
        scheduler = Scheduler(config, kv)
        if setup.never_schedules:
            scheduler.schedule = SchedulerOutput  # an empty plan, every step
        log_calls(scheduler, log, schedule="schedule", update_from_output="update")
        log_calls(kv, log, commit_written_blocks="commit", discard_unwritten_blocks="discard")
        return scheduler

    try:
        core = setup.core(scheduler=logged_scheduler, core_class=core_class, log=log)
        return run_trace(core, trace, max_steps=max_steps, events=log,
                         catch=(InjectedInterrupt, EngineStalledError), choose_tokens=choose_tokens,
                         check_pool=False)  # the KV cache manager is minivllm's
    finally:
        engine_log.setLevel(level)


# --- comparing ---------------------------------------------------------------------------------
def expected_times(run: TraceResult) -> dict[str, dict[str, float | None]]:
    """Each request's timestamps by the definitions of the latency metrics, read off the steps
    of ``run``: first scheduled = the start of the first step that computed any of its tokens
    (or, for a forked sibling, gave it its first token; a step that failed computed nothing);
    first token = the end of the first step that gave it a token; finished = the end of the
    step it ended in (or when it was aborted)."""
    times: dict[str, dict[str, float | None]] = {
        rid: {"first_scheduled_time": None, "first_token_time": None, "finished_time": None} for rid in run.requests
    }
    for rec in run.steps:
        start, end = rec.times
        if "discard" not in rec.events:  # a step that failed as a whole computed nothing
            for rid in [r for r, _ in rec.batch] + rec.sampled:
                if times[rid]["first_scheduled_time"] is None:
                    times[rid]["first_scheduled_time"] = start
            for rid in rec.sampled:
                if times[rid]["first_token_time"] is None:
                    times[rid]["first_token_time"] = end
        for rid in rec.finished:
            times[rid]["finished_time"] = end
    for rid, when in run.aborted_at.items():
        times[rid]["finished_time"] = when
    return times


def compare_times(expected: TraceResult, got: TraceResult, label: str = "") -> None:
    """Every request's timestamps in ``got`` -- on the request, and in the record the statistics
    keep of it once it finished (``got.stats.requests``, taken by ``record_finish``) -- must be
    the ones the definitions give on ``expected``'s steps."""
    where = f"{label}: " if label else ""
    for rid, want in expected_times(expected).items():
        req, record = got.requests[rid], got.stats.requests.get(rid)
        if req.is_finished and record is None:
            raise Mismatch("a record of it in stats.requests", None,
                           f"{where}request {rid!r} ended ({req.status.name}) but was never recorded as finished")
        for name, value in want.items():
            if getattr(req, name) != value:
                raise Mismatch(value, getattr(req, name), f"{where}request {rid!r}: request.{name}")
            if record is not None and getattr(record, name) != value:
                raise Mismatch(value, getattr(record, name), f"{where}request {rid!r}: stats.requests[{rid!r}].{name} "
                               "(what the statistics read off the request when it was recorded as finished)")
        if record is not None and record.num_output_tokens != req.num_output_tokens:
            raise Mismatch(req.num_output_tokens, record.num_output_tokens,
                           f"{where}request {rid!r}: output tokens recorded when it finished")


def compare_summaries(expected: TraceResult, got: TraceResult, label: str = "") -> None:
    """The run's request statistics (``EngineStats.summary()``): TTFT, TPOT, latency, tokens."""
    want, have = expected.stats.summary(), got.stats.summary()
    differ = [k for k in SUMMARY if want[k] != have[k] and not (math.isnan(want[k]) and math.isnan(have[k]))]
    if differ:
        raise Mismatch({k: want[k] for k in differ}, {k: have[k] for k in differ},
                       f"{label + ': ' if label else ''}the run's statistics, EngineStats.summary()")


def compare_with_engine_core(
    module: ModuleType | Callable[..., EngineCore],
    trace: Sequence[TraceRequest],
    setup: CoreSetup,
    label: str = "",
    fields: Sequence[str] = STEP_FIELDS,
    times: bool = True,
    choose_tokens: Callable[[], Callable] | None = None,
) -> tuple[TraceResult, TraceResult]:
    """Run ``trace`` through minivllm's ``EngineCore`` and through the student's ``StepLoop``
    (``module.StepLoop``, or a core class) and compare; returns ``(expected, got)``.
    ``choose_tokens``: a factory of a fresh token chooser for each run. With ``times``, the
    requests' timestamps and the run's statistics are compared too."""
    core_class = getattr(module, "StepLoop", module)
    label = label or setup.describe()
    expected = run_core(EngineCore, trace, setup, choose_tokens() if choose_tokens else None)
    got = run_core(core_class, trace, setup, choose_tokens() if choose_tokens else None)
    expect_same_steps(expected, got, fields, label)
    expect_same_tokens(expected.tokens, got.tokens, label)
    if got.cached != expected.cached:
        raise Mismatch(expected.cached, got.cached, f"{label}: prompt tokens each request found in the prefix cache "
                       "(its num_cached_tokens)")
    if times:
        compare_times(expected, got, label)
        compare_summaries(expected, got, label)
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
) -> list[TraceRequest]:
    """A seeded random trace: ragged prompts (some after a shared prefix), arrivals over the
    first steps, stop tokens, ``n`` up to ``max_n``, priorities and aborts."""
    rng = random.Random(seed)
    trace = []
    for i in range(num_requests):
        prefix = rng.choice(list(prefixes)) if prefixes and rng.random() < 0.6 else ()
        prompt = prefix + tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, max_prompt)))
        trace.append(TraceRequest(
            f"r{i}", prompt, rng.randint(1, max_tokens), arrival_step=rng.randint(0, 6), n=rng.randint(1, max_n),
            stop=(3,) if rng.random() < 0.4 else (), priority=rng.randrange(priorities),
            abort_step=rng.choice([None, None, None, 2, 5]) if aborts else None,
        ))
    return trace
