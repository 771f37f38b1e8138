"""The bookkeeping half of a scheduler, so that exercises 02 and 03 can be about the decisions.

A scheduler that plugs into ``LLM(scheduler=...)`` meets the protocol
:class:`minivllm.core.interfaces.SchedulerInterface`. Two of its methods are the ideas of notebooks 02
and 03, and the student writes them:

* ``schedule() -> SchedulerOutput``: which requests compute how many tokens this step
  (decode, admit, and -- in exercise 03 -- chunk and preempt), under the token budget and the
  seat limit;
* ``update_from_output(sampled) -> finished``: take the step's sampled tokens and retire the
  requests that are done.

Everything else the protocol asks for is bookkeeping -- queues, lookups, aborts -- and lives in
:class:`SchedulerBase` below, together with two helpers the student's ``schedule()`` calls:
:meth:`SchedulerBase.add_to_batch` (record one request's share of the step) and
:meth:`SchedulerBase.preempt` (send a running request back to the queue, exercise 03).

The student's scheduler may use its KV cache manager only through the protocol
:class:`minivllm.core.interfaces.KVCacheManagerInterface` (``allocate_slots``, ``free``, the sizes...),
so that notebook 08 can run it over any manager -- the student's own from exercise 04
included. The course's checks enforce that with :class:`ProtocolOnlyKV`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from minivllm.core.interfaces import KVCacheManagerInterface, protocol_members
from minivllm.core.scheduler import SchedulerConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.request import Request, RequestStatus


class SchedulerBase:
    """Queues and lookups of a first-come-first-served scheduler; ``schedule`` and
    ``update_from_output`` are left to the subclass.

    State the subclass reads and changes:

    * ``self.waiting``: a deque of requests not admitted yet, oldest on the left (a preempted
      request goes back to the left end);
    * ``self.running``: admitted requests in admission order (oldest first). They hold KV blocks;
    * ``self.requests``: request id -> request, for every unfinished request;
    * ``self.kv``: the KV cache manager (use only the ``KVCacheManager`` protocol);
    * ``self.config``: ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``,
      ``enable_chunked_prefill``.

    ``chunked_prefill`` (a class attribute) says whether the subclass cuts prompts into chunks;
    the constructor refuses a config that asks for the other behaviour, so that the scheduler
    and the engine's settings cannot silently disagree.
    """

    chunked_prefill = False

    def __init__(self, config: SchedulerConfig, kv: KVCacheManagerInterface):
        if config.enable_chunked_prefill != self.chunked_prefill:
            what = "cuts prompts into chunks" if self.chunked_prefill else "computes whole prompts"
            raise ValueError(
                f"{type(self).__name__} {what}: build it with enable_chunked_prefill="
                f"{self.chunked_prefill}, got enable_chunked_prefill={config.enable_chunked_prefill}"
            )
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}

    # --- what the subclass writes --------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        raise NotImplementedError

    def update_from_output(self, sampled_token_ids: dict[str, int]) -> list[Request]:
        raise NotImplementedError

    # --- helpers for schedule() ---------------------------------------------------------------
    def add_to_batch(self, out: SchedulerOutput, req: Request, num_new: int, block_ids: list[int]) -> None:
        """Record in ``out`` that ``req`` computes its next ``num_new`` tokens this step, whose K/V
        go to ``block_ids`` (the table ``kv.allocate_slots`` returned), and advance
        ``req.num_computed_tokens`` by ``num_new``. The step samples a token for ``req`` if
        these tokens reach its last one."""
        computed = req.num_computed_tokens
        out.add(req, computed, num_new, block_ids)
        req.num_computed_tokens = computed + num_new

    def preempt(self, victim: Request, out: SchedulerOutput) -> int:
        """Preempt a running request: free all its KV blocks and put it back at the front of
        the waiting queue; it will recompute everything (prompt and generated tokens) when it
        is admitted again. If it was already in this step's batch it is taken out of ``out``.
        Returns the number of budget tokens that gives back (0 if it was not in the batch)."""
        undone = out.remove(victim)
        self.running.remove(victim)
        self.kv.free(victim)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        out.preempted.append(victim)
        self.waiting.appendleft(victim)
        return undone

    # --- the rest of the protocol: bookkeeping --------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting)

    def live_requests(self) -> list[Request]:
        """Requests that hold KV blocks right now."""
        return self.running

    def finish_requests(self, request_ids: Iterable[str] | str, status: RequestStatus) -> list[Request]:
        """End requests from outside (abort, a stop string, an error): they leave the queues and
        free their blocks. Unknown or finished ids are ignored."""
        ids = {request_ids} if isinstance(request_ids, str) else set(request_ids)
        ended = [self.requests[r] for r in ids if r in self.requests and not self.requests[r].is_finished]
        gone = {r.request_id for r in ended}
        self.running = [r for r in self.running if r.request_id not in gone]
        self.waiting = deque(r for r in self.waiting if r.request_id not in gone)
        for req in ended:
            req.status = status
            self.kv.free(req)
            del self.requests[req.request_id]
        return ended


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
