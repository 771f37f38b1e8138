"""``minivllm.course.arrivals``: requests added at given engine steps, and the step log."""

from __future__ import annotations

import pytest

from minivllm import LLM
from minivllm.course.arrivals import Arrival, serve_arrivals
from minivllm.course.runtime import one_cpu_thread


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_cpu_thread():
        yield


@pytest.fixture(scope="module")
def llm():
    return LLM(num_kv_blocks=8, max_model_len=64, enable_prefix_caching=False)


def test_requests_join_at_their_step_and_the_log_follows_them(llm):
    arrivals = [Arrival("late", "The sky is", 4, step=3), Arrival("early", "Once upon a time", 6)]
    run = serve_arrivals(llm, arrivals)
    assert {rid: len(t) for rid, t in run.tokens.items()} == {"early": 6, "late": 4}
    assert run.first_token_step == {"early": 0, "late": 3}  # a short prompt is prefilled in one step
    assert run.wait("late", 3) == 0 and run.finished_step["late"] == 6
    assert [rec.step for rec in run.steps] == list(range(len(run.steps)))
    assert run.steps[0].running == ["early"] and run.steps[3].running == ["early", "late"]
    assert all(sum(rec.blocks_held.values()) == rec.kv_blocks_used for rec in run.steps)
    assert not run.preemptions and not any(rec.preempted for rec in run.steps)
    assert not llm.engine.has_unfinished_requests()


def test_preemptions_are_logged_per_step_and_per_request():
    small = LLM(num_kv_blocks=6, max_model_len=64, enable_prefix_caching=False)
    arrivals = [Arrival(f"r{i}", "Once upon a time", 40) for i in range(3)]  # 3 x 3 blocks > 6
    run = serve_arrivals(small, arrivals)
    logged = [rid for rec in run.steps for rid in rec.preempted]
    assert logged and sorted(set(logged)) == sorted(run.preemptions)
    assert sum(run.preemptions.values()) == len(logged) == small.stats().summary()["preemptions"]
    assert all(len(t) == 40 for t in run.tokens.values())


def test_a_run_that_does_not_end_is_stopped(llm):
    with pytest.raises(RuntimeError, match="after 2 steps"):
        serve_arrivals(llm, [Arrival("long", "Once upon a time", 30)], max_steps=2)
    llm.engine.abort_request(["long"])
