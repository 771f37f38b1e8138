"""Notebook 09's view of a run: requests that arrive at given steps, and the queues after each.

``LLM.generate`` queues everything at once, which cannot show what a scheduling policy does
when a chat request arrives while long requests already hold the KV cache. :func:`serve_arrivals`
runs :class:`Arrival` requests through :func:`~minivllm.course.harness.run_trace` and logs, in
steps rather than seconds (so that the log is the same on every machine), who ran after each
step, who waited and who was preempted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from minivllm.course.harness import TraceRequest, TraceResult, run_trace


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
class ArrivalStep:
    """The queues after one step: running requests in admission order and their blocks."""

    step: int
    running: list[str]
    num_waiting: int
    preempted: list[str]  # sent back to the waiting queue by this step
    kv_blocks_used: int
    blocks_held: dict[str, int] = field(default_factory=dict)


@dataclass
class ArrivalRun:
    """A run's tokens, preemptions (per request) and one :class:`ArrivalStep` per step."""

    result: TraceResult
    steps: list[ArrivalStep]

    @property
    def tokens(self) -> dict[str, list[int]]:
        return self.result.tokens

    @property
    def preemptions(self) -> dict[str, int]:
        return self.result.preemptions

    def wait(self, request_id: str, arrival_step: int) -> int:
        """Steps from a request's arrival to its first token (0: its first step produced it)."""
        return self.result.first_token_step(request_id) - arrival_step


def serve_arrivals(llm_or_engine, arrivals: Sequence[Arrival], max_steps: int = 100_000) -> ArrivalRun:
    """Run ``arrivals`` on an ``LLM`` (or ``LLMEngine``) until every request finished; requests
    with the same arrival step are added in list order."""
    trace = [TraceRequest(a.request_id, a.prompt, a.max_tokens, a.step, priority=a.priority) for a in arrivals]
    result = run_trace(llm_or_engine, trace, max_steps=max_steps)
    steps = [ArrivalStep(s.step, list(s.blocks_held), s.num_waiting, s.preempted, s.kv_blocks_used, s.blocks_held)
             for s in result.steps]
    return ArrivalRun(result, steps)
