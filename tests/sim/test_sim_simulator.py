"""Simulator invariants: every request finishes with its exact output length, no KV block
leaks, metrics are consistent with each other and with the clock."""

from __future__ import annotations

import pytest

from minivllm import workloads as w
from minivllm.sim import CostModel, Simulator, get_hardware, preset

LLAMA8B = preset("llama-3-8b")


def check_run(sim: Simulator, trace, stats) -> None:
    s = stats.summary()
    # every request finished with exactly its output length
    assert set(stats.requests) == {it.request_id for it in trace}
    for it in trace:
        m = stats.requests[it.request_id]
        assert m.num_output_tokens == it.output_len, it.request_id
        assert it.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
        assert m.ttft <= m.e2e_latency
    assert s["output_tokens"] == trace.num_output_tokens
    # the scheduler is empty and every block is back in the pool
    assert not sim.scheduler.has_unfinished_requests()
    assert sim.kv.num_used_blocks == 0
    sim.kv.check_invariants([])
    # the clock: steps back to back (gaps only when idle), durations from the cost model
    steps = stats.steps
    for a, b in zip(steps, steps[1:], strict=False):
        assert b.start_time >= a.start_time + a.duration - 1e-9
    for step, cost in zip(steps, sim.step_costs, strict=True):
        assert step.duration == pytest.approx(cost.time, rel=1e-12)  # clock end - clock start
        assert step.kv_blocks_used <= step.kv_blocks_total
        assert step.tokens_stored <= step.slots_reserved or sim.kv.enable_caching
    # every prompt token is computed at least once, recomputation only after preemption
    prefill = s["prefill_tokens"]
    if s["preemptions"] == 0 and stats.prefix_hit_rate == 0:
        assert prefill + s["decode_tokens"] == trace.num_prompt_tokens + trace.num_output_tokens - len(trace)
    else:
        assert prefill >= trace.num_prompt_tokens * (1 - stats.prefix_hit_rate) - len(trace)


@pytest.mark.parametrize(
    "engine_args",
    [
        dict(max_num_seqs=32),
        dict(max_num_seqs=32, enable_chunked_prefill=False),
        dict(max_num_seqs=16, kv_cache="contiguous"),
        dict(max_num_seqs=8, scheduler="static"),
        dict(max_num_seqs=8, scheduler="static", kv_cache="contiguous"),
    ],
)
def test_chat_trace_runs_to_completion(engine_args):
    trace = w.chat(60, seed=1, rate=20.0)
    # a small explicit pool keeps the per-step invariant check (O(pool)) cheap
    sim = Simulator(LLAMA8B, "H100-SXM", max_model_len=4096, num_kv_blocks=2048, **engine_args)
    stats = sim.run(trace, check_invariants=True)
    check_run(sim, trace, stats)


def test_preemption_under_a_small_pool_still_finishes_everything():
    trace = w.chat(40, seed=2)
    sim = Simulator(LLAMA8B, "L4", max_model_len=2304, num_kv_blocks=400, max_num_seqs=64)
    stats = sim.run(trace, check_invariants=True)
    assert stats.summary()["preemptions"] > 0
    assert any(m.num_preemptions for m in stats.requests.values())
    check_run(sim, trace, stats)


def test_no_request_is_scheduled_before_it_arrives_and_idle_time_is_skipped():
    trace = w.fixed([20, 20], [5, 5], arrival=[0.0, 100.0])
    sim = Simulator(LLAMA8B, "H100-SXM", max_model_len=1024)
    stats = sim.run(trace)
    second = stats.requests["fixed-1"]
    assert second.first_scheduled_time == 100.0
    assert stats.summary()["total_time_s"] < 1.0  # busy time excludes the idle gap
    assert sim.summary()["span_s"] > 100.0


def test_kv_pool_is_sized_from_memory_left_after_weights():
    sim = Simulator(LLAMA8B, "H100-SXM", max_model_len=8192, gpu_memory_utilization=0.9)
    left = 80e9 * 0.9 - LLAMA8B.weight_bytes - sim._activation_reserve
    assert sim.num_kv_blocks == int(left // (LLAMA8B.kv_bytes_per_token() * 16))
    # int8 KV doubles the tokens that fit
    sim8 = Simulator(LLAMA8B.with_dtypes(kv_dtype="int8"), "H100-SXM", max_model_len=8192)
    assert sim8.num_kv_blocks == pytest.approx(2 * sim.num_kv_blocks, rel=1e-3)
    with pytest.raises(ValueError, match="no room"):
        Simulator(preset("llama-3-70b"), "H100-SXM")  # 141 GB of bf16 weights


def test_explicit_block_count_wins_and_is_checked():
    sim = Simulator(LLAMA8B, "T4", num_kv_blocks=100, max_model_len=1024)
    assert sim.num_kv_blocks == 100
    with pytest.raises(ValueError, match="needs"):
        Simulator(LLAMA8B, "T4", num_kv_blocks=10, max_model_len=1024)


def test_static_batching_pays_for_padding_and_idle_seats():
    trace = w.fixed([10, 100], [2, 50])
    static = Simulator(LLAMA8B, "H100-SXM", scheduler="static", max_num_seqs=2, max_model_len=1024)
    cont = Simulator(LLAMA8B, "H100-SXM", max_num_seqs=2, max_model_len=1024)
    s_stats, c_stats = static.run(trace), cont.run(trace)
    s, c = s_stats.summary(), c_stats.summary()
    assert s["padding_tokens"] == 90 + (50 - 2)  # prompt pads + idle-seat steps
    assert c["padding_tokens"] == 0
    assert s["total_time_s"] > c["total_time_s"]


def test_shared_system_prompt_hits_the_prefix_cache():
    trace = w.shared_prefix(16, prefix_len=512, seed=0)
    on = Simulator(LLAMA8B, "H100-SXM", max_model_len=4096)
    off = Simulator(LLAMA8B, "H100-SXM", max_model_len=4096, enable_prefix_caching=False)
    on_stats, off_stats = on.run(trace), off.run(trace)
    assert on_stats.prefix_hit_rate > 0.5
    assert off_stats.prefix_hit_rate == 0
    assert max(on_stats.column("kv_blocks_used")) < max(off_stats.column("kv_blocks_used"))
    assert on_stats.summary()["prefill_tokens"] < off_stats.summary()["prefill_tokens"]


def test_contiguous_cache_wastes_what_paging_saves():
    trace = w.chat(80, seed=3)
    kw = dict(max_model_len=4096, num_kv_blocks=4096, max_num_seqs=64)
    paged = Simulator(LLAMA8B, "A100-80GB", **kw).run(trace).summary()
    contig = Simulator(LLAMA8B, "A100-80GB", kv_cache="contiguous", **kw).run(trace).summary()
    assert paged["mean_kv_utilization"] > 0.9
    assert contig["mean_kv_utilization"] < 0.25
    assert paged["mean_batch_seqs"] > contig["mean_batch_seqs"]


def test_faster_hardware_finishes_sooner_with_the_same_decisions():
    trace = w.chat(30, seed=5)
    runs = {}
    for hw in ("T4", "H200"):
        sim = Simulator(LLAMA8B, hw, num_kv_blocks=2000, max_model_len=2304, record_decisions=True)
        runs[hw] = (sim.run(trace), sim.decisions)
    assert runs["T4"][1] == runs["H200"][1]  # all-at-once: time never changes a decision
    assert runs["H200"][0].summary()["total_time_s"] < runs["T4"][0].summary()["total_time_s"] / 5


def test_cost_model_must_match_the_simulated_setup():
    with pytest.raises(ValueError):
        Simulator(LLAMA8B, "H100-SXM", cost_model=CostModel(LLAMA8B, get_hardware("T4")))


def test_a_request_that_can_never_fit_is_reported():
    trace = w.fixed([500], [10])
    with pytest.raises(ValueError, match="max_model_len"):
        Simulator(LLAMA8B, "T4", num_kv_blocks=64, max_model_len=256).run(trace)
