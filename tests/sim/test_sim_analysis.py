"""Figures of merit read off EngineStats (``minivllm/sim/analysis.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.metrics import EngineStats, StepStats
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams
from minivllm.sim.analysis import (
    class_throughput,
    finished_requests,
    percentile,
    request_percentiles,
    saturated_throughput,
)


def step(i: int, duration: float, waiting: int, decode: int, prefill: int = 0) -> StepStats:
    return StepStats(i, float(i), duration, decode, waiting, prefill, decode, 0, 1, 64, 1, 16, 0,
                     num_batched_seqs=decode)


def test_saturated_throughput_leaves_out_the_ramp_down():
    stats = EngineStats(steps=[
        step(0, 0.5, waiting=10, decode=0, prefill=900),  # a prefill step with a queue: counts as busy
        step(1, 0.1, waiting=3, decode=8),
        step(2, 0.1, waiting=1, decode=8),
        step(3, 0.2, waiting=0, decode=2),  # ramp-down: the queue is empty, the batch drains
    ])
    assert math.isclose(saturated_throughput(stats), 16 / 0.7)


def test_saturated_throughput_without_a_queue_is_nan():
    assert math.isnan(saturated_throughput(EngineStats(steps=[step(0, 0.1, waiting=0, decode=4)])))
    assert math.isnan(saturated_throughput(EngineStats()))


# --- per-request percentiles and throughput of one class of requests ----------------------------
@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_is_numpys_linear_interpolation(values, q):
    assert math.isclose(percentile(values, q), float(np.percentile(values, q)), rel_tol=1e-9, abs_tol=1e-6)


def test_percentile_edges():
    assert math.isnan(percentile([], 50))
    assert percentile([7.0], 99) == 7.0
    assert percentile([3, 1, 2], 50) == 2
    with pytest.raises(ValueError, match="q must be in"):
        percentile([1, 2], 101)


def mixed_stats() -> EngineStats:
    """Hand-made requests: three chat (one still running, so not recorded), two reasoning."""
    stats = EngineStats()
    for rid, arrival, first, done, tokens in (
        ("chat-0", 0.0, 0.1, 1.0, 10), ("chat-1", 1.0, 1.5, 2.0, 10), ("chat-2", 2.0, 2.2, None, 0),
        ("reasoning-0", 0.0, 0.3, 10.0, 100), ("reasoning-1", 4.0, 9.0, 20.0, 200),
    ):
        req = Request(rid, [1] * 3, SamplingParams(max_tokens=tokens or 1), arrival_time=arrival)
        req.all_token_ids += [2] * tokens
        req.first_token_time, req.finished_time = first, done
        if done is not None:
            stats.record_finish(req)
    return stats


def test_request_percentiles_select_finished_requests_by_prefix():
    stats = mixed_stats()
    assert sorted(finished_requests(stats, "chat")) == ["chat-0", "chat-1"]  # chat-2 is still running
    ttft = request_percentiles(stats, "ttft", "chat", (0, 50, 100))
    assert ttft == pytest.approx({0: 0.1, 50: 0.3, 100: 0.5})
    e2e = request_percentiles(stats, "e2e_latency", "reasoning", (50,))
    assert e2e == pytest.approx({50: (10.0 + 16.0) / 2})
    assert math.isnan(request_percentiles(stats, "ttft", "nobody")[90])
    with pytest.raises(ValueError, match="metric must be one of"):
        request_percentiles(stats, "speed")


def test_class_throughput_spans_first_arrival_to_last_finish():
    stats = mixed_stats()
    assert class_throughput(stats, "reasoning") == pytest.approx(300 / 20.0)
    assert class_throughput(stats, "chat") == pytest.approx(20 / 2.0)
    assert math.isnan(class_throughput(stats, "nobody"))
