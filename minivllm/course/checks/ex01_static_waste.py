"""Cases for ex01_static_waste: the student's books of a static batcher against hand-checked
examples and against what minivllm's ``StaticBatchScheduler`` really computes, step by step."""

from __future__ import annotations

import random

from minivllm.course.grading import Case, case, expect, expect_raises
from minivllm.course.reference import TraceRequest, run_reference

CASES: list[Case] = []

# The chapter's example batch: eight chat-sized prompts and one 9,500-token document, with the
# chapter's response lengths (seven of 300 tokens, one of 30,000).
CHAPTER_PROMPTS = [10, 12, 8, 14, 9500, 11, 13, 9]
CHAPTER_OUTPUTS = [300] * 7 + [30_000]


def engine_books(prompt_lens: list[int], output_lens: list[int], batch_size: int) -> dict[str, int]:
    """What minivllm's static scheduler computes for this trace, replayed step by step."""
    trace = [TraceRequest(f"r{i}", p, o) for i, (p, o) in enumerate(zip(prompt_lens, output_lens, strict=True))]
    steps = run_reference(trace, batch_size, max(prompt_lens), scheduler="static")
    prefill = [s for s in steps if s.num_prefill_tokens]
    decode = [s for s in steps if not s.num_prefill_tokens]
    return dict(
        num_steps=len(steps),
        prompt_rows=sum(s.num_prefill_tokens for s in prefill),
        padding_rows=sum(s.num_padding_tokens for s in prefill),
        decode_rows=sum(s.num_decode_tokens for s in decode),
        idle_rows=sum(s.num_padding_tokens for s in decode),
    )


def books(account) -> dict[str, int]:
    names = ("num_steps", "prompt_rows", "padding_rows", "decode_rows", "idle_rows")
    return {n: getattr(account, n) for n in names}


def against_engine(ex, prompts, outputs, batch_size, note=""):
    expect(books(ex.account_static(prompts, outputs, batch_size)), engine_books(prompts, outputs, batch_size), note)


@case(CASES, "the chapter's batch", "account_static",
      "one padded prefill of 8 x 9,500 rows, then the batch decodes until the 30,000-token response is done")
def _(ex):
    acc = ex.account_static(CHAPTER_PROMPTS, CHAPTER_OUTPUTS, 8)
    expect(books(acc), dict(num_steps=30_000, prompt_rows=9577, padding_rows=8 * 9500 - 9577,
                            decode_rows=7 * 299 + 29_999, idle_rows=7 * (30_000 - 300)))


@case(CASES, "one request", "account_static",
      "a batch of one never pads and never idles; its prefill pass already gives the first token")
def _(ex):
    against_engine(ex, [7], [5], 4)


@case(CASES, "equal lengths", "account_static", "equal prompts need no padding; equal responses leave no seat idle")
def _(ex):
    against_engine(ex, [6, 6, 6], [4, 4, 4], 3)


@case(CASES, "one-token responses", "account_static",
      "a batch whose responses are one token long is done after its prefill pass: no decode pass at all")
def _(ex):
    against_engine(ex, [3, 9, 4], [1, 1, 1], 3)


@case(CASES, "each batch pads to its own longest prompt", "account_static",
      "the padding of a batch depends on the prompts of that batch only")
def _(ex):
    against_engine(ex, [2, 30, 3, 4, 5, 6], [3, 3, 3, 3, 3, 3], 2)


@case(CASES, "a partial last batch", "account_static",
      "the last batch may have fewer members than batch_size; only members' rows are computed")
def _(ex):
    against_engine(ex, [4, 8, 2, 5, 6], [9, 2, 3, 7, 1], 2)


@case(CASES, "a straggler in each batch", "account_static",
      "a finished member's row is computed at every decode pass until its batch's longest response is done")
def _(ex):
    against_engine(ex, [12] * 8, [3, 3, 40, 3, 3, 3, 3, 25], 4)


@case(CASES, "20 random traces against the engine (seeded)", "account_static",
      "compare with what minivllm's StaticBatchScheduler computed; the note shows the trace")
def _(ex):
    rng = random.Random(1)
    for trial in range(20):
        n = rng.randint(1, 14)
        prompts = [rng.randint(1, 40) for _ in range(n)]
        outputs = [rng.randint(1, 30) for _ in range(n)]
        b = rng.randint(1, 6)
        against_engine(ex, prompts, outputs, b, f"trial {trial}: batch_size={b}, prompts={prompts}, outputs={outputs}")


@case(CASES, "an empty trace", "account_static", "no requests, no passes, no rows")
def _(ex):
    expect(books(ex.account_static([], [], 8)), dict.fromkeys(books(ex.StaticAccount()), 0))


@case(CASES, "bad input", "account_static",
      "ValueError for batch_size < 1, lists of different lengths, a 0-token prompt or a 0-token response")
def _(ex):
    expect_raises(ValueError, lambda: ex.account_static([3, 4], [2, 2], 0), "batch_size 0")
    expect_raises(ValueError, lambda: ex.account_static([3, 4], [2], 2), "2 prompts, 1 output")
    expect_raises(ValueError, lambda: ex.account_static([3, 0], [2, 2], 2), "a 0-token prompt")
    expect_raises(ValueError, lambda: ex.account_static([3, 4], [2, 0], 2), "a 0-token response")
