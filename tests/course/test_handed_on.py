"""A part graded on its own: an answer that hands the part on to minivllm's own implementation --
subclasses it, builds one inside, calls its functions, or binds the exercise's name to it --
fails its exercise, for every exercise from 02 on, with a message that names the line and the
import (``minivllm/course/handed_on.py`` reads the file before grading; the engine knows nothing
of it). Each answer below is the reference solution with the part rebound to minivllm's. Were the
file not read, ex06's and ex09's would pass every case, and ex02's and ex11's all but one."""

from __future__ import annotations

import pytest

from minivllm import course
from minivllm.course.grading import FAIL, PASS, run_cases
from minivllm.course.handed_on import OWN_IMPLEMENTATIONS, find_hand_offs
from minivllm.course.loader import load_path

ROOT = course.course_root()

HANDED_ON = {
    "ex02_continuous": '''
from minivllm.core.scheduler import Scheduler


class ContinuousScheduler(Scheduler):  # every decision minivllm's
    pass
''',
    "ex03_chunked_prefill": '''
from minivllm.core.scheduler import Scheduler


class ChunkedScheduler(ContinuousScheduler):
    def schedule(self):
        inner = getattr(self, "_inner", None)
        if inner is None:
            inner = self._inner = Scheduler(self.config, self.kv)
        inner.running, inner.requests = self.running, self.requests
        return inner.schedule()
''',
    "ex04_block_allocator": '''
from minivllm.core.kv_cache_manager import KVCacheManager


class PagedKVCacheManager(KVCacheManager):
    def __init__(self, num_blocks: int, block_size: int = 16):
        super().__init__(num_blocks, block_size, enable_caching=False)
''',
    "ex05_paged_attention_ref": '''
from minivllm.attention.torch_ragged import TorchAttentionBackend


class PagedAttentionBackend:
    name = "handed-on"

    def __init__(self):
        self.inner = TorchAttentionBackend()

    def forward(self, query, key, value, k_cache, v_cache, meta, scale):
        return self.inner.forward(query, key, value, k_cache, v_cache, meta, scale)
''',
    "ex06_triton_kernel": '''
from minivllm.attention.triton_decode import paged_decode_attention as paged_decode  # noqa: F811
''',
    "ex07_prefix_cache": '''
from minivllm.core.kv_cache_manager import KVCacheManager


class PrefixCachingKVCacheManager(KVCacheManager):
    def cached_block_ids(self):
        return {b.block_id for b in self.block_pool.cached_blocks.values()}
''',
    "ex08_engine_step": '''
from minivllm.core.engine_core import EngineCore


class StepLoop(EngineCoreBase):
    def run_step(self, choose_tokens=None):
        return EngineCore.run_step(self, choose_tokens)
''',
    "ex09_reasoning": '''
from minivllm.core.policies import PriorityPolicy


class ChatFirstPolicy:
    name = "handed-on"

    def __init__(self):
        self.inner = PriorityPolicy()

    def waiting_key(self, request):
        long = request.sampling_params.max_tokens is None or request.sampling_params.max_tokens > 2048
        return (request.priority, long, *self.inner.waiting_key(request)[1:])

    def choose_victim(self, running):
        return max(running, key=self.waiting_key)

    def may_preempt(self, incoming, victim):
        return self.waiting_key(incoming) < self.waiting_key(victim)
''',
    "ex10_costs": '''
from minivllm.sim.cost_model import CostModel


def decode_step_time(model, hardware, batch_size, context_len, assumptions=Assumptions()):  # noqa: F811
    return CostModel(model, hardware, assumptions.flops_efficiency, assumptions.bandwidth_efficiency,
                     assumptions.step_overhead_s).decode_step(batch_size, context_len).time
''',
    "ex11_spec_verify": '''
from minivllm.spec_decode.rejection import verify as verify_step  # noqa: F811
''',
}


def test_every_exercise_that_writes_a_part_has_a_handed_on_answer():
    assert set(HANDED_ON) == set(OWN_IMPLEMENTATIONS)


@pytest.mark.parametrize("name", sorted(HANDED_ON))
def test_an_answer_that_hands_the_part_on_fails(name, tmp_path):
    path = tmp_path / f"{name}.py"
    path.write_text((ROOT / "solutions" / f"{name}.py").read_text() + "\n" + HANDED_ON[name])
    module = load_path(path, name, "handed_on")
    report = run_cases(name, module, course.cases_for(name), "handed on")
    failed = [r for r in report.results if r.status == FAIL]
    assert failed, f"no case noticed that {name}'s answer hands its part on"
    assert all(r.status == FAIL for r in report.results)  # refused before anything ran
    message = report.results[0].message
    assert "minivllm's own" in message and "import" in message, message
    assert not any(r.status == PASS for r in report.results)


# The ways around a check that watched the call stack while the code ran, each refused by reading
# the file: the class compiled under another file name, the work done on another thread, the name
# bound by assignment, the module imported by name.
OTHER_ROUTES = {
    "exec": ("ex02_continuous", '''
exec(compile("from minivllm.core.scheduler import Scheduler as _S\\nclass ContinuousScheduler(_S): pass",
             "elsewhere.py", "exec"))
'''),
    "thread": ("ex11_spec_verify", '''
import concurrent.futures
from minivllm.spec_decode import rejection


def verify_step(*args, **kwargs):  # noqa: F811
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(rejection.verify, *args, **kwargs).result()
'''),
    "alias": ("ex02_continuous", '''
import minivllm.core.scheduler

ContinuousScheduler = minivllm.core.scheduler.Scheduler
'''),
    "import_module": ("ex09_reasoning", '''
import importlib

_policies = importlib.import_module("minivllm.core.policies")
ChatFirstPolicy = getattr(_policies, "PriorityPolicy")
'''),
}


@pytest.mark.parametrize("route", sorted(OTHER_ROUTES))
def test_other_routes_to_minivllms_part_are_refused(route, tmp_path):
    name, tail = OTHER_ROUTES[route]
    source = (ROOT / "solutions" / f"{name}.py").read_text() + "\n" + tail
    found = find_hand_offs(source, name)
    assert found, f"{route}: not refused"
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    report = run_cases(name, load_path(path, name, "handed_on"), course.cases_for(name)[:2], "handed on")
    assert all(r.status == FAIL and "minivllm's own" in r.message for r in report.results)


def test_a_constant_of_minivllms_class_and_the_reference_solutions_are_not_refused():
    """Reading a shared default (``CostModel.flops_efficiency``) is not handing the work on; no
    reference solution, stub or alternative answer reaches its part."""
    source = "from minivllm.sim import CostModel\n\nEFFICIENCY = CostModel.flops_efficiency\n"
    assert find_hand_offs(source, "ex10_costs") == []
    assert find_hand_offs(source + "model = CostModel(None, None)\n", "ex10_costs")
    for name in OWN_IMPLEMENTATIONS:
        for folder in ("solutions", "exercises"):
            assert find_hand_offs((ROOT / folder / f"{name}.py").read_text(), name) == [], (folder, name)
        alternative = ROOT / "tests" / "course" / "alternatives" / f"{name}.py"
        if alternative.exists():
            assert find_hand_offs(alternative.read_text(), name) == [], alternative
