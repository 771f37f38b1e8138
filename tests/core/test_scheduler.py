"""Scheduler decisions without a model: token budget, chunking, preemption order, priority,
abort, and the static-batching baseline. A fake runner samples token 5 for every request."""

from __future__ import annotations

import pytest

from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.core.static_scheduler import StaticBatchScheduler
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams


def make(policy="fcfs", blocks=64, bs=4, budget=32, seqs=8, chunked=True, static=False, max_len=256):
    cfg = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget, max_model_len=max_len,
                          enable_chunked_prefill=chunked, policy=policy)
    kv = KVCacheManager(blocks, bs, enable_caching=False)
    return (StaticBatchScheduler if static else Scheduler)(cfg, kv)


def add(s, rid, n_prompt, max_tokens=8, priority=0, t=0.0):
    r = Request(rid, [3] * n_prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                arrival_time=t, priority=priority)
    s.add_request(r)
    return r


def step(s):
    out = s.schedule()
    s.update_from_output(out, {r.request_id: [5] for r in out.sampling_requests})
    s.kv.check_invariants(s.live_request_ids())
    return out


def test_budget_is_split_running_first_then_admissions():
    s = make(budget=10)
    add(s, "a", 4)
    add(s, "b", 20)
    out = step(s)
    assert out.decisions() == [("a", 4), ("b", 6)]  # b's prompt is chunked to fit the budget
    out = step(s)
    assert out.decisions() == [("a", 1), ("b", 9)]  # a decodes, b continues its prefill
    out = step(s)
    assert out.decisions() == [("a", 1), ("b", 5)]
    assert out.num_decode_tokens == 1 and out.num_prefill_tokens == 5
    assert s.requests["b"].num_output_tokens == 1  # the chunk that finishes the prompt samples


def test_without_chunking_a_long_prompt_waits_for_a_whole_budget():
    s = make(budget=16, chunked=False, max_len=16)
    add(s, "a", 10)
    add(s, "b", 10)
    assert step(s).decisions() == [("a", 10)]  # b does not fit in the 6 tokens left
    assert step(s).decisions() == [("a", 1), ("b", 10)]


def test_max_num_seqs_caps_the_batch():
    s = make(seqs=2)
    for i in range(3):
        add(s, f"r{i}", 2)
    assert [d[0] for d in step(s).decisions()] == ["r0", "r1"]


def test_fcfs_preempts_the_newest_running_request():
    s = make(blocks=6, bs=4, budget=64)
    a, b, c = add(s, "a", 8, 20), add(s, "b", 4, 20), add(s, "c", 4, 20)
    for _ in range(30):  # a: 2 blocks, b: 1, c: 1, then they grow into the last 2 blocks
        out = step(s)
        if out.preempted:
            break
    assert out.preempted == [c]  # the newest running request is the victim
    assert c.status == RequestStatus.PREEMPTED and c.num_computed_tokens == 0
    assert a.status == b.status == RequestStatus.RUNNING
    assert s.waiting[0] is c


def test_priority_policy_preempts_the_least_important():
    s = make(policy="priority", blocks=6, bs=4, budget=64)
    a = add(s, "a", 8, 20, priority=5, t=0)
    b = add(s, "b", 4, 20, priority=0, t=1)
    c = add(s, "c", 4, 20, priority=1, t=2)
    for _ in range(30):
        out = step(s)
        if out.preempted:
            break
    assert out.preempted[0] is a  # the largest priority value is the least important
    assert b.status == RequestStatus.RUNNING and c.status == RequestStatus.RUNNING


def test_priority_admission_order_and_preemption_for_an_urgent_arrival():
    s = make(policy="priority", blocks=4, bs=4, budget=64, seqs=8)
    low = add(s, "low", 12, 4, priority=9, t=0)
    step(s)
    assert low.status == RequestStatus.RUNNING
    add(s, "mid", 8, 4, priority=5, t=1)
    add(s, "hi", 8, 4, priority=1, t=2)
    out = step(s)
    assert out.preempted == [low]  # both newcomers outrank it
    assert [d[0] for d in out.decisions()] == ["hi", "mid"]  # most urgent first
    assert low.status == RequestStatus.PREEMPTED and s.waiting == [low]


def test_abort_returns_blocks_and_keeps_others_running():
    s = make()
    a, b = add(s, "a", 9), add(s, "b", 9)
    step(s)
    s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert a.status.finish_reason == "abort" and "a" not in s.kv.req_to_blocks
    while s.has_unfinished_requests():
        step(s)
    assert b.num_output_tokens == 8 and s.kv.num_free_blocks == s.kv.num_blocks


def test_static_batch_pads_and_keeps_idle_seats_until_the_last_request_ends():
    s = make(static=True, seqs=2, budget=4)  # the budget is ignored by static batching
    add(s, "short", 3, max_tokens=2)
    add(s, "long", 7, max_tokens=5)
    add(s, "next", 2, max_tokens=1)
    out = step(s)
    assert out.decisions() == [("short", 3), ("long", 7)]
    assert out.num_padding_tokens == 4  # short padded from 3 to 7
    pads = []
    while s.requests.get("long") is not None:
        pads.append(step(s).num_padding_tokens)
    assert pads == [0, 1, 1, 1]  # short finished after 2 tokens; its seat idles 3 steps
    assert step(s).decisions() == [("next", 2)]  # only now does the next batch start
    assert s.kv.num_free_blocks == s.kv.num_blocks


def test_config_errors_name_the_limit():
    with pytest.raises(ValueError, match="max_num_batched_tokens \\(100\\).*max_model_len \\(200\\)"):
        SchedulerConfig(max_num_batched_tokens=100, max_model_len=200, enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="policy|scheduling_policy"):
        SchedulerConfig(policy="lifo")


def test_static_batching_refuses_a_policy_other_than_fcfs():
    from minivllm.core.policies import PriorityPolicy

    for policy in ("priority", PriorityPolicy()):
        with pytest.raises(ValueError, match="only scheduling_policy='fcfs'"):
            StaticBatchScheduler(SchedulerConfig(policy=policy), KVCacheManager(16, 16))


def test_a_request_takes_its_new_tokens_in_order_and_stops_at_the_first_stop():
    """``update_from_output`` appends a request's list of new tokens one by one under the stop
    rules: the token that ends it is its last; the ones after it are dropped, its blocks freed.
    It returns one delta per request: the tokens appended, and how one that ended did."""
    s = make()
    r = Request("r", [3] * 4, SamplingParams(max_tokens=8, stop_token_ids=[7]))
    s.add_request(r)
    other = add(s, "o", 4)
    out = s.schedule()
    deltas = s.update_from_output(out, {"r": [5, 7, 9], "o": [5, 6]})
    assert [(d.request_id, d.new_token_ids, d.finish_reason, d.stop_reason) for d in deltas] == [
        ("r", [5, 7], "stop", 7), ("o", [5, 6], None, None)]
    assert r.status is RequestStatus.FINISHED_STOPPED
    assert r.output_token_ids == [5, 7]  # 9 came after the stop
    assert other.output_token_ids == [5, 6] and s.running == [other]
    assert "r" not in s.requests
    s.kv.check_invariants(s.live_request_ids())
    # the length limit cuts a list the same way
    out = s.schedule()
    (delta,) = s.update_from_output(out, {"o": [1, 2, 3, 4, 5, 6, 7, 8]})
    assert (delta.new_token_ids, delta.finish_reason) == ([1, 2, 3, 4, 5, 6], "length")
    assert other.status is RequestStatus.FINISHED_LENGTH_CAPPED and other.output_token_ids == [5, 6, 1, 2, 3, 4, 5, 6]
