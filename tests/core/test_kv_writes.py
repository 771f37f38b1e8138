"""No request ever reads K/V that was not written for it.

A fake executor samples random tokens; :class:`~minivllm.core.kv_write_tracker.KVWriteTracker`
(what ``debug_checks=True`` runs) shadows every cache slot and checks each step's reads against
what earlier steps, and this step, wrote. Random traces cover FCFS and priority, chunked prefill,
prefix caching with shared prompts, copy-on-write forks (n > 1), static batching, pools small
enough to preempt, and random aborts. Beam search runs the same check on the real engine in
``tests/engine/test_beam_search.py`` (``debug_checks=True``).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.config import EngineArgs, build_scheduler
from minivllm.core.engine_core import EngineCore
from minivllm.core.interfaces import ModelRunnerOutput
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.kv_write_tracker import KVWriteTracker
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams


class RandomTokens:
    """An executor without a model: every sampling request (and fork) gets a random token."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def execute(self, out) -> ModelRunnerOutput:
        sampled = {r.request_id: [self.rng.randrange(4)] for r in out.sampling_requests}
        for leader, kids in out.forks.items():
            if leader in sampled:
                sampled.update((k.request_id, [self.rng.randrange(4)]) for k in kids)
        return ModelRunnerOutput(new_token_ids=sampled)


PREFIXES = ([], [1, 2, 3, 1, 2, 3, 1, 2], [5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 3, 3])


@st.composite
def workloads(draw):
    n = draw(st.integers(2, 10))
    requests = []
    for i in range(n):
        prefix = PREFIXES[draw(st.integers(0, len(PREFIXES) - 1))]
        tail = draw(st.lists(st.integers(0, 3), min_size=1, max_size=14))
        requests.append(dict(
            rid=f"r{i}", prompt=prefix + tail, max_tokens=draw(st.integers(1, 12)),
            n=draw(st.sampled_from([1, 1, 1, 2, 3])), priority=draw(st.integers(0, 3)),
            arrival_step=draw(st.integers(0, 6)), abort_step=draw(st.sampled_from([None] * 4 + [2, 5])),
        ))
    return requests


CONFIGS = st.fixed_dictionaries(dict(
    scheduler=st.sampled_from(["continuous", "continuous", "static"]),
    scheduling_policy=st.sampled_from(["fcfs", "priority"]),
    enable_chunked_prefill=st.booleans(),
    num_kv_blocks=st.integers(16, 40),  # the engine guarantees room for one max_model_len=64
    max_num_batched_tokens=st.sampled_from([4, 7, 16, 24, 64]),
    max_num_seqs=st.integers(1, 8),
))


def run_checked(requests, config, seed) -> EngineCore:
    static = config["scheduler"] == "static"
    args = EngineArgs(
        block_size=4, max_model_len=64,
        enable_prefix_caching=not static,
        **{**config, "scheduling_policy": "fcfs" if static else config["scheduling_policy"],
           "enable_chunked_prefill": config["enable_chunked_prefill"] or static,
           "max_num_batched_tokens": 64 if (static or not config["enable_chunked_prefill"])
           else config["max_num_batched_tokens"]},
    )
    core = EngineCore(build_scheduler(args, 64, lambda: args.num_kv_blocks), RandomTokens(seed),
                      clock=lambda: 0.0, debug_checks=True)
    step = 0
    pending = sorted(requests, key=lambda r: r["arrival_step"])
    while pending or core.has_unfinished_requests():
        while pending and pending[0]["arrival_step"] <= step:
            r = pending.pop(0)
            params = SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, temperature=0)
            kids = [Request(f"{r['rid']}#{i}", r["prompt"], params, priority=r["priority"],
                            arrival_time=float(step)) for i in range(r["n"])]
            core.add_request(kids[0], kids[1:])
        for r in requests:
            if r["abort_step"] == step:
                core.abort_requests([f"{r['rid']}#{i}" for i in range(r["n"])])
        core.step()
        step += 1
        assert step < 2000, "the trace did not finish"
    return core


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=workloads(), config=CONFIGS, seed=st.integers(0, 1000))
def test_every_read_was_written_for_the_reader(requests, config, seed):
    core = run_checked(requests, config, seed)
    assert core.kv.num_used_blocks == 0, "blocks leaked"
    assert not core.scheduler.requests, "requests left behind"
    computed = core.stats.summary()["prefill_tokens"]  # 0 when every request was aborted on arrival
    assert (core.kv_write_tracker.num_checked_reads > 0) == (computed > 0)


class EagerRegistrationKV(KVCacheManager):
    """The old behaviour: full blocks join the prefix cache as soon as they are allocated,
    before the step that writes them has run."""

    def allocate_slots(self, request, num_new_tokens, new_computed_blocks=(), num_lookahead_tokens=0):
        table = super().allocate_slots(request, num_new_tokens, new_computed_blocks, num_lookahead_tokens)
        if table is not None:
            end = request.num_computed_tokens + len(new_computed_blocks) * self.block_size + num_new_tokens
            self._cache_full_blocks(request, self.req_to_blocks[request.request_id], end)
            self._filled_this_step = []
        return table


def priority_preemption_after_a_prefix_hit(kv) -> list[str]:
    """A long prompt is computed in chunks; in its second step a more important request with
    the same prefix is admitted, then a third request outranks the first and preempts it out
    of the step. Returns what the tracker reports (nothing when correct)."""
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=14, max_model_len=64, policy="priority")
    sched = Scheduler(cfg, kv)
    tracker = KVWriteTracker(kv.block_size)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    prefix = list(range(10, 26))  # 16 tokens: 4 blocks of 4
    problems = []

    def step():
        out = sched.schedule()
        try:
            tracker.check_step(out)
        except AssertionError as err:
            problems.append(str(err))
        sched.update_from_output(out, {r.request_id: [1] for r in out.sampling_requests})
        return out

    sched.add_request(Request("long", prefix + [1, 2, 3], params, priority=9, arrival_time=0.0))
    step()  # "long" computes its first 14 tokens
    sched.add_request(Request("same-prefix", prefix + [7], params, priority=1, arrival_time=1.0))
    sched.add_request(Request("urgent", list(range(40, 52)), params, priority=2, arrival_time=1.0))
    out = step()
    assert [r.request_id for r in out.preempted] == ["long"], out
    return problems


def test_the_tracker_catches_blocks_shared_before_they_are_written():
    problems = priority_preemption_after_a_prefix_hit(EagerRegistrationKV(num_blocks=7, block_size=4))
    assert problems and "same-prefix" in problems[0] and "never written" in problems[0]


def test_blocks_are_shared_only_once_written():
    kv = KVCacheManager(num_blocks=7, block_size=4)
    assert priority_preemption_after_a_prefix_hit(kv) == []


def test_a_failed_step_registers_nothing():
    """The executor raises: the step's requests end with an error and the blocks the step was
    filling are not offered as prefix hits afterwards."""

    class Exploding(RandomTokens):
        def execute(self, out):
            raise RuntimeError("device lost")

    args = EngineArgs(block_size=4, max_model_len=64, num_kv_blocks=16)
    core = EngineCore(build_scheduler(args, 64, lambda: 16), Exploding(0), clock=lambda: 0.0)
    prompt = list(range(12))
    core.add_request(Request("a", prompt, SamplingParams(max_tokens=2)))
    out = core.step()
    assert out.failed == {"a": "RuntimeError: device lost"}
    assert out.finish_reasons == {"a": "error"}
    assert core.kv.num_used_blocks == 0 and not core.kv.block_pool.cached_blocks
    assert core.kv.get_computed_blocks(Request("b", prompt + [1]))[1] == 0


def test_an_executor_output_of_the_wrong_shape_fails_its_step_naming_the_request():
    """A bare token where ``new_token_ids`` holds a list per request: the step fails as if the
    executor had raised (its requests end with an error that names the field and the request),
    nothing of it is appended or registered, and a request outside the step goes on."""

    class BareTokens(RandomTokens):
        def execute(self, out):
            result = super().execute(out)
            if "bad" in result.new_token_ids:
                result.new_token_ids["bad"] = result.new_token_ids["bad"][0]
            return result

    args = EngineArgs(block_size=4, max_model_len=64, num_kv_blocks=16, max_num_seqs=1)
    core = EngineCore(build_scheduler(args, 64, lambda: 16), BareTokens(0), clock=lambda: 0.0)
    bad = Request("bad", list(range(6)), SamplingParams(max_tokens=2))
    good = Request("good", list(range(7)), SamplingParams(max_tokens=2, ignore_eos=True))
    core.add_request(bad)
    core.add_request(good)  # one seat: it waits outside the failing step
    out = core.step()
    assert list(out.failed) == ["bad"] and "new_token_ids['bad'] must be a list" in out.failed["bad"]
    assert out.failed["bad"].startswith("TypeError")
    assert bad.status is RequestStatus.FINISHED_ERROR and bad.output_token_ids == []
    while core.has_unfinished_requests():
        core.step()
    assert good.status is RequestStatus.FINISHED_LENGTH_CAPPED and len(good.output_token_ids) == 2
    assert core.kv.num_used_blocks == 0


def test_tokens_for_a_request_that_does_not_sample_fail_the_step_naming_it():
    """An executor that returns tokens for a request the plan does not sample (a waiting one, an
    unknown id): the step fails as if the executor had raised, naming the request, and nothing
    of it is appended; the request outside the step goes on."""

    class Stray(RandomTokens):
        def execute(self, out):
            result = super().execute(out)
            result.new_token_ids["ghost"] = [1]
            return result

    args = EngineArgs(block_size=4, max_model_len=64, num_kv_blocks=16, max_num_seqs=1)
    core = EngineCore(build_scheduler(args, 64, lambda: 16), Stray(0), clock=lambda: 0.0)
    first = Request("first", list(range(6)), SamplingParams(max_tokens=2))
    core.add_request(first)
    core.add_request(Request("ghost", list(range(5)), SamplingParams(max_tokens=2)))  # waits: one seat
    out = core.step()
    assert list(out.failed) == ["first"] and "['ghost']" in out.failed["first"]
    assert out.failed["first"].startswith("ValueError") and first.output_token_ids == []
    assert core.has_unfinished_requests() and core.kv.num_used_blocks == 0
