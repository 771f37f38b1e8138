"""Rotary position embeddings (RoPE), including Llama 3's frequency rescaling.

Each head's vector is split into two halves ``(x1, x2)``; pair ``i`` is rotated by the angle
``position * inv_freq[i]``. This is the "rotate half" layout Hugging Face checkpoints use.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def rope_inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None = None
) -> torch.Tensor:
    """``[head_dim // 2]`` float32 inverse frequencies, rescaled when ``scaling`` is llama3."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    # Llama 3.1: keep high frequencies, divide low frequencies by `factor`, blend in between.
    factor = scaling["factor"]
    low_ff = scaling.get("low_freq_factor", 1.0)
    high_ff = scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen = old_len / low_ff
    high_wavelen = old_len / high_ff
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_ff) / (high_ff - low_ff)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None = None):
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.register_buffer(
            "inv_freq", rope_inverse_frequencies(head_dim, theta, scaling), persistent=False
        )

    def reset_parameters(self) -> None:
        """Recompute ``inv_freq`` in float32 (a model built on the meta device, moved with
        ``to_empty`` and cast to half precision has an uninitialised, half-precision buffer;
        it is not stored in checkpoints)."""
        fresh = rope_inverse_frequencies(self.head_dim, self.theta, self.scaling)
        self.inv_freq = fresh.to(self.inv_freq.device)  # replaces the registered buffer

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions [T]`` -> ``cos, sin [T, head_dim]`` (computed in float32)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [T, heads, head_dim]``, ``cos/sin [T, head_dim]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
