"""The course's trace harness on the real engine (``minivllm.course.harness``), and notebook 09's
view of it (``minivllm.course.arrivals``): requests added at given steps, the step log."""

from __future__ import annotations

import pytest

from minivllm import LLM
from minivllm.course.arrivals import Arrival, serve_arrivals
from minivllm.course.grading import Mismatch
from minivllm.course.harness import TraceRequest, run_trace
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
    assert run.result.first_token_step("early") == 0 and run.wait("late", 3) == 0  # prefilled in one step
    assert run.result.finished_step("late") == 6
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
    with pytest.raises(Mismatch, match="after 2 steps"):
        serve_arrivals(llm, [Arrival("long", "Once upon a time", 30)], max_steps=2)
    llm.engine.abort_request(["long"])


def test_samples_aborts_and_the_records_of_the_real_engine(llm):
    """n > 1 samples are keyed id#i, an abort ends its request where the trace says, and the
    records carry the plan (tables, tokens) the engine's step listener saw."""
    trace = [
        TraceRequest("pair", "Once upon a time", 5, n=2, temperature=1.0, seed=3),
        TraceRequest("gone", "The sky is", 20, arrival_step=1, abort_step=3),
    ]
    run = run_trace(llm, trace)
    assert sorted(run.tokens) == ["gone", "pair#0", "pair#1"]
    assert run.finish_reasons["gone"] == "abort" and len(run.tokens["gone"]) == 2  # steps 1 and 2
    assert run.finish_reasons["pair#0"] == run.finish_reasons["pair#1"] == "length"
    assert run.joined == {"pair#0": 0, "pair#1": 0, "gone": 1}
    n = len(llm.engine.tokenize("Once upon a time")[1])
    first = run.steps[0]
    assert first.running == [] and first.waiting == [("pair#0", n)] and first.sampled == ["pair#0", "pair#1"]
    assert [len(t) for t in first.tables] == [1] and first.scheduled[0][:3] == ("pair#0", 0, n)
    assert all(s.stats.batch_tokens == sum(n for _, n in s.batch) for s in run.steps)


def test_a_plug_in_step_loop_is_recorded_once_per_step():
    """A step loop written from scratch calls no listener; the base's step() reports its steps
    anyway, and once each (a run would raise on a step() that ran and reported two)."""
    from minivllm.core.engine_core import EngineCoreBase

    class Plain(EngineCoreBase):  # calls no listener itself
        def run_step(self, choose_tokens=None):
            start = self.clock()
            out = self.scheduler.schedule()
            self.begin_step(out)
            result = self.executor.execute(out)
            self.kv.commit_written_blocks()
            deltas = self.scheduler.update_from_output(out, result.new_token_ids)
            self.stats.record_step(self.scheduler, out, start, 0.0)
            return self.step_outputs(out, start, self.clock(), deltas, result)

    class Greedy(Plain):  # one step() call runs (and reports) two steps
        def step(self, choose_tokens=None):
            super().step(choose_tokens)
            return super().step(choose_tokens)

    args = dict(num_kv_blocks=8, max_model_len=64, enable_prefix_caching=False)
    trace = [TraceRequest("a", "Once upon a time", 3)]
    run = run_trace(LLM(engine_core=Plain, **args), trace)
    assert [s.step for s in run.steps] == [0, 1, 2]
    assert run.tokens["a"] == run_trace(LLM(**args), trace).tokens["a"]
    with pytest.raises(RuntimeError, match="reported 2 steps to its step listeners for step 0"):
        run_trace(LLM(engine_core=Greedy, **args), trace)
