"""Grade exercise 10 (`pytest -m ex10`): beyond the notebook's cases (`test_cases.py`),
the protocol the checks enforce, and views that refuse what it does not list.

Imports `exercises/ex10_costs.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

import pytest

from minivllm import course
from minivllm.course.loader import has_solutions  # a copy with exercises/ alone reads the stub

NAME = "ex10_costs"


def test_the_exercise_documents_the_protocol_the_checks_enforce():
    """The attribute lists in the exercise file are the ones the checks' views expose."""
    from minivllm.course.checks import ex10_costs as checks

    reference = course.load(NAME, solutions=has_solutions())
    assert reference.MODEL_ATTRIBUTES == checks.MODEL_ATTRIBUTES
    assert reference.HARDWARE_ATTRIBUTES == checks.HARDWARE_ATTRIBUTES


def test_a_view_refuses_what_the_protocol_does_not_list():
    from minivllm.course.checks.ex10_costs import hardware_view, model_view
    from minivllm.sim import get_hardware, preset

    model = model_view(preset("llama-3-8b"))
    assert model.linear_params == preset("llama-3-8b").linear_params
    assert model.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2
    with pytest.raises(AttributeError, match="flops_per_token"):
        model.flops_per_token  # noqa: B018
    with pytest.raises(AttributeError, match="weight_bytes"):
        model.weight_bytes  # noqa: B018  (includes the embedding table, which a step does not stream)
    with pytest.raises(AttributeError, match="read-only"):
        model.num_layers = 1
    with pytest.raises(AttributeError, match="ridge_point"):
        hardware_view(get_hardware("H100")).ridge_point  # noqa: B018


def test_the_worked_examples_in_the_docstrings_are_the_reference_figures():
    """The stubs give one worked example each; the figures they print must be minivllm's."""
    from minivllm.sim import CostModel, get_hardware, preset

    doc = course.load(NAME, solutions=has_solutions())
    m, h100 = preset("llama-3-8b"), get_hardware("H100-SXM")
    step = CostModel(m, h100).decode_step(1, 1000)
    assert f"{step.flops:,.0f} FLOPs" in " ".join(doc.decode_flops.__doc__.split())
    assert f"{step.bytes:,.0f} bytes" in " ".join(doc.decode_bytes.__doc__.split())
    assert f"takes {1000 * step.time:.2f} ms, and is {step.bound}-bound" in " ".join(doc.decode_step_time.__doc__.split())
