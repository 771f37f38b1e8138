"""What one engine step computes: the scheduler's plan, handed to an executor.

The executor (the model runner, or the simulator's cost model) needs nothing else to run the
step: for every scheduled request its token ids to feed, how many of its tokens were already
in the KV cache when the step was planned, its block table, and whether a token is sampled
from its last row; plus the copy-on-write block copies to make before the forward pass.

Storage is a set of parallel lists, filled by the scheduler for every running request at every
step. A readable per-request view, :class:`ScheduledRequest`, is built on demand
(:attr:`SchedulerOutput.scheduled`). Creating one object per request per step in the
scheduler's loop cost about as much as the rest of the step's bookkeeping together
(``benchmarks/scheduler_overhead.py``), hence the lists.

Everything here is fixed when the step is planned, so it stays valid after the scheduler has
appended the sampled tokens: nothing has to be read "before ``update_from_output``".

The step's token counts (prefill, decode, padding) are read off the entries, here and nowhere
else: a scheduler only adds and removes entries, and a count can never disagree with them.
"""

from __future__ import annotations

from minivllm.request import Request


class ScheduledRequest:
    """One request's share of a step: compute its tokens ``[num_computed, num_computed + num_new)``.

    ``num_padding`` extra rows after them are computed and thrown away (static batching's pads
    and idle seats). ``sample``: a token is sampled from the last real row. ``draft_token_ids``:
    speculative decoding, the drafts this entry verifies after its last token (they are among
    its ``num_new`` tokens).
    """

    __slots__ = ("request", "num_computed", "num_new", "num_padding", "block_ids", "sample", "draft_token_ids")

    def __init__(
        self,
        request: Request,
        num_computed: int,
        num_new: int,
        block_ids: list[int],
        sample: bool,
        num_padding: int = 0,
        draft_token_ids: list[int] | None = None,
    ):
        self.request = request
        self.draft_token_ids = draft_token_ids or []
        self.num_computed = num_computed
        self.num_new = num_new
        self.num_padding = num_padding
        self.block_ids = block_ids
        self.sample = sample

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def token_ids(self) -> list[int]:
        """The tokens this step feeds (tokens are only ever appended, so this never changes);
        under speculative decoding a decode's last token is followed by the drafts it verifies."""
        tokens = self.request.all_token_ids[self.num_computed : self.num_computed + self.num_new]
        return tokens + self.draft_token_ids if self.draft_token_ids else tokens

    def __repr__(self) -> str:
        return (
            f"ScheduledRequest({self.request.request_id}, computed={self.num_computed}, "
            f"new={self.num_new}, pad={self.num_padding}, sample={self.sample}, "
            f"blocks={self.block_ids})"
        )


class SchedulerOutput:
    """The plan of one step. Entry ``i`` of the parallel lists describes one request:

    * ``requests[i]``: the :class:`~minivllm.request.Request`;
    * ``num_new[i]``: tokens it computes this step;
    * ``num_computed[i]``: its tokens already in the KV cache when the step was planned (so the
      step feeds ``all_token_ids[num_computed[i] : num_computed[i] + num_new[i]]``);
    * ``block_ids[i]``: its block table after this step's allocation (the KV manager's own
      list: valid until the next ``schedule()``, not to be modified);
    * ``sample[i]``: whether a token is sampled from its last row.

    A *decode* entry computes one token of a request whose prompt is already in the cache;
    every other token computed is a *prefill* token (a prompt, a chunk of one, or a preempted
    request's recomputation): :attr:`num_decode_tokens`, :attr:`num_prefill_tokens`,
    :attr:`num_padding_tokens` count them.

    Plus ``num_padding`` (static batching only: request id -> thrown-away rows), ``preempted``
    (requests sent back to the waiting queue this step), ``blocks_to_copy`` (copy-on-write
    ``(src, dst)`` block pairs to copy before the forward pass), ``forks`` (parallel
    sampling: request id -> its waiting siblings, forked off it once it samples this step; each
    draws its own first token from the same logits row), ``finished_req_ids`` (requests that
    ended since the previous plan, so an executor can drop what it keeps per request) -- both
    filled by a forking scheduler, empty otherwise -- and
    ``spec_token_ids`` (speculative decoding: request id -> the draft tokens its entry verifies;
    such an entry computes ``1 + len(drafts)`` tokens: its last token, then the drafts, and
    samples from all of those rows).
    """

    __slots__ = (
        "requests", "num_new", "num_computed", "block_ids", "sample", "num_padding", "preempted",
        "blocks_to_copy", "forks", "finished_req_ids", "spec_token_ids", "_scheduled", "_counts",
    )

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.num_new: list[int] = []
        self.num_computed: list[int] = []
        self.block_ids: list[list[int]] = []
        self.sample: list[bool] = []
        self.num_padding: dict[str, int] = {}
        self.preempted: list[Request] = []
        self.blocks_to_copy: list[tuple[int, int]] = []
        self.forks: dict[str, list[Request]] = {}
        self.finished_req_ids: set[str] = set()
        self.spec_token_ids: dict[str, list[int]] = {}
        self._scheduled: list[ScheduledRequest] | None = None
        self._counts: tuple[int, int, int] | None = None  # (entries, prefill, decode) when counted

    def add(
        self, request: Request, num_computed: int, num_new: int, block_ids: list[int],
        num_padding: int = 0, draft_token_ids: list[int] | None = None,
    ) -> None:
        """Append one request's share (the readable way; the scheduler's hot loop appends to
        the lists directly): it computes its tokens ``[num_computed, num_computed + num_new)``
        and, under speculative decoding, the drafts it verifies after its last token (the entry
        then computes ``num_new + len(draft_token_ids)`` rows). ``sample`` is derived: the step
        computes its last token."""
        drafts = list(draft_token_ids) if draft_token_ids else []
        self.requests.append(request)
        self.num_computed.append(num_computed)
        self.num_new.append(num_new + len(drafts))
        self.block_ids.append(block_ids)
        self.sample.append(num_new > 0 and num_computed + num_new == request.num_tokens)
        if num_padding:
            self.num_padding[request.request_id] = num_padding
        if drafts:
            self.spec_token_ids[request.request_id] = drafts

    def remove(self, request: Request) -> int:
        """Take a request back out of the plan (it was preempted); returns its token count."""
        for i, r in enumerate(self.requests):
            if r is request:
                num_new = self.num_new.pop(i)
                del self.requests[i], self.num_computed[i], self.block_ids[i], self.sample[i]
                self.num_padding.pop(request.request_id, None)
                self.spec_token_ids.pop(request.request_id, None)
                self._scheduled = self._counts = None
                return num_new
        return 0

    # --- the step's token counts, read off the entries --------------------------------------
    def _token_counts(self) -> tuple[int, int, int]:
        counts = self._counts
        if counts is None or counts[0] != len(self.requests):  # entries added since: count again
            decode = 0
            spec = self.spec_token_ids
            for req, computed, n in zip(self.requests, self.num_computed, self.num_new, strict=True):
                if n == 1 and computed >= req.num_prompt_tokens:
                    decode += 1
                elif spec and req.request_id in spec:  # a decode token and the drafts it verifies
                    decode += n
            counts = self._counts = (len(self.requests), sum(self.num_new) - decode, decode)
        return counts

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of prompts (or of recomputation after a preemption) computed this step."""
        return self._token_counts()[1]

    @property
    def num_decode_tokens(self) -> int:
        """Entries that compute one token past a request's prompt (with the drafts it verifies,
        under speculative decoding)."""
        return self._token_counts()[2]

    @property
    def num_padding_tokens(self) -> int:
        """Rows computed and thrown away (static batching's pads and idle seats)."""
        return sum(self.num_padding.values()) if self.num_padding else 0

    @property
    def scheduled(self) -> list[ScheduledRequest]:
        """One readable :class:`ScheduledRequest` per entry, in batch order."""
        if self._scheduled is None:
            pad, spec = self.num_padding, self.spec_token_ids
            self._scheduled = [
                ScheduledRequest(r, c, n, b, s, pad.get(r.request_id, 0) if pad else 0,
                                 spec.get(r.request_id) if spec else None)
                for r, c, n, b, s in zip(
                    self.requests, self.num_computed, self.num_new, self.block_ids, self.sample,
                    strict=True,
                )
            ]
        return self._scheduled

    @property
    def sampling_requests(self) -> list[Request]:
        """The requests that sample a token this step, in batch order."""
        return [r for r, s in zip(self.requests, self.sample, strict=True) if s]

    @property
    def total_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_padding_tokens

    @property
    def is_empty(self) -> bool:
        return not self.requests

    def decisions(self) -> list[tuple[str, int]]:
        """``(request_id, num_new_tokens)`` in batch order: what two schedulers must agree on."""
        return [(r.request_id, n) for r, n in zip(self.requests, self.num_new, strict=True)]

    def __repr__(self) -> str:
        return f"SchedulerOutput({self.decisions()}, preempted={[r.request_id for r in self.preempted]})"
