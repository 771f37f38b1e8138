"""Exercise 04: a paged KV cache -- the pool of physical blocks, and the manager that keeps one
block table per request.

Notebook: notebooks/04_block_allocator.ipynb. Check your work with
``course.check(course.load("ex04_block_allocator"))`` there, or ``pytest -m ex04``.

You write two classes from their contracts; the data structures are yours to choose.

``BlockPool`` is the memory: ``num_blocks`` blocks with ids ``0 .. num_blocks - 1``, a reference
count per block (how many block tables point at it) and a queue of the free blocks. Exercise 07
builds its prefix cache on your pool, and its eviction order is the order of this queue, so the
pool's rules are exact:

P1. A new pool has every block free, queued in id order: 0, 1, 2, ...
P2. ``allocate(n)`` takes the ``n`` blocks at the front of the free queue and returns their ids in
    queue order, each now with a reference count of 1. If fewer than ``n`` are free it raises
    ``ValueError`` and takes nothing. ``allocate(0)`` is ``[]``; ``allocate(-1)`` is a
    ``ValueError``.
P3. ``free(block_ids)`` drops one reference from each block, in the order given; a block whose
    count reaches 0 joins the back of the free queue. Freeing a block that is already free is a
    bug somewhere else: raise ``ValueError`` naming the block. A ``free`` that raises changes
    nothing, not even for the ids before the bad one: ``free([x, x])`` of a block with one
    reference raises and leaves ``x`` held.
P4. ``touch(block_ids)`` adds one reference to each block. A free block it touches leaves the
    free queue; the other free blocks keep their order.
P5. ``ref_count(block_id)``, ``num_free_blocks`` and ``free_block_ids()`` (the free queue, front
    first) say how things stand.
P6. An id that is not one of the pool's blocks (an int in ``0 .. num_blocks - 1``) given to
    ``free``, ``touch`` or ``ref_count`` is a ``ValueError`` naming it, and changes nothing.
P7. Cost: ``free`` and ``touch`` take O(1) per id they are given and ``allocate(n)`` O(n), however
    large the pool; none of them may scan the pool or the free queue (the engine calls them
    every step, for every running request). ``free_block_ids()`` may take O(num_free_blocks).
    The check times the same calls in a pool of 1,000 blocks and in one of 200,000: a pool that
    never searches takes about as long per call in both; a search shows as 20x or more.

``PagedKVCacheManager`` implements minivllm's ``KVCacheManagerInterface`` protocol
(``minivllm/core/interfaces.py``), so ``LLM(kv_cache=PagedKVCacheManager(num_blocks, 16))``
serves the model with it. The scheduler calls ``allocate_slots`` for every request it plans to
run, before each step, and ``free`` when a request ends or is preempted; the model runner then
writes each token's K/V at ``table[pos // block_size] * block_size + pos % block_size``, the slot
your table gives it (the runner works the slot out itself: your part ends at the table). The
manager's rules:

M1. After ``allocate_slots(request, n, num_lookahead_tokens=k)`` succeeds, the request's table
    holds ``max(blocks it held, ceil((request.num_computed_tokens + n + k) / block_size))``
    blocks: it grows by whole blocks, only when the tokens no longer fit, and never shrinks;
    the blocks already in it stay where they are.
M2. It returns the request's table (what ``get_block_ids`` returns), or ``None`` when the pool has fewer free
    blocks than the table must grow by -- and then nothing changed: no block taken, no table
    grown, and a request seen for the first time has no table at all.
M3. With exactly as many free blocks as it needs, it succeeds.
M4. ``free(request)`` gives every block the request holds back to the pool and forgets its table;
    a request that holds nothing (never admitted, already freed) is not an error. In which order
    the table's blocks reach ``self.pool.free`` is yours to choose: it is not graded (exercise
    07 builds its own manager on your pool; it uses your pool's P3, not this ``free``).
M5. Blocks are taken only with ``self.pool.allocate`` and given back only with ``self.pool.free``
    (``self.pool`` is your ``BlockPool``: the checks read it, and so does notebook 04's block map).
M6. Which free block a table gets is the pool's business. The checks never compare your block
    ids with minivllm's: they serve the same requests through minivllm's scheduler with your
    manager and with minivllm's, and compare what the scheduler did at every step (who ran, how
    many tokens, who was preempted, blocks in use and per request), the tokens generated, and
    the pool's books (P5) against your tables.
M7. ``get_block_ids(request_id)`` (``[]`` for a request that holds nothing) and
    ``allocate_slots`` return a list the caller owns: a caller that appends to it or clears it
    changes nothing in the manager.
M8. ``check_invariants(live_request_ids=None)`` raises ``AssertionError`` when the books are
    wrong, and is silent when they are right. It reads the pool through P5 alone (so it judges
    any pool), and it must notice each of these, naming the block (C1-C3) or the request (C4)
    in its message:

    C1. a block whose ``ref_count`` is not the number of table entries that list it;
    C2. a block in the free queue whose count is not 0, or a block with count 0 missing from it;
    C3. a block listed twice in the free queue;
    C4. with ``live_request_ids`` given, a request it does not name that holds blocks;

    and a ``num_free_blocks`` that is not the length of ``free_block_ids()``. The engine calls
    it after every step under ``debug_checks=True``; the checks hand it corrupted books.

A worked example, blocks of 4 tokens in a pool of 6 (free queue ``0 1 2 3 4 5``)::

    allocate_slots(a, 6)             a: [0, 1]        (6 tokens: 2 blocks; free 2 3 4 5)
    allocate_slots(b, 3)             b: [2]           (free 3 4 5)
    a.num_computed_tokens = 6
    allocate_slots(a, 2)             a: [0, 1]        (positions 6, 7 fit in block 1)
    a.num_computed_tokens = 8
    allocate_slots(a, 1)             a: [0, 1, 3]     (position 8 opens logical block 2)
    allocate_slots(c, 13)            None             (4 blocks needed, 2 free: c has no table)
    free(a)                          free 4 5, then 0 1 3 in the order your free passes them
                                     to the pool (M4: any order)

What exercise 07 relies on in this file: ``BlockPool`` and rules P1-P7, nothing else. Its prefix
cache keeps freed blocks' contents until the pool hands them out again, so the block freed
longest ago is overwritten first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

NOTEBOOK = "notebooks/04_block_allocator.ipynb"


class BlockPool:
    """``num_blocks`` physical blocks, their reference counts and the queue of free ones (rules
    P1-P5 in the module's docstring)."""

    def __init__(self, num_blocks: int):
        """A pool of ``num_blocks`` free blocks (a positive int, else ``ValueError``), queued in id
        order."""
        # BEGIN SOLUTION
        if type(num_blocks) is not int or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        from collections import OrderedDict

        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        # A queue that can also drop an entry from its middle in O(1) (touch needs that).
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # END SOLUTION

    @property
    def num_free_blocks(self) -> int:
        """How many blocks are free."""
        # BEGIN SOLUTION
        return len(self.free_queue)
        # END SOLUTION

    def free_block_ids(self) -> list[int]:
        """The free blocks' ids, the next to be handed out first."""
        # BEGIN SOLUTION
        return list(self.free_queue)
        # END SOLUTION

    def ref_count(self, block_id: int) -> int:
        """How many block tables point at block ``block_id`` (0: it is free), P5 and P6."""
        # BEGIN SOLUTION
        if not (isinstance(block_id, int) and 0 <= block_id < self.num_blocks):
            raise ValueError(f"no block {block_id!r} in a pool of {self.num_blocks} blocks")
        return self.ref_counts[block_id]
        # END SOLUTION

    def allocate(self, n: int) -> list[int]:
        """Take the ``n`` blocks at the front of the free queue, with one reference each (P2).

        Fewer than ``n`` free: ``ValueError``, and nothing is taken."""
        # BEGIN SOLUTION
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks, got {n}")
        if n > len(self.free_queue):
            raise ValueError(f"asked for {n} blocks but only {len(self.free_queue)} are free")
        taken = []
        for _ in range(n):
            block_id, _ = self.free_queue.popitem(last=False)
            self.ref_counts[block_id] = 1
            taken.append(block_id)
        return taken
        # END SOLUTION

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference from each block, in order; a block left with none joins the back of
        the free queue (P3)."""
        # BEGIN SOLUTION
        ids = list(block_ids)
        drops: dict[int, int] = {}  # every check before the first change: a raising free changes nothing
        for block_id in ids:
            drops[block_id] = drops.get(block_id, 0) + 1
            if drops[block_id] > self.ref_count(block_id):
                raise ValueError(f"block {block_id} is already free")
        for block_id in ids:
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free_queue[block_id] = None
        # END SOLUTION

    def touch(self, block_ids: Iterable[int]) -> None:
        """Add one reference to each block; a free one leaves the free queue (P4)."""
        # BEGIN SOLUTION
        ids = list(block_ids)
        for block_id in ids:
            self.ref_count(block_id)  # a bad id raises before anything changes
        for block_id in ids:
            if self.ref_counts[block_id] == 0:
                del self.free_queue[block_id]
            self.ref_counts[block_id] += 1
        # END SOLUTION


class PagedKVCacheManager:
    """Block tables over a :class:`BlockPool`: minivllm's ``KVCacheManagerInterface`` (rules
    M1-M6 in the module's docstring)."""

    def __init__(self, num_blocks: int, block_size: int = 16):
        """A manager over a new ``BlockPool(num_blocks)`` in ``self.pool``, with ``block_size``
        tokens per block (a positive int, else ``ValueError``) and no tables yet."""
        # BEGIN SOLUTION
        if type(block_size) is not int or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.pool = BlockPool(num_blocks)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.tables: dict[str, list[int]] = {}  # request id -> its block ids, logical order
        # END SOLUTION

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
        """The sum of every table's length (more than ``num_used_blocks`` once blocks are shared)."""
        # BEGIN SOLUTION
        return sum(len(table) for table in self.tables.values())
        # END SOLUTION

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table, physical block ids of its logical blocks 0, 1, 2, ... (``[]``
        for a request that holds no block), in a list the caller may change (M7)."""
        # BEGIN SOLUTION
        return list(self.tables.get(request_id, ()))
        # END SOLUTION

    def get_computed_blocks(self, request: Any) -> tuple[list[int], int]:
        """No prefix cache here (exercise 07 adds one): nothing is ever already computed."""
        return [], 0

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        new_computed_blocks: Sequence[int] = (),
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Make room for ``num_new_tokens`` more tokens of ``request``; return its table (M1-M3).

        Its first ``request.num_computed_tokens`` tokens are stored already; room for
        ``num_lookahead_tokens`` more is reserved beyond the new ones. ``None`` -- and nothing
        changed -- if the pool is short of blocks."""
        if new_computed_blocks:
            raise ValueError("this manager has no prefix cache, yet it was given prefix-cache hits")
        # BEGIN SOLUTION
        rid, bs = request.request_id, self.block_size
        held = self.tables.get(rid, [])
        total = request.num_computed_tokens + num_new_tokens + num_lookahead_tokens
        need = max(-(-total // bs) - len(held), 0)
        if need > self.pool.num_free_blocks:
            return None
        if need:
            self.tables.setdefault(rid, []).extend(self.pool.allocate(need))
        return self.get_block_ids(rid)
        # END SOLUTION

    def free(self, request: Any) -> None:
        """Give every block the request holds back to the pool and forget its table (M4)."""
        # BEGIN SOLUTION
        table = self.tables.pop(request.request_id, None)
        if table:
            self.pool.free(reversed(table))
        # END SOLUTION

    def commit_written_blocks(self) -> None:
        """Called after every step that ran: nothing to do without a prefix cache."""

    def discard_unwritten_blocks(self) -> None:
        """Called instead when the step failed: nothing to do without a prefix cache."""

    def check_invariants(self, live_request_ids: Iterable[str] | None = None) -> None:
        """Raise ``AssertionError`` naming the first thing wrong when the pool's books disagree
        with the tables, or when a request not in ``live_request_ids`` holds blocks (M8)."""
        # BEGIN SOLUTION
        from collections import Counter

        references = Counter(b for table in self.tables.values() for b in table)
        free = self.pool.free_block_ids()
        queued = Counter(free)
        for block_id, times in queued.items():
            assert times == 1, f"block {block_id} is in the free queue {times} times"
        assert len(free) == self.pool.num_free_blocks, (
            f"num_free_blocks is {self.pool.num_free_blocks}, but the free queue holds {len(free)} blocks")
        for block_id in range(self.num_blocks):
            count, in_queue = self.pool.ref_count(block_id), block_id in queued
            if count != references[block_id] or (count == 0) != in_queue:
                raise AssertionError(
                    f"block {block_id}: ref count {count}, {references[block_id]} block-table "
                    f"references, in the free queue: {in_queue}"
                )
        if live_request_ids is not None:
            extra = {rid for rid, table in self.tables.items() if table} - set(live_request_ids)
            assert not extra, f"blocks held by requests that are not live: {sorted(extra)[:5]}"
        # END SOLUTION
