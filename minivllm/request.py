"""A request as the scheduler sees it: tokens, progress, status. Pure Python, no torch.

The one number that drives scheduling is ``num_computed_tokens``: how many of the request's
tokens (prompt and generated so far) already have their K/V in the cache. Each step the
scheduler gives a request some new tokens to compute; when ``num_computed_tokens`` catches up
with ``num_tokens`` the model's output at the last token is sampled, which appends a token and
opens the gap by one again. Prefill and decode are the same thing at different gap sizes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from minivllm.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0
    priority: int = 0  # lower value = more important (as in vLLM)
    eos_token_ids: tuple[int, ...] = ()
    cache_salt: str | None = None
    prompt: str | None = None

    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    # times stamped by the engine (wall clock) or the simulator (simulated clock)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    # prefix-caching hashes of this request's full blocks (see minivllm.core.block_pool)
    block_hashes: list = field(default_factory=list, repr=False)
    # speculative decoding: draft tokens proposed for the next step, verified by it
    spec_token_ids: list[int] = field(default_factory=list, repr=False)
    # derived in __post_init__
    all_token_ids: list[int] = field(init=False, repr=False)
    num_prompt_tokens: int = field(init=False)
    max_tokens: int = field(init=False, repr=False)
    length_limit: int = field(init=False, repr=False)
    stop_token_set: set[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        params = self.sampling_params
        self.max_tokens = params.max_tokens if params.max_tokens is not None else 1 << 62
        self.length_limit = self.num_prompt_tokens + self.max_tokens  # total tokens at max_tokens
        # token ids that end the request (stop_token_ids, plus EOS unless ignore_eos)
        self.stop_token_set = set(params.stop_token_ids)
        if not params.ignore_eos:
            self.stop_token_set.update(self.eos_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED_STOPPED

    def check_stop(self, last_token: int, max_model_len: int | None = None) -> RequestStatus | None:
        """Stop rules, checked after ``last_token`` was appended: a stop token (once
        ``min_tokens`` exist), ``max_tokens``, or the model's length limit."""
        n_out = len(self.all_token_ids) - self.num_prompt_tokens
        if last_token in self.stop_token_set and n_out >= self.sampling_params.min_tokens:
            # vLLM reports the token for a stop_token_ids hit and None for plain EOS
            is_stop_id = last_token in self.sampling_params.stop_token_ids
            self.stop_reason = last_token if is_stop_id else None
            return RequestStatus.FINISHED_STOPPED
        if n_out >= self.max_tokens:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        if max_model_len is not None and len(self.all_token_ids) >= max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None
