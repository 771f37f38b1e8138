"""Drive minivllm's real scheduler over a request trace without a model, for grading.

The scheduler only needs to be told which token each scheduled request sampled; here every
request samples token 0 and stops on its length (``ignore_eos``). So a trace of
``(prompt_len, output_len, arrival_step)`` is enough to replay exactly what the engine's
scheduler would decide, step by step, and to compare a student's scheduler with it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from minivllm.core.kv_cache_manager import KVCacheManager, cdiv
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams

NO_LENGTH_CAP = 1 << 40


@dataclass(frozen=True)
class TraceRequest:
    request_id: str
    prompt_len: int
    output_len: int
    arrival_step: int = 0  # the request joins the waiting queue before this step is planned


@dataclass
class RefStep:
    """What the reference scheduler saw and decided at one step."""

    step: int
    running: list[tuple[str, int]]  # before planning: (request_id, tokens left to compute)
    waiting: list[tuple[str, int]]  # before planning: (request_id, prompt_len), arrival order
    batch: list[tuple[str, int]]  # (request_id, tokens computed this step)
    finished: list[str]  # requests that ended with this step


def random_trace(
    seed: int,
    num_requests: int,
    prompt_range: tuple[int, int] = (1, 64),
    output_range: tuple[int, int] = (1, 24),
    max_arrival_gap: int = 3,
) -> list[TraceRequest]:
    """A seeded trace with ragged lengths and bursty arrivals (gaps of 0..max_arrival_gap)."""
    rng = random.Random(seed)
    trace, t = [], 0
    for i in range(num_requests):
        t += rng.randint(0, max_arrival_gap)
        trace.append(TraceRequest(f"r{i}", rng.randint(*prompt_range), rng.randint(*output_range), t))
    return trace


def run_reference(
    trace: list[TraceRequest],
    max_num_seqs: int,
    max_num_batched_tokens: int,
    enable_chunked_prefill: bool = False,
    max_steps: int = 100_000,
) -> list[RefStep]:
    """Replay ``trace`` through :class:`minivllm.core.scheduler.Scheduler` with a KV cache big
    enough never to fill and no prefix caching. One :class:`RefStep` per step, idle steps
    (nothing arrived yet) included, until every request has finished."""
    if not enable_chunked_prefill:
        too_long = [r.request_id for r in trace if r.prompt_len > max_num_batched_tokens]
        if too_long:
            raise ValueError(f"without chunking, prompts longer than the budget never run: {too_long}")
    block_size = 16
    num_blocks = sum(cdiv(r.prompt_len + r.output_len, block_size) + 1 for r in trace) + 1
    kv = KVCacheManager(num_blocks, block_size, enable_caching=False)
    cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_num_batched_tokens if not enable_chunked_prefill else NO_LENGTH_CAP,
        enable_chunked_prefill=enable_chunked_prefill,
    )
    cfg.max_model_len = NO_LENGTH_CAP  # prompts were checked against the budget above; no cap
    sched = Scheduler(cfg, kv)
    pending = sorted(trace, key=lambda r: r.arrival_step)
    steps: list[RefStep] = []
    nxt = 0
    for t in range(max_steps):
        while nxt < len(pending) and pending[nxt].arrival_step <= t:
            r = pending[nxt]
            params = SamplingParams(max_tokens=r.output_len, ignore_eos=True)
            # distinct token ids per request, so nothing could ever be shared between them
            ids = [(nxt * 7919 + j) % 30000 + 1 for j in range(r.prompt_len)]
            sched.add_request(Request(r.request_id, ids, params, arrival_time=float(t)))
            nxt += 1
        if nxt == len(pending) and not sched.has_unfinished_requests():
            return steps
        running = [(q.request_id, q.num_tokens - q.num_computed_tokens) for q in sched.running]
        waiting = [(q.request_id, q.num_tokens - q.num_computed_tokens) for q in sched.waiting]
        out = sched.schedule()
        sampled = {r.request_id: 0 for r in out.sampling_requests}
        finished = sched.update_from_output(sampled)
        batch = out.decisions()
        steps.append(RefStep(t, running, waiting, batch, [q.request_id for q in finished]))
    raise RuntimeError(f"the reference scheduler did not finish the trace in {max_steps} steps")
