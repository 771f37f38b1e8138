"""Cases for ex08_engine_step: the student's step loop beside minivllm's ``EngineCore``.

The unit cases (``minivllm.course.core_replay``) run both cores over minivllm's scheduler and
paged KV cache manager with a fake executor, one trace each, and compare every step: the calls
made and their order, the plan, the tokens appended, who finished and failed, the
log-probabilities, the ``StepStats`` and the step's times. Request timestamps are compared
with the definitions of the latency metrics (read off the steps), not with minivllm's figures,
and the run's statistics with minivllm's. The scheduler there leaves committing written blocks
to the core, as the course's schedulers do. Then the tiny model is served with the student's
core (``debug_checks=True``), and last the engine assembled from all the student's exercises
(``minivllm.course.capstone``).
"""

from __future__ import annotations

from functools import lru_cache

from minivllm.core.engine_core import EngineCore
from minivllm.course.core_replay import (
    CoreSetup,
    compare_with_engine_core,
    random_core_trace,
    run_core,
)
from minivllm.course.grading import Case, case, expect
from minivllm.course.harness import TraceRequest as R

CASES: list[Case] = []

PREFIX = (1, 2, 3, 1, 2, 3, 1, 2)  # two full blocks of 4
OTHER = (2, 2, 0, 0, 1, 1, 0, 2, 1, 3, 0, 0)


def _events(ex, trace, setup, label):
    compare_with_engine_core(ex, trace, setup, label, fields=("raised", "events"), times=False)


# --- the order of a step -----------------------------------------------------------------------
@case(CASES, "one step: one plan, run once, its blocks findable, its tokens appended", "StepLoop.run_step",
      "S1, S2, K1: one plan per step, run once; each request that got a token has it appended once; the "
      "blocks the step filled become findable by a later request once the executor has returned")
def _(ex):
    trace = [R("a", PREFIX + (0, 1), 4), R("b", (3, 3, 1), 3, arrival_step=1), R("c", OTHER, 6, arrival_step=2)]
    _events(ex, trace, CoreSetup(), "three requests")


@case(CASES, "a step that raised: none of its blocks ever findable", "StepLoop.run_step",
      "K1: after an executor that raised, no block of the step ever becomes findable, at this step's "
      "end or at any later step's")
def _(ex):
    trace = [R("a", PREFIX + (0, 1), 5), R("b", OTHER, 4, arrival_step=1)]
    _events(ex, trace, CoreSetup(raise_at={1: "error"}), "the executor raises in step 1")


# --- what a step does --------------------------------------------------------------------------
@case(CASES, "tokens appended, requests ended, the executor's logprobs passed on", "StepLoop.run_step",
      "S2, C1: the tokens appended are the executor's (less the failed rows'); the output's deltas are the "
      "failed requests' and then update_from_output's, with result's log-probabilities (step_outputs)")
def _(ex):
    trace = [R(f"q{i}", tuple((i + j) % 4 for j in range(3 + 2 * i)), 2 + i % 4, arrival_step=i // 2,
               stop=(3,) if i % 2 else ()) for i in range(7)]
    compare_with_engine_core(ex, trace, CoreSetup(max_num_seqs=4), "seven requests, some stop early", times=False)


@case(CASES, "statistics: one StepStats per step, describing the engine as the step left it", "StepLoop.run_step",
      "C2: one StepStats per step, failed or not, describing the engine as the step left it (its "
      "running and waiting requests, its KV blocks in use); the prefix-cache counts are those of the "
      "requests scheduled for the first time")
def _(ex):
    trace = [R(f"s{i}", OTHER[: 4 + i], 1 + i % 3, arrival_step=i % 3) for i in range(6)]
    setup = CoreSetup(max_num_seqs=3, max_num_batched_tokens=12)
    compare_with_engine_core(ex, trace, setup, "six short requests", times=False)


@case(CASES, "timestamps: first scheduled, first token, finished (max_tokens=1 too)", "StepLoop.run_step",
      "C3, C4: first_token_time is the end of the step that appended the first token -- also for a "
      "request that finished in that very step and for a sibling that started in it; a request recorded "
      "as finished already holds every time C3 gives it (the statistics keep what it holds then)")
def _(ex):
    trace = [R("long", OTHER + OTHER, 3), R("one", (1, 2, 3), 1, arrival_step=1),
             R("stops", (0, 1), 6, arrival_step=1, stop=(0, 1, 2, 3)), R("pair", (2, 3, 0), 1, arrival_step=2, n=2),
             R("late", PREFIX, 4, arrival_step=5)]
    compare_with_engine_core(ex, trace, CoreSetup(max_num_batched_tokens=8), "five requests; a long prompt in chunks")
    # the statistics keep what a finished request holds when it is recorded: a request that ends
    # at its first token must have that token's time by then, or its TTFT is lost
    ones = [R("prompt", OTHER + OTHER, 1), R("short", (1, 2), 1, arrival_step=1)]
    compare_with_engine_core(ex, ones, CoreSetup(), "two requests ending at their first token in one step")


@case(CASES, "prefix cache: a block is shared only after the step that wrote it ran", "StepLoop.run_step",
      "K1: a block the step filled is findable by a later request once the executor returned, even when "
      "the request that filled it ends in this same step")
def _(ex):
    trace = [R("first", PREFIX + (0,), 3), R("second", PREFIX + (3, 3), 3, arrival_step=2),
             R("brief", OTHER + (1,), 1, arrival_step=4), R("after", OTHER + (2, 2), 2, arrival_step=6)]
    expected, _ = compare_with_engine_core(ex, trace, CoreSetup(), "shared prefixes")
    first_chunk: dict[str, int] = {}
    for rec in expected.steps:
        for rid, n in rec.batch:
            first_chunk.setdefault(rid, n)
    if (first_chunk["second"], first_chunk["after"]) != (2, 2):  # a guard on the trace itself
        raise AssertionError(f"the trace was meant to hit the prefix cache twice; first chunks {first_chunk}")


@case(CASES, "a failed step: its requests end with an error, its blocks are never shared", "StepLoop.run_step",
      "F2, K1: when the executor raises, every request of the plan ends with FINISHED_ERROR (its blocks "
      "freed), the others go on, and a later request with the same prefix does not find the failed "
      "step's blocks")
def _(ex):
    trace = [R("doomed", PREFIX + OTHER, 3), R("bystander", (0, 0, 1), 4),
             R("same-prefix", PREFIX + OTHER + (1,), 3, arrival_step=3)]
    compare_with_engine_core(ex, trace, CoreSetup(raise_at={0: "error"}), "the executor raises in step 0")


@case(CASES, "a failed row: that request ends with an error and gets no token", "StepLoop.run_step",
      "F1, K1: a failed row's request ends with FINISHED_ERROR and the row's message, and gets no token; "
      "the other rows go on. The executor returned, so the blocks the step filled were written: a later "
      "request with the same prefix finds them, the failed request's included")
def _(ex):
    trace = [R("ok", (1, 1, 2), 5), R("nan", (2, 0, 3), 5), R("later", (0, 3), 3, arrival_step=1)]
    setup = CoreSetup(fail_rows={2: ["nan"]}, token_for_failed_rows=True)
    compare_with_engine_core(ex, trace, setup, "row 'nan' fails at step 2 (with a token drawn for it)")
    trace = [R("ok", (1, 1, 2), 5), R("nan", PREFIX + (0, 3), 5), R("same-prefix", PREFIX + (2,), 3, arrival_step=2)]
    setup = CoreSetup(fail_rows={0: ["nan"]}, token_for_failed_rows=True)
    compare_with_engine_core(ex, trace, setup, "row 'nan' fails in the step that wrote its two full blocks")


@case(CASES, "n > 1: siblings fork off their leader and sample with it", "StepLoop.run_step",
      "S3: each sibling in plan.forks of a leader that got its token has started beside it once when "
      "the tokens are appended (fork_request; starting it again raises 'already holds blocks'), unless "
      "it ended; its first token is appended in the same step as the leader's")
def _(ex):
    trace = [R("trio", PREFIX + (0,), 4, n=3), R("solo", (3, 2, 1), 3, arrival_step=1),
             R("pair", OTHER, 2, arrival_step=2, n=2, stop=(1,))]
    compare_with_engine_core(ex, trace, CoreSetup(), "n = 3 and n = 2")


@case(CASES, "Ctrl-C in the middle of a step: the step's requests end, the interrupt goes up", "StepLoop.run_step",
      "F3: a KeyboardInterrupt is not an Exception, and it leaves the engine as an error does (F2), "
      "the step recorded, before it goes on up")
def _(ex):
    trace = [R("a", (1, 2, 3, 0), 4), R("b", (0, 1), 4, arrival_step=1)]
    compare_with_engine_core(ex, trace, CoreSetup(raise_at={2: "interrupt"}), "KeyboardInterrupt in step 2")


def _replace_tokens():
    def choose(out, result):
        return {rid: [(tokens[-1] + 1) % 4] for rid, tokens in result.new_token_ids.items()}

    return choose


@case(CASES, "beam search: choose_tokens picks the tokens to append", "StepLoop.run_step",
      "when step(choose_tokens) is given one, the tokens appended are choose_tokens(plan, result)")
def _(ex):
    trace = [R("a", (1, 2, 3), 5, stop=(0,)), R("b", (3, 3), 5, arrival_step=1, stop=(0,))]
    compare_with_engine_core(ex, trace, CoreSetup(), "a chooser that replaces every token",
                             choose_tokens=_replace_tokens)


@case(CASES, "a step that plans nothing while requests wait raises EngineStalledError", "StepLoop.run_step",
      "S4: a step that plans, preempts and ends nothing while requests remain raises EngineStalledError")
def _(ex):
    trace = [R("stuck", (1, 2), 3)]
    expected = run_core(EngineCore, trace, CoreSetup(never_schedules=True))
    got = run_core(ex.StepLoop, trace, CoreSetup(never_schedules=True))
    expect([r.raised for r in got.steps], [r.raised for r in expected.steps], "what each step raised")


@case(CASES, "40 random traces (seeded): preemption, prefixes, forks, stops, aborts, failures", "StepLoop.run_step",
      "compare step by step with minivllm's EngineCore; the note says which trace and step")
def _(ex):
    for seed in range(40):
        setup = CoreSetup(
            num_blocks=10 + seed % 14, max_num_seqs=1 + seed % 6, max_num_batched_tokens=(5, 8, 16, 64)[seed % 4],
            policy="priority" if seed % 3 == 2 else "fcfs", seed=seed,
            fail_rows={3: ["r1", "r2"], 7: ["r0#0", "r4"]} if seed % 4 == 1 else {},
            raise_at={5: "error"} if seed % 5 == 2 else ({4: "interrupt"} if seed % 5 == 4 else {}),
        )
        trace = random_core_trace(seed, 3 + seed % 8, prefixes=[PREFIX, OTHER], max_n=3, aborts=seed % 6 == 0,
                                  priorities=3 if seed % 3 == 2 else 1)
        compare_with_engine_core(ex, trace, setup, f"seed {seed}: {setup.describe()}")


# --- the tiny model ----------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _reference_serving():
    from minivllm.course.capstone import serve_engine_trace

    return serve_engine_trace(None)


@case(CASES, "serves the tiny model: minivllm's tokens, prefix hits, n > 1, preemption, beam search", "StepLoop",
      "pass the cases above first; debug_checks=True checks every K/V read against what was written")
def _(ex):
    from minivllm.course.capstone import compare_served, serve_engine_trace

    compare_served(_reference_serving(), serve_engine_trace(ex.StepLoop), "LLM(engine_core=StepLoop)")
