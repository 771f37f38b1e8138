"""Exercise 10: what a token costs, from the roofline of one decode step.

Notebook: notebooks/10_cost_frontiers.ipynb. Check your work with
``course.check(course.load("ex10_costs"))`` there, or ``pytest -m ex10``.

A decode step gives every sequence in the batch one new token. To do that the GPU must read
every weight once (shared by the whole batch), read every sequence's KV cache (not shared), and
multiply each sequence's new token through the weights. Whichever of "move the bytes" and "do
the FLOPs" takes longer on a given card sets the step time; the batch shares that time, and the
card's hourly price turns it into dollars.

The functions take a model description and a GPU description, the simulator's ``ModelSpec``
and ``Hardware`` (``minivllm.sim.preset(...)``, ``minivllm.sim.get_hardware(...)``). They may
read only the attributes listed in ``MODEL_ATTRIBUTES`` and ``HARDWARE_ATTRIBUTES``: the
checks hand them objects that have nothing else, so that the roofline is yours, not the
simulator's.
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.sim import CostModel

NOTEBOOK = "notebooks/10_cost_frontiers.ipynb"

# What a model description offers (a ModelSpec has more; the checks pass only these):
MODEL_ATTRIBUTES = (
    "name",
    "num_layers",  # decoder layers
    "hidden_size",
    "num_heads",  # query heads per layer
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "linear_params",  # weights of the decoder blocks' matmuls (q, k, v, o, gate, up, down), all layers
    "body_weight_bytes",  # bytes of those weights as stored (quantised or not), plus the norms
    "lm_head_bytes",  # bytes of the output projection (hidden_size x vocab_size, 16-bit)
    "kv_bytes_per_token",  # a method: K and V of one token, all layers, in the KV cache's dtype
    "weight_dtype",
    "kv_dtype",
)
# What a GPU description offers:
HARDWARE_ATTRIBUTES = ("name", "memory_bytes", "memory_bandwidth", "peak_flops", "usd_per_hour")

SECONDS_PER_HOUR = 3600


@dataclass(frozen=True)
class Assumptions:
    """How close to the datasheet a real step gets. Defaults: the simulator's own."""

    flops_efficiency: float = CostModel.flops_efficiency  # achievable share of peak FLOP/s
    bandwidth_efficiency: float = CostModel.bandwidth_efficiency  # achievable share of bandwidth
    step_overhead_s: float = CostModel.step_overhead_s  # paid by every step: launches, sampler, CPU


@dataclass(frozen=True)
class QueryCost:
    latency_s: float  # from the query's first thinking token to its last
    gpu_seconds: float  # GPU time the query is charged: the batch shares every step
    usd: float  # what those GPU-seconds cost


def decode_flops(model, batch_size: int, context_len: int) -> float:
    """Floating-point operations of one decode step.

    ``batch_size`` sequences each hold ``context_len`` tokens in their KV cache, compute one
    new token, and sample from it. Per sequence, count:

    * 2 FLOPs (a multiply and an add) for every weight of the decoder blocks' matmuls;
    * attention: the new query meets ``context_len + 1`` keys (its own included); each
      (query, key) pair costs ``2 * head_dim`` FLOPs for the score and ``2 * head_dim`` for
      weighting the value, in every query head of every layer;
    * the LM head: one ``hidden_size x vocab_size`` matmul for the sampled token.
    """
    # BEGIN SOLUTION
    matmuls = 2 * model.linear_params
    attention = 4 * model.num_layers * model.num_heads * model.head_dim * (context_len + 1)
    lm_head = 2 * model.hidden_size * model.vocab_size
    return float(batch_size * (matmuls + attention + lm_head))
    # END SOLUTION


def decode_bytes(model, batch_size: int, context_len: int) -> float:
    """Bytes one decode step moves between device memory and the chip.

    * The weights, streamed once per step: the decoder blocks with their norms, and the LM
      head. The token-embedding table is not streamed (a step gathers only its tokens' rows).
    * Each sequence's K and V: its ``context_len`` cached tokens and its new token, read once.
    * Each sequence's new K and V, written once.
    """
    # BEGIN SOLUTION
    weights = model.body_weight_bytes + model.lm_head_bytes
    kv = model.kv_bytes_per_token()
    kv_read = batch_size * (context_len + 1) * kv
    kv_written = batch_size * kv
    return float(weights + kv_read + kv_written)
    # END SOLUTION


def decode_step_time(
    model, hardware, batch_size: int, context_len: int, assumptions: Assumptions = Assumptions()
) -> float:
    """Seconds one decode step takes on ``hardware``.

    The card reaches ``assumptions.flops_efficiency`` of its ``peak_flops`` and
    ``assumptions.bandwidth_efficiency`` of its ``memory_bandwidth``. Arithmetic and memory
    traffic overlap perfectly within a step. Every step also pays ``step_overhead_s``.
    """
    # BEGIN SOLUTION
    compute = decode_flops(model, batch_size, context_len) / (hardware.peak_flops * assumptions.flops_efficiency)
    memory = decode_bytes(model, batch_size, context_len) / (
        hardware.memory_bandwidth * assumptions.bandwidth_efficiency
    )
    return max(compute, memory) + assumptions.step_overhead_s
    # END SOLUTION


def decode_tokens_per_s(
    model, hardware, batch_size: int, context_len: int, assumptions: Assumptions = Assumptions()
) -> float:
    """Output tokens per second of a steady, full decode batch (what one GPU produces)."""
    # BEGIN SOLUTION
    return batch_size / decode_step_time(model, hardware, batch_size, context_len, assumptions)
    # END SOLUTION


def tokens_per_usd(tokens_per_s: float, usd_per_hour: float) -> float:
    """Output tokens one dollar buys from a GPU rented at ``usd_per_hour`` that produces
    ``tokens_per_s``. Raise ``ValueError`` unless the price is above zero."""
    # BEGIN SOLUTION
    if not usd_per_hour > 0:
        raise ValueError(f"usd_per_hour must be > 0, got {usd_per_hour}")
    return tokens_per_s * SECONDS_PER_HOUR / usd_per_hour
    # END SOLUTION


def reasoning_query_cost(
    model,
    hardware,
    batch_size: int,
    prompt_len: int,
    think_tokens: int,
    assumptions: Assumptions = Assumptions(),
) -> QueryCost:
    """What one long reasoning query costs when ``batch_size`` of them decode side by side.

    The queries start together with ``prompt_len`` tokens in their caches (their prefill is
    left out: one step, small next to thousands of decode steps) and generate
    ``think_tokens`` tokens each, one per step; in step ``i`` (from 0) each holds
    ``prompt_len + i`` cached tokens. The batch shares the GPU, so each query is charged an
    equal share of the time, at ``hardware.usd_per_hour``.
    """
    # BEGIN SOLUTION
    latency = 0.0
    for i in range(think_tokens):
        latency += decode_step_time(model, hardware, batch_size, prompt_len + i, assumptions)
    gpu_seconds = latency / batch_size
    return QueryCost(latency, gpu_seconds, gpu_seconds * hardware.usd_per_hour / SECONDS_PER_HOUR)
    # END SOLUTION
