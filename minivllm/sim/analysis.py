"""Figures of merit computed from :class:`~minivllm.metrics.EngineStats` (engine or simulator).

Kept separate from the plots so that tables and tests need no matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from minivllm.metrics import EngineStats, StepStats
from minivllm.outputs import RequestMetrics


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


# --- per-request figures: percentiles and throughput of one class of requests -------------------
REQUEST_METRICS = ("ttft", "tpot", "e2e_latency", "num_preemptions", "num_output_tokens")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (``0 <= q <= 100``) of ``values``, interpolating linearly between
    the two nearest ranks (numpy's default), so ``percentile(x, 50)`` is the median. NaN for no
    values."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def finished_requests(stats: EngineStats, prefix: str = "") -> dict[str, RequestMetrics]:
    """The finished requests whose id starts with ``prefix`` (a trace's items are named
    ``"<kind>-<i>"``: ``prefix="chat"`` selects the chat requests of a mixed trace)."""
    return {
        rid: m for rid, m in stats.requests.items() if rid.startswith(prefix) and m.finished_time is not None
    }


def request_percentiles(
    stats: EngineStats, metric: str = "ttft", prefix: str = "", qs: Sequence[float] = (50, 90, 99)
) -> dict[float, float]:
    """``{q: q-th percentile}`` of a per-request ``metric`` (one of :data:`REQUEST_METRICS`)
    over the finished requests whose id starts with ``prefix``.

    Percentiles, not means, because a server is judged by its slow requests: a chat user whose
    first token takes a minute does not care that the mean was 0.2 s.
    """
    if metric not in REQUEST_METRICS:
        raise ValueError(f"metric must be one of {REQUEST_METRICS}, got {metric!r}")
    values = [getattr(m, metric) for m in finished_requests(stats, prefix).values()]
    values = [v for v in values if v is not None]
    return {q: percentile(values, q) for q in qs}


def class_throughput(stats: EngineStats, prefix: str = "") -> float:
    """Output tokens per second of the requests whose id starts with ``prefix``: their tokens
    over the span from the first one's arrival to the last one's finish (the rate at which the
    server got through that class of work). NaN if none finished."""
    done = finished_requests(stats, prefix).values()
    if not done:
        return math.nan
    span = max(m.finished_time for m in done) - min(m.arrival_time for m in done)
    return sum(m.num_output_tokens for m in done) / span if span > 0 else math.nan
