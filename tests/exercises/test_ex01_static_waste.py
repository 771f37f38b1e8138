"""Grade exercise 01 (`pytest -m ex01`): beyond the notebook's cases (`test_cases.py`),
random traces (hypothesis): the books agree with the engine's, and every wanted token
is counted once.

Imports `exercises/ex01_static_waste.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.course.checks.ex01_static_waste import books, engine_books

NAME = "ex01_static_waste"


# --- properties over many random traces -----------------------------------------------------------
@st.composite
def traces(draw):
    n = draw(st.integers(1, 16))
    prompts = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    return prompts, outputs, draw(st.integers(1, 9))


@settings(max_examples=60, deadline=None)
@given(traces())
def test_books_match_the_engine_on_any_trace(ex, trace):
    prompts, outputs, batch_size = trace
    assert books(ex.account_static(prompts, outputs, batch_size)) == engine_books(prompts, outputs, batch_size)


@settings(max_examples=60, deadline=None)
@given(traces())
def test_every_wanted_token_is_counted_once(ex, trace):
    prompts, outputs, batch_size = trace
    acc = ex.account_static(prompts, outputs, batch_size)
    # the prefill pass gives each request its first token, the decode rows the rest
    assert acc.decode_rows + len(outputs) == sum(outputs)
    assert acc.prompt_rows == sum(prompts)
    # a batch of one wastes nothing
    alone = ex.account_static(prompts, outputs, 1)
    assert alone.padding_rows == alone.idle_rows == 0
