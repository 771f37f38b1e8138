"""What ``LLM.generate`` returns, shaped like vLLM's ``RequestOutput`` / ``CompletionOutput``."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minivllm.request import Request


@dataclass
class Logprob:
    """One token's log-probability at one position (vLLM's ``Logprob``): ``rank`` 1 is the
    most likely token."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# per position: {token id: Logprob} holding the chosen token and the requested top tokens
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    cumulative_logprob: float | None = None  # with SamplingParams(logprobs=k)
    logprobs: list[PositionLogprobs] | None = None  # one entry per token, with logprobs=k
    error: str | None = None  # why the request failed, when finish_reason == "error"

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """A request's times in seconds (wall clock in the engine, simulated clock in the
    simulator) and counts, as read off its :class:`~minivllm.request.Request` -- where the
    engine stamps them, once each -- by :meth:`from_request`. The statistics keep one for every
    finished request; a ``RequestOutput`` carries one taken when it was made."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_output_tokens: int = 0
    num_preemptions: int = 0

    @classmethod
    def from_request(cls, request: Request) -> RequestMetrics:
        return cls(request.arrival_time, request.first_scheduled_time, request.first_token_time,
                   request.finished_time, request.num_output_tokens, request.num_preemptions)

    @property
    def ttft(self) -> float | None:
        """Time to first token: arrival -> first generated token."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (mean inter-token latency)."""
        if self.finished_time is None or self.first_token_time is None or self.num_output_tokens < 2:
            return None
        return (self.finished_time - self.first_token_time) / (self.num_output_tokens - 1)

    @property
    def e2e_latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = field(default=None, repr=False)
    # with SamplingParams(prompt_logprobs=k): one entry per prompt token (None for the first)
    prompt_logprobs: list[PositionLogprobs | None] | None = field(default=None, repr=False)


class RequestOutputKind(enum.Enum):
    """What each ``RequestOutput`` of a request holds (vLLM's ``RequestOutputKind``).

    ``CUMULATIVE``: everything so far, every time (``LLMEngine.step``'s default; building it
    costs as much as the answer is long); ``DELTA``: only what is new since the request's
    previous output (streams: ``LLM.stream``, ``AsyncLLM``; costs what is new); ``FINAL_ONLY``:
    one output, the whole answer, when the request ends (``LLM.generate``, a non-streaming
    HTTP reply)."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2
