"""Cases for ex02_continuous: the student's ``ContinuousScheduler`` against minivllm's own
``Scheduler`` (chunked prefill off, a KV pool that never fills), step by step on small traces
that each isolate one rule, on random traces, and serving the tiny model."""

from __future__ import annotations

from minivllm.course.grading import Case, case, expect
from minivllm.course.reference import TraceRequest, compare_with_reference, random_trace
from minivllm.course.scheduling import ProtocolOnlyKV
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams

CASES: list[Case] = []


def compare(ex, trace, max_num_seqs: int, budget: int, label: str = ""):
    """Replay ``trace`` through the student's scheduler and minivllm's; raise at the first step
    that differs (the message shows the state before it)."""
    return compare_with_reference(
        ex.ContinuousScheduler, trace, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, label=label
    )


def T(rid: str, prompt: int, out: int, arrival: int = 0) -> TraceRequest:
    return TraceRequest(rid, prompt, out, arrival)


# --- one rule at a time ----------------------------------------------------------------------
@case(CASES, "nothing to do", "schedule", "with no request anywhere, a step plans nothing and nothing is left")
def _(ex):
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.course.reference import scheduler_config

    sched = ex.ContinuousScheduler(scheduler_config(4, 64, False), ProtocolOnlyKV(KVCacheManager(8, 16, False)))
    out = sched.schedule()
    expect(out.decisions(), [], "batch")
    expect(sched.has_unfinished_requests(), False, "has_unfinished_requests()")


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
      "a request already running has been waiting longer than any newcomer; give the running their "
      "token before admitting anyone")
def _(ex):
    compare(ex, [T("a", 6, 6), T("b", 7, 5), T("late", 12, 2, arrival=2)], max_num_seqs=4, budget=16)


@case(CASES, "seats run out", "schedule", "running requests hold seats until they finish; count them against max_num_seqs")
def _(ex):
    compare(ex, [T(f"s{i}", 4 + i, 3 + i) for i in range(5)], max_num_seqs=2, budget=64)


@case(CASES, "a prompt exactly as long as the budget", "schedule", "a prompt fits when it needs no more tokens than are left")
def _(ex):
    compare(ex, [T("a", 30, 2), T("b", 1, 2)], max_num_seqs=4, budget=30)


@case(CASES, "the head of the queue does not fit", "schedule",
      "first come, first served: a later, smaller prompt must not overtake the oldest waiting one")
def _(ex):
    # four decodes leave 12 of 16 tokens; 'big' (14) must wait, and 'small' (2) behind it too
    trace = [T(f"d{i}", 1, 8) for i in range(4)] + [T("big", 14, 2, arrival=1), T("small", 2, 2, arrival=1)]
    compare(ex, trace, max_num_seqs=8, budget=16)


@case(CASES, "arrivals spread out, idle steps between", "schedule",
      "a step with nobody to serve plans nothing; later arrivals join the running batch")
def _(ex):
    compare(ex, [T("a", 4, 3, 0), T("b", 6, 2, 7), T("c", 2, 5, 8)], max_num_seqs=8, budget=16)


@case(CASES, "one seat (max_num_seqs=1)", "schedule", "with one seat, requests are served one after the other")
def _(ex):
    compare(ex, random_trace(3, 6), max_num_seqs=1, budget=64)


@case(CASES, "a stop token ends a request early", "update_from_output",
      "req.check_stop(token, max_model_len) says whether (and how) the request ends; a finished request "
      "leaves running and requests, and frees its blocks")
def _(ex):
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.course.reference import scheduler_config

    kv = KVCacheManager(16, 4, enable_caching=False)
    sched = ex.ContinuousScheduler(scheduler_config(4, 64, False), ProtocolOnlyKV(kv))
    reqs = [Request(f"q{i}", [5, 6, 7, 8, 9][: 2 + i], SamplingParams(max_tokens=9, stop_token_ids=[3]))
            for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    sched.schedule()
    finished = sched.update_from_output({"q0": 11, "q1": 3, "q2": 12})
    expect([r.request_id for r in finished], ["q1"], "finished")
    expect(reqs[1].status, RequestStatus.FINISHED_STOPPED, "status of q1")
    expect(reqs[1].output_token_ids, [3], "q1's tokens")
    expect([r.request_id for r in sched.running], ["q0", "q2"], "still running, in order")
    expect(sorted(sched.requests), ["q0", "q2"], "requests")
    expect(kv.num_used_blocks, 2, "KV blocks in use (q1's were freed)")
    expect(reqs[0].output_token_ids, [11], "q0's tokens")


# --- whole traces ---------------------------------------------------------------------------------
@case(CASES, "tight budget blocks admission", "schedule",
      "decodes spend the budget first; a prompt that no longer fits waits for a later step")
def _(ex):
    compare(ex, random_trace(11, 14, prompt_range=(10, 40), max_arrival_gap=1), max_num_seqs=6, budget=44)


@case(CASES, "30 random traces (seeded)", "schedule", "the message shows the settings and the state before the first step that differs")
def _(ex):
    for seed in range(30):
        trace = random_trace(100 + seed, 5 + seed % 17)
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
