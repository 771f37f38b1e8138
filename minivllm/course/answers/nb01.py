"""Notebook 01's answers: static batching."""

from __future__ import annotations

from minivllm.course.answers import question

CHAPTER_PROMPTS = [10, 12, 8, 14, 9500, 11, 13, 9]


@question("nb01.passes", "the chapter's batch with responses of 7 x 300 and 1 x 30,000 tokens: 30,000 "
          "forward passes or 30,001? How many rows of the last one are thrown away?")
def passes() -> str:
    from minivllm import workloads
    from minivllm.sim import Simulator, preset

    outputs = [300] * 7 + [30_000]
    trace = workloads.fixed(CHAPTER_PROMPTS, outputs, name="chapter")
    sim = Simulator(preset("llama-3-8b"), "H100-SXM", scheduler="static", max_num_seqs=len(outputs),
                    max_model_len=32_768)
    steps = sim.run(trace).steps  # minivllm's StaticBatchScheduler deciding, a simulated clock
    last = steps[-1]
    return (
        f"**{len(steps):,}**: the prefill pass samples every member's first token, so the longest "
        f"response needs {max(outputs):,} - 1 decode passes after it. The last pass computes "
        f"{last.num_batched_seqs} rows and throws **{last.num_padding_tokens}** away: the seven short "
        "answers ended long before, and their seats are still computed. (Counted by minivllm's "
        "static scheduler on the simulator; your `account_static` must agree.)"
    )
