"""Cases for ex03_chunked_prefill: the student's ``ChunkedScheduler`` against minivllm's
``Scheduler(enable_chunked_prefill=True)`` step by step -- chunks first with a pool that never
fills, then small pools that force preemptions -- serving the tiny model, and the
steps-to-first-token arithmetic."""

from __future__ import annotations

from minivllm.course.grading import Case, case, expect
from minivllm.course.reference import (
    TraceRequest,
    compare_with_reference,
    random_trace,
    run_reference,
)

CASES: list[Case] = []


def compare(ex, trace, max_num_seqs: int, budget: int, num_kv_blocks: int | None = None, label: str = ""):
    return compare_with_reference(
        ex.ChunkedScheduler, trace, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
        enable_chunked_prefill=True, num_kv_blocks=num_kv_blocks, label=label,
    )


def T(rid: str, prompt: int, out: int, arrival: int = 0) -> TraceRequest:
    return TraceRequest(rid, prompt, out, arrival)


def preempting(trace, max_num_seqs: int, budget: int, num_kv_blocks: int) -> list:
    """The trace, after making sure the reference really preempts on it (a case about
    preemption that never preempts would test nothing)."""
    steps = run_reference(trace, max_num_seqs, budget, True, num_kv_blocks=num_kv_blocks)
    if not any(s.preempted for s in steps):
        raise RuntimeError("this case's trace no longer preempts in the reference: choose a smaller pool")
    return trace


# --- chunks -----------------------------------------------------------------------------------------
@case(CASES, "a prompt longer than the budget", "schedule",
      "a prompt no longer has to fit whole: each step it gets what is left of the budget, and it samples "
      "only in the step that computes its last prompt token")
def _(ex):
    compare(ex, [T("long", 50, 3)], max_num_seqs=4, budget=16)


@case(CASES, "decodes first, then a prompt gets the rest", "schedule",
      "the running requests' decodes take their token each; the newcomer's chunk is what is left")
def _(ex):
    compare(ex, [T("a", 3, 9), T("b", 2, 9), T("c", 4, 9), T("doc", 60, 2, arrival=2)], max_num_seqs=8, budget=16)


@case(CASES, "a prefill in progress continues before new admissions", "schedule",
      "a request still prefilling is running: it gets its next chunk before anyone waiting is admitted")
def _(ex):
    compare(ex, [T("d", 2, 9), T("half", 40, 3), T("new", 5, 2, arrival=1)], max_num_seqs=8, budget=12)


@case(CASES, "several short prompts share one step", "schedule",
      "keep admitting while budget and seats last; the last one admitted may get only part of its prompt")
def _(ex):
    compare(ex, [T("a", 40, 2), T("b", 40, 2), T("c", 40, 2)], max_num_seqs=8, budget=100)


@case(CASES, "seats count requests still prefilling", "schedule",
      "a request that has only started its prompt already holds a seat")
def _(ex):
    compare(ex, [T(f"s{i}", 30, 3) for i in range(4)], max_num_seqs=2, budget=16)


@case(CASES, "20 random traces, pool never full (seeded)", "schedule",
      "the message shows the settings and the state before the first step that differs")
def _(ex):
    for seed in range(20):
        trace = random_trace(200 + seed, 4 + seed % 13, prompt_range=(1, 300), output_range=(1, 30))
        compare(ex, trace, max_num_seqs=1 + seed % 6, budget=32 + 24 * (seed % 6), label=f"seed {200 + seed}")


# --- a full pool -------------------------------------------------------------------------------------
@case(CASES, "the pool fills: the newest running request is preempted", "schedule",
      "when allocate_slots returns None, the newest running request gives its blocks back "
      "(self.preempt) and is recomputed later; the older one continues")
def _(ex):
    # two requests that each grow to 2 blocks of 16 tokens, in a pool of 3 blocks
    trace = preempting([T("old", 8, 14), T("new", 8, 14)], 4, 32, 3)
    compare(ex, trace, max_num_seqs=4, budget=32, num_kv_blocks=3)


@case(CASES, "the request that needs room is itself the newest", "schedule",
      "preempt until the request fits or has been preempted itself; it then computes nothing this step")
def _(ex):
    # c crosses into its second block first, and it is the newest: it preempts itself
    trace = preempting([T("a", 6, 12), T("b", 6, 12), T("c", 10, 12)], 3, 32, 3)
    compare(ex, trace, max_num_seqs=3, budget=32, num_kv_blocks=3)


@case(CASES, "no admission in a step that preempted", "schedule",
      "after a preemption memory is short: admit nobody, not even the victim, until the next step")
def _(ex):
    # with a 4-token budget the victim's first chunk would fit in the freed block at once
    trace = preempting([T("a", 8, 16), T("b", 8, 16)], 4, 4, 3)
    compare(ex, trace, max_num_seqs=4, budget=4, num_kv_blocks=3)


@case(CASES, "20 random traces with small pools (seeded)", "schedule",
      "chunks and preemptions together; the message shows the state before the first step that differs")
def _(ex):
    for seed in range(20):
        trace = random_trace(300 + seed, 5 + seed % 9, prompt_range=(1, 60), output_range=(1, 40))
        longest = max(-(-(r.prompt_len + r.max_tokens) // 16) for r in trace)
        compare(ex, trace, max_num_seqs=2 + seed % 5, budget=16 + 16 * (seed % 4),
                num_kv_blocks=longest + seed % 4, label=f"seed {300 + seed}")


@case(CASES, "serves the tiny model, preempting: same decisions, same tokens", "ChunkedScheduler",
      "LLM(scheduler=ChunkedScheduler) must decide every step as minivllm's Scheduler does, preemptions "
      "included; then the greedy tokens match too")
def _(ex):
    from minivllm.course.engine_check import compare_on_engine

    mine, _ = compare_on_engine(
        ex.ChunkedScheduler, arrivals=[0, 0, 0, 1, 2, 4, 4, 9], label="8 prompts, 4 seats, 8 blocks",
        max_num_seqs=4, max_num_batched_tokens=24, max_model_len=96, num_kv_blocks=8,
        max_tokens=24,
    )
    if mine.num_preemptions == 0:
        raise RuntimeError("the engine case no longer preempts: choose a smaller pool")


# --- steps to the first token --------------------------------------------------------------------------
@case(CASES, "30k prompt, 2k budget, no decodes", "steps_to_first_token", "the prompt gets the whole budget every step")
def _(ex):
    expect(ex.steps_to_first_token(30000, 2048, 0), 15)


@case(CASES, "boundaries", "steps_to_first_token", "a partial last chunk still takes a step; an exact multiple does not add one")
def _(ex):
    expect(ex.steps_to_first_token(2048, 2048, 0), 1, "exact")
    expect(ex.steps_to_first_token(2049, 2048, 0), 2, "one over")
    expect(ex.steps_to_first_token(1, 64, 63), 1, "one token left for the prompt")


@case(CASES, "decodes take their share first", "steps_to_first_token",
      "every step the decodes take their tokens before the prompt gets any")
def _(ex):
    expect(ex.steps_to_first_token(1000, 100, 50), 20, "half the budget left")
    expect(ex.steps_to_first_token(1000, 512, 12), 2, "a few decodes")


@case(CASES, "decodes eat the whole budget", "steps_to_first_token", "None when no budget is left for the prompt")
def _(ex):
    expect(ex.steps_to_first_token(100, 64, 64), None, "exactly used up")
    expect(ex.steps_to_first_token(100, 64, 70), None, "more decodes than budget")


@case(CASES, "agrees with the scheduler", "steps_to_first_token",
      "your formula against the scheduler's own count, on a trace with steady decodes")
def _(ex):
    for decodes, budget, prompt in ((3, 16, 50), (5, 24, 200), (0, 32, 64)):
        trace = [T(f"d{i}", 1, 30) for i in range(decodes)] + [T("doc", prompt, 1, arrival=1)]
        steps = run_reference(trace, 8, budget, True)
        measured = sum(1 for s in steps if "doc" in dict(s.batch))
        expect(ex.steps_to_first_token(prompt, budget, decodes), measured, f"{decodes} decodes, budget {budget}, prompt {prompt}")
