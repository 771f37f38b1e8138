"""Replay request traces through minivllm's scheduler over any KV cache manager, for grading.

Exercises 04 and 07 write KV cache managers. To grade them step by step, this module drives
minivllm's real :class:`~minivllm.core.engine_core.EngineCore` and scheduler without a model: a
scripted executor "samples" a token that depends only on the request and its length, so the
same trace gives the same tokens whatever the manager. Run once over the student's manager and
once over minivllm's own :class:`~minivllm.core.kv_cache_manager.KVCacheManager`, every step must
schedule the same requests with the same block tables, preempt the same victims, and ask for
the same copy-on-write copies. Both runs use ``debug_checks=True``: after every step the
:class:`~minivllm.core.kv_write_tracker.KVWriteTracker` checks that each slot a request reads
holds K/V written for that very token, and this module checks through the protocol alone
that the pool's used-block count is the number of distinct blocks live requests hold.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from minivllm.core.engine_core import EngineCore
from minivllm.core.interfaces import ModelRunnerOutput
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.core.static_scheduler import StaticBatchScheduler
from minivllm.course.grading import Mismatch
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams

VOCAB = 50  # scripted tokens and prompt tokens are drawn below this


@dataclass(frozen=True)
class KVRequest:
    """One request of a trace: its prompt, how many tokens it generates, when it arrives
    (before that step is planned), how many samples (``n > 1``: siblings fork off the first
    once it samples), its priority, tenant salt, and when it is aborted (if ever)."""

    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    arrival_step: int = 0
    n: int = 1
    priority: int = 0
    cache_salt: str | None = None
    abort_step: int | None = None


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


@dataclass
class KVStep:
    """What one step planned: ``(request, tokens already computed, new tokens, block table)``
    per scheduled request, the copy-on-write pairs, the preempted and finished requests, and
    the pool's used blocks after the step."""

    step: int
    scheduled: list[tuple[str, int, int, list[int]]] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    used_blocks: int = 0


def scripted_token(request: Request) -> int:
    """The token a request "samples" next: a function of its id and length only, so that a
    trace produces the same tokens under any KV manager (and siblings diverge)."""
    key = sum(ord(c) * (i + 1) for i, c in enumerate(request.request_id))
    return (key * 31 + 7 * len(request.all_token_ids)) % VOCAB


class ScriptedExecutor:
    """An executor without a model: every request that samples gets :func:`scripted_token`."""

    def execute(self, out) -> ModelRunnerOutput:
        sampled = {r.request_id: scripted_token(r) for r in out.sampling_requests}
        for leader, kids in out.forks.items():
            if leader in sampled:
                sampled.update((kid.request_id, scripted_token(kid)) for kid in kids)
        return ModelRunnerOutput(sampled=sampled)


def _check_pool_accounting(core: EngineCore, step: int) -> None:
    """Through the protocol only: blocks in use = distinct blocks held by live requests."""
    kv = core.kv
    held = {b for r in core.scheduler.live_requests() for b in kv.get_block_ids(r.request_id)}
    if kv.num_used_blocks != len(held):
        raise AssertionError(
            f"step {step}: the pool says {kv.num_used_blocks} blocks are in use, but live requests "
            f"hold {len(held)} distinct blocks"
        )
    if kv.num_free_blocks != kv.num_blocks - kv.num_used_blocks:
        raise AssertionError(f"step {step}: free + used blocks != {kv.num_blocks}")


def replay(kv, trace: Sequence[KVRequest], setup: KVSetup, max_steps: int = 5000) -> list[KVStep]:
    """Serve ``trace`` with minivllm's scheduler over ``kv`` and return every step's plan.

    Raises ``AssertionError`` when a request reads K/V not written for it, when the pool's
    accounting is off, or when blocks are still held after the last request ended."""
    sched_cls = StaticBatchScheduler if setup.scheduler == "static" else Scheduler
    core = EngineCore(sched_cls(setup.scheduler_config(), kv), ScriptedExecutor(),
                      clock=lambda: 0.0, debug_checks=True)
    pending = sorted(trace, key=lambda r: r.arrival_step)
    aborts: dict[int, list[KVRequest]] = {}
    for r in trace:
        if r.abort_step is not None:
            aborts.setdefault(r.abort_step, []).append(r)
    steps: list[KVStep] = []
    for t in range(max_steps):
        while pending and pending[0].arrival_step <= t:
            r = pending.pop(0)
            params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0)
            kids = [Request(f"{r.request_id}#{i}" if r.n > 1 else r.request_id, list(r.prompt), params,
                            arrival_time=float(t), priority=r.priority, cache_salt=r.cache_salt)
                    for i in range(r.n)]
            core.add_request(kids[0], kids[1:])
        for r in aborts.get(t, []):
            core.abort_requests([f"{r.request_id}#{i}" for i in range(r.n)] if r.n > 1 else [r.request_id])
        if not pending and not core.has_unfinished_requests():
            if kv.num_used_blocks != 0:
                raise AssertionError(f"every request ended but {kv.num_used_blocks} blocks are still in use")
            return steps
        result = core.step()
        out = result.scheduler_output
        steps.append(KVStep(
            t,
            [(r.request_id, c, n, list(ids))
             for r, c, n, ids in zip(out.requests, out.num_computed, out.num_new, out.block_ids, strict=True)],
            list(out.blocks_to_copy),
            [r.request_id for r in out.preempted],
            [r.request_id for r in result.finished],
            kv.num_used_blocks,
        ))
        _check_pool_accounting(core, t)
    raise AssertionError(f"the trace did not finish in {max_steps} steps")


def reference_kv(setup: KVSetup, caching: bool) -> KVCacheManager:
    """minivllm's own manager over the same pool."""
    return KVCacheManager(setup.num_blocks, setup.block_size, enable_caching=caching)


def compare_with_minivllm(
    make_kv: Callable[[], object], trace: Sequence[KVRequest], setup: KVSetup, caching: bool, label: str = ""
) -> int:
    """Replay ``trace`` over ``make_kv()`` and over minivllm's manager; raise :class:`Mismatch`
    at the first step where the plans differ. Returns the number of steps compared."""
    where = f"{label}: " if label else ""
    expected = replay(reference_kv(setup, caching), trace, setup)
    try:
        got = replay(make_kv(), trace, setup)
    except AssertionError as err:
        raise AssertionError(f"{where}{err}") from None
    for want, have in zip(expected, got):
        for what in ("preempted", "scheduled", "copies", "finished", "used_blocks"):
            a, b = getattr(want, what), getattr(have, what)
            if a != b:
                raise Mismatch(a, b, f"{where}step {want.step}, {_describe(what)}")
    if len(got) != len(expected):
        raise Mismatch(f"{len(expected)} steps", f"{len(got)} steps", f"{where}trace length")
    return len(expected)


def _describe(what: str) -> str:
    return {
        "scheduled": "scheduled (request, tokens cached, new tokens, block table)",
        "copies": "copy-on-write (src, dst) block copies",
        "preempted": "preempted requests",
        "finished": "finished requests",
        "used_blocks": "blocks in use after the step",
    }[what]


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
) -> list[KVRequest]:
    """A seeded trace: each prompt is one of ``prefixes`` (or none) plus a random tail; ragged
    lengths, bursty arrivals, ``n`` up to ``max_n``, optional priorities, salts and aborts."""
    rng = random.Random(seed)
    choices = [()] + [tuple(p) for p in prefixes]
    trace = []
    for i in range(num_requests):
        prefix = rng.choice(choices)
        tail = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, max_prompt_tail)))
        abort = rng.randint(1, 8) if abort_every and i % abort_every == abort_every - 1 else None
        trace.append(KVRequest(
            f"r{i}", prefix + tail, rng.randint(1, max_tokens), rng.randint(0, max_arrival_step),
            n=rng.randint(1, max_n), priority=rng.randrange(priorities), cache_salt=rng.choice(list(salts)),
            abort_step=abort,
        ))
    return trace


# --- the tiny model ---------------------------------------------------------------------------------
PROMPTS = [
    "Once upon a time", "The little fox", "Tom went to the market and", "A bird sat on a branch",
    "In the morning the sun", "Mia had a red ball", "The old man smiled", "Sam and Lily were friends",
]


def first_difference(want: Sequence[int], got: Sequence[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))


def expect_same_tokens(expected: dict[str, list[int]], got: dict[str, list[int]], what: str) -> None:
    """Raise :class:`Mismatch` naming the first request (and token) that differs."""
    for rid, want in expected.items():
        have = got.get(rid)
        if have != want:
            i = first_difference(want, have or [])
            raise Mismatch(want, have, f"{what}: request {rid!r}, first difference at generated token {i}")
