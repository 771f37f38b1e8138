"""Cases for ex10_costs: one decode step's FLOPs, bytes and time, tokens/s, tokens per dollar,
and the cost of a long reasoning query.

Every expected value comes from minivllm's simulator (``CostModel`` for a step,
``Simulator.summary()`` for dollars), never from the reference answer. The student's functions
receive views of the ``ModelSpec`` and ``Hardware`` objects that expose only the attributes the
exercise documents, so a case fails with a clear message if an answer reads, say,
``model.flops_per_token`` instead of computing it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from functools import cache

from minivllm.course.grading import Case, case, expect, expect_raises
from minivllm.sim import HARDWARE, CostModel, Hardware, ModelSpec, get_hardware, preset

CASES: list[Case] = []

# The protocol of the exercise: what its functions may read (the exercise file lists the same).
MODEL_ATTRIBUTES = (
    "name", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
    "linear_params", "body_weight_bytes", "lm_head_bytes", "kv_bytes_per_token", "weight_dtype",
    "kv_dtype",
)
HARDWARE_ATTRIBUTES = ("name", "memory_bytes", "memory_bandwidth", "peak_flops", "usd_per_hour")


class Only:
    """A read-only view of ``obj`` with just the ``allowed`` attributes."""

    def __init__(self, obj: object, allowed: tuple[str, ...], what: str):
        object.__setattr__(self, "_view", (obj, allowed, what))

    def __getattr__(self, name: str):
        obj, allowed, what = object.__getattribute__(self, "_view")
        if name in allowed:
            return getattr(obj, name)
        raise AttributeError(
            f"ex10 reads only these {what} attributes: {', '.join(allowed)}; {name!r} is not one "
            f"of them (compute it from those)"
        )

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"the {object.__getattribute__(self, '_view')[2]} is read-only")

    def __repr__(self) -> str:
        obj, _, what = object.__getattribute__(self, "_view")
        return f"<{what} {getattr(obj, 'name', '?')}>"


def model_view(spec: ModelSpec) -> Only:
    return Only(spec, MODEL_ATTRIBUTES, "model")


def hardware_view(hw: Hardware) -> Only:
    return Only(hw, HARDWARE_ATTRIBUTES, "hardware")


# --- the grid ---------------------------------------------------------------------------------
# (preset, weight dtype, KV dtype): 16-bit, the chapter's int4 + int8-KV stack, int8 weights,
# a model with tied embeddings (Qwen3-0.6B: its LM head is the embedding matrix), the tiny model.
MODELS = [
    ("llama-3-8b", "bf16", "bf16"),
    ("llama-3-70b", "int4", "int8"),
    ("llama-3-70b", "int8", "bf16"),
    ("qwen3-0.6b", "bf16", "int8"),
    ("tiny", "bf16", "fp8"),
]
BATCHES = (1, 3, 64, 256)
CONTEXTS = (0, 1, 1000, 30_000)
# (flops_efficiency, bandwidth_efficiency, step_overhead_s): the simulator's defaults, the pure
# datasheet roofline, and an arbitrary third set
ASSUMPTION_SETS = [
    (CostModel.flops_efficiency, CostModel.bandwidth_efficiency, CostModel.step_overhead_s),
    (1.0, 1.0, 0.0),
    (0.45, 0.9, 2e-3),
]


@cache
def spec(name: str, weights: str, kv: str) -> ModelSpec:
    return preset(name, weight_dtype=weights, kv_dtype=kv)


def assumptions(ex, flops_eff: float, bw_eff: float, overhead: float):
    return ex.Assumptions(flops_efficiency=flops_eff, bandwidth_efficiency=bw_eff, step_overhead_s=overhead)


def grid() -> Iterator[tuple[tuple[str, str, str], int, int]]:
    return itertools.product(MODELS, BATCHES, CONTEXTS)


def label(model: tuple[str, str, str], batch: int, context: int, extra: str = "") -> str:
    name, weights, kv = model
    return f"{name} ({weights} weights, {kv} KV), batch {batch}, context {context}{extra}"


H100 = get_hardware("H100-SXM")
STACK_70B = ("llama-3-70b", "int4", "int8")  # the chapter's section 7 stack


# --- decode_flops -----------------------------------------------------------------------------
@case(CASES, "one sequence, empty cache (Llama-3-8B)", "decode_flops",
      "2 FLOPs per matmul weight, attention over the one key it has (its own), and the LM head")
def _(ex):
    m = spec("llama-3-8b", "bf16", "bf16")
    expect(ex.decode_flops(model_view(m), 1, 0), CostModel(m, H100).decode_step(1, 0).flops)


@case(CASES, "attention grows with the context", "decode_flops",
      "the new query meets every cached key and its own: context_len + 1 keys per head and layer")
def _(ex):
    m = spec(*STACK_70B)
    for context in (1, 4096, 30_000):
        expect(ex.decode_flops(model_view(m), 1, context), CostModel(m, H100).decode_step(1, context).flops,
               f"context {context}")


@case(CASES, "grid: 5 models x 4 batch sizes x 4 contexts", "decode_flops",
      "every term is per sequence; the LM head runs for every sampled token, tied or not")
def _(ex):
    for model, batch, context in grid():
        m = spec(*model)
        expect(ex.decode_flops(model_view(m), batch, context), CostModel(m, H100).decode_step(batch, context).flops,
               label(model, batch, context))


# --- decode_bytes -----------------------------------------------------------------------------
@case(CASES, "one sequence, empty cache: the weights", "decode_bytes",
      "decoder weights + LM head, streamed once; the embedding table is not streamed")
def _(ex):
    m = spec("llama-3-8b", "bf16", "bf16")
    expect(ex.decode_bytes(model_view(m), 1, 0), CostModel(m, H100).decode_step(1, 0).bytes)


@case(CASES, "64 sequences of 30,000 tokens (70B, int4 weights, int8 KV)", "decode_bytes",
      "every sequence reads its whole cache plus its new token, and writes its new K and V")
def _(ex):
    m = spec(*STACK_70B)
    expect(ex.decode_bytes(model_view(m), 64, 30_000), CostModel(m, H100).decode_step(64, 30_000).bytes)


@case(CASES, "the weights are read once per step, not once per sequence", "decode_bytes",
      "the batch shares one pass over the weights: only the KV traffic grows with the batch")
def _(ex):
    m = spec("llama-3-8b", "bf16", "bf16")
    for batch in (2, 256):
        expect(ex.decode_bytes(model_view(m), batch, 0), CostModel(m, H100).decode_step(batch, 0).bytes,
               f"batch {batch}, empty caches")


@case(CASES, "grid: 5 models x 4 batch sizes x 4 contexts", "decode_bytes",
      "quantised weights and KV caches: read their sizes from the model, do not assume 2 bytes")
def _(ex):
    for model, batch, context in grid():
        m = spec(*model)
        expect(ex.decode_bytes(model_view(m), batch, context), CostModel(m, H100).decode_step(batch, context).bytes,
               label(model, batch, context))


# --- decode_step_time -------------------------------------------------------------------------
@case(CASES, "memory-bound step: batch 1 on an H100", "decode_step_time",
      "at batch 1 the step is one pass over the weights at the achievable bandwidth, plus the overhead")
def _(ex):
    m = spec(*STACK_70B)
    cost = CostModel(m, H100).decode_step(1, 512)
    assert cost.bound == "memory"
    expect(ex.decode_step_time(model_view(m), hardware_view(H100), 1, 512), cost.time)


@case(CASES, "compute-bound step: 8B, int4 weights, batch 256, empty caches", "decode_step_time",
      "past the knee the FLOPs take longer than the bytes")
def _(ex):
    m = spec("llama-3-8b", "int4", "bf16")
    cost = CostModel(m, H100).decode_step(256, 0)
    assert cost.bound == "compute"
    expect(ex.decode_step_time(model_view(m), hardware_view(H100), 256, 0), cost.time)


@case(CASES, "the datasheet roofline: full efficiency, no overhead", "decode_step_time",
      "with perfect overlap a step takes as long as its slower part, not the sum of both")
def _(ex):
    m = spec(*STACK_70B)
    a = assumptions(ex, 1.0, 1.0, 0.0)
    for batch, context in ((1, 0), (64, 1000), (256, 0)):
        expect(ex.decode_step_time(model_view(m), hardware_view(H100), batch, context, a),
               CostModel(m, H100, 1.0, 1.0, 0.0).decode_step(batch, context).time, f"batch {batch}, context {context}")


@case(CASES, "grid: every GPU x 5 models x 4 batches x 4 contexts x 3 sets of assumptions", "decode_step_time",
      "achievable rates are the datasheet peaks times the efficiencies; the overhead is paid every step")
def _(ex):
    for hw in HARDWARE.values():
        for (model, batch, context), (fe, be, oh) in itertools.product(grid(), ASSUMPTION_SETS):
            m = spec(*model)
            got = ex.decode_step_time(model_view(m), hardware_view(hw), batch, context, assumptions(ex, fe, be, oh))
            want = CostModel(m, hw, fe, be, oh).decode_step(batch, context).time
            expect(got, want, label(model, batch, context, f" on {hw.name}, efficiencies {fe}/{be}, overhead {oh}"))


# --- decode_tokens_per_s ----------------------------------------------------------------------
@case(CASES, "batch 1 and batch 64 on an H100 (70B, int4, int8 KV)", "decode_tokens_per_s",
      "one step gives one token to every sequence in the batch")
def _(ex):
    m = spec(*STACK_70B)
    for batch in (1, 64):
        expect(ex.decode_tokens_per_s(model_view(m), hardware_view(H100), batch, 1000),
               CostModel(m, H100).decode_throughput(batch, 1000), f"batch {batch}")


@case(CASES, "grid: every GPU x 5 models x 4 batches x 4 contexts", "decode_tokens_per_s",
      "tokens per second = tokens per step / seconds per step, with the assumptions passed on")
def _(ex):
    fe, be, oh = ASSUMPTION_SETS[2]
    for hw in HARDWARE.values():
        for model, batch, context in grid():
            m = spec(*model)
            got = ex.decode_tokens_per_s(model_view(m), hardware_view(hw), batch, context, assumptions(ex, fe, be, oh))
            expect(got, CostModel(m, hw, fe, be, oh).decode_throughput(batch, context),
                   label(model, batch, context, f" on {hw.name}"))


# --- tokens_per_usd ---------------------------------------------------------------------------
@cache
def _simulated_run() -> dict[str, float]:
    """A short chat run on a simulated A100: its tokens/s and tokens per dollar."""
    from minivllm import workloads
    from minivllm.sim import Simulator

    sim = Simulator(preset("llama-3-8b"), "A100-80GB", max_num_seqs=16, max_model_len=4096)
    sim.run(workloads.chat(24, seed=0))
    return sim.summary()


@case(CASES, "the simulator's bill for a chat run", "tokens_per_usd",
      "prices are per hour, rates per second: convert one of them")
def _(ex):
    s = _simulated_run()
    price = get_hardware("A100-80GB").usd_per_hour
    expect(ex.tokens_per_usd(s["output_tokens_per_s"], price), s["output_tokens_per_usd"], rel=1e-9)


@case(CASES, "two prices, one throughput", "tokens_per_usd",
      "twice the price buys half the tokens")
def _(ex):
    for price in (2.5, 5.0):
        # a GPU that makes 1,000 tokens/s for one hour at `price`: 3.6 million tokens for `price` dollars
        expect(ex.tokens_per_usd(1000.0, price), 3_600_000 / price, f"${price}/h")


@case(CASES, "a free or negative price", "tokens_per_usd", "raise ValueError when usd_per_hour <= 0")
def _(ex):
    expect_raises(ValueError, lambda: ex.tokens_per_usd(1000.0, 0.0), "$0/h")
    expect_raises(ValueError, lambda: ex.tokens_per_usd(1000.0, -1.0), "-$1/h")


# --- reasoning_query_cost ---------------------------------------------------------------------
def expected_query(m: ModelSpec, hw: Hardware, batch: int, prompt: int, think: int, cm: CostModel | None = None):
    cm = cm or CostModel(m, hw)
    latency = sum(cm.decode_step(batch, prompt + i).time for i in range(think))
    return latency, latency / batch, latency / batch * hw.usd_per_hour / 3600


def expect_query(got, want: tuple[float, float, float], note: str) -> None:
    for field_name, value in zip(("latency_s", "gpu_seconds", "usd"), want, strict=True):
        expect(getattr(got, field_name), value, f"{note}: {field_name}")


@case(CASES, "one query alone: 500 tokens after a 200-token prompt", "reasoning_query_cost",
      "the query waits for every step; alone, it pays for all of the GPU's time")
def _(ex):
    m = spec(*STACK_70B)
    got = ex.reasoning_query_cost(model_view(m), hardware_view(H100), 1, 200, 500)
    expect_query(got, expected_query(m, H100, 1, 200, 500), "batch 1")


@case(CASES, "8 queries side by side on an A100 at another price", "reasoning_query_cost",
      "the batch shares each step's time, so each query is charged its share")
def _(ex):
    m = spec(*STACK_70B)
    hw = get_hardware("A100-80GB").with_price(1.1)
    got = ex.reasoning_query_cost(model_view(m), hardware_view(hw), 8, 100, 700)
    expect_query(got, expected_query(m, hw, 8, 100, 700), "batch 8")


@case(CASES, "6 queries of 30,000 thinking tokens on an H100 (the chapter's regime)", "reasoning_query_cost",
      "each step reads a longer cache than the last; pass the assumptions on to every step")
def _(ex):
    m = spec(*STACK_70B)
    fe, be, oh = ASSUMPTION_SETS[2]
    cm = CostModel(m, H100, fe, be, oh)
    got = ex.reasoning_query_cost(model_view(m), hardware_view(H100), 6, 200, 30_000, assumptions(ex, fe, be, oh))
    expect_query(got, expected_query(m, H100, 6, 200, 30_000, cm), "30k tokens, batch 6")
