"""The per-token operations of a decoder layer, in PyTorch or as the CPU's C++ kernels.

:class:`TorchLayerOps` is the reference the model is read from: RMSNorm as Hugging Face computes
it, rotary embeddings in the "rotate half" layout (:func:`~minivllm.model.rope.apply_rotary`),
and SiLU(gate) * up. It runs on every device. On a CPU each of them is several PyTorch operators,
each with its own pass over memory, temporary and dispatch, and for a small model those cost
more than the arithmetic; :class:`CpuLayerOps` does each in one pass, in C++
(``minivllm/csrc/layer_ops_cpu.h``). :func:`layer_ops_for` picks one when the model is built.
The rotation is the reference's to the bit; RMSNorm and SiLU round differently in the last bits
(a different order of summation, another ``exp``), which ``tests/model/test_layer_ops.py`` bounds.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from minivllm.model.rope import apply_rotary


class LayerOps(Protocol):
    """What the model's layers call; both implementations below have these."""

    name: str

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor: ...

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...


class TorchLayerOps:
    """The PyTorch forms (any device, any dtype)."""

    name = "torch"

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # Hugging Face's order: normalise in float32, cast back, then scale by the weight
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)

    @staticmethod
    def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x [T, heads, head_dim]`` rotated by ``cos, sin [T, head_dim]``."""
        return apply_rotary(x, cos, sin)

    @staticmethod
    def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
        """``gate_up [T, 2I]`` (gate, then up) -> ``silu(gate) * up [T, I]``."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class CpuLayerOps:
    """The same three as C++ kernels, for float32 on a CPU. ``rotary`` rotates ``x`` in place
    (the model's ``x`` is a view of the q/k/v projection's output, used once)."""

    name = "cpu"

    def __init__(self, kernels):
        self.kernels = kernels

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.dim() == 2:
            return self.kernels.rms_norm(x, weight, eps)
        return self.kernels.rms_norm(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        self.kernels.rotary_(x, cos, sin)
        return x

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.kernels.silu_and_mul(gate_up)


def layer_ops_for(device: torch.device, dtype: torch.dtype):
    """:class:`CpuLayerOps` for a float32 model on a CPU where the kernels build
    (:mod:`minivllm.cpu_kernels`; ``MINIVLLM_NO_CPP=1`` declines them), else :class:`TorchLayerOps`."""
    if torch.device(device).type != "cpu" or dtype != torch.float32:
        return TorchLayerOps()
    from minivllm.cpu_kernels import kernel_status, load_kernels

    if kernel_status() is not None:
        return TorchLayerOps()
    return CpuLayerOps(load_kernels())
