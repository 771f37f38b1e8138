"""Drive the real engine step by step with requests that arrive at given steps, and log it.

``LLM.generate`` queues everything at once, which cannot show what a scheduling policy does
when a chat request arrives while long requests already hold the KV cache. Here each request
is added just before the engine step it arrives at, and every step records who ran, who
waited and who was preempted, in steps rather than seconds, so that the log is the same on
every machine. Used by notebook 09 and by the checks of exercise 09.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from minivllm.sampling_params import SamplingParams


@dataclass(frozen=True)
class Arrival:
    """A greedy request that produces exactly ``max_tokens`` tokens, added to the engine just
    before step ``step`` runs."""

    request_id: str
    prompt: str | list[int]
    max_tokens: int
    step: int = 0
    priority: int = 0


@dataclass
class StepRecord:
    step: int
    running: list[str]  # after the step was planned, in admission order
    num_waiting: int
    preempted: list[str]  # sent back to the waiting queue by this step
    kv_blocks_used: int
    blocks_held: dict[str, int] = field(default_factory=dict)  # running request -> its KV blocks


@dataclass
class ArrivalRun:
    """What happened: every request's tokens, the step of its first and last token, the
    requests preempted (and how often), and one :class:`StepRecord` per step."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    first_token_step: dict[str, int] = field(default_factory=dict)
    finished_step: dict[str, int] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)

    def wait(self, request_id: str, arrival_step: int) -> int:
        """Steps from a request's arrival to its first token (0: its first step produced it)."""
        return self.first_token_step[request_id] - arrival_step


def serve_arrivals(llm_or_engine, arrivals: Sequence[Arrival], max_steps: int = 100_000) -> ArrivalRun:
    """Run ``arrivals`` on an ``LLM`` (or ``LLMEngine``) until every request finished.

    Requests with the same arrival step are added in list order. Raises ``RuntimeError`` if
    they have not all finished after ``max_steps`` steps.
    """
    engine = getattr(llm_or_engine, "engine", llm_or_engine)
    scheduler = engine.scheduler
    pending = sorted(arrivals, key=lambda a: a.step)  # stable
    run = ArrivalRun()
    step = 0
    while pending or engine.has_unfinished_requests():
        if step >= max_steps:
            raise RuntimeError(f"requests still unfinished after {max_steps} steps")
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
            engine.add_request(a.request_id, a.prompt, params, priority=a.priority)
        before = {rid: r.num_preemptions for rid, r in scheduler.requests.items()}
        outputs = engine.step()
        preempted = [rid for rid, r in scheduler.requests.items() if r.num_preemptions > before.get(rid, 0)]
        for rid in preempted:
            run.preemptions[rid] = run.preemptions.get(rid, 0) + 1
        kv = engine.kv
        held = {r.request_id: len(kv.get_block_ids(r.request_id)) for r in scheduler.running}
        run.steps.append(StepRecord(step, list(held), scheduler.num_waiting, preempted, kv.num_used_blocks, held))
        for out in outputs:
            if out.outputs and out.outputs[0].token_ids:
                run.first_token_step.setdefault(out.request_id, step)
            if out.finished:
                run.finished_step[out.request_id] = step
                run.tokens[out.request_id] = list(out.outputs[0].token_ids)
        step += 1
    return run
