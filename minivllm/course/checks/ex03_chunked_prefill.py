"""Cases for ex03_chunked_prefill: chunks, one step's plan, steps to the first token."""

from __future__ import annotations

from minivllm.course.grading import Case, Mismatch, case, expect, expect_raises
from minivllm.course.reference import random_trace, run_reference

CASES: list[Case] = []


def compare_with_reference(ex, trace, max_num_seqs: int, budget: int, label: str = "") -> int:
    """Give ``plan_step`` the state the real scheduler saw before each step (chunked prefill
    on) and compare the plans. Returns the number of steps compared."""
    steps = run_reference(trace, max_num_seqs, budget, enable_chunked_prefill=True)
    for st in steps:
        got = ex.plan_step(list(st.running), list(st.waiting), budget, max_num_seqs)
        if list(map(tuple, got)) != st.batch:
            where = f"{label}: " if label else ""
            raise Mismatch(st.batch, got, f"{where}step {st.step}: plan_step(running={st.running}, "
                           f"waiting={st.waiting}, token_budget={budget}, max_num_seqs={max_num_seqs})")
    return len(steps)


# --- split_into_chunks --------------------------------------------------------------------------
@case(CASES, "10 tokens in chunks of 4", "split_into_chunks", "full chunks first, then the remainder")
def _(ex):
    expect(ex.split_into_chunks(10, 4), [4, 4, 2])


@case(CASES, "exact multiple, short prompt, chunk of 1", "split_into_chunks", "no empty trailing chunk")
def _(ex):
    expect(ex.split_into_chunks(8, 4), [4, 4], "8 / 4")
    expect(ex.split_into_chunks(3, 512), [3], "shorter than one chunk")
    expect(ex.split_into_chunks(3, 1), [1, 1, 1], "chunk of 1")
    expect(ex.split_into_chunks(30000, 2048), [2048] * 14 + [30000 - 14 * 2048], "30k prompt, 2k chunks")


@case(CASES, "zero tokens, bad chunk size", "split_into_chunks", "[] for 0 tokens; ValueError for chunk_size < 1")
def _(ex):
    expect(ex.split_into_chunks(0, 4), [], "0 tokens")
    expect_raises(ValueError, lambda: ex.split_into_chunks(5, 0), "chunk_size 0")


# --- plan_step ------------------------------------------------------------------------------------
@case(CASES, "nothing to do", "plan_step", "empty running and waiting lists give an empty plan")
def _(ex):
    expect(list(ex.plan_step([], [], 2048, 8)), [])


@case(CASES, "decodes first, then a long prompt gets the rest", "plan_step",
      "each decode takes 1 token; the new prompt gets min(prompt_len, budget left)")
def _(ex):
    got = ex.plan_step([("d1", 1), ("d2", 1), ("d3", 1)], [("long", 30000)], 2048, 8)
    expect(list(got), [("d1", 1), ("d2", 1), ("d3", 1), ("long", 2045)])


@case(CASES, "a prefill in progress continues before new admissions", "plan_step",
      "a running request with many tokens left is still prefilling: give it the next chunk")
def _(ex):
    got = ex.plan_step([("d", 1), ("half", 700)], [("new", 50)], 512, 8)
    expect(list(got), [("d", 1), ("half", 511)])


@case(CASES, "budget spent exactly by decodes", "plan_step", "with 0 budget left, admit nobody")
def _(ex):
    got = ex.plan_step([("a", 1), ("b", 1)], [("w", 5)], 2, 8)
    expect(list(got), [("a", 1), ("b", 1)])


@case(CASES, "more decodes than budget", "plan_step", "stop as soon as the budget is spent, even among running requests")
def _(ex):
    got = ex.plan_step([("a", 1), ("b", 1), ("c", 1)], [], 2, 8)
    expect(list(got), [("a", 1), ("b", 1)])


@case(CASES, "seats full", "plan_step", "running requests count against max_num_seqs")
def _(ex):
    got = ex.plan_step([("a", 1), ("b", 1)], [("w1", 3), ("w2", 3)], 100, 3)
    expect(list(got), [("a", 1), ("b", 1), ("w1", 3)])


@case(CASES, "several short prompts share one step", "plan_step",
      "keep admitting while budget and seats last; the last one may get only a partial chunk")
def _(ex):
    got = ex.plan_step([], [("a", 40), ("b", 40), ("c", 40)], 100, 8)
    expect(list(got), [("a", 40), ("b", 40), ("c", 20)])


@case(CASES, "chunk_size caps every request", "plan_step",
      "with chunk_size, a request gets at most chunk_size tokens even when budget is left")
def _(ex):
    got = ex.plan_step([("d", 1), ("half", 700)], [("a", 300), ("b", 10)], 1000, 8, chunk_size=256)
    expect(list(got), [("d", 1), ("half", 256), ("a", 256), ("b", 10)], "chunk 256")
    got = ex.plan_step([], [("a", 5)], 1000, 8, chunk_size=1)
    expect(list(got), [("a", 1)], "chunk 1")


@case(CASES, "chunk_size larger than the budget", "plan_step", "the budget still caps the chunk")
def _(ex):
    got = ex.plan_step([], [("a", 5000)], 2048, 8, chunk_size=4096)
    expect(list(got), [("a", 2048)])


@case(CASES, "20 random traces against the real scheduler", "plan_step",
      "before each step the real scheduler's state is given to plan_step; the note shows it")
def _(ex):
    for seed in range(20):
        trace = random_trace(200 + seed, 4 + seed % 13, prompt_range=(1, 300), output_range=(1, 30))
        compare_with_reference(ex, trace, max_num_seqs=1 + seed % 6, budget=32 + 24 * (seed % 6),
                               label=f"seed {200 + seed}")


# --- steps_to_first_token ---------------------------------------------------------------------------
@case(CASES, "30k prompt, 2k budget, no decodes", "steps_to_first_token", "ceil(prompt_len / budget)")
def _(ex):
    expect(ex.steps_to_first_token(30000, 2048, 0), 15)


@case(CASES, "boundaries", "steps_to_first_token", "ceil division: 2048 tokens in 2048-token steps is 1 step, 2049 is 2")
def _(ex):
    expect(ex.steps_to_first_token(2048, 2048, 0), 1, "exact")
    expect(ex.steps_to_first_token(2049, 2048, 0), 2, "one over")
    expect(ex.steps_to_first_token(1, 64, 63), 1, "one token left for the prompt")
    expect(ex.steps_to_first_token(1000, 512, 12), 2, "decodes take their share first")


@case(CASES, "decodes eat the whole budget", "steps_to_first_token", "return None when no budget is left for the prompt")
def _(ex):
    expect(ex.steps_to_first_token(100, 64, 64), None, "exactly used up")
    expect(ex.steps_to_first_token(100, 64, 70), None, "more decodes than budget")
