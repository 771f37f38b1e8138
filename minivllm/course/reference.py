"""Replay a request trace through a scheduler without a model, to grade a student's scheduler.

A scheduler only needs to be told which token each scheduled request sampled; here every
request samples token 0 and stops on its length (``ignore_eos``). So a trace of
``(prompt_len, output_len, arrival_step)`` is enough to replay exactly what the engine's
scheduler would decide, step by step -- minivllm's own :class:`~minivllm.core.scheduler.Scheduler`
or any object that meets the ``Scheduler`` protocol -- and to compare the two.

* :func:`run_reference` replays minivllm's scheduler (continuous, or the static baseline);
* :class:`Replay` drives any scheduler factory one step at a time;
* :func:`compare_with_reference` runs a student's scheduler next to the reference and raises
  :class:`StepMismatch` at the first step where they disagree, with the state before that step.

Every scheduler gets its KV cache manager through
:class:`~minivllm.course.scheduling.ProtocolOnlyKV`, so a scheduler that passes uses only the
``KVCacheManager`` protocol.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.core.static_scheduler import StaticBatchScheduler
from minivllm.course.grading import Mismatch
from minivllm.course.scheduling import ProtocolOnlyKV
from minivllm.math_utils import cdiv
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams

NO_LENGTH_CAP = 1 << 40
SchedulerFactory = Callable[[SchedulerConfig, object], object]
REFERENCE_SCHEDULERS: dict[str, SchedulerFactory] = {"continuous": Scheduler, "static": StaticBatchScheduler}


@dataclass(frozen=True)
class TraceRequest:
    request_id: str
    prompt_len: int
    output_len: int
    arrival_step: int = 0  # the request joins the waiting queue before this step is planned


@dataclass
class ReplayStep:
    """What a scheduler saw and decided at one step."""

    step: int
    running: list[tuple[str, int]]  # before planning: (request_id, tokens left to compute)
    waiting: list[tuple[str, int]]  # before planning: (request_id, tokens left), queue order
    batch: list[tuple[str, int]]  # (request_id, tokens computed this step), batch order
    sampled: list[str]  # requests that sampled a token at the end of the step
    preempted: list[str]  # requests sent back to the waiting queue during the step
    finished: list[str]  # requests that ended with this step
    kv_blocks_used: int  # after the step
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_padding_tokens: int = 0


RefStep = ReplayStep  # the name older notebooks use


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
    return sum(cdiv(r.prompt_len + r.output_len, block_size) for r in trace) + 1


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


class Replay:
    """Drive one scheduler over a trace, one step at a time, without a model.

    ``factory(config, kv)`` builds the scheduler (a class such as ``Scheduler`` will do). Each
    request gets distinct token ids, ``max_tokens = output_len`` and ``ignore_eos``; every
    sampled token is 0. ``num_kv_blocks=None`` sizes the pool so that it never fills.
    """

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
    ):
        if not enable_chunked_prefill:
            too_long = [r.request_id for r in trace if r.prompt_len > max_num_batched_tokens]
            if too_long:
                raise ValueError(f"without chunking, prompts longer than the budget never run: {too_long}")
        self.num_blocks = num_kv_blocks or blocks_to_never_fill(trace, block_size)
        self.block_size = block_size
        self.kv = KVCacheManager(self.num_blocks, block_size, enable_caching=False)
        self.config = scheduler_config(max_num_seqs, max_num_batched_tokens, enable_chunked_prefill)
        self.scheduler = factory(self.config, ProtocolOnlyKV(self.kv))
        self.pending = sorted(trace, key=lambda r: r.arrival_step)
        self.next_arrival = 0
        self.t = 0

    def settings(self) -> str:
        cfg = self.config
        return (f"max_num_seqs={cfg.max_num_seqs}, max_num_batched_tokens={cfg.max_num_batched_tokens}, "
                f"chunked prefill {'on' if cfg.enable_chunked_prefill else 'off'}, "
                f"KV pool of {self.num_blocks} blocks x {self.block_size} tokens")

    def _arrive(self) -> None:
        while self.next_arrival < len(self.pending) and self.pending[self.next_arrival].arrival_step <= self.t:
            r = self.pending[self.next_arrival]
            params = SamplingParams(max_tokens=r.output_len, ignore_eos=True)
            # distinct token ids per request, so that nothing could ever be shared between them
            ids = [(self.next_arrival * 7919 + j) % 30000 + 1 for j in range(r.prompt_len)]
            self.scheduler.add_request(Request(r.request_id, ids, params, arrival_time=float(self.t)))
            self.next_arrival += 1

    def done(self) -> bool:
        """Every request has arrived and finished (call after :meth:`step` or before the first)."""
        self._arrive()
        return self.next_arrival == len(self.pending) and not self.scheduler.has_unfinished_requests()

    def state(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """``(running, waiting)``: ``(request_id, tokens left to compute)`` in queue order."""
        sched = self.scheduler
        running = [(q.request_id, q.num_tokens - q.num_computed_tokens) for q in sched.running]
        waiting = [(q.request_id, q.num_tokens - q.num_computed_tokens) for q in sched.waiting]
        return running, waiting

    def step(self) -> ReplayStep:
        """Admit this step's arrivals, plan the step, 'run' it (token 0 for every request that
        samples), hand the tokens back, and report what happened."""
        self._arrive()
        running, waiting = self.state()
        out = self.scheduler.schedule()
        sampled = [r.request_id for r in out.sampling_requests]
        self.kv.commit_written_blocks()
        finished = self.scheduler.update_from_output(dict.fromkeys(sampled, 0))
        step = ReplayStep(
            self.t, running, waiting, out.decisions(), sampled,
            [r.request_id for r in out.preempted], [r.request_id for r in finished],
            self.kv.num_used_blocks, out.num_prefill_tokens, out.num_decode_tokens,
            out.num_padding_tokens,
        )
        self.t += 1
        return step


def run_reference(
    trace: Sequence[TraceRequest],
    max_num_seqs: int,
    max_num_batched_tokens: int,
    enable_chunked_prefill: bool = False,
    num_kv_blocks: int | None = None,
    block_size: int = 16,
    scheduler: str = "continuous",
    max_steps: int = 100_000,
) -> list[ReplayStep]:
    """Replay ``trace`` through minivllm's own scheduler (``"continuous"``: ``Scheduler``;
    ``"static"``: ``StaticBatchScheduler``) with no prefix caching. One :class:`ReplayStep`
    per step, idle steps (nothing has arrived yet) included, until every request has finished."""
    replay = Replay(
        REFERENCE_SCHEDULERS[scheduler], trace, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=enable_chunked_prefill,
        num_kv_blocks=num_kv_blocks, block_size=block_size,
    )
    steps: list[ReplayStep] = []
    while not replay.done():
        if len(steps) >= max_steps:
            raise RuntimeError(f"the reference scheduler did not finish the trace in {max_steps} steps")
        steps.append(replay.step())
    return steps


def _wrong_status(scheduler) -> list[tuple[str, str]]:
    """Requests whose status does not match the queue they are in."""
    bad = [(r.request_id, r.status.name) for r in scheduler.running if r.status is not RequestStatus.RUNNING]
    bad += [(r.request_id, r.status.name) for r in scheduler.waiting
            if r.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED)]
    return bad


class StepMismatch(Mismatch):
    """A scheduler decided differently from the reference at one step; the message shows the
    settings, the state before the step, and what differed."""

    def __init__(self, where: str, replay: Replay, ref: ReplayStep, what: str, expected, got):
        self.expected, self.got, self.note = expected, got, where
        lines = [
            f"{where}{replay.settings()}",
            f"before step {ref.step}: running {ref.running}",
            f"{' ' * len(f'before step {ref.step}: ')}waiting {ref.waiting}   (request, tokens left to compute)",
            f"step {ref.step}, {what}:",
            f"  expected {expected}",
            f"  got      {got}",
            "(the state before that step is shown above)",
        ]
        AssertionError.__init__(self, "\n".join(lines))


def compare_with_reference(
    factory: SchedulerFactory,
    trace: Sequence[TraceRequest],
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    enable_chunked_prefill: bool = False,
    num_kv_blocks: int | None = None,
    block_size: int = 16,
    label: str = "",
) -> list[ReplayStep]:
    """Run the scheduler ``factory`` builds next to minivllm's ``Scheduler`` (same settings, same
    pool) and raise :class:`StepMismatch` at the first step where the batch, the requests that
    sample, the preempted ones, the finished ones or the KV blocks in use differ. Returns the
    student's steps."""
    kwargs = dict(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=enable_chunked_prefill, num_kv_blocks=num_kv_blocks,
        block_size=block_size,
    )
    reference = run_reference(trace, **kwargs)
    mine = Replay(factory, trace, **kwargs)
    where = f"{label}: " if label else ""
    steps = []
    for ref in reference:
        got = mine.step()
        steps.append(got)
        checks = (
            ("batch (request, tokens)", ref.batch, [tuple(x) for x in got.batch]),
            ("requests that sample a token", ref.sampled, got.sampled),
            ("requests preempted", ref.preempted, got.preempted),
            ("requests finished", sorted(ref.finished), sorted(got.finished)),
            ("KV blocks in use after the step", ref.kv_blocks_used, got.kv_blocks_used),
        )
        for what, expected, actual in checks:
            if expected != actual:
                raise StepMismatch(where, mine, ref, what, expected, actual)
        wrong = _wrong_status(mine.scheduler)
        if wrong:
            raise StepMismatch(where, mine, ref, "status of the requests in self.running / self.waiting",
                               "RUNNING / WAITING or PREEMPTED", wrong)
    if not mine.done():
        left = [r.request_id for r in list(mine.scheduler.running) + list(mine.scheduler.waiting)]
        raise Mismatch("every request finished", f"still unfinished: {left}",
                       f"{where}after {len(reference)} steps ({mine.settings()})")
    return steps
