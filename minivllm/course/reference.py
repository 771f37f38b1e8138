"""Replay a request trace through a scheduler without a model, to grade a student's scheduler.

A scheduler only needs to be told which token each scheduled request sampled, and here every
request stops on its length (``ignore_eos``, no stop token). So a trace of prompt lengths,
output lengths and arrival steps is enough to replay exactly what the engine's scheduler would
decide, step by step: minivllm's ``EngineCore`` runs the scheduler (minivllm's own
:class:`~minivllm.core.scheduler.Scheduler`, or any object that meets the ``Scheduler``
protocol) over a KV pool and :class:`~minivllm.course.harness.FakeExecutor`.

* :func:`run_reference` replays minivllm's scheduler (continuous, or the static baseline);
* :class:`Replay` steps any scheduler factory through a trace, one step per ``step()``;
* :func:`compare_with_reference` runs a student's scheduler next to the reference and raises
  :class:`~minivllm.course.harness.StepMismatch` at the first step where they disagree, with
  the state before that step.

Every scheduler but minivllm's own gets its KV cache manager through
:class:`~minivllm.course.scheduling.ProtocolOnlyKV`, so a scheduler that passes uses only the
``KVCacheManager`` protocol.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from minivllm.core.engine_core import EngineCore
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.core.static_scheduler import StaticBatchScheduler
from minivllm.course.harness import (
    FakeExecutor,
    StepRecord,
    TraceRequest,
    TraceRun,
    expect_same_steps,
)
from minivllm.course.scheduling import ProtocolOnlyKV
from minivllm.math_utils import cdiv
from minivllm.metrics import EngineStats

NO_LENGTH_CAP = 1 << 40
SchedulerFactory = Callable[[SchedulerConfig, object], object]
REFERENCE_SCHEDULERS: dict[str, SchedulerFactory] = {"continuous": Scheduler, "static": StaticBatchScheduler}
# what two schedulers must agree on at every step, in the order a difference is reported
DECISIONS = ("batch", "sampled", "preempted", "ended", "kv_blocks_used")


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


def blocks_to_never_fill(trace: Sequence[TraceRequest], block_size: int = 16) -> int:
    """A pool size at which no request ever waits for KV blocks: every request's final length."""
    return sum(cdiv(r.prompt_len + r.max_tokens, block_size) for r in trace) + 1


def scheduler_config(max_num_seqs: int, max_num_batched_tokens: int, enable_chunked_prefill: bool) -> SchedulerConfig:
    """A config without a length cap: requests stop on their ``max_tokens`` only."""
    cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_num_batched_tokens,  # passes the unchunked check; lifted below
        enable_chunked_prefill=enable_chunked_prefill,
    )
    cfg.max_model_len = NO_LENGTH_CAP
    return cfg


class Replay(TraceRun):
    """Drive the scheduler ``factory(config, kv)`` builds (a class such as ``Scheduler`` will do)
    over ``trace`` without a model; ``step()`` runs one engine step and returns its record.
    ``num_kv_blocks=None`` sizes the pool so that it never fills."""

    def __init__(
        self,
        factory: SchedulerFactory,
        trace: Sequence[TraceRequest],
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool = False,
        num_kv_blocks: int | None = None,
        block_size: int = 16,
        max_steps: int = 100_000,
    ):
        if not enable_chunked_prefill:
            too_long = [r.request_id for r in trace if r.prompt_len > max_num_batched_tokens]
            if too_long:
                raise ValueError(f"without chunking, prompts longer than the budget never run: {too_long}")
        self.num_blocks = num_kv_blocks or blocks_to_never_fill(trace, block_size)
        self.block_size = block_size
        self.config = scheduler_config(max_num_seqs, max_num_batched_tokens, enable_chunked_prefill)
        kv = KVCacheManager(self.num_blocks, block_size, enable_caching=False)
        if factory not in REFERENCE_SCHEDULERS.values():  # minivllm's own need no policing
            kv = ProtocolOnlyKV(kv)
        executor = FakeExecutor(vocab=1, logprobs=False)  # requests end on their length
        core = EngineCore(factory(self.config, kv), executor, clock=executor.clock, stats=EngineStats(window=None))
        super().__init__(core, trace, max_steps=max_steps, check_pool=False)  # minivllm's manager

    def settings(self) -> str:
        cfg = self.config
        return (f"max_num_seqs={cfg.max_num_seqs}, max_num_batched_tokens={cfg.max_num_batched_tokens}, "
                f"chunked prefill {'on' if cfg.enable_chunked_prefill else 'off'}, "
                f"KV pool of {self.num_blocks} blocks x {self.block_size} tokens")

    def step(self) -> StepRecord:
        return next(self)


def run_reference(
    trace: Sequence[TraceRequest],
    max_num_seqs: int,
    max_num_batched_tokens: int,
    enable_chunked_prefill: bool = False,
    num_kv_blocks: int | None = None,
    block_size: int = 16,
    scheduler: str = "continuous",
    max_steps: int = 100_000,
) -> list[StepRecord]:
    """Replay ``trace`` through minivllm's own scheduler (``"continuous"``: ``Scheduler``;
    ``"static"``: ``StaticBatchScheduler``) with no prefix caching: one record per engine step
    until every request has finished."""
    replay = Replay(
        REFERENCE_SCHEDULERS[scheduler], trace, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=enable_chunked_prefill,
        num_kv_blocks=num_kv_blocks, block_size=block_size, max_steps=max_steps,
    )
    return list(replay)


def compare_with_reference(factory: SchedulerFactory, trace: Sequence[TraceRequest], *, label: str = "",
                           **settings) -> list[StepRecord]:
    """Run the scheduler ``factory`` builds next to minivllm's ``Scheduler`` (same
    :class:`Replay` ``settings``, same pool), step by step, and raise at the first step where the
    batch, the requests that sample, the preempted ones, the ones that ended (and how) or the KV
    blocks in use differ, or where a queued request has the wrong status. Returns the student's
    steps."""
    expected = Replay(Scheduler, trace, **settings).finish()
    mine = Replay(factory, trace, **settings)
    return expect_same_steps(expected, mine, DECISIONS, label, mine.settings())
