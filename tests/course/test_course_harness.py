"""The checks' harness without a model (``minivllm.course.harness``): traces refused at the door,
runs that cannot end, the checks it makes after every step, and how two runs are compared."""

from __future__ import annotations

import pytest

from minivllm.core.engine_core import EngineCore, EngineStalledError
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.course.grading import Mismatch
from minivllm.course.harness import (
    StepMismatch,
    TraceRequest,
    TraceRun,
    expect_same_steps,
    expect_same_tokens,
    run_trace,
)
from minivllm.course.reference import DECISIONS, Replay, run_reference
from minivllm.sampling_params import MAX_N
from minivllm.sim.executor import Faults, InjectedInterrupt, ModelFreeExecutor


def core(scheduler_class=Scheduler, num_blocks: int = 16, **faults) -> EngineCore:
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    fake = ModelFreeExecutor(vocab=4, faults=Faults(**faults), logprobs=True)
    return EngineCore(scheduler_class(config, KVCacheManager(num_blocks, 4)), fake, clock=fake.clock)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(request_id="", prompt=3), ValueError, "non-empty string"),
        (dict(request_id=7, prompt=3), ValueError, "non-empty string"),
        (dict(request_id="a", prompt=0), ValueError, "length must be >= 1, got 0"),
        (dict(request_id="a", prompt=True), TypeError, "text, token ids or a length"),
        (dict(request_id="a", prompt=None), TypeError, "text, token ids or a length"),
        (dict(request_id="a", prompt=3, arrival_step=-1), ValueError, "arrival_step must be an int >= 0, got -1"),
        (dict(request_id="a", prompt=3, arrival_step=1.5), ValueError, "got 1.5"),
        (dict(request_id="a", prompt=3, abort_step=2**63 * -1), ValueError, "abort_step"),
        (dict(request_id="a", prompt=()), ValueError, "non-empty list of ints"),
        (dict(request_id="a", prompt=(1, -2)), ValueError, r"ints >= 0, got \(1, -2\)"),
        (dict(request_id="a", prompt=(1, 2.0)), ValueError, "ints >= 0"),
        (dict(request_id="a", prompt=3, max_tokens=0), ValueError, "max_tokens"),
        (dict(request_id="a", prompt=3, n=0), ValueError, rf"n must be in \[1, {MAX_N}\], got n=0"),
        (dict(request_id="a", prompt=3, temperature=float("nan")), ValueError, "temperature"),
    ],
)
def test_a_bad_trace_request_is_refused_naming_the_value(kwargs, error, match):
    with pytest.raises(error, match=match):
        TraceRequest(**kwargs)


def test_a_trace_with_two_requests_of_one_id_is_refused():
    with pytest.raises(ValueError, match="unique"):
        TraceRun(core(), [TraceRequest("a", 3), TraceRequest("b", 3, n=2), TraceRequest("b#1", 2)])


def test_made_up_prompts_differ_and_text_needs_a_tokenizer():
    a, b = TraceRequest("a", 40), TraceRequest("b", 40)
    assert a.token_ids(0) != b.token_ids(1) and len(a.token_ids(0)) == a.prompt_len == 40
    with pytest.raises(TypeError, match="tokenizer"):
        run_trace(core(), [TraceRequest("t", "Once upon a time")])
    with pytest.raises(TypeError, match="tokenizer"):
        TraceRequest("t", "text").prompt_len  # noqa: B018


def test_a_run_that_cannot_end_stops_with_a_mismatch():
    with pytest.raises(Mismatch, match=r"after 3 steps.*still unfinished: \['long'\]"):
        run_trace(core(), [TraceRequest("long", 5, 30)], max_steps=3, label="bounded")


class Stuck(Scheduler):
    def schedule(self) -> SchedulerOutput:
        return SchedulerOutput()


def test_a_stall_is_raised_or_recorded_and_ends_the_run():
    with pytest.raises(EngineStalledError):
        run_trace(core(Stuck), [TraceRequest("a", 3)])
    run = run_trace(core(Stuck), [TraceRequest("a", 3)], catch=(EngineStalledError,))
    assert [s.raised for s in run.steps] == ["EngineStalledError"]


def test_an_injected_interrupt_is_recorded_and_the_run_goes_on():
    run = run_trace(core(raise_at={1: "interrupt"}), [TraceRequest("a", 3, 4), TraceRequest("b", 2, 4, 2)],
                    catch=(InjectedInterrupt,))
    assert [s.raised for s in run.steps] == [None, "KeyboardInterrupt"] + [None] * 4
    assert run.steps[1].ended == [("a", "FINISHED_ERROR")] and run.finish_reasons == {"a": "error", "b": "length"}
    with pytest.raises(KeyboardInterrupt):  # not caught unless asked: a real Ctrl-C is never swallowed
        run_trace(core(raise_at={0: "interrupt"}), [TraceRequest("a", 3)])


def test_idle_trace_steps_run_no_engine_step_and_aborts_end_their_request():
    trace = [TraceRequest("a", 3, 2), TraceRequest("b", 3, 8, arrival_step=5, abort_step=7)]
    run = run_trace(core(), trace)
    assert run.joined == {"a": 0, "b": 2}  # a ran steps 0-1; trace steps 2-4 were idle
    assert run.finish_reasons == {"a": "length", "b": "abort"} and len(run.tokens["b"]) == 2
    assert [s.step for s in run.steps] == list(range(len(run.steps))) == list(range(4))
    assert run.aborted_at == {"b": 4.0}  # the fake executor's clock: one second per step


class Leaky(KVCacheManager):
    """Forgets to count one block it hands out."""

    @property
    def num_used_blocks(self) -> int:
        return max(super().num_used_blocks - 1, 0)

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_used_blocks


class WrongStatus(Scheduler):
    """Admits requests but leaves them marked WAITING."""

    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        for req in self.running:
            req.status = type(req.status).WAITING
        return out


def test_every_step_checks_the_pool_and_the_queues_through_the_protocols():
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    leaky = EngineCore(Scheduler(config, Leaky(8, 4)), ModelFreeExecutor(vocab=4))
    with pytest.raises(AssertionError, match="the pool says 1 blocks are in use, but live requests hold 2"):
        run_trace(leaky, [TraceRequest("a", 6, 2)])
    with pytest.raises(StepMismatch, match="status of the requests in running / waiting"):
        run_trace(core(WrongStatus), [TraceRequest("a", 6, 2)])


def test_lock_step_comparison_stops_at_the_first_difference_with_the_state_before_it():
    trace = [TraceRequest("a", 20, 2), TraceRequest("b", 3, 4, 1)]
    expected = Replay(Scheduler, trace, max_num_seqs=2, max_num_batched_tokens=32).finish()

    class OneSeat(Scheduler):  # never admits a second request while one runs
        def schedule(self):
            if self.running:
                self.config.max_num_seqs = 1
            return super().schedule()

    mine = Replay(OneSeat, trace, max_num_seqs=2, max_num_batched_tokens=32)
    with pytest.raises(StepMismatch) as err:
        expect_same_steps(expected, mine, DECISIONS, "one seat", mine.settings())
    text = str(err.value)
    assert text.startswith("one seat: max_num_seqs=2") and "before step 1: running [('a', 1)]" in text
    assert "step 1, batch (request, tokens):\n  expected [('a', 1), ('b', 3)]\n  got      [('a', 1)]" in text
    assert len(mine.steps) == 2  # the run stopped at the step that differed


def test_a_run_that_outlasts_the_expected_one_is_reported_unfinished():
    trace = [TraceRequest("a", 4, 3)]
    shorter = run_trace(core(), [TraceRequest("a", 4, 2)])
    with pytest.raises(Mismatch, match=r"after 2 steps: expected 'every request finished', got \"still unfinished: \['a'\]"):
        expect_same_steps(shorter, TraceRun(core(), trace), ("batch",))
    with pytest.raises(Mismatch, match="expected '3 steps', got '2 steps'"):
        expect_same_steps(run_trace(core(), trace), shorter, ("batch",))


def test_token_comparison_names_the_first_completion_and_token_that_differ():
    with pytest.raises(Mismatch, match="request 'b', first difference at generated token 2"):
        expect_same_tokens({"a": [1, 2], "b": [1, 2, 3]}, {"a": [1, 2], "b": [1, 2, 4]}, "two requests")
    with pytest.raises(Mismatch, match="request 'b', first difference at generated token 0"):
        expect_same_tokens({"b": [5]}, {}, "missing")


def test_the_replay_of_minivllms_scheduler_is_what_the_scheduler_decides():
    """A hand-checked trace: two seats, a 12-token budget (notebook 02's worked example)."""
    steps = run_reference([TraceRequest("A", 5, 3), TraceRequest("B", 6, 2), TraceRequest("C", 8, 2, 1),
                           TraceRequest("D", 2, 1, 1)], max_num_seqs=2, max_num_batched_tokens=12)
    assert [s.batch for s in steps] == [[("A", 5), ("B", 6)], [("A", 1), ("B", 1)], [("A", 1), ("C", 8)],
                                        [("C", 1), ("D", 2)]]
    assert [s.finished for s in steps] == [[], ["B"], ["A"], ["C", "D"]]
    assert steps[2].running == [("A", 1)] and steps[2].waiting == [("C", 8), ("D", 2)]


def test_the_example_in_docs_course_md_runs_and_catches_an_admission_after_a_preemption():
    from minivllm import course
    from minivllm.core.scheduler import Scheduler as MinivllmScheduler

    ex = course.load("ex03_chunked_prefill", solutions=True)
    trace = [TraceRequest("a", 8, 16), TraceRequest("b", 8, 16)]  # 8-token prompts, 16 tokens out
    settings = dict(max_num_seqs=4, max_num_batched_tokens=4, enable_chunked_prefill=True, num_kv_blocks=3)
    expected = Replay(MinivllmScheduler, trace, **settings).finish()
    mine = Replay(ex.ChunkedScheduler, trace, **settings)
    assert len(expect_same_steps(expected, mine, DECISIONS, "3 blocks", mine.settings())) == len(expected.steps)
    assert expected.num_preemptions > 0

    class AdmitsAfterPreempting(ex.ChunkedScheduler):  # the rule broken: admits in a step that preempted
        def schedule(self):
            out = super().schedule()
            if out.preempted and self.waiting:
                req = self.waiting[0]
                table = self.kv.allocate_slots(req, 1)
                if table is not None:
                    self.waiting.popleft()
                    req.status = type(req.status).RUNNING
                    self.running.append(req)
                    out.add(req, 0, 1, table)
                    req.num_computed_tokens = 1
            return out

    with pytest.raises(StepMismatch, match="3 blocks: max_num_seqs=4"):
        expect_same_steps(expected, Replay(AdmitsAfterPreempting, trace, **settings), DECISIONS, "3 blocks",
                          mine.settings())


def test_a_cache_poisoned_until_written_catches_a_backend_that_reads_a_slot_it_does_not_own():
    """``serve_trace(..., poisoned=True)`` fills every layer's cache with NaN before that layer
    writes anything (through the attention protocol: the backend is wrapped). A backend that lets
    the whole cache into its output (here as ``0 * sum``, harmless on finite values) serves the
    trace right on a clean cache and fails it on the poisoned one; minivllm's own does not."""
    from minivllm.attention import get_attention_backend
    from minivllm.course.serving import serve_trace

    class Leaky:
        name = "leaky"

        def __init__(self):
            self.inner = get_attention_backend("torch")

        def forward(self, query, key, value, k_cache, v_cache, meta, scale):
            out = self.inner.forward(query, key, value, k_cache, v_cache, meta, scale)
            return out + 0 * k_cache.sum()

    reference = serve_trace()
    assert serve_trace(poisoned=True).tokens == reference.tokens
    assert serve_trace(Leaky()).tokens == reference.tokens
    poisoned = serve_trace(Leaky(), poisoned=True)
    assert set(poisoned.finish_reasons.values()) == {"error"}
