"""A debugging check that no request ever reads K/V that was not written for it.

The model runner writes each new token's K/V into a cache slot and then lets every token read
its request's whole context through the block table. Scheduling, prefix caching, preemption
and copy-on-write must together guarantee that each slot a request reads holds exactly the K/V
of *its own* token at that position -- written by an earlier step, or earlier in the same step
(every backend writes all of a step's new K/V before any attention reads it).

:class:`KVWriteTracker` checks that guarantee without any tensors. It keeps a shadow cache:
for every slot, the identity of what was last written there -- the position, the token and a
hash of every token before the slot's block (plus the request's ``cache_salt``), so two slots
hold the same K/V exactly when their identities are equal. Each step it applies the step's
copy-on-write copies, records the step's writes, then checks every read. A violation raises
``AssertionError`` naming the request, the position and the slot. ``EngineCore`` runs it on
every step when ``debug_checks=True``; tests drive it over random traces.
"""

from __future__ import annotations

from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.request import Request

SlotIdentity = tuple[int, int, int]  # (position, token id, hash of the tokens before its block)


class KVWriteTracker:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self.shadow: dict[tuple[int, int], SlotIdentity] = {}  # (block, offset) -> identity
        self._chains: dict[str, list[int]] = {}  # request id -> prefix hash per block index
        self.num_checked_reads = 0

    def _prefix_hash(self, req: Request, block_index: int, tokens: list[int]) -> int:
        """Hash of ``tokens`` (the request's, plus any drafts the step verifies) before logical
        block ``block_index`` (and its salt). Only blocks of the request's own tokens are
        remembered: a draft may be rejected."""
        chain = self._chains.get(req.request_id)
        if chain is None:
            chain = self._chains[req.request_id] = [hash(("salt", req.cache_salt))]
        bs, num_own = self.block_size, len(req.all_token_ids)
        while len(chain) <= block_index and len(chain) * bs <= num_own:
            j = len(chain) - 1
            chain.append(hash((chain[j], tuple(tokens[j * bs : (j + 1) * bs]))))
        value = chain[min(block_index, len(chain) - 1)]
        for j in range(len(chain) - 1, block_index):  # blocks that hold drafts
            value = hash((value, tuple(tokens[j * bs : (j + 1) * bs])))
        return value

    def identity(self, req: Request, position: int, tokens: list[int] | None = None) -> SlotIdentity:
        tokens = req.all_token_ids if tokens is None else tokens
        return (position, tokens[position], self._prefix_hash(req, position // self.block_size, tokens))

    def forget(self, request_id: str) -> None:
        """The request ended: drop what was kept of its tokens."""
        self._chains.pop(request_id, None)

    def check_step(self, out: SchedulerOutput) -> None:
        """Apply the step's copies and writes to the shadow cache, then check all its reads."""
        bs, shadow = self.block_size, self.shadow
        for src, dst in out.blocks_to_copy:
            for off in range(bs):
                if (src, off) in shadow:
                    shadow[(dst, off)] = shadow[(src, off)]
                else:
                    shadow.pop((dst, off), None)
        written: dict[tuple[int, int], str] = {}
        spec = out.spec_token_ids
        step_tokens = [req.all_token_ids + spec[req.request_id] if req.request_id in spec else req.all_token_ids
                       for req in out.requests]
        for req, start, n, table, tokens in zip(out.requests, out.num_computed, out.num_new, out.block_ids,
                                                step_tokens, strict=True):
            for p in range(start, start + n):
                slot = (table[p // bs], p % bs)
                ident = self.identity(req, p, tokens)
                other = written.get(slot)
                if other is not None and shadow[slot] != ident:
                    raise AssertionError(
                        f"requests {other!r} and {req.request_id!r} write different K/V into block "
                        f"{slot[0]} offset {slot[1]} in the same step"
                    )
                shadow[slot] = ident
                written[slot] = req.request_id
        for req, start, n, table, tokens in zip(out.requests, out.num_computed, out.num_new, out.block_ids,
                                                step_tokens, strict=True):
            for p in range(start + n):
                slot = (table[p // bs], p % bs)
                if shadow.get(slot) != self.identity(req, p, tokens):
                    what = "was never written" if slot not in shadow else f"holds {shadow[slot]}"
                    raise AssertionError(
                        f"request {req.request_id!r} reads position {p} from block {slot[0]} offset "
                        f"{slot[1]}, which {what}, not its token {tokens[p]} there"
                    )
            self.num_checked_reads += start + n
