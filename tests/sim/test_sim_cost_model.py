"""The roofline step cost: monotonic, memory-bound at small batch, a knee where predicted,
padding and idle seats paid for."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.core.scheduler import SchedulerOutput
from minivllm.request import Request
from minivllm.sim import CostModel, get_hardware, preset

H100 = get_hardware("H100")


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel(preset("llama-3-8b"), H100)


def test_batch_one_decode_is_a_pass_over_the_weights(cm):
    c = cm.decode_step(1, 0)
    assert c.bound == "memory"
    weights = cm.model.body_weight_bytes + cm.model.lm_head_bytes
    assert c.weight_bytes == weights
    assert c.time == pytest.approx(weights / (H100.memory_bandwidth * 0.8) + cm.step_overhead_s, rel=0.01)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 1024), ctx=st.integers(0, 32_000))
def test_step_time_grows_with_batch_and_context(b, ctx):
    cm = CostModel(preset("llama-3-8b"), H100)
    t = cm.decode_step(b, ctx).time
    assert cm.decode_step(b + 1, ctx).time >= t
    assert cm.decode_step(b, ctx + 100).time >= t
    # and per-token cost never rises with batch: batching is never a loss
    assert cm.decode_step(b + 1, ctx).time / (b + 1) <= t / b + 1e-12


@pytest.mark.parametrize("name,wdtype", [("llama-3-8b", "bf16"), ("llama-3-70b", "bf16"), ("llama-3-70b", "int4")])
def test_crossover_is_where_the_roofs_meet(name, wdtype):
    cm = CostModel(preset(name, weight_dtype=wdtype), H100)
    b_star = cm.crossover_batch(0)
    below, above = cm.decode_step(int(b_star * 0.9), 0), cm.decode_step(int(b_star * 1.1) + 1, 0)
    assert below.bound == "memory" and above.bound == "compute"
    # weights-only knee ~ (bytes per weight) x ridge point x (eff_F / eff_M) / 2
    bytes_per_weight = cm.model.bits_per_linear_weight / 8
    approx = bytes_per_weight * H100.ridge_point * (0.6 / 0.8) / 2
    assert b_star == pytest.approx(approx, rel=0.1)


def test_int4_weights_move_the_knee_to_smaller_batches():
    fp16 = CostModel(preset("llama-3-70b", weight_dtype="bf16"), H100).crossover_batch(0)
    int4 = CostModel(preset("llama-3-70b", weight_dtype="int4"), H100).crossover_batch(0)
    assert int4 < fp16 / 3


def test_long_context_keeps_gqa_decode_memory_bound():
    cm = CostModel(preset("llama-3-8b"), H100)
    assert cm.crossover_batch(8192) == float("inf")
    assert cm.decode_step(4096, 8192).bound == "memory"


def test_pure_roofline_without_efficiency_or_overhead():
    cm = CostModel(preset("llama-3-70b"), H100, flops_efficiency=1.0, bandwidth_efficiency=1.0, step_overhead_s=0)
    c = cm.prefill_step([4096])
    assert c.compute_time == pytest.approx(c.flops / H100.peak_flops)
    assert c.time == max(c.compute_time, c.memory_time)
    assert c.bound == "compute"


def _scheduled(out: SchedulerOutput, n_tokens: int, cached: int, new: int, pad: int = 0) -> Request:
    """Add a request of ``n_tokens`` tokens to ``out`` the way a scheduler does: it advances
    ``num_computed_tokens`` past this step's tokens before the step runs."""
    req = Request(f"r{len(out.requests)}", list(range(1, n_tokens + 1)))
    req.num_computed_tokens = cached + new
    out.add(req, cached, new, [], pad)
    return req


def test_padding_and_idle_seats_cost_like_real_rows(cm):
    # a padded prefill of prompts (3, 10) costs what two real 10-token prompts cost: a pad row
    # goes through every matmul and attends over the same causal positions
    padded = SchedulerOutput()
    _scheduled(padded, 3, 0, 3, pad=7)
    _scheduled(padded, 10, 0, 10)
    assert cm.schedule_cost(padded).flops == cm.prefill_step([10, 10]).flops
    # an idle static seat (0 new tokens, 1 padding row) still costs FLOPs and KV reads
    idle = SchedulerOutput()
    _scheduled(idle, 50, 50, 0, pad=1)
    c = cm.schedule_cost(idle)
    assert c.flops > 0 and c.kv_read_bytes == 51 * cm.model.kv_bytes_per_token()
    assert c.flops < cm.decode_step(1, 50).flops  # no LM head: nothing is sampled


def test_schedule_cost_reads_context_and_sampling_from_the_output(cm):
    out = SchedulerOutput()
    _scheduled(out, 100, 99, 1)  # a decode at context 99
    _scheduled(out, 300, 0, 128)  # the first chunk of a 300-token prompt: no sampling yet
    c = cm.schedule_cost(out)
    expected = cm.step_cost([(99, 1, True), (0, 128, False)])
    assert c == expected
    assert c.flops < cm.step_cost([(99, 1, True), (0, 128, True)]).flops


def test_empty_step_costs_only_the_overhead(cm):
    assert cm.schedule_cost(SchedulerOutput()).time == cm.step_overhead_s


def test_invalid_efficiency_rejected():
    with pytest.raises(ValueError):
        CostModel(preset("llama-3-8b"), H100, flops_efficiency=1.5)
