"""Replay request traces through minivllm's scheduler over any KV cache manager, for grading.

Exercises 04 and 07 write KV cache managers. To grade them step by step, this module runs
minivllm's real :class:`~minivllm.core.engine_core.EngineCore` and scheduler over the student's
manager without a model (:class:`~minivllm.sim.executor.ModelFreeExecutor` samples the tokens),
once over the student's manager and once over minivllm's own
:class:`~minivllm.core.kv_cache_manager.KVCacheManager`, and compares what the scheduler did at
every step (:data:`DECISIONS`): who ran with how many tokens, how many of them came from the
prefix cache, who was preempted or ended, the blocks in use and the blocks each running request
holds. Block ids are not compared: which free block a table gets is the pool's business, and two
correct managers may hand out different ones.

What makes the ids irrelevant is checked instead. Both runs use ``debug_checks=True``: after
every step the :class:`~minivllm.core.kv_write_tracker.KVWriteTracker` checks that each slot a
request reads holds K/V written for that very token (a wrong table, a wrong copy-on-write copy or
a wrong prefix hit reads someone else's K/V), and the harness checks through the protocol that
the pool's used-block count is the number of distinct blocks live requests hold. Over a
student's manager, :func:`audit_pool` also reads the pool's own books (the exercises' rules P1-P5:
``ref_count``, ``free_block_ids``) and checks them against the tables after every step: a leaked
block, a double free or a reference count off by one stops the run at the step that did it.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from minivllm.core.engine_core import EngineCore
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.course.grading import Mismatch
from minivllm.course.harness import (
    ReplaySetup,
    StepRecord,
    TraceRequest,
    TraceResult,
    TraceRun,
    expect_same_steps,
    run_trace,
)

VOCAB = 50  # prompt tokens of random traces are drawn below this
# what must agree at every step, in the order a difference is reported (no block ids)
DECISIONS = ("batch", "computed", "preempted", "ended", "kv_blocks_used", "blocks_held")


@dataclass(frozen=True)
class KVSetup(ReplaySetup):
    """A :class:`~minivllm.course.harness.ReplaySetup` for replaying KV cache managers: the
    pool's size is given, the budget is 64 tokens, and :meth:`core` takes the manager to
    replay (minivllm's :class:`~minivllm.core.kv_cache_manager.KVCacheManager` runs there when
    none is given)."""

    num_blocks: int
    max_num_batched_tokens: int = 64
    logprobs: bool = False


def audit_pool(core: EngineCore) -> Callable[[], None]:
    """After every step of ``core``, check the books of its KV manager's pool (``core.kv.pool``,
    with the exercises' ``ref_count`` and ``free_block_ids``) against the block tables of the
    requests the scheduler says are live; raise ``AssertionError`` at the first step where they
    disagree. Returns the function that stops the audit."""
    steps = iter(range(1 << 62))

    def audit(_step_output) -> None:
        where = f"after step {next(steps)}"
        kv = core.kv
        tables = {r.request_id: kv.get_block_ids(r.request_id) for r in core.scheduler.live_requests()}
        problem = pool_problem(kv.pool, kv.num_blocks, tables)
        if problem:
            raise AssertionError(f"{where}: {problem} (block tables of the live requests: {tables})")

    return core.add_step_listener(audit)


def pool_problem(pool, num_blocks: int, tables: dict[str, list[int]]) -> str | None:
    """What is wrong with a pool's books given every block table (``None``: nothing): a block in
    the free queue twice, a reference count that is not the number of tables pointing at the
    block, a held block in the free queue or a block nobody holds missing from it."""
    free = pool.free_block_ids()
    twice = sorted(b for b, n in Counter(free).items() if n > 1)
    if twice:
        return f"block {twice[0]} is in the free queue twice (freed twice?)"
    if len(free) != pool.num_free_blocks:
        return f"num_free_blocks is {pool.num_free_blocks} but the free queue holds {len(free)} blocks"
    references = Counter(b for table in tables.values() for b in table)
    in_queue = set(free)
    for block in range(num_blocks):
        count, tabled = pool.ref_count(block), references[block]
        if count != tabled:
            return f"block {block} has ref_count {count}, but {tabled} block tables point at it"
        if (count == 0) != (block in in_queue):
            state = "is in the free queue" if block in in_queue else "is missing from the free queue"
            return f"block {block} (ref_count {count}) {state}"
    return None


def replay(kv, trace: Sequence[TraceRequest], setup: KVSetup, max_steps: int = 5000) -> list[StepRecord]:
    """Serve ``trace`` with minivllm's scheduler over ``kv`` and return every step's record.
    Raises ``AssertionError`` when a request reads K/V not written for it, when the pool's
    accounting is off, or when blocks are still held after the last request ended."""
    return run_trace(setup.core(kv), trace, max_steps=max_steps).steps


def reference_kv(setup: KVSetup, caching: bool) -> KVCacheManager:
    """minivllm's own manager over the same pool."""
    return setup.kv(caching)


def compare_with_minivllm(
    make_kv: Callable[[], object], trace: Sequence[TraceRequest], setup: KVSetup, caching: bool, label: str = ""
) -> int:
    """Replay ``trace`` over ``make_kv()`` (a manager of the exercises, with a ``pool``) and over
    minivllm's manager, step by step; raise at the first step where the scheduler's decisions
    differ or the pool's books are wrong. Returns the number of steps compared."""
    expected = TraceResult(replay(reference_kv(setup, caching), trace, setup))
    core = setup.core(make_kv())
    audit_pool(core)
    try:
        return len(expect_same_steps(expected, TraceRun(core, trace), DECISIONS, label))
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
