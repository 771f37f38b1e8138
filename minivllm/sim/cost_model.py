"""How long one engine step takes on a given GPU: a roofline over the step's whole batch.

One step is one forward pass over every scheduled row (prefill chunks, decode tokens, padding
and idle static-batch seats alike: a padded row costs what a real row costs). We count

* FLOPs  = 2 x (decoder matmul parameters) per row
           + 4 x layers x heads x head_dim per (query, key) pair of causal attention
           + 2 x vocab x hidden per sampled row (the LM head runs only where a token is sampled);
* bytes  = the weights, streamed once per step whatever the batch size
           + every sequence's K/V context, read once (FlashAttention / PagedAttention style)
           + the K/V of the step's new rows, written once,

and take

    time = max(FLOPs / (peak_flops x flops_efficiency),
               bytes / (memory_bandwidth x bandwidth_efficiency)) + step_overhead_s.

Why a roofline is enough here: at small batch a decode step is one pass over the weights (time
~ weight bytes / bandwidth, independent of batch), so batching is nearly free; once the
batch's FLOPs catch up with that, time grows with the batch (compute-bound). That knee is the
whole economic argument of the chapter.

Assumptions and limits (also in ``docs/simulator.md``):

* compute and memory traffic overlap perfectly within a step (max, not sum);
* the efficiency factors are single numbers for the whole step; real kernels reach different
  fractions of peak for a 1-row GEMV, a 2k-row GEMM and attention. Defaults (60 % of peak
  FLOP/s, 80 % of peak bandwidth) are typical of good inference kernels on H100-class parts;
* activation traffic, the sampler, all-reduce (single GPU only), CUDA-graph capture, kernel
  launch gaps and CPU scheduling time are folded into ``step_overhead_s``;
* attention re-reads of K/V inside a long prefill (one pass per query tile) are not counted;
  long prefills are compute-bound anyway;
* no tensor parallelism; speculative decoding's acceptances are drawn at a given rate
  (``minivllm/sim/speculation.py``), the steps priced here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from minivllm.sim.hardware import Hardware
from minivllm.sim.model_spec import ModelSpec


def scheduled_rows(sched_out) -> list[tuple[int, int, int]]:
    """``(num_cached, num_rows, num_sampled_rows)`` per scheduled request of a ``SchedulerOutput``.

    ``num_rows`` counts the new tokens plus padding (static batching's pads and idle seats are
    real rows: they cost what a real row costs); ``num_sampled_rows`` is 1 for a request that
    samples (``1 + k`` when it verifies ``k`` drafts: every row gets logits), else 0.
    """
    pads = sched_out.num_padding
    spec = getattr(sched_out, "spec_token_ids", None)
    return [
        (done, n + (pads.get(req.request_id, 0) if pads else 0),
         (1 + len(spec.get(req.request_id, ())) if spec else 1) if sample else 0)
        for req, done, n, sample in zip(
            sched_out.requests, sched_out.num_computed, sched_out.num_new, sched_out.sample, strict=True
        )
    ]


@dataclass(frozen=True)
class StepCost:
    flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    compute_time: float  # FLOPs / achievable FLOP/s
    memory_time: float  # bytes / achievable bandwidth
    overhead: float
    draft_time: float = 0.0  # speculative decoding: the draft model's passes before this one

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def time(self) -> float:
        return max(self.compute_time, self.memory_time) + self.overhead + self.draft_time

    @property
    def bound(self) -> str:
        """Which roof limits the step: ``"compute"`` or ``"memory"``."""
        return "compute" if self.compute_time > self.memory_time else "memory"


@dataclass(frozen=True)
class CostModel:
    model: ModelSpec
    hardware: Hardware
    flops_efficiency: float = 0.6  # ASSUMPTION: achievable fraction of peak dense FLOP/s
    bandwidth_efficiency: float = 0.8  # ASSUMPTION: achievable fraction of peak bandwidth
    step_overhead_s: float = 5e-4  # ASSUMPTION: fixed per-step cost (launches, CPU, sampler)

    def __post_init__(self) -> None:
        for name in ("flops_efficiency", "bandwidth_efficiency"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {v}")
        if self.step_overhead_s < 0:
            raise ValueError(f"step_overhead_s must be >= 0, got {self.step_overhead_s}")

    @property
    def achievable_flops(self) -> float:
        return self.hardware.peak_flops * self.flops_efficiency

    @property
    def achievable_bandwidth(self) -> float:
        return self.hardware.memory_bandwidth * self.bandwidth_efficiency

    @cached_property
    def _constants(self) -> tuple[float, ...]:
        """Per-model numbers used at every step, computed once."""
        m = self.model
        return (
            2.0 * m.linear_params,
            float(m.attention_flops_per_pair),
            float(m.lm_head_flops),
            m.kv_bytes_per_token(),
            m.body_weight_bytes,
            m.lm_head_bytes,
        )

    # --- one step ------------------------------------------------------------------------
    def step_cost(self, rows: Iterable[tuple[int, int, int | bool]]) -> StepCost:
        """Cost of a step given, per scheduled sequence, ``(num_cached, num_rows, sample)``:
        ``num_rows`` rows (new tokens + padding) computed after ``num_cached`` tokens already
        in the KV cache, and how many of them the LM head runs on (``True``: one, the last;
        ``1 + k`` for a verification of ``k`` drafts)."""
        row_flops, pair_flops, head_flops, kv_tok, body_bytes, head_bytes = self._constants
        total_rows = pairs = context = samples = 0
        for cached, n, sample in rows:
            total_rows += n
            # query i (0-based) of the chunk attends to cached + i + 1 keys (causal)
            pairs += n * cached + n * (n + 1) // 2
            context += cached + n
            samples += sample
        if total_rows == 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, self.step_overhead_s)
        flops = row_flops * total_rows + pair_flops * pairs + head_flops * samples
        weight_bytes = body_bytes + (head_bytes if samples else 0.0)
        kv_read = context * kv_tok
        kv_write = total_rows * kv_tok
        return StepCost(
            flops=flops,
            weight_bytes=weight_bytes,
            kv_read_bytes=kv_read,
            kv_write_bytes=kv_write,
            compute_time=flops / self.achievable_flops,
            memory_time=(weight_bytes + kv_read + kv_write) / self.achievable_bandwidth,
            overhead=self.step_overhead_s,
        )

    def schedule_cost(self, sched_out) -> StepCost:
        """Cost of a :class:`~minivllm.core.scheduler_output.SchedulerOutput` as the engine
        would run it."""
        return self.step_cost(scheduled_rows(sched_out))

    def decode_step(self, batch_size: int, context_len: int) -> StepCost:
        """A pure decode step: ``batch_size`` sequences, each with ``context_len`` cached tokens."""
        return self.step_cost([(context_len, 1, True)] * batch_size)

    def prefill_step(self, prompt_lens: Iterable[int]) -> StepCost:
        return self.step_cost((0, n, True) for n in prompt_lens)

    def decode_throughput(self, batch_size: int, context_len: int) -> float:
        """Output tokens per second of a steady, full decode batch."""
        return batch_size / self.decode_step(batch_size, context_len).time

    # --- the roofline knee ---------------------------------------------------------------
    def crossover_batch(self, context_len: int = 0) -> float:
        """Decode batch size at which compute time catches up with memory time.

        With ``B`` sequences of ``c`` cached tokens: compute ``B*f / F`` and memory
        ``(W + B*k) / M`` where ``f`` = FLOPs per token, ``k`` = KV bytes read and written per
        token, ``W`` = weight bytes, ``F``/``M`` = achievable FLOP/s and bandwidth. Equal at
        ``B* = (W/M) / (f/F - k/M)``. Infinite when ``f/F <= k/M``: the KV traffic alone keeps
        the step memory-bound at any batch (long contexts with low GQA ratios).
        """
        m = self.model
        f = m.flops_per_token(context_len, sample=True)
        k = (context_len + 2) * m.kv_bytes_per_token()  # read c + 1, write 1
        w = m.body_weight_bytes + m.lm_head_bytes
        denom = f / self.achievable_flops - k / self.achievable_bandwidth
        if denom <= 0:
            return float("inf")
        return (w / self.achievable_bandwidth) / denom
