# This file is generated from solutions/ex00_kv_memory.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex00` or `pytest -m ex00`. Stuck? `course.hint("ex00")` in the
# notebook (or `minivllm hint ex00`) gives a hint, one at a time.
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
    raise NotImplementedError("ex00 kv_bytes_per_token: Bytes of K and V that one token adds to the cache, summed over all layers. Yours to write; stuck? course.hint('ex00') (notebooks/00_setup_and_tour.ipynb)")


def kv_bytes_per_sequence(config: dict, dtype: str, num_tokens: int, block_size: int | None = None) -> int:
    """Bytes of cache one sequence of ``num_tokens`` tokens occupies.

    Without ``block_size`` the cache stores exactly ``num_tokens`` tokens. With it, the cache
    hands out memory in whole blocks of ``block_size`` token slots, as a paged cache does.
    """
    raise NotImplementedError("ex00 kv_bytes_per_sequence: Bytes of cache one sequence of ``num_tokens`` tokens occupies. Yours to write; stuck? course.hint('ex00') (notebooks/00_setup_and_tour.ipynb)")


def decode_intensity(batch_size: int, num_params: float, weight_bytes: float, kv_bytes_per_seq: float = 0) -> float:
    """Arithmetic intensity (FLOPs per byte moved from memory) of one decode step.

    One step produces one token for each of ``batch_size`` sequences. Count
    ``2 * num_params`` FLOPs per sequence (a multiply and an add per weight); count the bytes
    as the weights read once for the whole batch (``num_params * weight_bytes``) plus each
    sequence's KV cache read once (``kv_bytes_per_seq`` per sequence).
    """
    raise NotImplementedError("ex00 decode_intensity: Arithmetic intensity (FLOPs per byte moved from memory) of one decode step. Yours to write; stuck? course.hint('ex00') (notebooks/00_setup_and_tour.ipynb)")


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
    raise NotImplementedError("ex00 crossover_batch: The smallest batch size at which a decode step is compute-bound, or ``None`` if none is. Yours to write; stuck? course.hint('ex00') (notebooks/00_setup_and_tour.ipynb)")
