"""Cases for ex01_static_waste: padding tax, idle slots, static-batch efficiency."""

from __future__ import annotations

import random

from minivllm.course.grading import Case, case, expect, expect_raises

CASES: list[Case] = []

# The chapter's example batch: eight chat-sized prompts and one 9,500-token document.
CHAPTER_PROMPTS = [10, 12, 8, 14, 9500, 11, 13, 9]


@case(CASES, "chapter batch [10, 12, 8, 14, 9500, 11, 13, 9]", "padded_prefill_fraction",
      "sum of the prompt lengths over (batch size x longest prompt)")
def _(ex):
    expect(ex.padded_prefill_fraction(CHAPTER_PROMPTS), 9577 / (8 * 9500))


@case(CASES, "one prompt, equal prompts", "padded_prefill_fraction", "no padding means a fraction of exactly 1")
def _(ex):
    expect(ex.padded_prefill_fraction([7]), 1.0, "single prompt")
    expect(ex.padded_prefill_fraction([5, 5, 5]), 1.0, "equal prompts")


@case(CASES, "ragged batch", "padded_prefill_fraction", "use the longest prompt of this batch, not of any other")
def _(ex):
    expect(ex.padded_prefill_fraction([1, 2, 3, 100]), 106 / 400)
    expect(ex.padded_prefill_fraction([100, 1]), 101 / 200, "longest first")


@case(CASES, "empty batch, zero-length prompt", "padded_prefill_fraction",
      "raise ValueError for [] and for a prompt of 0 tokens")
def _(ex):
    expect_raises(ValueError, lambda: ex.padded_prefill_fraction([]), "empty batch")
    expect_raises(ValueError, lambda: ex.padded_prefill_fraction([3, 0, 5]), "a 0-token prompt")


@case(CASES, "300-token majority and one 30,000-token straggler", "idle_slot_steps",
      "seven requests each wait 30,000 - 300 steps for the straggler")
def _(ex):
    expect(ex.idle_slot_steps([300] * 7 + [30000]), 7 * (30000 - 300))


@case(CASES, "ragged responses", "idle_slot_steps", "idle steps of request i = longest - output_lens[i]")
def _(ex):
    expect(ex.idle_slot_steps([1, 4, 2, 4]), 3 + 0 + 2 + 0)
    expect(ex.idle_slot_steps([9]), 0, "a batch of one never idles")
    expect(ex.idle_slot_steps([6, 6, 6]), 0, "equal lengths")


@case(CASES, "empty batch", "idle_slot_steps", "an empty batch has 0 idle slot-steps (max([]) raises: guard it)")
def _(ex):
    expect(ex.idle_slot_steps([]), 0)


@case(CASES, "one full batch", "static_batch_efficiency", "sum(outputs) / (batch_size x longest)")
def _(ex):
    outs = [300] * 7 + [30000]
    expect(ex.static_batch_efficiency(outs, 8), sum(outs) / (8 * 30000))


@case(CASES, "several batches, a partial last one", "static_batch_efficiency",
      "batches are consecutive slices of batch_size; an unfilled seat still costs a seat-step")
def _(ex):
    # batches [4, 1] and [2]: 2 seats x (4 + 2) steps paid, 7 tokens wanted
    expect(ex.static_batch_efficiency([4, 1, 2], 2), 7 / 12)
    expect(ex.static_batch_efficiency([5], 4), 5 / 20, "one request, four seats")


@case(CASES, "batch size 1 is perfectly efficient", "static_batch_efficiency", "one seat is never idle")
def _(ex):
    expect(ex.static_batch_efficiency([3, 9, 1, 4], 1), 1.0)


@case(CASES, "random traces (seeded)", "static_batch_efficiency",
      "per batch: steps = its longest response; efficiency = tokens / (batch_size x total steps)")
def _(ex):
    rng = random.Random(1)
    for trial in range(20):
        outs = [rng.randint(1, 500) for _ in range(rng.randint(1, 40))]
        b = rng.randint(1, 12)
        steps = 0
        for start in range(0, len(outs), b):
            steps += max(outs[start : start + b])
        expect(ex.static_batch_efficiency(outs, b), sum(outs) / (b * steps), f"trial {trial}: B={b}, outputs={outs}")


@case(CASES, "empty trace, bad batch size", "static_batch_efficiency",
      "raise ValueError for an empty trace and for batch_size < 1")
def _(ex):
    expect_raises(ValueError, lambda: ex.static_batch_efficiency([], 4), "empty trace")
    expect_raises(ValueError, lambda: ex.static_batch_efficiency([3, 4], 0), "batch_size 0")
