"""``dtype="auto"``: one rule for the engine and the notebooks, decided by the compute capability.

A T4 (sm_75) says ``torch.cuda.is_bf16_supported() == True`` (torch emulates bfloat16 there), yet
has no bfloat16 arithmetic: float16 is its number format. The device is faked here so that the
rule is checked on a machine without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.course.runtime import engine_dtype
from minivllm.model.loader import auto_dtype, resolve_dtype

CUDA = torch.device("cuda")


def fake_gpu(monkeypatch, capability: tuple[int, int]) -> list:
    """Make torch report one CUDA device of ``capability`` (and bfloat16 "supported", as a T4
    does). Returns the list of devices the capability was asked for."""
    asked = []

    def get_device_capability(device=None):
        asked.append(device)
        return capability

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", get_device_capability)
    return asked


@pytest.mark.parametrize("capability, expected", [
    ((7, 5), torch.float16),  # T4: bfloat16 only emulated
    ((7, 0), torch.float16),  # V100
    ((8, 0), torch.bfloat16),  # A100
    ((8, 9), torch.bfloat16),  # L4
    ((9, 0), torch.bfloat16),  # H100 / H200
])
def test_auto_follows_the_compute_capability(monkeypatch, capability, expected):
    asked = fake_gpu(monkeypatch, capability)
    assert auto_dtype(CUDA) == expected
    assert resolve_dtype("auto", CUDA) == expected
    assert resolve_dtype("auto", torch.device("cuda:1")) == expected
    assert asked[-1] == torch.device("cuda:1"), "the capability of the device in use, not of device 0"
    # the notebooks' setup cell and the exercise checks name the same dtype
    assert engine_dtype("cuda") == str(expected).removeprefix("torch.")


def test_cpu_is_float32_and_explicit_names_win(monkeypatch):
    fake_gpu(monkeypatch, (7, 5))
    assert auto_dtype(torch.device("cpu")) == torch.float32
    assert engine_dtype("cpu") == "float32"
    assert resolve_dtype("bfloat16", CUDA) == torch.bfloat16  # asked for explicitly: given
    assert resolve_dtype(torch.float16, torch.device("cpu")) == torch.float16


def test_unknown_name_is_refused():
    with pytest.raises(ValueError, match="dtype='float8' is not one of auto"):
        resolve_dtype("float8", torch.device("cpu"))
