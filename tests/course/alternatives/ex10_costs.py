"""Exercise 10: what a token costs, from the roofline of one decode step.

(An alternative correct answer, for tests/course/test_alternatives.py: the FLOPs are counted per
token and per layer before the batch multiplies them; the KV traffic is one term per sequence;
the step's time comes from comparing the step's arithmetic intensity with the card's ridge
point; dollars go through a price per second; a query's charge is summed step by step.)

Notebook: notebooks/10_cost_frontiers.ipynb. Check your work with
``course.check(course.load("ex10_costs"))`` there, or ``pytest -m ex10``.

A decode step gives every sequence in the batch one new token. You derive what it costs from
the model's shape: the arithmetic it does and the bytes it must move, and from those, by the
roofline of notebook 00, how long it takes on a given card; the batch shares that time, and the
card's hourly price turns it into dollars. Each function states its contract and one worked
example; the terms are yours to find.

The functions take a model description and a GPU description, the simulator's ``ModelSpec``
and ``Hardware`` (``minivllm.sim.preset(...)``, ``minivllm.sim.get_hardware(...)``). They may
read only the attributes listed in ``MODEL_ATTRIBUTES`` and ``HARDWARE_ATTRIBUTES``: the
checks hand them objects that have nothing else, so that the roofline is yours, not the
simulator's.
"""

from __future__ import annotations

import math
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

    ``batch_size`` sequences each hold ``context_len`` tokens in their KV cache and compute one
    new token, from the embedding lookup to the logits it is sampled from. Count what the
    roofline counts: multiplications and additions of matrix products (a multiply-add is 2
    FLOPs), including attention's; leave out what is linear in ``hidden_size`` alone (norms,
    activations, rotary embeddings, softmax, sampling) and the embedding lookup (a gather). In
    attention the new token's query meets every cached key and its own. The model's shape is
    in ``MODEL_ATTRIBUTES``; which of its parts does a token pass through, and what does each
    cost?

    Worked example (see ``decode_bytes`` and ``decode_step_time`` for the same step):
    Llama-3-8B, 16-bit, ``batch_size=1``, ``context_len=1000``: 15,534,129,152 FLOPs.
    """

    keys = context_len + 1  # the cached keys and the new token's own
    layers, heads, dim = model.num_layers, model.num_heads, model.head_dim
    scores = 2 * heads * dim * keys  # q . k for every key, every query head of one layer
    mixing = 2 * heads * dim * keys  # the weighted sum of the values, likewise
    per_token = 2 * model.linear_params + layers * (scores + mixing) + 2 * model.vocab_size * model.hidden_size
    return float(per_token * batch_size)


def decode_bytes(model, batch_size: int, context_len: int) -> float:
    """Bytes one decode step moves between device memory and the chip.

    Count what must cross from device memory to the chip, or back, in one step, once each: an
    ideal kernel reads a tensor that every sequence of the batch uses only once per step, and
    caches nothing between steps. Activations stay on chip (leave them out); the token
    embedding is gathered row by row (a few kilobytes: leave it out). The sizes as stored,
    quantised or not, are in ``MODEL_ATTRIBUTES``. A new token's K and V are written to the
    cache and then read by attention like every other cached token.

    Worked example: Llama-3-8B, 16-bit weights and KV cache, ``batch_size=1``,
    ``context_len=1000``: 15,141,183,488 bytes (almost all of it the weights).
    """

    streamed_once = model.lm_head_bytes + model.body_weight_bytes  # shared by the whole batch
    # each sequence reads its context_len cached tokens and its new one, and writes the new one
    per_sequence = (context_len + 2) * model.kv_bytes_per_token()
    return float(streamed_once + per_sequence * batch_size)


def decode_step_time(
    model, hardware, batch_size: int, context_len: int, assumptions: Assumptions = Assumptions()
) -> float:
    """Seconds one decode step takes on ``hardware``, by the roofline.

    The card does arithmetic at ``assumptions.flops_efficiency`` of its ``peak_flops`` and moves
    bytes at ``assumptions.bandwidth_efficiency`` of its ``memory_bandwidth``; within a step the
    two overlap perfectly. Every step also pays ``assumptions.step_overhead_s`` (kernel
    launches, sampling, the CPU's share).

    Worked example: the step of ``decode_flops``' example on an H100-SXM with the default
    ``Assumptions()`` takes 6.15 ms, and is memory-bound.
    """

    flops = decode_flops(model, batch_size, context_len)
    moved = decode_bytes(model, batch_size, context_len)
    achievable_flops = assumptions.flops_efficiency * hardware.peak_flops
    achievable_bandwidth = assumptions.bandwidth_efficiency * hardware.memory_bandwidth
    ridge = achievable_flops / achievable_bandwidth  # FLOPs per byte where the two limits meet
    if flops > ridge * moved:  # more arithmetic per byte than the card balances: compute-bound
        busy = flops / achievable_flops
    else:
        busy = moved / achievable_bandwidth
    return assumptions.step_overhead_s + busy


def decode_tokens_per_s(
    model, hardware, batch_size: int, context_len: int, assumptions: Assumptions = Assumptions()
) -> float:
    """Output tokens per second of a steady, full decode batch (what one GPU produces)."""

    seconds_per_token = decode_step_time(model, hardware, batch_size, context_len, assumptions) / batch_size
    return 1.0 / seconds_per_token


def tokens_per_usd(tokens_per_s: float, usd_per_hour: float) -> float:
    """Output tokens one dollar buys from a GPU rented at ``usd_per_hour`` that produces
    ``tokens_per_s``. Raise ``ValueError`` unless the price is above zero."""

    if usd_per_hour > 0:
        usd_per_second = usd_per_hour / SECONDS_PER_HOUR
        return tokens_per_s / usd_per_second
    raise ValueError(f"a GPU's price has to be above zero dollars an hour, not {usd_per_hour!r}")


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

    step_times = [decode_step_time(model, hardware, batch_size, prompt_len + step, assumptions)
                  for step in range(think_tokens)]
    share = 1.0 / batch_size  # each query's part of every step
    usd_per_second = hardware.usd_per_hour / SECONDS_PER_HOUR
    latency = math.fsum(step_times)
    charged = math.fsum(t * share for t in step_times)
    return QueryCost(latency_s=latency, gpu_seconds=charged, usd=math.fsum(t * share * usd_per_second for t in step_times))
