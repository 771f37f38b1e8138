# This file is generated from solutions/ex04_block_allocator.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex04` or `pytest -m ex04`. Stuck? `course.hint("ex04")` in the
# notebook (or `minivllm hint ex04`) gives a hint, one at a time.
"""Exercise 04: a paged KV cache -- a pool of blocks with a free list and reference counts, and
a manager that keeps one block table per request.

Notebook: notebooks/04_block_allocator.ipynb. Check your work with
``course.check(course.load("ex04_block_allocator"))`` there, or ``pytest -m ex04``.

``PagedKVCacheManager`` implements minivllm's ``KVCacheManager`` protocol
(``minivllm/core/interfaces.py``), so ``LLM(kv_cache=PagedKVCacheManager(num_blocks, 16))``
serves the model with your bookkeeping: the scheduler asks it for room before every step, the
model runner writes each token's K/V into the slot your block table gives it. The rules:

- **The free queue.** The pool hands out blocks from the *front* of ``free_queue`` and takes
  freed blocks back at the *back*, so the block freed longest ago is reused first. (Notebook 07
  turns this order into the prefix cache's least-recently-used order.)
- **Reference counts.** ``ref_cnt`` counts the block tables that point at a block. A block
  goes back to the free queue only when its count reaches 0. Here every block has one owner;
  exercise 07 shares blocks between requests.
- **Whole blocks, on demand.** After a step a request's table covers exactly
  ``ceil(tokens / block_size)`` blocks of its tokens (plus any lookahead the scheduler asked
  for), never more: the last block may be partly empty, the others are full.
- **All or nothing.** When the pool cannot supply the blocks, ``allocate_slots`` returns
  ``None`` and changes nothing: no block taken, no table touched. The scheduler then preempts
  someone and asks again.
- **Tail first.** ``free`` returns a request's blocks last block first.

Block ids are therefore determined by the order of operations, and the check compares them
with those of minivllm's own ``KVCacheManager`` (prefix caching off), step by step.

How exercise 07 (and notebook 08's assembled engine) builds on this file: exercise 07's
``PrefixCachingKVCacheManager`` is a subclass of this ``PagedKVCacheManager`` whose
``pool_class`` is a subclass of this ``BlockPool``. It reuses, unchanged, ``BlockPool.allocate``
/ ``free`` / ``touch`` (the free queue order becomes the LRU eviction order),
``num_new_blocks``, ``allocate_slots`` (growing a table), ``free`` (tail first) and
``slot_mapping``. It relies on the attributes set in ``__init__`` below (``pool``, ``tables``,
``block_size``) and on every block being taken through ``self.pool.allocate`` and returned
through ``self.pool.free``: keep to them.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

NOTEBOOK = "notebooks/04_block_allocator.ipynb"


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ``a``: the number of blocks ``a`` tokens need."""
    return -(-a // b)


@dataclass(eq=False, slots=True)
class Block:
    """One physical KV block: room for the K/V of ``block_size`` tokens, in every layer.

    ``ref_cnt`` is the number of block tables that point at it (0: it is in the free queue).
    """

    block_id: int
    ref_cnt: int = 0


class BlockPool:
    """A fixed set of blocks and a queue of the free ones, front = handed out next."""

    def __init__(self, num_blocks: int):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        # An OrderedDict is a queue that can also drop an entry from its middle in O(1)
        # (touch below, and the prefix cache of notebook 07, need that).
        self.free_queue: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def allocate(self, n: int) -> list[Block]:
        """Take ``n`` blocks from the front of the free queue, each with ``ref_cnt`` 1, in
        queue order. Raise ``ValueError`` -- taking nothing -- if fewer than ``n`` are free."""
        raise NotImplementedError("ex04 BlockPool.allocate: Take ``n`` blocks from the front of the free queue, each with ``ref_cnt`` 1, in queue order. Yours to write; stuck? course.hint('ex04') (notebooks/04_block_allocator.ipynb)")

    def free(self, blocks: Iterable[Block]) -> None:
        """Drop one reference from each block, in the order given; a block whose count reaches
        0 joins the back of the free queue. Freeing a block that is already free is a bug
        elsewhere: raise ``ValueError`` naming the block."""
        raise NotImplementedError("ex04 BlockPool.free: Drop one reference from each block, in the order given; a block whose count reaches 0 joins the back of the free queue. Yours to write; stuck? course.hint('ex04') (notebooks/04_block_allocator.ipynb)")

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take one more reference on each block: a block another request holds, or a free one
        whose contents someone wants back (notebook 07). A free block leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1


class PagedKVCacheManager:
    """Block tables over a :class:`BlockPool`: minivllm's ``KVCacheManager`` protocol."""

    pool_class: type[BlockPool] = BlockPool  # exercise 07 swaps in a pool that caches prefixes

    def __init__(self, num_blocks: int, block_size: int = 16):
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.pool = self.pool_class(num_blocks)
        self.tables: dict[str, list[Block]] = {}  # request id -> its blocks, logical order

    # --- sizes (the engine's statistics read these) ------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.pool.num_free_blocks

    @property
    def num_reserved_slots(self) -> int:
        """Token slots set aside for requests: whole blocks, partly empty last blocks included."""
        return self.num_used_blocks * self.block_size

    @property
    def num_referenced_blocks(self) -> int:
        """Sum of block-table lengths (more than ``num_used_blocks`` once blocks are shared)."""
        return sum(len(table) for table in self.tables.values())

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table: physical block ids of its logical blocks 0, 1, 2, ..."""
        return [block.block_id for block in self.tables.get(request_id, ())]

    def get_computed_blocks(self, request: Any) -> tuple[list[Block], int]:
        """No prefix cache here (exercise 07 adds one): nothing is ever already computed."""
        return [], 0

    # --- the exercise ---------------------------------------------------------------------------
    def num_new_blocks(self, request: Any, num_new_tokens: int, num_lookahead_tokens: int = 0) -> int:
        """How many blocks the request's table must grow by to hold its first
        ``request.num_computed_tokens + num_new_tokens + num_lookahead_tokens`` tokens
        (0 if the blocks it holds already suffice)."""
        raise NotImplementedError("ex04 PagedKVCacheManager.num_new_blocks: What it must do is in its docstring. Yours to write; stuck? course.hint('ex04') (notebooks/04_block_allocator.ipynb)")

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        new_computed_blocks: Sequence[Block] = (),
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Make room for ``num_new_tokens`` more tokens of ``request`` (its first
        ``request.num_computed_tokens`` tokens are already stored), plus
        ``num_lookahead_tokens`` reserved beyond them.

        Returns the request's block table (``get_block_ids``), or ``None`` if the pool cannot
        supply the blocks -- and then nothing changed at all.
        """
        if new_computed_blocks:
            raise ValueError("this manager has no prefix cache, yet it was given prefix-cache hits")
        raise NotImplementedError("ex04 PagedKVCacheManager.allocate_slots: What it must do is in its docstring. Yours to write; stuck? course.hint('ex04') (notebooks/04_block_allocator.ipynb)")

    def free(self, request: Any) -> None:
        """Give back every block the request holds, its last block first, and forget its table.
        A request that holds nothing (never admitted, or already freed) is not an error."""
        raise NotImplementedError("ex04 PagedKVCacheManager.free: Give back every block the request holds, its last block first, and forget its table. Yours to write; stuck? course.hint('ex04') (notebooks/04_block_allocator.ipynb)")

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        """The cache slot of each of the request's positions ``start .. end - 1``: the K/V of
        position ``p`` lives at offset ``p % block_size`` of the physical block that logical
        block ``p // block_size`` maps to, i.e. slot ``block_id * block_size + offset`` of the
        flat cache. Raises ``IndexError`` for a position beyond the request's blocks."""
        table = self.tables.get(request_id, [])
        if not 0 <= start <= end <= len(table) * self.block_size:
            raise IndexError(
                f"positions {start}..{end - 1} of {request_id!r}: its {len(table)} blocks hold "
                f"positions 0..{len(table) * self.block_size - 1}"
            )
        raise NotImplementedError("ex04 PagedKVCacheManager.slot_mapping: What it must do is in its docstring. Yours to write; stuck? course.hint('ex04') (notebooks/04_block_allocator.ipynb)")

    # --- the rest of the protocol ---------------------------------------------------------------
    def commit_written_blocks(self) -> None:
        """Called after every step that ran: nothing to do without a prefix cache."""

    def discard_unwritten_blocks(self) -> None:
        """Called instead when the step failed: nothing to do without a prefix cache."""

    def check_invariants(self, live_request_ids: Iterable[str] | None = None) -> None:
        """Every block is either free (``ref_cnt`` 0, in the free queue) or referenced exactly
        as often as block tables point at it. Raises ``AssertionError`` naming a violation."""
        references = Counter(block.block_id for table in self.tables.values() for block in table)
        for block in self.pool.blocks:
            in_queue = block.block_id in self.pool.free_queue
            if block.ref_cnt != references[block.block_id] or (block.ref_cnt == 0) != in_queue:
                raise AssertionError(
                    f"block {block.block_id}: ref_cnt {block.ref_cnt}, {references[block.block_id]} "
                    f"block-table references, in the free queue: {in_queue}"
                )
        if live_request_ids is not None:
            holders = {rid for rid, table in self.tables.items() if table}
            extra = holders - set(live_request_ids)
            assert not extra, f"blocks held by requests that are not live: {sorted(extra)[:5]}"
