"""Figures of merit computed from :class:`~minivllm.metrics.EngineStats` (engine or simulator).

Kept separate from the plots so that tables and tests need no matplotlib.
"""

from __future__ import annotations

from minivllm.metrics import EngineStats, StepStats


def useful_seqs(step: StepStats) -> int:
    """Sequences doing useful work in a step: every batched sequence, minus static batching's
    idle seats. In a step without prefill every padding row is an idle seat (one thrown-away
    token); in a prefill step padding sits inside real prompts and every sequence is useful."""
    if step.num_prefill_tokens == 0:
        return step.num_batched_seqs - step.num_padding_tokens
    return step.num_batched_seqs


def effective_batch(stats: EngineStats, time_weighted: bool = True) -> float:
    """B_eff: the mean number of sequences doing useful work per step (the chapter's average
    active batch size). Time-weighted by default, so a long prefill step counts for its length."""
    steps = stats.steps
    if not steps:
        return 0.0
    if not time_weighted:
        return sum(useful_seqs(s) for s in steps) / len(steps)
    total = sum(s.duration for s in steps)
    return sum(useful_seqs(s) * s.duration for s in steps) / total if total else 0.0


def decode_only_steps(stats: EngineStats) -> list[StepStats]:
    """Steps that only decode (no prompt tokens, no padding)."""
    return [s for s in stats.steps if s.num_prefill_tokens == 0 and s.num_padding_tokens == 0 and s.num_decode_tokens]


def productive_fraction(stats: EngineStats) -> float:
    """Share of computed token rows that were real (prompt + generated), not padding."""
    s = stats.summary()
    done = s["prefill_tokens"] + s["decode_tokens"]
    total = done + s["padding_tokens"]
    return done / total if total else 0.0


def mean_running(stats: EngineStats, time_weighted: bool = True) -> float:
    """Mean number of requests holding a seat (and KV memory) per step."""
    steps = stats.steps
    if not steps:
        return 0.0
    if not time_weighted:
        return sum(s.num_running for s in steps) / len(steps)
    total = sum(s.duration for s in steps)
    return sum(s.num_running * s.duration for s in steps) / total if total else 0.0


def saturated_throughput(stats: EngineStats) -> float:
    """Output tokens/s over the steps that left requests waiting (the batch was kept full).

    An offline trace ends with a ramp-down in which the batch empties and the GPU idles on a
    few stragglers; a server under steady load never sees that part, so the chapter's "tokens/s
    at saturation" is measured without it. NaN when no step had a queue.
    """
    steps = [s for s in stats.steps if s.num_waiting > 0]
    busy = sum(s.duration for s in steps)
    return sum(s.num_decode_tokens for s in steps) / busy if busy else float("nan")
