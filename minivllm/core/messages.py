"""What crosses between a front end and the engine core: small messages of token ids.

The front end (``LLMEngine``, ``AsyncLLM``) tokenizes, validates and detokenizes; the engine
core schedules and runs the model. Whether the core runs in the caller's process or in a
process of its own (``engine_core_process=True``), they talk only through these messages:

    front end -> core   EngineCoreRequest   one user request: prompt token ids, its settings
                        FinishRequests      end samples now (an abort, a stop string found)
                        UtilityCall         a question about the core (its statistics, state)
                        SHUTDOWN            abort everything and stop
    core -> front end   EngineCoreOutputs   one step: per sample the *new* token ids (a delta),
                                            how it ended, log-probabilities; the core's state
                                            for the gauges; what the step did
                        UtilityResult       the answer to a UtilityCall

Text never crosses: a token id is an int, a step's message is one small object per sample that
made progress, so its size does not grow with the length of an answer. vLLM v1 has the same
split (``EngineCoreRequest`` / ``EngineCoreOutputs`` in ``vllm/v1/engine/__init__.py``).

Pure Python (no torch): the messages are pickled when the core runs in another process (see
``docs/architecture.md`` for why pickle), and passed as they are when it runs in this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.outputs import RequestMetrics
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams


@dataclass
class Logprobs:
    """Log-probabilities of one sampled position: the chosen token's, and the ``k`` best.

    ``token_id``/``logprob``: the token that was sampled and its log-probability; ``rank``: its
    rank among all tokens (1 = most likely); ``top``: ``[(token_id, logprob), ...]``, best first.
    """

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]] = field(default_factory=list)



def sample_ids(request_id: str, n: int) -> list[str]:
    """The engine-level ids of a user request's ``n`` samples: the id itself when ``n == 1``."""
    return [request_id] if n == 1 else [f"{request_id}#{i}" for i in range(n)]


# --- front end -> core ---------------------------------------------------------------------
@dataclass(slots=True)
class EngineCoreRequest:
    """One user request, validated and tokenized by the front end (``InputProcessor``)."""

    request_id: str  # the user's id; its samples are sample_ids(request_id, params.n)
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float  # time.perf_counter() when it arrived (system-wide, so any process)
    priority: int = 0
    cache_salt: str | None = None

    def samples(self, eos_token_ids: tuple[int, ...]) -> list[Request]:
        """The core's requests: one per sample, sample ``i`` seeded ``seed + i`` (the first is
        the leader the others fork off; see ``EngineCore.add_request``)."""
        params = self.params
        per_sample = [params] if params.n == 1 else [params.for_sample(i) for i in range(params.n)]
        return [
            Request(rid, self.prompt_token_ids, sp, arrival_time=self.arrival_time,
                    priority=self.priority, eos_token_ids=eos_token_ids, cache_salt=self.cache_salt)
            for rid, sp in zip(sample_ids(self.request_id, params.n), per_sample, strict=True)
        ]


@dataclass(frozen=True, slots=True)
class FinishRequests:
    """End these samples now with ``status`` (aborted, or stopped at a stop string the front
    end found): they leave the scheduler and their blocks are freed. Unknown ids are ignored."""

    request_ids: tuple[str, ...]
    status: RequestStatus


UTILITIES = ("get_stats", "reset_stats", "check_invariants", "state", "set_stats_window", "request_ids",
             "beam_search")


@dataclass(frozen=True, slots=True)
class UtilityCall:
    """A question for the core, answered by a :class:`UtilityResult` with the same ``call_id``.
    ``method`` is one of :data:`UTILITIES` (nothing else is called)."""

    call_id: int
    method: str
    args: tuple = ()


SHUTDOWN = "shutdown"  # the command that stops the core (a string: it pickles as itself)


# --- core -> front end ---------------------------------------------------------------------
@dataclass(slots=True)
class RequestDelta:
    """What one step did for one sample (vLLM's ``EngineCoreOutput``): only what is new."""

    request_id: str  # the sample's id
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"; None: running on
    stop_reason: int | str | None = None  # the stop_token_ids entry that ended it (None: EOS, a length)
    error: str | None = None  # why it failed (finish_reason == "error")
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served it
    new_logprobs: list[Logprobs] | None = None  # one per new token, when asked for
    prompt_logprobs: tuple[int, list] | None = None  # (first prompt position, entries)
    metrics: RequestMetrics | None = None  # its times, on the delta that ends it

    def __reduce__(self):
        """Pickled as its fields in a tuple: a step sends one delta per sample, and this is
        about 3x cheaper than pickle's default for a dataclass (benchmarks/core_transport.py)."""
        return RequestDelta, (self.request_id, self.new_token_ids, self.finish_reason, self.stop_reason,
                              self.error, self.num_cached_tokens, self.new_logprobs, self.prompt_logprobs,
                              self.metrics)


@dataclass(frozen=True, slots=True)
class CoreState:
    """The core right after a step or a command: what the gauges show."""

    num_running: int  # sequences holding a seat
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    num_unfinished: int  # every sample the core holds (running, waiting, unforked siblings)


@dataclass(frozen=True, slots=True)
class StepSummary:
    """What one step did, for the counters and histograms (read off its ``StepStats``)."""

    num_batched_seqs: int  # sequences in the forward pass
    num_preemptions: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # ... and found there
    num_draft_tokens: int = 0  # speculative decoding: drafts verified ...
    num_accepted_tokens: int = 0  # ... and accepted


@dataclass(slots=True)
class EngineCoreOutputs:
    """What one engine step did, as the core hands it on (vLLM's ``EngineCoreOutputs``): the
    deltas of its samples, the state it left, the step's figures and ``timestamp``, the core's
    clock when the step ended -- the moment its tokens exist, which the core stamps as a
    request's first-token time. ``EngineCore.step()`` returns it, the step listeners get it, and
    the core loop sends it to the front end (with the deltas of samples a command ended; a
    message that carries no step has ``step``, ``timestamp`` and ``plan`` ``None``).

    ``plan`` and ``start_time`` (the step's :class:`SchedulerOutput` and the clock before it was
    planned) are for whoever watches the step in the core's own process; they never cross to
    another process (the plan holds the requests themselves), see :meth:`__reduce__`. The
    properties below read the deltas the way a test or a listener asks about a step."""

    deltas: list[RequestDelta]
    state: CoreState | None = None
    step: StepSummary | None = None
    timestamp: float | None = None
    plan: SchedulerOutput | None = None
    start_time: float | None = None

    def __reduce__(self):
        """Pickled without the plan and the start time: only the deltas, state and figures
        cross to the front end's process."""
        return EngineCoreOutputs, (self.deltas, self.state, self.step, self.timestamp)

    @property
    def new_token_ids(self) -> dict[str, list[int]]:
        """Sample id -> the tokens appended to it in this step (for those that got any)."""
        return {d.request_id: d.new_token_ids for d in self.deltas if d.new_token_ids}

    @property
    def finish_reasons(self) -> dict[str, str]:
        """Sample id -> how it ended (``"stop"``, ``"length"``, ``"abort"``, ``"error"``), for
        the samples that ended."""
        return {d.request_id: d.finish_reason for d in self.deltas if d.finish_reason is not None}

    @property
    def failed(self) -> dict[str, str]:
        """Sample id -> the error it ended with, for the samples that failed."""
        return {d.request_id: d.error or "" for d in self.deltas if d.finish_reason == "error"}


@dataclass(frozen=True, slots=True)
class UtilityResult:
    call_id: int
    value: Any = None
    error: str | None = None  # "TypeName: message" when the call raised

    def unwrap(self) -> Any:
        """The value, or the call's error raised here: a ``ValueError`` or ``TypeError`` (a
        refused argument) as itself, anything else as a ``RuntimeError`` that names it."""
        if self.error is None:
            return self.value
        name, _, message = self.error.partition(": ")
        refused = {"ValueError": ValueError, "TypeError": TypeError}.get(name)
        if refused is not None:
            raise refused(message)
        raise RuntimeError(f"the engine core could not answer: {self.error}")


# --- the core process's start-up handshake ----------------------------------------------------
@dataclass(frozen=True)
class CoreReady:
    """What the front end needs to know about the core it started (after the model loaded)."""

    max_model_len: int
    num_kv_blocks: int
    block_size: int
    can_fork: bool
    model_config: Any  # minivllm.model.ModelConfig
    device: str
    pid: int


@dataclass(frozen=True)
class CoreFailed:
    """The core could not start: the exception's type name, message and traceback."""

    error_type: str
    message: str
    traceback: str = field(repr=False, default="")
