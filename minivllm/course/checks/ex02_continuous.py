"""Cases for ex02_continuous: the student's ``ContinuousScheduler``, written from the
``SchedulerInterface`` protocol, against minivllm's own ``Scheduler`` (chunked prefill off),
step by step: small traces that each isolate one rule of the policy, seeded random traces with
aborts, and the tiny model served with both. Every run of the student's scheduler is checked
after every step for the limits (budget, seats, the pool's accounting) as well."""

from __future__ import annotations

import re
from collections import deque

from minivllm.course.grading import Case, Mismatch, case, expect
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
    that differs (the message shows the state before it, and a hint chosen by what differed)."""
    try:
        return compare_with_reference(ex.ContinuousScheduler, trace, max_num_seqs=max_num_seqs,
                                      max_num_batched_tokens=budget, label=label, **settings)
    except Mismatch as err:
        raise with_hint(err) from None


def T(rid: str, prompt: int, out: int, arrival: int = 0, **kw) -> TraceRequest:
    return TraceRequest(rid, prompt, out, arrival, **kw)


# --- a hint from what differed ----------------------------------------------------------------
# (what the harness names the difference, the hint); the policy's numbers are the stub's
HINTS = (
    ("status of the requests", "a request's status says which queue it is in between steps (policy 7); "
     "preemption, and its status, come in exercise 03"),
    ("the budget", "the plan computed more tokens than the budget (policy 1)"),
    ("the seats", "more requests ran than there are seats (policy 1): who holds a seat, and from when?"),
    ("batch entries", "a request appears in a plan at most once, with at least one token (SchedulerOutput.add)"),
    ("requests that sample", "a request samples when the step reaches its last token: which tokens did "
     "out.add say the step computes?"),
    ("requests that ended", "who ends, and with which status (policies 5 and 6): compare the list with the "
     "tokens appended and the settings"),
    ("KV blocks in use", "the pool holds a different number of blocks after the step: who holds blocks, and "
     "until when (policies 4 to 6)?"),
    ("num_waiting", "the waiting queue has a different size after the step: who left it, who joined it?"),
    ("steps", "your run took a different number of steps: a request that ends too soon, too late or never"),
    ("every request finished", "a request never ended: policies 5 and 6 say when one does"),
)


def batch_hint(expected: list, got: list) -> str:
    """What a wrong plan got wrong, in terms of the policy: extra or missing requests, tokens, order."""
    want, have = dict(expected), dict(got)
    extra = [r for r in have if r not in want]
    missing = [r for r in want if r not in have]
    if extra:
        return (f"your plan has {extra}, which minivllm's leaves out: which of the policy's limits (seats, "
                "budget, KV room, first come first served) does that break?")
    if missing:
        return (f"your plan leaves out {missing}: is it running (policy 2), or may it be admitted "
                "(policy 3)? Which limit did you think it breaks?")
    if want != have:
        wrong = [r for r in want if want[r] != have[r]]
        return f"the right requests, but not the right number of tokens for {wrong} (policy 2)"
    return "the right requests with the right tokens, in another order: policy 2 says the order of a plan"


def with_hint(err: Mismatch) -> Mismatch:
    """``err`` with a last line that points at the policy statement its difference is about."""
    text = str(err).replace("RUNNING / WAITING or PREEMPTED", "RUNNING / WAITING")
    found = re.search(r"^step \d+, (.+):$", text, re.MULTILINE)
    what = found.group(1) if found else text
    if what.startswith("batch (request, tokens)"):
        hint = batch_hint(err.expected, err.got)
    else:
        hint = next((h for key, h in HINTS if key in what), "")
    err.args = (f"{text}\nhint: {hint}" if hint else text,)
    return err


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
@case(CASES, "one request: prefill, decodes, retire", "schedule")
def _(ex):
    compare(ex, [T("a", 5, 3)], max_num_seqs=4, budget=64)


@case(CASES, "one-token responses leave in their prefill step", "update_from_output")
def _(ex):
    compare(ex, [T("a", 5, 1), T("b", 3, 1), T("c", 4, 2)], max_num_seqs=4, budget=64)


@case(CASES, "late arrivals beside running requests", "schedule")
def _(ex):
    # a and b decode; the late 12-token prompt fits only what they leave of the 16-token budget
    compare(ex, [T("a", 6, 6), T("b", 7, 5), T("late", 14, 2, arrival=2), T("small", 2, 2, arrival=2)],
            max_num_seqs=4, budget=16)


@case(CASES, "four arrivals, one step apart", "schedule")
def _(ex):
    compare(ex, [T("a", 3, 9), T("b", 5, 4, arrival=1), T("c", 2, 6, arrival=2), T("d", 4, 2, arrival=4)],
            max_num_seqs=4, budget=32)


@case(CASES, "seats run out", "schedule")
def _(ex):
    compare(ex, [T(f"s{i}", 4 + i, 3 + i) for i in range(5)], max_num_seqs=2, budget=64)


@case(CASES, "six short prompts, three seats", "schedule")
def _(ex):
    compare(ex, [T(f"n{i}", 3, 4) for i in range(6)], max_num_seqs=3, budget=64)


@case(CASES, "prompts of about the budget left", "schedule")
def _(ex):
    # three decodes leave 13 of 16: 'fits' (13) gets in, 'over' (14) waits for the next step
    trace = [T(f"d{i}", 2, 6) for i in range(3)] + [T("fits", 13, 2, arrival=1), T("over", 14, 2, arrival=1)]
    compare(ex, trace, max_num_seqs=8, budget=16)


@case(CASES, "the whole budget in one prompt", "schedule")
def _(ex):
    compare(ex, [T("a", 30, 2), T("b", 1, 2)], max_num_seqs=4, budget=30)


@case(CASES, "a long prompt queued ahead of a short one", "schedule")
def _(ex):
    # four decodes leave 12 of 16 tokens; 'big' (14) must wait, and 'small' (2) behind it too
    trace = [T(f"d{i}", 1, 8) for i in range(4)] + [T("big", 14, 2, arrival=1), T("small", 2, 2, arrival=1)]
    compare(ex, trace, max_num_seqs=8, budget=16)


@case(CASES, "a KV pool of four blocks", "schedule")
def _(ex):
    # 4 blocks of 16: 'a' grows to 3 blocks; 'b' (2 blocks) waits for it, and 'c' (1 block) for 'b'
    trace = never_preempting([T("a", 40, 8), T("b", 20, 4, arrival=1), T("c", 3, 4, arrival=1)], 4, 64, 4)
    compare(ex, trace, max_num_seqs=4, budget=64, num_kv_blocks=4)


@case(CASES, "arrivals spread out, idle steps between", "schedule")
def _(ex):
    compare(ex, [T("a", 4, 3, 0), T("b", 6, 2, 7), T("c", 2, 5, 8)], max_num_seqs=8, budget=16)


@case(CASES, "one seat (max_num_seqs=1)", "schedule")
def _(ex):
    compare(ex, random_trace(3, 6), max_num_seqs=1, budget=64)


@case(CASES, "a stop token ends a request early", "update_from_output")
def _(ex):
    # tokens are drawn from 0-3 (seeded); token 3 stops these requests
    trace = [T(f"q{i}", 3 + i, 12, i // 2, stop=(3,)) for i in range(6)]
    compare(ex, trace, max_num_seqs=3, budget=32, vocab=4)


@case(CASES, "max_model_len caps a request", "update_from_output")
def _(ex):
    compare(ex, [T("long", 14, 30), T("short", 4, 3), T("late", 9, 30, arrival=2)], max_num_seqs=4, budget=20,
            max_model_len=20)


@case(CASES, "aborts: waiting, running, finished", "finish_requests")
def _(ex):
    trace = [T("a", 5, 9), T("b", 6, 9, abort_step=3), T("c", 4, 9, abort_step=2), T("d", 2, 2, abort_step=6),
             T("e", 3, 4, arrival=1)]
    compare(ex, trace, max_num_seqs=2, budget=32)


def _by_hand(ex, max_num_seqs: int):
    """``(kv, scheduler)``: the student's scheduler over a 16-block pool seen through the protocol
    only, a budget of 64 tokens, chunking off -- to be driven by hand."""
    from minivllm.core.kv_cache_manager import KVCacheManager

    kv = ProtocolOnlyKV(KVCacheManager(16, 16, enable_caching=False))
    return kv, ex.ContinuousScheduler(scheduler_config(max_num_seqs, 64, False), kv)


def check_deltas(deltas, expected: list[tuple], call: str) -> None:
    """``deltas`` (what ``call`` returned) against ``expected``, one ``(request id, tokens
    appended, finish_reason, stop_reason)`` per request given tokens, in the order given."""
    from minivllm.core.messages import RequestDelta

    if not isinstance(deltas, (list, tuple)) or not all(isinstance(d, RequestDelta) for d in deltas):
        kinds = [type(d).__name__ for d in deltas] if isinstance(deltas, (list, tuple)) else type(deltas).__name__
        raise Mismatch(f"a list of {len(expected)} RequestDelta", kinds, f"{call} returned")
    expect([d.request_id for d in deltas], [rid for rid, *_ in expected],
           f"{call}: the request_id of each delta it returned (one per request in new_token_ids, in that order)")
    expect({d.request_id: list(d.new_token_ids) for d in deltas}, {rid: tokens for rid, tokens, *_ in expected},
           f"{call}: each delta's new_token_ids (the tokens appended to the request, none after the one "
           "that ended it)")
    expect({d.request_id: (d.finish_reason, d.stop_reason) for d in deltas},
           {rid: (reason, stop) for rid, _, reason, stop in expected},
           f"{call}: each delta's (finish_reason, stop_reason) ((None, None) for a request that goes on; "
           "for one that ended, its status's finish_reason and its own stop_reason)")


@case(CASES, "what update_from_output and finish_requests return", "finish_requests",
      "update_from_output returns one RequestDelta per request in new_token_ids, in that order; "
      "finish_requests the requests that call ended, whatever their order, and nothing else")
def _(ex):
    from minivllm.request import Request, RequestStatus
    from minivllm.sampling_params import SamplingParams

    kv, sched = _by_hand(ex, max_num_seqs=2)
    lengths = {"one": 1, "two": 2, "many": 9, "queued": 9}  # max_tokens of each
    for rid, n in lengths.items():
        sched.add_request(Request(rid, [5, 6, 7], SamplingParams(max_tokens=n, ignore_eos=True)))

    def ids(requests) -> list[str]:
        return sorted(r.request_id for r in requests)

    plan = sched.schedule()  # two seats: 'one' and 'two' run; 'one' ends (max_tokens=1)
    deltas = sched.update_from_output(plan, {r.request_id: [0] for r in plan.sampling_requests})
    check_deltas(deltas, [("one", [0], "length", None), ("two", [0], None, None)],
                 "update_from_output after the first step")
    plan = sched.schedule()  # 'two' decodes and ends, 'many' takes the seat 'one' left
    deltas = sched.update_from_output(plan, {r.request_id: [0] for r in plan.sampling_requests})
    check_deltas(deltas, [("two", [0], "length", None), ("many", [0], None, None)],
                 "update_from_output after the second step")
    ended = sched.finish_requests(["queued", "many", "one", "nobody"], RequestStatus.FINISHED_ABORTED)
    expect(ids(ended), ["many", "queued"], "finish_requests(['queued', 'many', 'one', 'nobody']) returned")
    expect([r.status for r in ended], [RequestStatus.FINISHED_ABORTED] * 2, "their statuses")
    expect(ids(sched.finish_requests(["many"], RequestStatus.FINISHED_ABORTED)), [],
           "finish_requests(['many']) once 'many' has ended")
    expect((sched.has_unfinished_requests(), kv.num_used_blocks), (False, 0),
           "(has_unfinished_requests(), KV blocks in use) at the end")


@case(CASES, "a request given several tokens in one step", "update_from_output",
      "policy 5: each of a request's new tokens is appended in order under the stop rules; the token "
      "that ends it is its last, and the ones after it are dropped (from the request and from its delta)")
def _(ex):
    from minivllm.request import Request, RequestStatus
    from minivllm.sampling_params import SamplingParams

    kv, sched = _by_hand(ex, max_num_seqs=4)
    # 'stops' ends on token 3; 'capped' on its 4th output token; 'goes_on' on neither
    by_id = {"stops": Request("stops", [5, 6], SamplingParams(max_tokens=9, stop_token_ids=[3])),
             "capped": Request("capped", [5, 6], SamplingParams(max_tokens=4, ignore_eos=True)),
             "goes_on": Request("goes_on", [5, 6], SamplingParams(max_tokens=9, ignore_eos=True))}
    for req in by_id.values():
        sched.add_request(req)
    plan = sched.schedule()
    deltas = sched.update_from_output(plan, {"stops": [1, 3, 2, 2], "capped": [1, 2, 0, 1, 2, 0], "goes_on": [1, 2]})
    outputs = {rid: req.output_token_ids for rid, req in by_id.items()}
    expect(outputs, {"stops": [1, 3], "capped": [1, 2, 0, 1], "goes_on": [1, 2]},
           "the output tokens of each request (given [1, 3, 2, 2] with stop token 3, "
           "[1, 2, 0, 1, 2, 0] with max_tokens=4, and [1, 2] to 'goes_on', which does not end)")
    expect((by_id["stops"].status, by_id["capped"].status),
           (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED), "the statuses of the two that ended")
    check_deltas(deltas, [("stops", [1, 3], "stop", 3), ("capped", [1, 2, 0, 1], "length", None),
                          ("goes_on", [1, 2], None, None)],
                 "update_from_output given {'stops': [1, 3, 2, 2], 'capped': [1, 2, 0, 1, 2, 0], 'goes_on': [1, 2]}")
    expect(([r.request_id for r in sched.running], kv.num_used_blocks > 0), (["goes_on"], True),
           "(running, KV blocks in use) after the step")


# --- whole traces ---------------------------------------------------------------------------------
@case(CASES, "long prompts, a budget of 44", "schedule")
def _(ex):
    compare(ex, random_trace(11, 14, prompt_range=(10, 40), max_arrival_gap=1), max_num_seqs=6, budget=44)


@case(CASES, "30 random traces with aborts (seeded)", "schedule")
def _(ex):
    for seed in range(30):
        trace = random_trace(100 + seed, 5 + seed % 17, abort_share=0.25 * (seed % 3))
        compare(ex, trace, max_num_seqs=1 + seed % 7, budget=64 + 16 * (seed % 5), label=f"seed {100 + seed}")


@case(CASES, "serves the tiny model: same decisions, same tokens", "ContinuousScheduler")
def _(ex):
    from minivllm.course.engine_check import compare_on_engine

    try:
        compare_on_engine(
            ex.ContinuousScheduler, arrivals=[0, 0, 0, 1, 2, 4, 4, 9], label="8 prompts, 3 seats",
            max_num_seqs=3, max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=False,
            num_kv_blocks=64,
        )
    except Mismatch as err:
        raise with_hint(err) from None
