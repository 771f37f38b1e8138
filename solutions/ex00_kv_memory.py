"""Exercise 00: how much memory the KV cache takes, and when decode stops being memory-bound.

Notebook: notebooks/00_setup_and_tour.ipynb. Check your work with
``course.check(course.load("ex00_kv_memory"))`` there, or ``pytest -m ex00``.

Every attention layer keeps, for every token it has seen, one key vector and one value vector
per KV head. Those vectors are what a decode step reads back, so their size decides both how
many sequences fit in memory and how many bytes each step must move.
"""

from __future__ import annotations

import math

NOTEBOOK = "notebooks/00_setup_and_tour.ipynb"

# Bytes per stored number for the dtypes a KV cache is commonly kept in.
DTYPE_BYTES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "int8": 1,
}


def kv_bytes_per_token(config: dict, dtype: str) -> int:
    """Bytes of K and V that one token adds to the cache, summed over all layers.

    ``config`` is a Hugging Face ``config.json`` read into a dict. Use its keys
    ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` (missing means
    plain multi-head attention: as many KV heads as query heads) and ``head_dim`` (missing
    means ``hidden_size // num_attention_heads``). ``dtype`` is a key of ``DTYPE_BYTES``;
    raise ``ValueError`` for any other.
    """
    # BEGIN SOLUTION
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    layers = config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]
    # END SOLUTION


def kv_bytes_per_sequence(config: dict, dtype: str, num_tokens: int, block_size: int | None = None) -> int:
    """Bytes of cache one sequence of ``num_tokens`` tokens occupies.

    Without ``block_size`` the cache stores exactly ``num_tokens`` tokens. With it, the cache
    hands out memory in whole blocks of ``block_size`` token slots, as a paged cache does.
    """
    # BEGIN SOLUTION
    slots = num_tokens
    if block_size is not None:
        slots = -(-num_tokens // block_size) * block_size
    return slots * kv_bytes_per_token(config, dtype)
    # END SOLUTION


def decode_intensity(batch_size: int, num_params: float, weight_bytes: float, kv_bytes_per_seq: float = 0) -> float:
    """Arithmetic intensity (FLOPs per byte moved from memory) of one decode step.

    One step produces one token for each of ``batch_size`` sequences. Count
    ``2 * num_params`` FLOPs per sequence (a multiply and an add per weight); count the bytes
    as the weights read once for the whole batch (``num_params * weight_bytes``) plus each
    sequence's KV cache read once (``kv_bytes_per_seq`` per sequence).
    """
    # BEGIN SOLUTION
    flops = 2 * num_params * batch_size
    moved = num_params * weight_bytes + batch_size * kv_bytes_per_seq
    return flops / moved
    # END SOLUTION


def crossover_batch(
    num_params: float,
    weight_bytes: float,
    peak_flops: float,
    hbm_bandwidth: float,
    kv_bytes_per_seq: float = 0,
) -> int | None:
    """The smallest batch size at which a decode step is compute-bound, or ``None`` if none is.

    A step is compute-bound when its intensity (:func:`decode_intensity`) reaches the
    hardware's ridge point ``peak_flops / hbm_bandwidth`` (reaching it exactly counts). Return
    ``None`` if no batch size, however large, reaches it.
    """
    # BEGIN SOLUTION
    ridge = peak_flops / hbm_bandwidth
    slope = 2 * num_params - ridge * kv_bytes_per_seq
    if slope <= 0:
        return None
    batch = max(1, math.ceil(ridge * num_params * weight_bytes / slope))
    # guard against rounding in the division: step to the exact boundary
    while batch > 1 and decode_intensity(batch - 1, num_params, weight_bytes, kv_bytes_per_seq) >= ridge:
        batch -= 1
    while decode_intensity(batch, num_params, weight_bytes, kv_bytes_per_seq) < ridge:
        batch += 1
    return batch
    # END SOLUTION
