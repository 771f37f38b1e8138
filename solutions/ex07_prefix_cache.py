"""Exercise 07: prefix caching and copy-on-write forks -- a whole KV cache manager, on your pool.

Notebook: notebooks/07_prefix_sharing_cow.ipynb. Check your work with
``course.check(course.load("ex07_prefix_cache"))`` there, or ``pytest -m ex07``.

``PrefixCachingKVCacheManager`` implements minivllm's ``ForkingKVCacheManager`` protocol
(``minivllm/core/interfaces.py``): ``LLM(kv_cache=PrefixCachingKVCacheManager(num_blocks, 16))``
serves requests that share a prompt prefix from the same physical blocks, and runs ``n > 1``
sampling and beam search by forking requests copy-on-write. It keeps its blocks in exercise 04's
``BlockPool`` (``ex04`` below: yours once it passes its checks; until then the reference stands
in, so that the other cases grade this file, and the first case stays unfinished), and relies on
nothing else of exercise 04: the pool's rules P1-P5 (front of the free queue out,
freed blocks to the back, ``touch`` pulls a free block out of the queue). You write the hash
chain (``hash_block``, ``block_hashes``) and the manager; the data structures are yours.

How the engine drives a manager, each step: the scheduler calls ``get_computed_blocks`` for a
request it is about to admit (nothing computed yet) and passes the hits it got to
``allocate_slots``; it calls ``allocate_slots`` for every other request it plans to run, ``fork``
when a request branches (``n > 1``, beam search), ``take_pending_copies`` once after planning
(the model runner makes those block copies on the device before the forward pass), and ``free``
when a request ends or is preempted. After the forward pass the step loop calls
``commit_written_blocks`` -- or ``discard_unwritten_blocks`` if the step failed.

The rules say what must hold; the checks grade what follows from them, never your block ids
(the ids in the unit cases follow from exercise 04's pool rules alone).

Sharing. Two tables share a block by listing the same id: its ``ref_count`` is the number of
tables that list it, and every holder reads the one copy of its K/V. A prefix hit shares only
full blocks that are registered in the cache (C1); a fork shares every block of its parent, the
partly filled last one included. Nobody writes into a block while it is shared (A2).

Hashes
H1. ``hash_block`` is a deterministic int of the parent's hash, the block's token ids in order
    and its extra keys; change any of them and the hash changes.
H2. A block's hash stands for its own tokens and every token before them: ``block_hashes`` gives
    one hash per *full* block of a token sequence, each chained to the hash of the block before
    it (the first to ``parent``); a partial block has none. ``(cache_salt,)`` is the extra key of
    a chain's first block and of no other, so the salt reaches every later block through the
    chain, and a chain continued from a ``parent`` does not take it again.

The cache: when a later request may find a block
C1. Only once its K/V is known to be written. A commit (``commit_written_blocks``) follows a
    step that ran. For each request ``allocate_slots`` was called for since the last commit or
    discard, and that still holds blocks, it considers the request's blocks that are full now
    (all their tokens computed: ``request.num_computed_tokens`` says how many are) and were not
    considered before, and registers each unless C2 stops it. So a block is considered once, at
    the commit of the step that filled it, and one passed over then is never registered later.
    A request's hits count as considered; so, for a forked child, does what its parent had
    considered (F1). A request freed (preempted) before the commit registers nothing. A step
    that fails considers nothing: after ``discard_unwritten_blocks`` the next commit registers
    nothing for the requests planned before it, and the blocks the failed step was to fill are
    not considered either -- a request that outlives it, is planned again (``allocate_slots``)
    and then runs a step has them considered at that step's commit, as full blocks not
    considered before. This holds for every block: a prompt's, a generated one's, a fork's, a
    copy.
C2. One block per hash, one hash per block: a block whose hash is registered already (under
    another block) is passed over, and a registered block keeps its hash. Within one commit the
    requests register in the order ``allocate_slots`` was called for them, so of two blocks with
    the same hash filled in one step, the first request's is the one found.
C3. A registered block stays findable while requests hold it and after they free it, until the
    pool hands it out again (as a new block or as a copy): then, and only then, its hash is
    forgotten (evicted). A registered block nobody holds is free: it counts in
    ``num_free_blocks``, and a hit takes it back out of the free queue (A1).
C4. Eviction order is the free queue's (exercise 04's P2, P3): the free block freed longest ago
    is handed out first. ``free`` gives a request's blocks back last block first, so its private
    tail is evicted before its prefix, and its first block, the one most requests share, last.

Lookup
L1. ``get_computed_blocks(request)`` returns the longest run of registered blocks matching the
    request's block hashes (all its tokens so far, its ``cache_salt``) from its first block on,
    stopping at the first miss, as ``(their block ids, number of tokens they hold)``. It changes
    nothing: no reference taken, no block out of the free queue; that is ``allocate_slots``'s
    job. With ``enable_caching=False``: ``([], 0)``, and no commit registers anything.
L2. A lookup never returns the block holding the request's last token: that token must be
    computed in the step, so that there are logits to sample the next token from. A request
    whose tokens fill whole blocks, all of them cached, gets all but the last of them.

Allocation
A1. ``allocate_slots(request, n, hits, k)``: the hits (only ever given for a request that holds
    nothing yet) become the first blocks of the request's table, in order, each with one more
    reference; a hit nobody held leaves the free queue, from wherever it is in it. Their tokens
    then count as computed: the table grows as in exercise 04 (rule M1) to hold the request's
    computed tokens (``num_computed_tokens``, which does not count the hits yet), the hits'
    tokens, the ``n`` new tokens and ``k`` lookahead slots.
A2. Copy-on-write: the request never writes into a block another table also lists. The ``n``
    new tokens take the positions right after its computed tokens and its hits; each block one
    of them lands in whose ``ref_count`` is above 1 is replaced, at the same place in the
    request's table, by a fresh block. The request drops its reference to the shared block (the
    other holders keep theirs; the last holder writes in place), and ``(shared id, fresh id)``
    joins the copies ``take_pending_copies()`` hands over, each once, for the model runner to
    make before the forward pass writes. No other block is copied: full blocks before the new
    tokens are only read, lookahead slots are room, not writes, and ``n = 0`` writes nothing.
A3. All or nothing: if the pool cannot supply every fresh block the call needs (new ones and
    copies), return ``None`` and change nothing at all: no reference, no copy, and no table for
    a request seen for the first time. A hit that is free now is one of the free blocks, and
    attaching it takes it out of the free queue: it cannot also be one of the fresh blocks.

Forks
F1. ``fork(parent, child)``: the child (a new request with the parent's tokens; the scheduler
    sets its computed count to the parent's once ``fork`` returns, so read counts off the parent)
    gets a table of its own listing the parent's blocks in order, one more reference each, and
    counts as considered (C1) what the parent had considered. Nothing is copied or
    taken from the pool, and the parent is unchanged; from then on each side's writes go
    through A2, so neither sees the other's new tokens.
F2. ``free`` also drops the pending copies into blocks the request held: the forward pass must
    not write into a block that may soon be someone else's.

A worked example, blocks of 4 in a pool of 8 (hashes shortened)::

    a = 10 tokens t0..t9          hashes: h0 = H(None, t0..t3), h1 = H(h0, t4..t7); t8, t9: none
    allocate_slots(a, 10)         a: [0, 1, 2]; nothing registered until the step has run
    commit_written_blocks()       registered: h0 -> 0, h1 -> 1
    get_computed_blocks(t0..t7)   ([0], 4): block 1 holds the last token, so it is computed
    b = t0..t7 + 3 other tokens   get_computed_blocks(b) = ([0, 1], 8)
    allocate_slots(b, 3, [0, 1])  b: [0, 1, 3]; blocks 0, 1 have 2 references
    fork(b, c)                    c: [0, 1, 3]; block 3 has 2 references, nothing copied
    allocate_slots(c, 1)          c writes position 11, in shared block 3: c: [0, 1, 4],
                                  copy (3, 4); b keeps block 3 alone and writes in place
    commit_written_blocks()       c's block 4 is now full: registered under H(h1, c's t8..t11)
    free(a), free(b), free(c)     free queue 5 6 7 2 3 4 1 0: the shared prefix goes last
    a request of 21 new tokens    takes 6 blocks, 5 6 7 2 3 4: block 4's hash is forgotten,
                                  h0 and h1 stay findable (blocks 0, 1, free and cached)

How notebook 08 assembles the student's engine: ``ex07 = course.working("ex07_prefix_cache")``,
then ``ex07.PrefixCachingKVCacheManager(num_blocks, block_size)``; ``ex07.ex04`` is the exercise
04 it runs on.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from minivllm import course

NOTEBOOK = "notebooks/07_prefix_sharing_cow.ipynb"

# Exercise 07 builds on exercise 04's pool: yours if it passes its checks, else the reference.
ex04 = course.working("ex04_block_allocator")


# --- hashing ---------------------------------------------------------------------------------------
def digest(parts: tuple) -> int:
    """64 bits of SHA-256 over a canonical text of ``parts`` (ints, strings, ``None``, tuples).
    Python's ``hash`` of a string changes from one process to the next; this does not."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def hash_block(parent_hash: int | None, token_ids: Sequence[int], extra_keys: tuple | None = None) -> int:
    """The identity of one full block, an int (H1): ``parent_hash`` (``None`` for a sequence's
    first block), the block's token ids in order, and ``extra_keys`` (``None`` or a tuple).

    ``digest`` above will do, or any deterministic hash: equal inputs, equal hash."""
    # BEGIN SOLUTION
    return digest((parent_hash, tuple(token_ids), extra_keys))
    # END SOLUTION


def block_hashes(
    token_ids: Sequence[int], block_size: int, cache_salt: str | None = None, parent: int | None = None
) -> list[int]:
    """The hashes of the full blocks of ``token_ids``, each chained to the one before (H2).

    The first is chained to ``parent`` (``None`` when ``token_ids`` starts a sequence); a
    trailing partial block has no hash. ``cache_salt`` (if not ``None``) is the extra key,
    ``(cache_salt,)``, of the chain's first block only: only when ``parent`` is ``None``."""
    # BEGIN SOLUTION
    hashes: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        extra = (cache_salt,) if parent is None and cache_salt is not None else None
        parent = hash_block(parent, token_ids[start : start + block_size], extra)
        hashes.append(parent)
    return hashes
    # END SOLUTION


# --- the manager ----------------------------------------------------------------------------------
class PrefixCachingKVCacheManager:
    """Block tables over exercise 04's ``BlockPool``, with a prefix cache and copy-on-write forks:
    minivllm's ``ForkingKVCacheManager`` (the rules in the module's docstring)."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_caching: bool = True):
        """A manager over a new ``ex04.BlockPool(num_blocks)`` in ``self.pool``, ``block_size``
        tokens per block (a positive int, else ``ValueError``), with an empty prefix cache."""
        # BEGIN SOLUTION
        if type(block_size) is not int or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.pool = ex04.BlockPool(num_blocks)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.tables: dict[str, list[int]] = {}  # request id -> its block ids, logical order
        self.hashes: dict[str, list[int]] = {}  # request id -> hashes of its full blocks so far
        self.num_committed: dict[str, int] = {}  # request id -> its leading blocks known cached
        self.cached: dict[int, int] = {}  # block hash -> the block registered under it
        self.hash_of: dict[int, int] = {}  # block id -> its hash, for the blocks in ``cached``
        self.pending_copies: list[tuple[int, int]] = []  # (src, dst) for the next forward pass
        self.planned: list[Any] = []  # requests whose blocks this step may fill, in order
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
        """The sum of every table's length (more than ``num_used_blocks`` when blocks are shared)."""
        # BEGIN SOLUTION
        return sum(len(table) for table in self.tables.values())
        # END SOLUTION

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (``[]`` for a request that holds no block)."""
        # BEGIN SOLUTION
        return list(self.tables.get(request_id, ()))
        # END SOLUTION

    def cached_block_ids(self) -> set[int]:
        """The blocks registered in the prefix cache now, held or free (for the block map)."""
        # BEGIN SOLUTION
        return set(self.hash_of)
        # END SOLUTION

    # --- the prefix cache ----------------------------------------------------------------------
    def get_computed_blocks(self, request: Any) -> tuple[list[int], int]:
        """The longest run of cached blocks at the start of a new request's tokens, never the
        block of its last token, and the number of tokens they hold (L1, L2); reserves nothing."""
        # BEGIN SOLUTION
        if not self.enable_caching:
            return [], 0
        bs = self.block_size
        max_hit_blocks = (request.num_tokens - 1) // bs
        hits: list[int] = []
        for block_hash in block_hashes(request.all_token_ids[: max_hit_blocks * bs], bs, request.cache_salt):
            block = self.cached.get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size
        # END SOLUTION

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        new_computed_blocks: Sequence[int] = (),
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Attach the hits, copy the shared blocks the new tokens land in, grow the table; return
        it, or ``None`` with nothing changed (A1-A3)."""
        # BEGIN SOLUTION
        rid, bs, pool = request.request_id, self.block_size, self.pool
        table = self.tables.get(rid, [])
        hits = list(new_computed_blocks)
        if hits and table:
            raise ValueError(f"{rid!r} already holds blocks: prefix-cache hits are for new requests")
        first = request.num_computed_tokens + len(hits) * bs  # the first position written now
        end = first + num_new_tokens
        last = min((end - 1) // bs, len(table) - 1) if num_new_tokens > 0 else -1
        to_copy = [i for i in range(first // bs, last + 1) if pool.ref_count(table[i]) > 1]
        need = max(-(-(end + num_lookahead_tokens) // bs) - len(table) - len(hits), 0)
        free_hits = sum(1 for block in hits if pool.ref_count(block) == 0)
        if need + len(to_copy) > pool.num_free_blocks - free_hits:
            return None
        table = self.tables.setdefault(rid, [])
        if hits:
            pool.touch(hits)  # before taking new blocks: a free hit must not be handed out as one
            table.extend(hits)
            self.num_committed[rid] = len(hits)
        fresh = pool.allocate(len(to_copy) + need)
        for block in fresh:  # about to be overwritten: it no longer holds what it was cached for
            evicted = self.hash_of.pop(block, None)
            if evicted is not None:
                del self.cached[evicted]
        for i, copy in zip(to_copy, fresh, strict=False):
            self.pending_copies.append((table[i], copy))
            pool.free([table[i]])  # ours goes; the other holders keep theirs
            table[i] = copy
        table.extend(fresh[len(to_copy) :])
        if self.enable_caching:
            self.planned.append(request)
        return list(table)
        # END SOLUTION

    def commit_written_blocks(self) -> None:
        """The step ran: register the full blocks it wrote (C1, C2)."""
        # BEGIN SOLUTION
        planned, self.planned = self.planned, []
        for request in planned:
            rid = request.request_id
            table = self.tables.get(rid)
            if not table:  # freed (preempted) after its allocation: it holds nothing it wrote
                continue
            num_full = min(request.num_computed_tokens // self.block_size, len(table))
            start = self.num_committed.get(rid, 0)
            if num_full <= start:
                continue
            hashes = self.hashes.setdefault(rid, [])
            if len(hashes) < num_full:  # extend the request's chain to its new full blocks
                tokens, bs = request.all_token_ids, self.block_size
                parent = hashes[-1] if hashes else None
                hashes += block_hashes(tokens[len(hashes) * bs : num_full * bs], bs, request.cache_salt, parent)
            for block, block_hash in zip(table[start:num_full], hashes[start:num_full], strict=True):
                if block_hash not in self.cached and block not in self.hash_of:
                    self.cached[block_hash] = block
                    self.hash_of[block] = block_hash
            self.num_committed[rid] = num_full
        # END SOLUTION

    def discard_unwritten_blocks(self) -> None:
        """The step failed: register none of the blocks it was to fill (C1)."""
        # BEGIN SOLUTION
        self.planned = []
        # END SOLUTION

    # --- forks ---------------------------------------------------------------------------------
    def fork(self, parent: Any, child: Any) -> None:
        """``child`` shares every block of ``parent``: one more reference each, nothing copied (F1)."""
        # BEGIN SOLUTION
        if self.tables.get(child.request_id):
            raise ValueError(f"request {child.request_id!r} already holds blocks")
        blocks = self.tables.get(parent.request_id, [])
        self.pool.touch(blocks)
        self.tables[child.request_id] = list(blocks)
        self.hashes[child.request_id] = list(self.hashes.get(parent.request_id, []))
        self.num_committed[child.request_id] = self.num_committed.get(parent.request_id, 0)
        # END SOLUTION

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """The ``(src, dst)`` block copies the next forward pass must make first, each once (A2)."""
        # BEGIN SOLUTION
        copies, self.pending_copies = self.pending_copies, []
        return copies
        # END SOLUTION

    def free(self, request: Any) -> None:
        """Give the request's blocks back, last block first, and forget it (C4, F2)."""
        # BEGIN SOLUTION
        rid = request.request_id
        table = self.tables.pop(rid, None)
        self.hashes.pop(rid, None)
        self.num_committed.pop(rid, None)
        if not table:
            return
        if self.pending_copies:
            mine = set(table)
            self.pending_copies = [(src, dst) for src, dst in self.pending_copies if dst not in mine]
        self.pool.free(reversed(table))
        # END SOLUTION

    def check_invariants(self, live_request_ids: Iterable[str] | None = None) -> None:
        """Raise ``AssertionError`` naming the first thing wrong: a block whose ref count or place
        in the free queue disagrees with the tables; a cached hash that does not map to a block
        cached under that same hash (one block per hash); a request not in ``live_request_ids``
        that holds blocks."""
        # BEGIN SOLUTION
        references = Counter(b for table in self.tables.values() for b in table)
        free = set(self.pool.free_block_ids())
        for block in range(self.num_blocks):
            count = self.pool.ref_count(block)
            if count != references[block] or (count == 0) != (block in free):
                raise AssertionError(f"block {block}: ref count {count}, {references[block]} block-table "
                                     f"references, in the free queue: {block in free}")
        for block_hash, block in self.cached.items():
            assert self.hash_of.get(block) == block_hash, f"the cache's entry for block {block} is stale"
        assert len(self.hash_of) == len(self.cached), "a block is registered under two hashes"
        if live_request_ids is not None:
            extra = {rid for rid, table in self.tables.items() if table} - set(live_request_ids)
            assert not extra, f"blocks held by requests that are not live: {sorted(extra)[:5]}"
        # END SOLUTION
