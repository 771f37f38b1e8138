"""Cases for ex02_continuous: decode, admit, retire, then whole traces against the real
``minivllm.core.scheduler.Scheduler`` (chunked prefill off, KV cache never full)."""

from __future__ import annotations

from minivllm.course.grading import Case, Mismatch, case, expect
from minivllm.course.reference import TraceRequest, random_trace, run_reference

CASES: list[Case] = []


def _sched(ex, seqs: int, budget: int, running=(), waiting=()):
    s = ex.ContinuousScheduler(max_num_seqs=seqs, max_num_batched_tokens=budget)
    for rid, prompt, out in running:  # already prefilled, decoding
        seq = ex.Seq(rid, prompt, out)
        seq.num_computed, seq.num_output = prompt, 1
        s.running.append(seq)
    for rid, prompt, out in waiting:
        s.add_request(ex.Seq(rid, prompt, out))
    return s


def _ids(pairs) -> list[tuple[str, int]]:
    return [(seq.request_id, n) for seq, n in pairs]


def compare_with_reference(ex, trace: list[TraceRequest], max_num_seqs: int, budget: int, label: str = "") -> int:
    """Run the student's scheduler and the reference over ``trace``; raise :class:`Mismatch`
    at the first step where they disagree. Returns the number of steps compared."""
    ref = run_reference(trace, max_num_seqs, budget, enable_chunked_prefill=False)
    sched = ex.ContinuousScheduler(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    arrivals = sorted(trace, key=lambda r: r.arrival_step)
    nxt = 0
    where = f"{label}: " if label else ""
    for ref_step in ref:
        while nxt < len(arrivals) and arrivals[nxt].arrival_step <= ref_step.step:
            r = arrivals[nxt]
            sched.add_request(ex.Seq(r.request_id, r.prompt_len, r.output_len))
            nxt += 1
        got = sched.step()
        if list(map(tuple, got.batch)) != ref_step.batch:
            raise Mismatch(ref_step.batch, got.batch, f"{where}step {ref_step.step}, batch "
                           f"(before it: running {ref_step.running}, waiting {ref_step.waiting})")
        if list(got.finished) != ref_step.finished:
            raise Mismatch(ref_step.finished, got.finished, f"{where}step {ref_step.step}, finished")
    if sched.has_unfinished():
        left = [s.request_id for s in list(sched.running) + list(sched.waiting)]
        raise Mismatch("all requests finished", f"still unfinished: {left}", f"{where}after {len(ref)} steps")
    return len(ref)


# --- decode ----------------------------------------------------------------------------------
@case(CASES, "three running, plenty of budget", "schedule_decodes", "one token per running request, oldest first")
def _(ex):
    s = _sched(ex, 8, 100, running=[("a", 5, 9), ("b", 3, 9), ("c", 7, 9)])
    decodes, left = s.schedule_decodes(100)
    expect(_ids(decodes), [("a", 1), ("b", 1), ("c", 1)], "decodes")
    expect(left, 97, "budget left")
    expect([q.num_computed for q in s.running], [5, 3, 7], "schedule_decodes must not change the Seqs")


@case(CASES, "budget smaller than the batch", "schedule_decodes",
      "stop giving out tokens when the budget reaches 0; the rest wait for the next step")
def _(ex):
    s = _sched(ex, 8, 2, running=[("a", 5, 9), ("b", 3, 9), ("c", 7, 9)])
    decodes, left = s.schedule_decodes(2)
    expect((_ids(decodes), left), ([("a", 1), ("b", 1)], 0), "budget 2")
    decodes, left = s.schedule_decodes(0)
    expect((_ids(decodes), left), ([], 0), "budget 0")


@case(CASES, "nothing running", "schedule_decodes", "an empty batch decodes nothing and spends nothing")
def _(ex):
    decodes, left = _sched(ex, 4, 50).schedule_decodes(50)
    expect((_ids(decodes), left), ([], 50))


# --- admit -----------------------------------------------------------------------------------
@case(CASES, "admit in arrival order", "admit", "pop from the left of self.waiting, append to self.running")
def _(ex):
    s = _sched(ex, 8, 100, waiting=[("a", 10, 3), ("b", 20, 3), ("c", 30, 3)])
    expect(_ids(s.admit(100)), [("a", 10), ("b", 20), ("c", 30)], "admitted")
    expect([q.request_id for q in s.running], ["a", "b", "c"], "running afterwards")
    expect(len(s.waiting), 0, "waiting afterwards")


@case(CASES, "seats run out", "admit", "running requests count against max_num_seqs")
def _(ex):
    s = _sched(ex, 2, 100, running=[("x", 4, 9)], waiting=[("a", 10, 3), ("b", 20, 3)])
    expect(_ids(s.admit(99)), [("a", 10)], "one seat was free")
    expect([q.request_id for q in s.waiting], ["b"], "still waiting")


@case(CASES, "prompt exactly equal to the budget", "admit", "a prompt fits when prompt_len <= budget")
def _(ex):
    s = _sched(ex, 4, 30, waiting=[("a", 30, 3), ("b", 1, 3)])
    expect(_ids(s.admit(30)), [("a", 30)], "the first fills the budget, the second must wait")


@case(CASES, "head of the line does not fit", "admit",
      "first come, first served: when the oldest waiting prompt does not fit, admit nobody behind it")
def _(ex):
    s = _sched(ex, 4, 40, waiting=[("big", 50, 3), ("small", 5, 3)])
    expect(_ids(s.admit(40)), [], "admitted")
    expect([q.request_id for q in s.waiting], ["big", "small"], "queue untouched")


@case(CASES, "empty queue, zero budget", "admit", "nothing to admit is not an error")
def _(ex):
    expect(_ids(_sched(ex, 4, 10).admit(10)), [], "empty queue")
    expect(_ids(_sched(ex, 4, 10, waiting=[("a", 1, 1)]).admit(0)), [], "zero budget")


# --- retire ----------------------------------------------------------------------------------
@case(CASES, "retire finished, keep order", "retire", "done means num_output >= max_tokens; keep the others in order")
def _(ex):
    s = _sched(ex, 8, 100, running=[("a", 5, 1), ("b", 3, 4), ("c", 7, 1), ("d", 2, 2)])
    s.running[3].num_output = 2
    done = s.retire()
    expect([q.request_id for q in done], ["a", "c", "d"], "retired")
    expect([q.request_id for q in s.running], ["b"], "still running")
    expect([q.request_id for q in s.retire()], [], "retiring again removes nothing")


# --- whole traces against the reference ---------------------------------------------------------
@case(CASES, "empty trace", "step", "with nothing to do, step() returns an empty batch and finishes nothing")
def _(ex):
    s = _sched(ex, 4, 64)
    res = s.step()
    expect((list(res.batch), list(res.finished)), ([], []))
    expect(s.has_unfinished(), False, "has_unfinished")


@case(CASES, "one-token responses leave in their prefill step", "step",
      "a request with max_tokens=1 gets its only token from the prefill and retires in the same step")
def _(ex):
    trace = [TraceRequest("a", 5, 1), TraceRequest("b", 3, 1), TraceRequest("c", 4, 2)]
    compare_with_reference(ex, trace, max_num_seqs=4, budget=64)


@case(CASES, "chapter-shaped batch, all at once", "step", "decode the running first, then admit; retire at the end")
def _(ex):
    prompts = [10, 12, 8, 14, 950, 11, 13, 9]
    outs = [30, 5, 12, 40, 3, 60, 8, 20]
    trace = [TraceRequest(f"r{i}", p, o) for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
    compare_with_reference(ex, trace, max_num_seqs=4, budget=1024)


@case(CASES, "arrivals spread out, idle steps between", "step",
      "steps with nothing to run return an empty batch; later arrivals join the running batch")
def _(ex):
    trace = [TraceRequest("a", 4, 3, 0), TraceRequest("b", 6, 2, 7), TraceRequest("c", 2, 5, 8)]
    compare_with_reference(ex, trace, max_num_seqs=8, budget=16)


@case(CASES, "one seat (max_num_seqs=1)", "step", "with one seat, continuous batching serves requests one by one")
def _(ex):
    compare_with_reference(ex, random_trace(3, 6), max_num_seqs=1, budget=64)


@case(CASES, "tight budget blocks admission", "step",
      "decodes spend budget first; a prompt that no longer fits waits for a later step")
def _(ex):
    trace = random_trace(11, 14, prompt_range=(10, 40), max_arrival_gap=1)
    compare_with_reference(ex, trace, max_num_seqs=6, budget=44)


@case(CASES, "30 random traces (seeded)", "step", "compare step by step with the reference; the note says where")
def _(ex):
    for seed in range(30):
        seqs = 1 + seed % 7
        budget = 64 + 16 * (seed % 5)
        trace = random_trace(100 + seed, 5 + seed % 17)
        compare_with_reference(ex, trace, max_num_seqs=seqs, budget=budget, label=f"seed {100 + seed}")
