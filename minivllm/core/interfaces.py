"""The plug-in points of the engine, as ``typing.Protocol`` classes. Pure Python, no torch.

Each protocol is the contract a replacement part must meet; the course's exercises implement
them, and ``LLM(...)`` / ``Simulator(...)`` accept an instance (or, for the scheduler, a
factory) wherever they accept a name. ``docs/architecture.md`` shows the smallest
implementation of each that serves the tiny model.

* :class:`KVCacheManagerInterface` -- block tables over a pool of KV blocks
  (``minivllm.core.kv_cache_manager.KVCacheManager`` is the paged one,
  ``minivllm.core.contiguous_kv`` the contiguous baseline);
* :class:`ForkingKVCacheManager` -- adds sharing blocks between requests (copy-on-write), which
  parallel sampling (``n > 1``) and beam search need;
* :class:`SchedulerInterface` -- decides every step which requests compute how many tokens
  (``minivllm.core.scheduler.Scheduler``, ``minivllm.core.static_scheduler``);
* :class:`ForkingScheduler` -- adds forking a running request (``n > 1``, beam search);
* :class:`SpeculativeScheduler` and :class:`SpeculativeKVCacheManager` -- add what speculative
  decoding needs: keeping the drafts proposed for a request's next step, and giving back the
  slots of drafts the target rejected;
* :class:`Executor` -- runs a planned step: the model runner (real tensors) or the simulator's
  cost model (a clock).

A protocol is named ``...Interface`` where minivllm's own implementation has the plain name (as
vLLM names ``SchedulerInterface`` and ``Scheduler``), so that neither has to be imported under
another name. The engine core uses nothing of a part that its protocol does not declare, and a
configuration that needs a protocol's extension (speculative decoding) is refused when the
engine is built if a plug-in part lacks it (:func:`check_implements` names the missing member).

The attention backend's protocol lives with the backends (``minivllm.attention``): it is the
one plug-in point that sees tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from minivllm.core.messages import Logprobs, RequestDelta
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.request import Request, RequestStatus


@runtime_checkable
class KVCacheManagerInterface(Protocol):
    """Which physical KV blocks each request's tokens live in.

    ``allocate_slots`` is the heart of it: make room for ``num_new_tokens`` more tokens of
    ``request`` (whose first ``request.num_computed_tokens`` tokens are already stored) and
    return the request's whole block table, or ``None`` -- changing nothing at all -- if the
    pool cannot supply the blocks. ``free`` returns every block a request holds.
    """

    block_size: int
    num_blocks: int

    @property
    def num_free_blocks(self) -> int: ...

    @property
    def num_used_blocks(self) -> int: ...

    @property
    def num_reserved_slots(self) -> int:
        """Token slots set aside for live requests (utilisation = tokens stored / this)."""
        ...

    @property
    def num_referenced_blocks(self) -> int:
        """Sum of block-table lengths (more than ``num_used_blocks`` when blocks are shared)."""
        ...

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (physical block ids of its logical blocks 0, 1, ...)."""
        ...

    def get_computed_blocks(self, request: Request) -> tuple[Sequence[Any], int]:
        """Prefix-cache hits for a new request: ``(blocks, num_tokens_they_hold)``; ``([], 0)``
        for a manager without prefix caching."""
        ...

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[Any] = (),
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None: ...

    def free(self, request: Request) -> None: ...

    def commit_written_blocks(self) -> None:
        """Called by the step loop, once, after every step whose forward pass succeeded (code
        that drives a scheduler by hand calls it too): blocks filled by the step now hold real
        K/V, so the prefix cache may register them. Does nothing without caching."""
        ...

    def discard_unwritten_blocks(self) -> None:
        """Called instead of :meth:`commit_written_blocks` when the step failed."""
        ...

    def check_invariants(self, live_request_ids: Iterable[str] | None = None) -> None: ...


@runtime_checkable
class ForkingKVCacheManager(KVCacheManagerInterface, Protocol):
    """A KV manager that can share blocks between requests, copy-on-write. The scheduler hands
    the copies a step needs to the executor (``SchedulerOutput.blocks_to_copy``)."""

    def fork(self, parent: Request, child: Request) -> None:
        """``child`` shares every block of ``parent``; whichever writes first gets a copy."""
        ...

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """``(src, dst)`` block copies the next forward pass must make first."""
        ...


@runtime_checkable
class SpeculativeKVCacheManager(KVCacheManagerInterface, Protocol):
    """A KV manager that speculative decoding can roll back: a step that verified drafts took
    slots for all of them, and the ones the target rejected must not keep blocks."""

    def trim(self, request: Request, num_tokens: int) -> None:
        """Keep only the blocks that hold the request's first ``num_tokens`` token slots and
        return the rest to the pool (none of them is ever in the prefix cache: only blocks full
        of the request's own tokens are). A request that shares blocks may be left as it is."""
        ...


@runtime_checkable
class SchedulerInterface(Protocol):
    """Decides, every step, which requests compute how many tokens.

    ``schedule()`` returns the step's :class:`SchedulerOutput` (and advances each scheduled
    request's ``num_computed_tokens``); nothing edits the plan after that.
    ``update_from_output(plan, new_token_ids)`` appends the step's tokens (request id -> the
    tokens it got, as :class:`ModelRunnerOutput` holds them), applies the stop rules to each
    token, frees finished requests and returns what changed, one ``RequestDelta`` per request.
    Committing the step's blocks to the prefix cache is the step loop's, not the scheduler's;
    the statistics (tokens per phase, prefix-cache hits) are read off the plan, so a scheduler
    keeps none.
    """

    kv: KVCacheManagerInterface
    running: list[Request]
    requests: dict[str, Request]

    @property
    def num_waiting(self) -> int: ...

    def add_request(self, request: Request) -> None: ...

    def schedule(self) -> SchedulerOutput: ...

    def update_from_output(self, plan: SchedulerOutput, new_token_ids: dict[str, list[int]]) -> list[RequestDelta]:
        """Append each request's new tokens (``plan``: the step's own plan), one by one under the
        stop rules (tokens after a stop are dropped); return one ``RequestDelta`` per request in
        ``new_token_ids``: the tokens appended and, for one that ended, how."""
        ...

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """End requests from outside (abort, a stop string, an error); frees their blocks."""
        ...

    def has_unfinished_requests(self) -> bool: ...

    def live_requests(self) -> list[Request]:
        """Requests that hold KV blocks right now."""
        ...


@runtime_checkable
class ForkingScheduler(SchedulerInterface, Protocol):
    """A scheduler over a :class:`ForkingKVCacheManager` that can fork a running request.

    Parallel sampling (``n > 1``): ``add_request(leader, siblings)`` queues the leader; its
    siblings wait in no queue (:attr:`pending_siblings`) until the leader samples its first
    token, and the plan of that step names them (``SchedulerOutput.forks``) so that the executor
    draws their first tokens from the leader's row; the step loop then forks each off the leader.
    Ending a leader ends its waiting siblings. Its plans name in ``finished_req_ids`` the
    requests that ended since the previous plan (an executor drops what it keeps for them).
    """

    @property
    def pending_siblings(self) -> dict[str, list[Request]]:
        """Leader request id -> its siblings that have not forked off it yet."""
        ...

    def add_request(self, request: Request, siblings: Sequence[Request] = ()) -> None: ...

    def fork_request(self, parent: Request, child: Request) -> None:
        """``child`` (a waiting sibling of ``parent``, or any new request: beam search) continues
        from ``parent``'s tokens and waits no longer. With a seat free (``max_num_seqs``
        counts every running sequence, forks included) it runs at once, sharing every block of
        ``parent`` copy-on-write; without one it waits for a seat like any request (and, when
        admitted, computes the tokens the prefix cache does not hold)."""
        ...


@runtime_checkable
class SpeculativeScheduler(SchedulerInterface, Protocol):
    """A scheduler over a :class:`SpeculativeKVCacheManager` that verifies drafts: a decoding
    request with drafts is given ``1 + len(drafts)`` tokens (``SchedulerOutput.spec_token_ids``)
    and room for them plus ``SchedulerConfig.num_lookahead_tokens``; ``update_from_output`` rolls
    back what the target rejected (``num_computed_tokens`` to the last token kept, the rejected
    slots' blocks trimmed)."""

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:
        """Keep the drafts proposed for each request's next step (after ``update_from_output``
        of the step that proposed them; each already fits the request's length limits). A
        request that ended or left the running set meanwhile has none."""
        ...


@dataclass
class ModelRunnerOutput:
    """What an executor returns for one step.

    ``new_token_ids``: request id -> the tokens it gets from this step, for every request that
    sampled (fork children included): one token, the one sampled from its last row; under
    speculative decoding, the drafts the target accepted and then that token (the drafts it
    verified are ``plan.spec_token_ids[request id]``: the first ``len(new_token_ids) - 1`` were
    accepted, the rest rejected). ``logprobs``: request id -> :class:`Logprobs` of its last new
    token (requests that asked for them); ``prompt_logprobs``: request id -> ``(index of the first
    prompt token covered, one entry per prompt token)`` for the prompt rows computed this step
    (``None`` for the very first prompt token, which has no prediction); ``failed``: request id
    -> error message, for requests whose row could not be sampled (non-finite logits, say). A
    failed request gets no token. ``draft_token_ids``: speculative decoding, request id -> the
    drafts proposed for its next step.
    """

    new_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, Logprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, tuple[int, list[Logprobs | None]]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)


@runtime_checkable
class Executor(Protocol):
    """Runs a planned step. The model runner computes it; the simulator's executor prices it."""

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...


def protocol_members(protocol: type) -> list[str]:
    """Public attribute and method names a protocol class declares (its bases' included)."""
    names: set[str] = set()
    for klass in protocol.__mro__:
        if klass in (Protocol, object) or not getattr(klass, "_is_protocol", False):
            continue
        names.update(n for n in vars(klass) if not n.startswith("_"))
        names.update(n for n in getattr(klass, "__annotations__", {}) if not n.startswith("_"))
    return sorted(names)


def missing_members(obj: object, protocol: type) -> list[str]:
    """Names ``protocol`` requires that ``obj`` lacks (for an error that says what is missing)."""
    return [n for n in protocol_members(protocol) if not hasattr(obj, n)]


def check_implements(obj: object, protocol: type, what: str) -> None:
    """``TypeError`` naming every missing member unless ``obj`` implements ``protocol``."""
    missing = missing_members(obj, protocol)
    if missing:
        raise TypeError(
            f"{what}={type(obj).__name__} does not implement minivllm's {protocol.__name__} "
            f"protocol: missing {', '.join(missing)} (see docs/architecture.md)"
        )
