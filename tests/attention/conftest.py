"""Kernel tests on a GPU without bfloat16 arithmetic (compute capability below 8.0, a T4): the
bfloat16 cases are skipped there, since ``dtype="auto"`` serves float16 on such a card."""

from __future__ import annotations

import pytest
import torch


def _without_bf16() -> str | None:
    """A skip reason when the kernels run on a CUDA GPU that has no bfloat16 arithmetic."""
    if not torch.cuda.is_available():
        return None  # the interpreter computes bfloat16 exactly on a CPU
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) >= (8, 0):
        return None
    return f"bfloat16 needs compute capability 8.0, this GPU has {major}.{minor}: float16 is its format"


def pytest_collection_modifyitems(config, items):
    reason = _without_bf16()
    if reason is None:
        return
    for item in items:
        params = getattr(item, "callspec", None)
        if params is not None and any(value is torch.bfloat16 for value in params.params.values()):
            item.add_marker(pytest.mark.skip(reason=reason))
