"""Cases for ex03_chunked_prefill: the student's ``ChunkedScheduler`` against minivllm's
``Scheduler(enable_chunked_prefill=True)`` step by step -- chunks first with a pool that never
fills, then small pools that force preemptions -- serving the tiny model, and the
steps-to-first-token arithmetic."""

from __future__ import annotations

from minivllm.core.scheduler import Scheduler
from minivllm.course.grading import Case, case, expect
from minivllm.course.reference import (
    Replay,
    TraceRequest,
    compare_with_reference,
    random_trace,
    run_reference,
)

CASES: list[Case] = []


def compare(ex, trace, max_num_seqs: int, budget: int, num_kv_blocks: int | None = None, label: str = "",
            **settings):
    return compare_with_reference(
        ex.ChunkedScheduler, trace, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
        enable_chunked_prefill=True, num_kv_blocks=num_kv_blocks, label=label, **settings,
    )


def T(rid: str, prompt: int, out: int, arrival: int = 0, **kw) -> TraceRequest:
    return TraceRequest(rid, prompt, out, arrival, **kw)


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
      "(freed, its computed tokens back to 0, PREEMPTED, counted, listed in out.preempted, at the front "
      "of the queue) and is recomputed later with the tokens it had generated; the older one continues")
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


def queue_after_two_preemptions(replay: Replay):
    """Step ``replay`` to the first step that preempts two requests or more; return that step's
    record and the request ids in ``waiting`` after it (``None``: no such step)."""
    for rec in replay:
        if len(rec.preempted) >= 2:
            return rec, [r.request_id for r in getattr(replay.core.scheduler, "waiting", ())]
    return None


@case(CASES, "two preemptions in one step: the victims requeued oldest first", "schedule",
      "rule 6: after the step, waiting holds the step's victims first, in the order they had been admitted "
      "(the oldest at the head), then the requests that were waiting before; the victims themselves were "
      "preempted newest first")
def _(ex):
    # four requests that each cross into their second 4-token block in the same step, in a pool
    # of 5: 'a' and 'b' each need one of the blocks 'd' and then 'c' give back
    trace = [T(rid, 4, 8) for rid in "abcd"]
    settings = dict(max_num_seqs=4, max_num_batched_tokens=32, enable_chunked_prefill=True, num_kv_blocks=5,
                    block_size=4)
    reference = queue_after_two_preemptions(Replay(Scheduler, trace, **settings))
    if reference is None:
        raise RuntimeError("this case's trace no longer preempts twice in one step in the reference")
    want, want_queue = reference
    mine = queue_after_two_preemptions(Replay(ex.ChunkedScheduler, trace, **settings))
    if mine is not None and mine[0].step == want.step and mine[0].preempted == want.preempted:
        expect(mine[1], want_queue, f"the request ids in waiting after step {want.step}, which preempted "
               f"{want.preempted} (newest first)")
    compare(ex, trace, max_num_seqs=4, budget=32, num_kv_blocks=5, block_size=4)


@case(CASES, "no admission in a step that preempted", "schedule",
      "after a preemption memory is short: admit nobody, not even the victim, until the next step")
def _(ex):
    # with a 4-token budget the victim's first chunk would fit in the freed block at once
    trace = preempting([T("a", 8, 16), T("b", 8, 16)], 4, 4, 3)
    compare(ex, trace, max_num_seqs=4, budget=4, num_kv_blocks=3)


@case(CASES, "a waiting request the pool cannot hold waits", "schedule",
      "allocate_slots returned None for a waiting request: admission stops there, and nobody running is "
      "preempted for it (nor does a smaller request behind it overtake it)")
def _(ex):
    # 'big' needs 3 of the 4 blocks 'a' leaves it 2 of; 'small' behind it would fit but must wait too
    trace = [T("a", 20, 12), T("big", 40, 2, arrival=1), T("small", 2, 2, arrival=1)]
    compare(ex, trace, max_num_seqs=4, budget=64, num_kv_blocks=4)


@case(CASES, "chunks that end on a block's edge", "schedule",
      "a chunk of exactly a block, then one token more: allocate_slots is asked for the tokens of this "
      "step only, after num_computed_tokens")
def _(ex):
    compare(ex, [T("a", 48, 3), T("b", 17, 18, arrival=1)], max_num_seqs=2, budget=16, num_kv_blocks=5,
            block_size=16)


@case(CASES, "aborts while waiting, prefilling, preempted (seeded)", "finish_requests",
      "a request aborted in the middle of its prompt or while it waits to be recomputed leaves with its "
      "blocks freed; exercise 02's finish_requests must cover both")
def _(ex):
    for seed in range(10):
        trace = random_trace(400 + seed, 6 + seed % 5, prompt_range=(10, 60), output_range=(4, 30),
                             abort_share=0.4)
        longest = max(-(-(r.prompt_len + r.max_tokens) // 16) for r in trace)
        compare(ex, trace, max_num_seqs=3, budget=16, num_kv_blocks=longest + 1, label=f"seed {400 + seed}")


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
