"""Grade exercise 08 (`pytest -m ex08`): beyond the notebook's cases (`test_cases.py`),
random traces (hypothesis) through your step loop and minivllm's `EngineCore`, compared step by
step, with every failure the fake executor can inject.

Imports `exercises/ex08_engine_step.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`. The last case serves the engine assembled from all
your exercises (`minivllm/course/capstone.py`), with the reference standing in for a part that
does not pass its checks yet.
"""

from __future__ import annotations

import types

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm import course
from minivllm.core.engine_core import EngineCore, EngineCoreBase
from minivllm.course.core_replay import (
    VOCAB,
    CoreRequest,
    CoreSetup,
    compare_with_engine_core,
    random_core_trace,
    run_core,
)

NAME = "ex08_engine_step"
PREFIXES = ((), (1, 2, 3, 1, 2, 3, 1, 2), (2, 2, 0, 0, 1, 1, 0, 2, 1, 3, 0, 0))


@st.composite
def traces(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    setup = CoreSetup(  # a pool that holds one sequence of max_model_len, as the engine requires
        num_blocks=draw(st.integers(48 // block_size, 3 * 48 // block_size)),
        block_size=block_size,
        max_model_len=48,
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.sampled_from([3, 8, 16, 64])),
        prefix_caching=draw(st.booleans()),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        seed=draw(st.integers(0, 1000)),
        fail_rows=draw(st.sampled_from([{}, {}, {2: ["q0", "q1"]}, {4: ["q2#0", "q3"]}])),
        raise_at=draw(st.sampled_from([{}, {}, {3: "error"}, {1: "interrupt"}])),
        token_for_failed_rows=draw(st.booleans()),
    )
    trace = []
    for i in range(draw(st.integers(1, 8))):
        prefix = draw(st.sampled_from(PREFIXES))
        tail = tuple(draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10)))
        trace.append(
            CoreRequest(
                f"q{i}",
                prefix + tail,
                draw(st.integers(1, 10)),
                draw(st.integers(0, 6)),
                n=draw(st.sampled_from([1, 1, 2, 3])),
                stop=draw(st.sampled_from([(), (), (3,), (0, 1)])),
                priority=draw(st.integers(0, 2)),
                abort_step=draw(st.sampled_from([None, None, None, 2, 5])),
            )
        )
    return trace, setup


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_any_trace_gives_minivllms_steps(ex, case_input):
    trace, setup = case_input
    compare_with_engine_core(ex, trace, setup)


def test_it_is_an_engine_core_that_leaves_nothing_behind(ex):
    """The student's loop stands on the engine core's base, beside minivllm's loop, not on it."""
    assert issubclass(ex.StepLoop, EngineCoreBase) and not issubclass(ex.StepLoop, EngineCore)
    trace = random_core_trace(3, 8, prefixes=PREFIXES[1:], max_n=3, aborts=True)
    run = run_core(ex.StepLoop, trace, CoreSetup(num_blocks=12, max_num_batched_tokens=8))
    assert run.blocks_in_use == 0
    assert all(r.is_finished for r in run.requests.values())


def test_the_checks_do_not_grade_against_the_solution():
    """minivllm's own EngineCore, handed in as the exercise, passes every unit case: the checks
    test the step's behaviour, not the reference's source."""
    as_exercise = types.SimpleNamespace(StepLoop=EngineCore)
    results = [
        course.grading.run_case(c, as_exercise)
        for c in course.cases_for(NAME)
        if c.func != "StepLoop"
    ]
    assert results and all(r.passed for r in results), [r.message for r in results if not r.passed]


def test_minivllm_engine_core_meets_the_timestamp_definitions():
    from minivllm.course.core_replay import compare_times

    trace = [CoreRequest("one", (1, 2, 3), 1), CoreRequest("two", (0, 1, 2), 3)]
    run = run_core(EngineCore, trace, CoreSetup())
    compare_times(run, run, "minivllm's EngineCore")
