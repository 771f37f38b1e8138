"""Exercise 04: a paged KV cache -- the pool of physical blocks, and the manager that keeps one
block table per request.

(An alternative correct answer, for tests/course/test_alternatives.py: the free queue is a
circular doubly linked list kept in two index arrays with a sentinel slot, the reference counts
a third array; ``free`` decrements first and rolls back on a bad id.)

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

from array import array
from collections.abc import Iterable, Sequence
from typing import Any

NOTEBOOK = "notebooks/04_block_allocator.ipynb"


def _is_plain_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class BlockPool:
    """``num_blocks`` physical blocks, their reference counts and the queue of free ones (rules
    P1-P5 in the module's docstring)."""

    def __init__(self, num_blocks: int):
        """A pool of ``num_blocks`` free blocks (a positive int, else ``ValueError``), queued in id
        order."""
        if not _is_plain_int(num_blocks) or num_blocks <= 0:
            raise ValueError(f"a pool needs a positive int number of blocks, not {num_blocks!r}")
        self.num_blocks = num_blocks
        # Slot ``num_blocks`` is the sentinel of a circular list through the free blocks: its
        # successor is the front of the queue, its predecessor the back. Held blocks are unlinked.
        head = num_blocks
        self._succ = array("q", range(1, num_blocks + 2))
        self._succ[num_blocks - 1] = head
        self._succ[head] = 0
        self._pred = array("q", range(-1, num_blocks))
        self._pred[0] = head
        self._pred[head] = num_blocks - 1
        self._refs = array("q", bytes(8 * num_blocks))
        self._count_free = num_blocks

    # --- the linked queue ----------------------------------------------------------------------
    def _unlink(self, block: int) -> None:
        before, after = self._pred[block], self._succ[block]
        self._succ[before] = after
        self._pred[after] = before
        self._count_free -= 1

    def _push_back(self, block: int) -> None:
        head = self.num_blocks
        tail = self._pred[head]
        self._succ[tail] = block
        self._pred[block] = tail
        self._succ[block] = head
        self._pred[head] = block
        self._count_free += 1

    def _validate(self, block_id: Any) -> None:
        if not (_is_plain_int(block_id) and -1 < block_id < self.num_blocks):
            raise ValueError(f"block {block_id!r} is not a block of this pool (ids 0..{self.num_blocks - 1})")

    # --- P5 ------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """How many blocks are free."""
        return self._count_free

    def free_block_ids(self) -> list[int]:
        """The free blocks' ids, the next to be handed out first."""
        order, head = [], self.num_blocks
        cursor = self._succ[head]
        while cursor != head:
            order.append(cursor)
            cursor = self._succ[cursor]
        return order

    def ref_count(self, block_id: int) -> int:
        """How many block tables point at block ``block_id`` (0: it is free), P5 and P6."""
        self._validate(block_id)
        return self._refs[block_id]

    # --- P2-P4 ---------------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Take the ``n`` blocks at the front of the free queue, with one reference each (P2).

        Fewer than ``n`` free: ``ValueError``, and nothing is taken."""
        if n < 0 or n > self._count_free:
            raise ValueError(f"cannot take {n} blocks from a pool with {self._count_free} free")
        out = [0] * n
        for k in range(n):
            front = self._succ[self.num_blocks]
            self._unlink(front)
            self._refs[front] = 1
            out[k] = front
        return out

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference from each block, in order; a block left with none joins the back of
        the free queue (P3)."""
        dropped: list[int] = []  # undo log: the ids decremented so far
        emptied: list[int] = []  # the ids whose count hit 0, in the order they did
        try:
            for block in block_ids:
                self._validate(block)
                if self._refs[block] == 0:
                    raise ValueError(f"block {block} is already free (a double free)")
                self._refs[block] -= 1
                dropped.append(block)
                if not self._refs[block]:
                    emptied.append(block)
        except ValueError:
            for block in dropped:
                self._refs[block] += 1
            raise
        for block in emptied:
            self._push_back(block)

    def touch(self, block_ids: Iterable[int]) -> None:
        """Add one reference to each block; a free one leaves the free queue (P4)."""
        wanted = list(block_ids)
        for block in wanted:
            self._validate(block)
        for block in wanted:
            if self._refs[block] == 0:
                self._unlink(block)
            self._refs[block] += 1


class PagedKVCacheManager:
    """Block tables over a :class:`BlockPool`: minivllm's ``KVCacheManagerInterface`` (rules
    M1-M6 in the module's docstring)."""

    def __init__(self, num_blocks: int, block_size: int = 16):
        """A manager over a new ``BlockPool(num_blocks)`` in ``self.pool``, with ``block_size``
        tokens per block (a positive int, else ``ValueError``) and no tables yet."""
        if not _is_plain_int(block_size) or block_size <= 0:
            raise ValueError(f"block_size has to be a positive int, not {block_size!r}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.num_blocks = self.pool.num_blocks
        self._tables: dict[str, list[int]] = {}

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
        total = 0
        for table in self._tables.values():
            total += len(table)
        return total

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table, physical block ids of its logical blocks 0, 1, 2, ... (``[]``
        for a request that holds no block), in a list the caller may change (M7)."""
        table = self._tables.get(request_id)
        return [] if table is None else table.copy()

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
        key = request.request_id
        have = len(self._tables.get(key, ()))
        tokens = request.num_computed_tokens + num_new_tokens + num_lookahead_tokens
        blocks_for_tokens = (tokens + self.block_size - 1) // self.block_size
        missing = blocks_for_tokens - have
        if missing > 0:
            if self.pool.num_free_blocks < missing:
                return None  # all or nothing: the pool is left as it was
            fresh = self.pool.allocate(missing)
            if key in self._tables:
                self._tables[key] += fresh
            else:
                self._tables[key] = fresh
        return self.get_block_ids(key)

    def free(self, request: Any) -> None:
        """Give every block the request holds back to the pool and forget its table (M4)."""
        if request.request_id not in self._tables:
            return
        self.pool.free(self._tables.pop(request.request_id))

    def commit_written_blocks(self) -> None:
        """Called after every step that ran: nothing to do without a prefix cache."""

    def discard_unwritten_blocks(self) -> None:
        """Called instead when the step failed: nothing to do without a prefix cache."""

    def check_invariants(self, live_request_ids: Iterable[str] | None = None) -> None:
        """Raise ``AssertionError`` naming the first thing wrong when the pool's books disagree
        with the tables, or when a request not in ``live_request_ids`` holds blocks (M8)."""
        pool = self.pool
        if live_request_ids is not None:
            allowed = frozenset(live_request_ids)
            for rid in sorted(self._tables):
                if self._tables[rid] and rid not in allowed:
                    raise AssertionError(f"request {rid!r} holds blocks but is not live")

        listed = pool.free_block_ids()
        in_queue: set[int] = set()
        for block in listed:
            if block in in_queue:
                raise AssertionError(f"the free queue lists block {block} more than once")
            in_queue.add(block)
        if pool.num_free_blocks != len(listed):
            raise AssertionError(f"the pool counts {pool.num_free_blocks} free blocks, "
                                 f"its free queue has {len(listed)}")

        expected = [0] * self.num_blocks
        for table in self._tables.values():
            for block in table:
                expected[block] += 1
        for block in range(self.num_blocks):
            count = pool.ref_count(block)
            if count != expected[block]:
                raise AssertionError(f"block {block} has ref_count {count}, "
                                     f"yet {expected[block]} table entries list it")
            if (block in in_queue) == bool(count):
                state = "queued as free" if count else "not queued as free"
                raise AssertionError(f"block {block} has ref_count {count} and is {state}")
