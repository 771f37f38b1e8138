"""Exercise 07: prefix caching and copy-on-write forks, on top of your block allocator.

Notebook: notebooks/07_prefix_sharing_cow.ipynb. Check your work with
``course.check(course.load("ex07_prefix_cache"))`` there, or ``pytest -m ex07``.

``PrefixCachingKVCacheManager`` implements minivllm's ``ForkingKVCacheManager`` protocol
(``minivllm/core/interfaces.py``): ``LLM(kv_cache=PrefixCachingKVCacheManager(num_blocks, 16))``
serves requests that share a prompt prefix from the same physical blocks, and runs ``n > 1``
sampling and beam search by forking requests copy-on-write. You write four pieces:

- ``hash_block`` / ``block_hashes``: the identity of a full block is its tokens *and everything
  before it*, so each block's hash chains the previous block's hash; a request's
  ``cache_salt`` enters the first block's hash (and, through the chain, every later one);
- ``get_computed_blocks``: the longest run of cached blocks at the start of a new request's
  tokens -- whole blocks only, and never every token: the last one must be computed so that
  there are logits to sample from;
- ``fork``: a child request shares all of its parent's blocks (reference counts go up, nothing
  is copied);
- ``shared_blocks_to_write`` / ``copy_on_write``: before a request writes into a block that
  another request also holds, it gets a private copy (the copy itself is made on the device by
  the model runner, from the ``(src, dst)`` pairs in ``pending_copies``).

The rest is given: the pool that holds the cache (``CachingBlockPool``), registering blocks
once the step that fills them has run (``commit_written_blocks``), and ``allocate_slots``,
which puts the pieces together so that a refused allocation still changes nothing.

How this composes with exercise 04 (and how notebook 08 assembles the student's engine)::

    ex04 = course.working("ex04_block_allocator")  # your allocator, or the reference
    ex07 = course.working("ex07_prefix_cache")     # this file, built on that same ex04
    kv = ex07.PrefixCachingKVCacheManager(num_blocks, block_size)  # a ForkingKVCacheManager
    llm = LLM(kv_cache=kv, ...)

``ex04`` below is your exercise 04 if it passes its checks, else the reference solution (with
a notice). ``CachingBlockPool`` subclasses ``ex04.BlockPool`` and
``PrefixCachingKVCacheManager`` subclasses ``ex04.PagedKVCacheManager`` (installing the pool
through ``pool_class``), so exercise 04's free queue, reference counts, table growth, slot
mapping and tail-first ``free`` are the ones that run. The free queue's order -- freed blocks
join the back, new blocks come from the front -- makes eviction least-recently-used: a free
block keeps its contents and its place in the cache until the pool hands it out again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from minivllm import course

NOTEBOOK = "notebooks/07_prefix_sharing_cow.ipynb"

# Exercise 07 builds on exercise 04: yours if it passes its checks, else the reference.
ex04 = course.working("ex04_block_allocator")
Block = ex04.Block


# --- hashing ---------------------------------------------------------------------------------------
def _digest(parts: tuple) -> int:
    """64 bits of SHA-256 over a canonical text of ``parts``. (Python's ``hash`` of a string
    changes from one process to the next; this does not, so printed hashes stay put.)"""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def hash_block(parent_hash: int | None, token_ids: Sequence[int], extra_keys: tuple | None = None) -> int:
    """The identity of one full block: a 64-bit int that depends on ``parent_hash`` (the hash
    of the block before it, ``None`` for a sequence's first block), on this block's token ids
    in order, and on ``extra_keys`` (``None`` or a tuple, e.g. ``(cache_salt,)``).

    Use ``_digest`` above (or any deterministic hash): equal inputs, equal hash."""
    # BEGIN SOLUTION
    return _digest((parent_hash, tuple(token_ids), extra_keys))
    # END SOLUTION


def block_hashes(
    token_ids: Sequence[int], block_size: int, cache_salt: str | None = None, parent: int | None = None
) -> list[int]:
    """Hashes of the *full* blocks of ``token_ids`` (a trailing partial block has none), each
    chained to the one before it; the first is chained to ``parent`` (``None`` when
    ``token_ids`` starts a sequence). ``cache_salt`` (if not ``None``) is the first block's
    extra key, ``(cache_salt,)``, but only when ``parent`` is ``None``: later blocks inherit it
    through the chain."""
    # BEGIN SOLUTION
    hashes: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        extra = (cache_salt,) if parent is None and cache_salt is not None else None
        parent = hash_block(parent, token_ids[start : start + block_size], extra)
        hashes.append(parent)
    return hashes
    # END SOLUTION


# --- the pool with a prefix cache ----------------------------------------------------------------
class CachingBlockPool(ex04.BlockPool):
    """Exercise 04's pool plus the prefix cache: block hash -> the block holding those tokens.

    A registered block stays in the cache while requests use it *and* after they free it, in
    the free queue, until ``allocate`` hands it out to be overwritten: that is its eviction.
    Since freed blocks join the back of the queue and new ones come from the front, the block
    evicted first is the one freed longest ago (LRU)."""

    def __init__(self, num_blocks: int):
        super().__init__(num_blocks)
        self.cached: dict[int, Block] = {}  # block hash -> block
        self.hash_of: dict[int, int] = {}  # block id -> its hash, for blocks in ``cached``
        self.num_evictions = 0

    def allocate(self, n: int) -> list[Block]:
        blocks = super().allocate(n)
        for block in blocks:  # about to be overwritten: no longer holds what it was cached for
            self.evict(block)
        return blocks

    def evict(self, block: Block) -> None:
        block_hash = self.hash_of.pop(block.block_id, None)
        if block_hash is not None:
            del self.cached[block_hash]
            self.num_evictions += 1

    def lookup(self, block_hash: int) -> Block | None:
        return self.cached.get(block_hash)

    def register(self, block: Block, block_hash: int) -> None:
        """Cache a block whose K/V is written. If the same contents are cached already (two
        requests computed the same prefix at the same time), the older block stays the entry."""
        if block_hash not in self.cached and block.block_id not in self.hash_of:
            self.cached[block_hash] = block
            self.hash_of[block.block_id] = block_hash


# --- the manager ----------------------------------------------------------------------------------
class PrefixCachingKVCacheManager(ex04.PagedKVCacheManager):
    """Exercise 04's manager plus prefix caching and copy-on-write forks."""

    pool_class = CachingBlockPool

    def __init__(self, num_blocks: int, block_size: int = 16, enable_caching: bool = True):
        super().__init__(num_blocks, block_size)
        self.enable_caching = enable_caching
        self.hashes: dict[str, list[int]] = {}  # request id -> hashes of its full blocks so far
        self.num_committed: dict[str, int] = {}  # request id -> leading blocks it has registered
        self.pending_copies: list[tuple[int, int]] = []  # (src, dst) for the next forward pass
        self.num_cow_copies = 0
        self._allocated_this_step: list[Any] = []  # requests whose blocks this step may fill

    # --- prefix cache ------------------------------------------------------------------------------
    def request_hashes(self, request: Any) -> list[int]:
        """The hashes of every full block of the request's tokens, extended as it grows."""
        hashes = self.hashes.setdefault(request.request_id, [])
        tokens, bs = request.all_token_ids, self.block_size
        num_full = len(tokens) // bs
        if len(hashes) < num_full:
            parent = hashes[-1] if hashes else None
            hashes.extend(block_hashes(tokens[len(hashes) * bs : num_full * bs], bs, request.cache_salt, parent))
        return hashes

    def get_computed_blocks(self, request: Any) -> tuple[list[Block], int]:
        """The longest run of cached blocks at the start of a new request's tokens, as
        ``(blocks, number of tokens they hold)``; nothing is reserved yet (``allocate_slots``
        does that). The request's last token is never covered: it must be computed to have
        logits to sample from."""
        if not self.enable_caching:
            return [], 0
        # BEGIN SOLUTION
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[Block] = []
        for block_hash in self.request_hashes(request)[:max_hit_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size
        # END SOLUTION

    def commit_written_blocks(self) -> None:
        """The step's forward pass has run: the blocks it filled hold K/V now, so they join the
        cache. Not earlier: a request preempted out of the step, or a step that failed, must
        not leave a registered block whose K/V was never written."""
        requests, self._allocated_this_step = self._allocated_this_step, []
        for request in requests:
            rid = request.request_id
            table = self.tables.get(rid)
            if not table:  # preempted after its allocation: it wrote nothing it still holds
                continue
            num_full = min(request.num_computed_tokens, len(request.all_token_ids)) // self.block_size
            start = self.num_committed.get(rid, 0)
            if num_full <= start:
                continue
            hashes = self.request_hashes(request)
            for block, block_hash in zip(table[start:num_full], hashes[start:num_full], strict=True):
                self.pool.register(block, block_hash)
            self.num_committed[rid] = num_full

    def discard_unwritten_blocks(self) -> None:
        """The step failed: register nothing it was filling."""
        self._allocated_this_step = []

    # --- copy-on-write -----------------------------------------------------------------------------
    def fork(self, parent: Any, child: Any) -> None:
        """``child`` (a new request with the same tokens) shares every block of ``parent``;
        whichever of them first writes into a shared block gets a copy of it."""
        if child.request_id in self.tables:
            raise ValueError(f"request {child.request_id!r} already holds blocks")
        # BEGIN SOLUTION
        blocks = self.tables.get(parent.request_id, [])
        self.pool.touch(blocks)
        self.tables[child.request_id] = list(blocks)
        # END SOLUTION
        # what the cache knows about the parent's blocks holds for the child's
        self.hashes[child.request_id] = list(self.hashes.get(parent.request_id, []))
        self.num_committed[child.request_id] = self.num_committed.get(parent.request_id, 0)

    def shared_blocks_to_write(self, request: Any, num_new_tokens: int) -> list[int]:
        """Indices, in the request's block table, of the blocks that its next
        ``num_new_tokens`` tokens (positions ``request.num_computed_tokens`` onwards) would be
        written into and that another request also holds."""
        # BEGIN SOLUTION
        table = self.tables.get(request.request_id, [])
        if num_new_tokens <= 0 or not table:
            return []
        first = request.num_computed_tokens // self.block_size
        last = min((request.num_computed_tokens + num_new_tokens - 1) // self.block_size, len(table) - 1)
        return [i for i in range(first, last + 1) if table[i].ref_cnt > 1]
        # END SOLUTION

    def copy_on_write(self, request_id: str, index: int) -> None:
        """Give the request a private copy of its block ``index``: a new block from the pool
        takes its place in the table, ``(old id, new id)`` joins ``pending_copies``, and the
        request drops its reference to the old block (the others keep theirs)."""
        # BEGIN SOLUTION
        table = self.tables[request_id]
        old = table[index]
        (new,) = self.pool.allocate(1)
        self.pending_copies.append((old.block_id, new.block_id))
        table[index] = new
        self.pool.free([old])
        # END SOLUTION
        self.num_cow_copies += 1

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """The ``(src, dst)`` copies the next forward pass must make before it runs."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    # --- putting it together -------------------------------------------------------------------
    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        new_computed_blocks: Sequence[Block] = (),
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Exercise 04's ``allocate_slots``, plus prefix-cache hits (``new_computed_blocks``,
        from ``get_computed_blocks``: attached first, as if computed) and copy-on-write of shared
        blocks this step writes into. Returns the block table, or ``None`` with nothing changed."""
        rid = request.request_id
        hits = list(new_computed_blocks)
        num_hit_tokens = len(hits) * self.block_size
        to_copy = self.shared_blocks_to_write(request, num_new_tokens)
        # blocks exercise 04 will add for the tokens after the hits (a request with hits is new,
        # so its table holds nothing yet: the hits count as tokens it must make room for)
        fresh = self.num_new_blocks(request, num_hit_tokens + num_new_tokens, num_lookahead_tokens) - len(hits)
        # a hit sitting in the free queue stops being free when we take it
        free_hits = sum(1 for block in hits if block.ref_cnt == 0)
        if fresh + len(to_copy) > self.pool.num_free_blocks - free_hits:
            return None
        for index in to_copy:
            self.copy_on_write(rid, index)
        if hits:
            self.pool.touch(hits)
            self.tables.setdefault(rid, []).extend(hits)
            self.num_committed[rid] = len(hits)
        table = super().allocate_slots(request, num_hit_tokens + num_new_tokens, (), num_lookahead_tokens)
        if table is None:
            raise AssertionError(f"exercise 04 refused {rid!r} although {fresh} blocks were free for it")
        if self.enable_caching:
            self._allocated_this_step.append(request)
        return table

    def free(self, request: Any) -> None:
        """Exercise 04's ``free`` (tail first, so a shared prefix is evicted last), after
        forgetting the request's hashes and any copy into a block it will no longer hold."""
        rid = request.request_id
        mine = set(self.get_block_ids(rid))
        if self.pending_copies and mine:
            self.pending_copies = [(src, dst) for src, dst in self.pending_copies if dst not in mine]
        self.hashes.pop(rid, None)
        self.num_committed.pop(rid, None)
        super().free(request)

    def check_invariants(self, live_request_ids: Iterable[str] | None = None) -> None:
        super().check_invariants(live_request_ids)
        for block_hash, block in self.pool.cached.items():
            assert self.pool.hash_of.get(block.block_id) == block_hash, (
                f"the cache maps a hash to block {block.block_id}, which is registered under another"
            )
