"""Figures of merit read off EngineStats (``minivllm/sim/analysis.py``)."""

from __future__ import annotations

import math

from minivllm.metrics import EngineStats, StepStats
from minivllm.sim.analysis import saturated_throughput


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
