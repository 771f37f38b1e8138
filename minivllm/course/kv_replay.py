"""Replay request traces through minivllm's scheduler over any KV cache manager, for grading.

Exercises 04 and 07 write KV cache managers. To grade them step by step, this module runs
minivllm's real :class:`~minivllm.core.engine_core.EngineCore` and scheduler over the student's
manager without a model (:class:`~minivllm.course.harness.FakeExecutor` samples the tokens),
once over the student's manager and once over minivllm's own
:class:`~minivllm.core.kv_cache_manager.KVCacheManager`: every step must schedule the same
requests with the same block tables, preempt the same victims, and ask for the same
copy-on-write copies. Both runs use ``debug_checks=True``: after every step the
:class:`~minivllm.core.kv_write_tracker.KVWriteTracker` checks that each slot a request reads
holds K/V written for that very token, and the harness checks through the protocol alone that
the pool's used-block count is the number of distinct blocks live requests hold.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from minivllm.core.engine_core import EngineCore
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.core.static_scheduler import StaticBatchScheduler
from minivllm.course.grading import Mismatch
from minivllm.course.harness import (
    FakeExecutor,
    StepRecord,
    TraceRequest,
    TraceResult,
    TraceRun,
    expect_same_steps,
    run_trace,
)

VOCAB = 50  # prompt tokens of random traces are drawn below this
KVRequest = TraceRequest  # the name notebook 07 uses
# what must agree at every step, in the order a difference is reported
PLAN = ("preempted", "scheduled", "copies", "ended", "kv_blocks_used")


@dataclass(frozen=True)
class KVSetup:
    num_blocks: int
    block_size: int = 4
    max_model_len: int = 64
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 64
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"
    scheduler: str = "continuous"  # or "static" (each request reserves its worst case: lookahead)

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            policy=self.policy,
        )

    def core(self, kv) -> EngineCore:
        """minivllm's scheduler over ``kv``, in an engine core with a fake executor."""
        sched_cls = StaticBatchScheduler if self.scheduler == "static" else Scheduler
        executor = FakeExecutor(logprobs=False)
        return EngineCore(sched_cls(self.scheduler_config(), kv), executor, clock=executor.clock, debug_checks=True)


def replay(kv, trace: Sequence[TraceRequest], setup: KVSetup, max_steps: int = 5000) -> list[StepRecord]:
    """Serve ``trace`` with minivllm's scheduler over ``kv`` and return every step's record
    (``.scheduled``: the plan). Raises ``AssertionError`` when a request reads K/V not written for
    it, when the pool's accounting is off, or when blocks are still held after the last request
    ended."""
    return run_trace(setup.core(kv), trace, max_steps=max_steps).steps


def reference_kv(setup: KVSetup, caching: bool) -> KVCacheManager:
    """minivllm's own manager over the same pool."""
    return KVCacheManager(setup.num_blocks, setup.block_size, enable_caching=caching)


def compare_with_minivllm(
    make_kv: Callable[[], object], trace: Sequence[TraceRequest], setup: KVSetup, caching: bool, label: str = ""
) -> int:
    """Replay ``trace`` over ``make_kv()`` and over minivllm's manager, step by step; raise at the
    first step where the plans differ. Returns the number of steps compared."""
    expected = TraceResult(replay(reference_kv(setup, caching), trace, setup))
    try:
        return len(expect_same_steps(expected, TraceRun(setup.core(make_kv()), trace), PLAN, label))
    except AssertionError as err:
        if isinstance(err, Mismatch) or not label:
            raise
        raise AssertionError(f"{label}: {err}") from None


# --- traces ---------------------------------------------------------------------------------------
def random_kv_trace(
    seed: int,
    num_requests: int,
    prefixes: Sequence[Sequence[int]] = (),
    max_prompt_tail: int = 14,
    max_tokens: int = 12,
    max_n: int = 1,
    priorities: int = 1,
    salts: Sequence[str | None] = (None,),
    abort_every: int = 0,
    max_arrival_step: int = 6,
) -> list[TraceRequest]:
    """A seeded trace: each prompt is one of ``prefixes`` (or none) plus a random tail; ragged
    lengths, bursty arrivals, ``n`` up to ``max_n``, optional priorities, salts and aborts."""
    rng = random.Random(seed)
    choices = [()] + [tuple(p) for p in prefixes]
    trace = []
    for i in range(num_requests):
        prefix = rng.choice(choices)
        tail = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, max_prompt_tail)))
        abort = rng.randint(1, 8) if abort_every and i % abort_every == abort_every - 1 else None
        trace.append(TraceRequest(
            f"r{i}", prefix + tail, rng.randint(1, max_tokens), rng.randint(0, max_arrival_step),
            n=rng.randint(1, max_n), priority=rng.randrange(priorities), cache_salt=rng.choice(list(salts)),
            abort_step=abort,
        ))
    return trace


# Prompts in the tiny model's world, for the checks that serve it with a student's manager.
PROMPTS = [
    "Once upon a time", "The little fox", "Tom went to the market and", "A bird sat on a branch",
    "In the morning the sun", "Mia had a red ball", "The old man smiled", "Sam and Lily were friends",
]
