"""The 8-bit KV cache (``kv_cache_dtype="int8"``): how a token's K or V row is stored, in plain PyTorch.

Layout. Each layer keeps one ``torch.int8`` tensor for K and one for V, shaped
``[num_blocks, block_size, num_kv_heads, head_dim + 4]``. The row of one token and one KV head
is its ``head_dim`` codes followed by the 4 bytes of a float32 *scale*::

    row = [c_0, c_1, ..., c_{head_dim-1}, s_byte0, s_byte1, s_byte2, s_byte3]
    x_i ~= c_i * s,   s = max_i |x_i| * (1/127),   c_i = round(x_i / s) clamped to [-127, 127]

(symmetric quantisation in float32, round half to even; an all-zero row gets ``s = 0`` and
codes 0, so it dequantises to exact zeros). Each element is off by at most ``s / 2`` (plus the
float32 rounding of ``x_i / s``). The scale is a product by the float32 constant ``1/127`` and the
code a correctly rounded division, so that the Triton writer, on a GPU too, stores the very
same bytes as these functions.

Why this shape:

* one tensor per K and V keeps everything that handles caches unchanged: the backend protocol
  ``forward(q, k, v, k_cache, v_cache, meta, scale)``, copy-on-write ``copy_blocks`` (it copies
  whole rows, scales included), the gathers through block tables and slots;
* a scale per token and KV head (not per block): a token's row is written once, when the token
  is computed, and never touched again when later tokens of its block arrive; no re-scaling;
* the scale sits next to its codes, so reading a slot reads its scale too (one more 4-byte word
  per ``head_dim`` bytes: 3% more for ``head_dim=128``, 12.5% for 32).

``head_dim`` must be a multiple of 4 so that the scale is an aligned float32 (a view of the
row's last 4 bytes, no copy). These functions are what the ``"torch"`` backend runs, and the
reference the Triton kernels (``triton_cache.py``, ``triton_decode.py``) are tested against.
"""

from __future__ import annotations

import torch

# How each non-"auto" value of the engine argument kv_cache_dtype is stored ("auto": in the model's
# dtype). minivllm.config owns the argument's names (KV_CACHE_DTYPES, checked without torch);
# a test checks that they are "auto" and these keys.
CACHE_STORAGE = {"int8": torch.int8}
SCALE_BYTES = 4  # one float32 per row
QMAX = 127  # codes lie in [-127, 127]: symmetric, -128 is never written
INT8_BACKENDS = ("cpp", "torch", "triton")  # the built-in backends that read an int8 cache


def int8_row_width(head_dim: int) -> int:
    """Bytes of one token's row per KV head in an int8 cache: the codes and the scale."""
    check_int8_head_dim(head_dim)
    return head_dim + SCALE_BYTES


def check_int8_head_dim(head_dim: int) -> None:
    """The float32 scale after the codes must be 4-byte aligned: ``head_dim % 4 == 0``."""
    if head_dim % SCALE_BYTES:
        raise ValueError(
            f"kv_cache_dtype='int8' needs head_dim to be a multiple of {SCALE_BYTES} (the float32 "
            f"scale after each row's codes must be aligned), got head_dim={head_dim}; use "
            "kv_cache_dtype='auto' for this model"
        )


def check_cache_dtype(backend: str, dtype: torch.dtype, int8: bool) -> None:
    """``ValueError`` unless ``backend`` reads a cache of ``dtype``: a floating-point format, or
    ``torch.int8`` (an 8-bit cache) when ``int8``."""
    if dtype == torch.int8:
        if not int8:
            raise ValueError(
                f"attention_backend={backend!r} cannot read an 8-bit KV cache (kv_cache_dtype='int8'); "
                f"the backends that can: {INT8_BACKENDS}"
            )
        return
    if not dtype.is_floating_point:
        raise ValueError(
            f"attention_backend={backend!r}: a KV cache of {dtype} is neither a float format nor int8"
        )


def is_int8_cache(cache: torch.Tensor) -> bool:
    return cache.dtype == torch.int8


INV_QMAX = 1.0 / QMAX  # rounded to float32 where it multiplies a float32 tensor


def row_scales(x: torch.Tensor) -> torch.Tensor:
    """``[..., 1]`` float32: ``max |x| * (1/127)`` over the last dimension (0 for an all-zero row)."""
    return x.float().abs().amax(dim=-1, keepdim=True) * INV_QMAX


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """``[..., head_dim]`` floats -> ``[..., head_dim + 4]`` int8: codes, then the scale's bytes.

    Computed in float32 whatever ``x``'s dtype (float16 and bfloat16 convert exactly)."""
    head_dim = x.shape[-1]
    check_int8_head_dim(head_dim)
    xf = x.float()
    scale = row_scales(xf)
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: 0 / 1 = 0
    codes = torch.round(xf / divisor).clamp_(-QMAX, QMAX).to(torch.int8)
    return torch.cat([codes, scale.view(torch.int8)], dim=-1)


def split_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., head_dim + 4]`` int8 -> ``(codes [..., head_dim] int8, scales [..., 1] float32)``,
    both views of ``rows`` (no copy)."""
    if rows.dtype != torch.int8:
        raise TypeError(f"an int8 KV row is stored as torch.int8, got {rows.dtype}")
    head_dim = rows.shape[-1] - SCALE_BYTES
    return rows[..., :head_dim], rows[..., head_dim:].view(torch.float32)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[..., head_dim + 4]`` int8 -> ``[..., head_dim]`` in ``dtype``: ``code * scale`` computed
    in float32 (one rounding of the exact product), then rounded to ``dtype``. The Triton kernels
    dequantise the same way."""
    codes, scales = split_rows(rows)
    return (codes.float() * scales).to(dtype)


def round_trip(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x`` as an int8 cache gives it back: ``dequantize_rows(quantize_rows(x))`` in ``dtype``
    (default ``x``'s)."""
    return dequantize_rows(quantize_rows(x), dtype or x.dtype)


def as_cached(x: torch.Tensor, cache: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` (``[..., head_dim]``) rounded exactly as ``cache`` holds it, in ``dtype``: through
    the cache's float format, or through int8 codes and a scale."""
    if is_int8_cache(cache):
        return round_trip(x, dtype)
    return x.to(cache.dtype).to(dtype)


def read_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows gathered from a cache (``[..., head_dim]`` floats or ``[..., head_dim + 4]`` int8),
    as ``[..., head_dim]`` in ``dtype``."""
    if rows.dtype == torch.int8:
        return dequantize_rows(rows, dtype)
    return rows.to(dtype)


def to_cache_rows(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """``x`` (``[..., head_dim]``) in the cache's storage format: cast, or quantised."""
    if is_int8_cache(cache):
        return quantize_rows(x)
    return x.to(cache.dtype)


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of the cache tensors for the engine argument ``kv_cache_dtype``."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype in CACHE_STORAGE:
        return CACHE_STORAGE[kv_cache_dtype]
    raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not one of {('auto', *CACHE_STORAGE)}")
