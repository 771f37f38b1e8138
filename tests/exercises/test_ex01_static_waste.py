"""Grade exercise 01 (`pytest -m ex01`): the same cases as `course.check` in the notebook.

Imports `exercises/ex01_static_waste.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

import pytest

from minivllm import course

NAME = "ex01_static_waste"
pytestmark = pytest.mark.ex01


@pytest.fixture(scope="module")
def ex():
    return course.load(NAME)


@pytest.mark.parametrize("case", course.cases_for(NAME), ids=lambda c: f"{c.func}: {c.name}")
def test_case(ex, case):
    course.require(case, ex)


# --- properties over many random batches ------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

lengths = st.lists(st.integers(1, 5000), min_size=1, max_size=64)


@settings(max_examples=60, deadline=None)
@given(lengths)
def test_padding_fraction_bounds(ex, prompt_lens):
    frac = ex.padded_prefill_fraction(prompt_lens)
    assert 1 / len(prompt_lens) <= frac + 1e-12 and frac <= 1.0 + 1e-12
    assert (frac == 1.0) == (len(set(prompt_lens)) == 1)


@settings(max_examples=60, deadline=None)
@given(lengths, st.integers(1, 16))
def test_efficiency_matches_idle_slots_for_one_full_batch(ex, output_lens, extra):
    # one batch with every seat filled: wasted seat-steps are exactly the idle slot-steps
    b = len(output_lens)
    eff = ex.static_batch_efficiency(output_lens, b)
    assert eff == pytest.approx(1 - ex.idle_slot_steps(output_lens) / (b * max(output_lens)))
    # more seats than requests can only lower the efficiency
    assert ex.static_batch_efficiency(output_lens, b + extra) < eff + 1e-12
