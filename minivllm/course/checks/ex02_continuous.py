"""Cases for ex02_continuous: the student's ``ContinuousScheduler``, written from the
``SchedulerInterface`` protocol, against minivllm's own ``Scheduler`` (chunked prefill off),
step by step: small traces that each isolate one rule of the policy, seeded random traces with
aborts, and the tiny model served with both. Every run of the student's scheduler is checked
after every step for the limits (budget, seats, the pool's accounting) as well."""

from __future__ import annotations

from collections import deque

from minivllm.course.grading import Case, case, expect
from minivllm.course.reference import (
    ProtocolOnlyKV,
    TraceRequest,
    compare_with_reference,
    random_trace,
    run_reference,
    scheduler_config,
)

CASES: list[Case] = []


def compare(ex, trace, max_num_seqs: int, budget: int, label: str = "", **settings):
    """Replay ``trace`` through the student's scheduler and minivllm's; raise at the first step
    that differs (the message shows the state before it)."""
    return compare_with_reference(ex.ContinuousScheduler, trace, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=budget, label=label, **settings)


def T(rid: str, prompt: int, out: int, arrival: int = 0, **kw) -> TraceRequest:
    return TraceRequest(rid, prompt, out, arrival, **kw)


def never_preempting(trace, max_num_seqs: int, budget: int, num_kv_blocks: int) -> list:
    """The trace, after making sure minivllm's scheduler never preempts on it (this exercise's
    scheduler need not): a case about a small pool must only refuse admissions."""
    steps = run_reference(trace, max_num_seqs, budget, num_kv_blocks=num_kv_blocks)
    if any(s.preempted for s in steps):
        raise RuntimeError("this case's trace now preempts in the reference: choose a larger pool")
    return trace


# --- the protocol ---------------------------------------------------------------------------
@case(CASES, "a new scheduler: the protocol, empty queues", "ContinuousScheduler",
      "every member of SchedulerInterface; requests wait in a deque in arrival order, status WAITING")
def _(ex):
    from minivllm.core.interfaces import SchedulerInterface, check_implements
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.request import Request, RequestStatus
    from minivllm.sampling_params import SamplingParams

    kv = ProtocolOnlyKV(KVCacheManager(8, 16, enable_caching=False))
    sched = ex.ContinuousScheduler(scheduler_config(4, 64, False), kv)
    check_implements(sched, SchedulerInterface, "scheduler")
    expect(sched.kv is kv, True, "self.kv is the manager it was built with")
    expect(sched.has_unfinished_requests(), False, "has_unfinished_requests() with nothing queued")
    expect(sched.schedule().decisions(), [], "the plan of a step with nothing queued")
    reqs = [Request(rid, [5, 6, 7], SamplingParams(max_tokens=2)) for rid in ("q0", "q1")]
    for r in reqs:
        sched.add_request(r)
    expect((sched.num_waiting, sched.has_unfinished_requests()), (2, True), "(num_waiting, has_unfinished)")
    expect(isinstance(sched.waiting, deque), True, "self.waiting is a collections.deque (exercise 03 uses it)")
    expect([r.request_id for r in sched.waiting], ["q0", "q1"], "self.waiting, in arrival order")
    expect([r.status for r in reqs], [RequestStatus.WAITING] * 2, "statuses")
    expect((sched.running, sorted(sched.requests)), ([], ["q0", "q1"]), "(self.running, self.requests)")


# --- one rule at a time -----------------------------------------------------------------------
@case(CASES, "one request: prefill, decodes, retire", "schedule",
      "the step that admits a request computes its whole prompt; each later step computes one token; "
      "it leaves (and frees its blocks) with its last token")
def _(ex):
    compare(ex, [T("a", 5, 3)], max_num_seqs=4, budget=64)


@case(CASES, "one-token responses leave in their prefill step", "update_from_output",
      "the token sampled at the end of the prefill step is the first output token; with max_tokens=1 "
      "it is also the last")
def _(ex):
    compare(ex, [T("a", 5, 1), T("b", 3, 1), T("c", 4, 2)], max_num_seqs=4, budget=64)


@case(CASES, "running requests are served before newcomers", "schedule",
      "a request already running has waited longer than any newcomer: its token comes out of the "
      "budget before anyone is admitted")
def _(ex):
    # a and b decode; the late 12-token prompt fits only what they leave of the 16-token budget
    compare(ex, [T("a", 6, 6), T("b", 7, 5), T("late", 14, 2, arrival=2), T("small", 2, 2, arrival=2)],
            max_num_seqs=4, budget=16)


@case(CASES, "the oldest running request first", "schedule",
      "the batch lists the running requests in the order they were admitted, before the newcomers")
def _(ex):
    compare(ex, [T("a", 3, 9), T("b", 5, 4, arrival=1), T("c", 2, 6, arrival=2), T("d", 4, 2, arrival=4)],
            max_num_seqs=4, budget=32)


@case(CASES, "seats run out", "schedule", "running requests hold seats until they finish; count them against max_num_seqs")
def _(ex):
    compare(ex, [T(f"s{i}", 4 + i, 3 + i) for i in range(5)], max_num_seqs=2, budget=64)


@case(CASES, "seats taken in the same step count too", "schedule",
      "a request admitted in this step already holds a seat: count it before admitting the next")
def _(ex):
    compare(ex, [T(f"n{i}", 3, 4) for i in range(6)], max_num_seqs=3, budget=64)


@case(CASES, "a prompt exactly as long as the budget left", "schedule",
      "a prompt fits when it needs no more tokens than are left after the decodes (and one more does not)")
def _(ex):
    # three decodes leave 13 of 16: 'fits' (13) gets in, 'over' (14) waits for the next step
    trace = [T(f"d{i}", 2, 6) for i in range(3)] + [T("fits", 13, 2, arrival=1), T("over", 14, 2, arrival=1)]
    compare(ex, trace, max_num_seqs=8, budget=16)


@case(CASES, "the whole budget in one prompt", "schedule", "a prompt as long as the whole budget runs alone")
def _(ex):
    compare(ex, [T("a", 30, 2), T("b", 1, 2)], max_num_seqs=4, budget=30)


@case(CASES, "the head of the queue does not fit", "schedule",
      "first come, first served: a later, smaller prompt must not overtake the oldest waiting one")
def _(ex):
    # four decodes leave 12 of 16 tokens; 'big' (14) must wait, and 'small' (2) behind it too
    trace = [T(f"d{i}", 1, 8) for i in range(4)] + [T("big", 14, 2, arrival=1), T("small", 2, 2, arrival=1)]
    compare(ex, trace, max_num_seqs=8, budget=16)


@case(CASES, "the pool cannot hold the next prompt yet", "schedule",
      "allocate_slots returned None: that request waits, and nobody behind it overtakes it")
def _(ex):
    # 4 blocks of 16: 'a' grows to 3 blocks; 'b' (2 blocks) waits for it, and 'c' (1 block) for 'b'
    trace = never_preempting([T("a", 40, 8), T("b", 20, 4, arrival=1), T("c", 3, 4, arrival=1)], 4, 64, 4)
    compare(ex, trace, max_num_seqs=4, budget=64, num_kv_blocks=4)


@case(CASES, "arrivals spread out, idle steps between", "schedule",
      "a step with nobody to serve plans nothing; later arrivals join the running batch")
def _(ex):
    compare(ex, [T("a", 4, 3, 0), T("b", 6, 2, 7), T("c", 2, 5, 8)], max_num_seqs=8, budget=16)


@case(CASES, "one seat (max_num_seqs=1)", "schedule", "with one seat, requests are served one after the other")
def _(ex):
    compare(ex, random_trace(3, 6), max_num_seqs=1, budget=64)


@case(CASES, "a stop token ends a request early", "update_from_output",
      "req.check_stop(token, config.max_model_len) says whether (and how) the request ends; a finished "
      "request leaves running and requests, and frees its blocks at once")
def _(ex):
    # tokens are drawn from 0-3 (seeded); token 3 stops these requests
    trace = [T(f"q{i}", 3 + i, 12, i // 2, stop=(3,)) for i in range(6)]
    compare(ex, trace, max_num_seqs=3, budget=32, vocab=4)


@case(CASES, "max_model_len caps a request", "update_from_output",
      "check_stop needs config.max_model_len: a request that reaches it ends, capped, whatever its max_tokens")
def _(ex):
    compare(ex, [T("long", 14, 30), T("short", 4, 3), T("late", 9, 30, arrival=2)], max_num_seqs=4, budget=20,
            max_model_len=20)


@case(CASES, "aborts: waiting, running, finished", "finish_requests",
      "finish_requests ends a waiting or a running request at once (blocks freed, seat free next step) and "
      "ignores a request that already ended")
def _(ex):
    trace = [T("a", 5, 9), T("b", 6, 9, abort_step=3), T("c", 4, 9, abort_step=2), T("d", 2, 2, abort_step=6),
             T("e", 3, 4, arrival=1)]
    compare(ex, trace, max_num_seqs=2, budget=32)


# --- whole traces ---------------------------------------------------------------------------------
@case(CASES, "tight budget blocks admission", "schedule",
      "decodes spend the budget first; a prompt that no longer fits waits for a later step")
def _(ex):
    compare(ex, random_trace(11, 14, prompt_range=(10, 40), max_arrival_gap=1), max_num_seqs=6, budget=44)


@case(CASES, "30 random traces with aborts (seeded)", "schedule",
      "the message shows the settings and the state before the first step that differs")
def _(ex):
    for seed in range(30):
        trace = random_trace(100 + seed, 5 + seed % 17, abort_share=0.25 * (seed % 3))
        compare(ex, trace, max_num_seqs=1 + seed % 7, budget=64 + 16 * (seed % 5), label=f"seed {100 + seed}")


@case(CASES, "serves the tiny model: same decisions, same tokens", "ContinuousScheduler",
      "LLM(scheduler=ContinuousScheduler) must decide every step as minivllm's Scheduler does; then the "
      "greedy tokens match too")
def _(ex):
    from minivllm.course.engine_check import compare_on_engine

    compare_on_engine(
        ex.ContinuousScheduler, arrivals=[0, 0, 0, 1, 2, 4, 4, 9], label="8 prompts, 3 seats",
        max_num_seqs=3, max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=False,
        num_kv_blocks=64,
    )
