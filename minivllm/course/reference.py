"""The scheduler rig: request traces through any scheduler, without a model, next to minivllm's.

A scheduler only needs to be told which token each scheduled request sampled, and here every
request stops on its length or a stop token. So a trace of prompt lengths, output lengths and
arrival (and abort) steps is enough to replay exactly what the engine's scheduler would decide,
step by step: minivllm's ``EngineCore`` runs the scheduler (minivllm's own
:class:`~minivllm.core.scheduler.Scheduler`, or any object that meets the ``SchedulerInterface``
protocol) over a KV pool and :class:`~minivllm.sim.executor.ModelFreeExecutor`, as
:class:`~minivllm.course.harness.ReplaySetup` builds it.

* :class:`Replay` steps a scheduler factory through a trace, one step per ``next()``;
* :func:`run_reference` replays minivllm's scheduler (continuous, or the static baseline);
* :func:`compare_with_reference` runs a scheduler next to minivllm's and raises
  :class:`~minivllm.course.harness.StepMismatch` at the first step where they disagree, with
  the state before that step.

Every scheduler but minivllm's own gets its KV cache manager through :class:`ProtocolOnlyKV`, so a
scheduler that passes uses only the ``KVCacheManager`` protocol, and its run is checked after
every step against the limits every scheduler keeps (:func:`within_limits`): the token budget,
the seats, the pool's accounting.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from minivllm.core.interfaces import KVCacheManagerInterface, protocol_members
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.core.static_scheduler import StaticBatchScheduler
from minivllm.course.grading import Mismatch
from minivllm.course.harness import (
    ReplaySetup,
    StepMismatch,
    StepRecord,
    TraceRequest,
    TraceResult,
    TraceRun,
    expect_same_steps,
    scheduler_config,
)
from minivllm.math_utils import cdiv

SchedulerFactory = Callable[[SchedulerConfig, object], object]
REFERENCE_SCHEDULERS: dict[str, SchedulerFactory] = {"continuous": Scheduler, "static": StaticBatchScheduler}
# what two schedulers must agree on at every step, in the order a difference is reported
DECISIONS = ("batch", "sampled", "preempted", "ended", "kv_blocks_used")
# ... and, for a scheduler written from the protocol, the size of its waiting queue after the step
SCHEDULER_FIELDS = DECISIONS + ("num_waiting",)

__all__ = [
    "DECISIONS", "SCHEDULER_FIELDS", "ProtocolOnlyKV", "Replay", "TraceRequest", "blocks_to_never_fill",
    "compare_with_reference", "random_trace", "run_reference", "scheduler_config", "within_limits",
]


def random_trace(
    seed: int,
    num_requests: int,
    prompt_range: tuple[int, int] = (1, 64),
    output_range: tuple[int, int] = (1, 24),
    max_arrival_gap: int = 3,
    abort_share: float = 0.0,
) -> list[TraceRequest]:
    """A seeded trace with ragged lengths and bursty arrivals (gaps of 0..max_arrival_gap);
    ``abort_share`` of the requests are aborted 0-12 steps after they arrive (waiting, in the
    middle of their prompt or decoding, or after they ended, depending on the scheduler)."""
    rng = random.Random(seed)
    trace, t = [], 0
    for i in range(num_requests):
        t += rng.randint(0, max_arrival_gap)
        abort = t + rng.randint(0, 12) if rng.random() < abort_share else None
        trace.append(TraceRequest(f"r{i}", rng.randint(*prompt_range), rng.randint(*output_range), t,
                                  abort_step=abort))
    return trace


def blocks_to_never_fill(trace: Sequence[TraceRequest], block_size: int = 16) -> int:
    """A pool size at which no request ever waits for KV blocks: every request's final length."""
    return sum(cdiv(r.prompt_len + r.max_tokens, block_size) for r in trace) + 1


class ProtocolOnlyKV:
    """A KV cache manager seen only through the ``KVCacheManager`` protocol.

    Wraps a manager and forwards the protocol's members; anything else raises an
    ``AttributeError`` that says so. The checks give this to a student's scheduler, so that a
    scheduler that passes them also runs over any other manager (notebook 08 plugs in the
    student's own)."""

    _ALLOWED = frozenset(protocol_members(KVCacheManagerInterface))

    def __init__(self, inner: KVCacheManagerInterface):
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str):
        if name in ProtocolOnlyKV._ALLOWED:
            return getattr(self._inner, name)
        raise AttributeError(
            f"{name!r} is not part of the KVCacheManager protocol; a scheduler may use only "
            f"{', '.join(sorted(ProtocolOnlyKV._ALLOWED))}"
        )

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"a scheduler must not change its KV cache manager (tried to set {name!r})")

    def __repr__(self) -> str:
        return f"ProtocolOnlyKV({type(self._inner).__name__}, {self._inner.num_blocks} blocks)"


def protocol_only(factory: SchedulerFactory) -> SchedulerFactory:
    """``factory(config, kv)`` given only the ``KVCacheManager`` protocol of ``kv`` (for
    ``LLM(scheduler=...)``)."""

    def build(config, kv):
        return factory(config, ProtocolOnlyKV(kv))

    return build


def within_limits(max_num_seqs: int, max_num_batched_tokens: int, label: str = "",
                  settings: str = "") -> Callable[[StepRecord], None]:
    """A check for :class:`~minivllm.course.harness.TraceRun` (``checks=``) of what every
    scheduler must keep whatever it decides: at most ``max_num_batched_tokens`` tokens computed,
    at most ``max_num_seqs`` requests in the batch and running, no request in the batch with no
    token or twice. A step that breaks one raises :class:`StepMismatch` with the state before it."""

    def check(rec: StepRecord) -> None:
        total = sum(n for _, n in rec.batch)
        ids = [rid for rid, _ in rec.batch]
        broken = []
        if total > max_num_batched_tokens:
            broken.append(("tokens computed (the budget)", f"at most {max_num_batched_tokens}", total))
        if len(ids) > max_num_seqs:
            broken.append(("requests in the batch (the seats)", f"at most {max_num_seqs}", len(ids)))
        if len(rec.blocks_held) > max_num_seqs:
            broken.append(("requests running after the step (the seats)", f"at most {max_num_seqs}",
                           sorted(rec.blocks_held)))
        if len(set(ids)) != len(ids) or any(n < 1 for _, n in rec.batch):
            broken.append(("batch entries", "each request at most once, with at least one token", rec.batch))
        if broken:
            what, expected, got = broken[0]
            raise StepMismatch(label, settings, rec, what, expected, got)

    return check


class Replay(TraceRun):
    """Drive the scheduler ``factory(config, kv)`` builds (a class such as ``Scheduler`` will do)
    over ``trace`` without a model; iterating runs one engine step at a time and yields its
    record. ``num_kv_blocks=None`` sizes the pool so that it never fills; ``max_model_len=None``
    lets requests stop on their ``max_tokens`` only; ``vocab > 1`` samples seeded tokens (for
    traces with stop tokens), else every token is 0. A scheduler other than minivllm's gets
    its KV cache manager through :class:`ProtocolOnlyKV`, and its run is checked after every
    step against the limits (:func:`within_limits`) and the pool's accounting."""

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
        max_model_len: int | None = None,
        vocab: int = 1,
        max_steps: int = 100_000,
        label: str = "",
    ):
        if not enable_chunked_prefill:
            too_long = [r.request_id for r in trace if r.prompt_len > max_num_batched_tokens]
            if too_long:
                raise ValueError(f"without chunking, prompts longer than the budget never run: {too_long}")
        self.num_blocks = num_kv_blocks or blocks_to_never_fill(trace, block_size)
        self.block_size = block_size
        setup = ReplaySetup(self.num_blocks, block_size, max_num_seqs, max_num_batched_tokens, max_model_len,
                            enable_chunked_prefill, prefix_caching=False, debug_checks=False, vocab=vocab,
                            logprobs=False)
        mine = factory not in REFERENCE_SCHEDULERS.values()  # minivllm's own need no policing
        core = setup.core(ProtocolOnlyKV(setup.kv()) if mine else None, scheduler=factory)
        cap = "" if max_model_len is None else f", max_model_len={max_model_len}"
        settings = (f"max_num_seqs={max_num_seqs}, max_num_batched_tokens={max_num_batched_tokens}{cap}, "
                    f"chunked prefill {'on' if enable_chunked_prefill else 'off'}, "
                    f"KV pool of {self.num_blocks} blocks x {block_size} tokens")
        self._settings = settings
        checks = [within_limits(max_num_seqs, max_num_batched_tokens, label, settings)] if mine else []
        super().__init__(core, trace, label=label, max_steps=max_steps, check_pool=mine, checks=checks)

    def settings(self) -> str:
        return self._settings


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


def expect_same_preemptions(expected: TraceResult, got: TraceResult, where: str) -> None:
    """Every request counted as often in ``Request.num_preemptions`` (its metrics report it) as
    minivllm's scheduler counted it."""
    want = {rid: r.num_preemptions for rid, r in expected.requests.items()}
    have = {rid: r.num_preemptions for rid, r in got.requests.items()}
    if want != have:
        wrong = sorted(rid for rid in want if want[rid] != have.get(rid))
        raise Mismatch({r: want[r] for r in wrong}, {r: have.get(r) for r in wrong},
                       f"{where}: Request.num_preemptions at the end")


def compare_with_reference(factory: SchedulerFactory, trace: Sequence[TraceRequest], *, label: str = "",
                           **settings) -> list[StepRecord]:
    """Run the scheduler ``factory`` builds next to minivllm's ``Scheduler`` (same
    :class:`Replay` ``settings``, same pool), step by step, and raise at the first step where
    the batch, the requests that sample, the preempted ones, the ones that ended (and how), the
    KV blocks in use or the requests left waiting differ, where a queued request has the wrong
    status, or where the scheduler breaks a limit (:func:`within_limits`). Returns its steps."""
    expected = Replay(Scheduler, trace, **settings).finish()
    mine = Replay(factory, trace, label=label, **settings)
    steps = expect_same_steps(expected, mine, SCHEDULER_FIELDS, label, mine.settings())
    expect_same_preemptions(expected, mine.result, ", ".join(x for x in (label, mine.settings()) if x))
    return steps
