# This file is generated from solutions/ex07_prefix_cache.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex07` or `pytest -m ex07`. Stuck? `course.hint("ex07")` in the
# notebook (or `minivllm hint ex07`) gives a hint, one at a time.
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

The rules (the checks grade what follows from them, never your block ids):

Hashes
H1. ``hash_block`` is a deterministic int of the parent's hash, the block's token ids in order
    and its extra keys; change any of them and the hash changes.
H2. ``block_hashes`` hashes the *full* blocks of a token sequence, each chained to the one
    before it (the first to ``parent``); ``(cache_salt,)`` is the extra key of a chain's first
    block only, so every later block carries the salt through the chain.

The cache
C1. A full block is registered under its hash only once the step that writes its last token has
    run: ``commit_written_blocks`` registers, for each request the step allocated for, the blocks
    that became full in this step (their last token was among its new tokens); a block not
    registered then (C2) never is. After ``discard_unwritten_blocks`` none of the step's blocks
    is registered. A request freed (preempted) before the commit registers nothing. This holds
    for every block: a prompt's, a generated one's, a fork's, a copy's.
C2. One block per hash: a block whose hash is cached already (under another block) is not
    registered. Within one commit, requests register in the order ``allocate_slots`` was called
    for them.
C3. A cached block stays cached while requests hold it and after they free it, until the pool's
    ``allocate`` hands it out again: then, and only then, its hash is forgotten (evicted). A
    cached block nobody holds is free (it counts in ``num_free_blocks``).
C4. ``free`` gives a request's blocks back last block first.

Lookup
L1. ``get_computed_blocks(request)`` returns the longest run of cached blocks matching the
    request's block hashes from its first block on (stopping at the first miss), as ``(their
    block ids, number of tokens they hold)``, and reserves nothing. At most ``(request.num_tokens - 1) //
    block_size`` blocks: the last token is always computed, to give the logits to sample from.
    With ``enable_caching=False``: ``([], 0)``.

Allocation
A1. ``allocate_slots(request, n, hits, k)``: the hits (only ever given for a request that holds
    nothing yet) become the request's logical blocks ``0 .. len(hits) - 1``, each with one more
    reference -- a hit nobody held leaves the free queue; then the table grows as in exercise 04
    (rule M1) to hold ``request.num_computed_tokens + len(hits) * block_size + n + k`` tokens.
A2. Copy-on-write: if a block that the ``n`` new tokens land in (positions ``num_computed +
    len(hits) * block_size`` to that plus ``n - 1``) is also in another table (``ref_count`` > 1),
    the request first gets a fresh block in its place, drops its reference to the shared one, and
    ``(shared id, fresh id)`` joins the copies ``take_pending_copies()`` hands over, once. No
    other block is copied: the lookahead slots never cause a copy.
A3. All or nothing: if the pool cannot supply the fresh blocks and the copies, return ``None``
    and change nothing at all. A hit that is free now leaves the free queue, so it cannot also be
    one of the fresh blocks.

Forks
F1. ``fork(parent, child)``: the child (a new request with the parent's tokens and computed
    count) gets a table listing the parent's blocks, one more reference each; nothing is copied.
F2. ``free`` also drops the pending copies into blocks the request held.

A worked example, blocks of 4 (hashes shortened)::

    a = 10 tokens t0..t9          hashes: h0 = H(None, t0..t3), h1 = H(h0, t4..t7); t8, t9: none
    allocate_slots(a, 10)         a: [0, 1, 2]; nothing cached yet
    commit_written_blocks()       cached: h0 -> 0, h1 -> 1
    b = t0..t7 + 3 other tokens   get_computed_blocks(b) = ([0, 1], 8)
    allocate_slots(b, 3, [0, 1])  b: [0, 1, 3]; blocks 0, 1 have 2 references
    fork(b, c)                    c: [0, 1, 3]; block 3 has 2 references
    allocate_slots(c, 1)          c writes position 11, in shared block 3: c: [0, 1, 4], copy (3, 4)

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
    raise NotImplementedError("ex07 hash_block: What it must do is in its docstring. Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")


def block_hashes(
    token_ids: Sequence[int], block_size: int, cache_salt: str | None = None, parent: int | None = None
) -> list[int]:
    """The hashes of the full blocks of ``token_ids``, each chained to the one before (H2).

    The first is chained to ``parent`` (``None`` when ``token_ids`` starts a sequence); a
    trailing partial block has no hash. ``cache_salt`` (if not ``None``) is the extra key,
    ``(cache_salt,)``, of the chain's first block only: only when ``parent`` is ``None``."""
    raise NotImplementedError("ex07 block_hashes: The hashes of the full blocks of ``token_ids``, each chained to the one before (H2). Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")


# --- the manager ----------------------------------------------------------------------------------
class PrefixCachingKVCacheManager:
    """Block tables over exercise 04's ``BlockPool``, with a prefix cache and copy-on-write forks:
    minivllm's ``ForkingKVCacheManager`` (the rules in the module's docstring)."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_caching: bool = True):
        """A manager over a new ``ex04.BlockPool(num_blocks)`` in ``self.pool``, ``block_size``
        tokens per block (a positive int, else ``ValueError``), with an empty prefix cache."""
        raise NotImplementedError("ex07 PrefixCachingKVCacheManager.__init__: What it must do is in its docstring. Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")

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
        raise NotImplementedError("ex07 PrefixCachingKVCacheManager.num_referenced_blocks: The sum of every table's length (more than ``num_used_blocks`` when blocks are shared). Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (``[]`` for a request that holds no block)."""
        raise NotImplementedError("ex07 PrefixCachingKVCacheManager.get_block_ids: The request's block table (``[]`` for a request that holds no block). Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")

    def cached_block_ids(self) -> set[int]:
        """The blocks registered in the prefix cache now, held or free (for the block map)."""
        raise NotImplementedError("ex07 PrefixCachingKVCacheManager.cached_block_ids: The blocks registered in the prefix cache now, held or free (for the block map). Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")

    # --- the prefix cache ----------------------------------------------------------------------
    def get_computed_blocks(self, request: Any) -> tuple[list[int], int]:
        """The longest run of cached blocks at the start of a new request's tokens, and the
        number of tokens they hold (L1); reserves nothing."""
        raise NotImplementedError("ex07 PrefixCachingKVCacheManager.get_computed_blocks: What it must do is in its docstring. Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        new_computed_blocks: Sequence[int] = (),
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Attach the hits, copy the shared blocks the new tokens land in, grow the table; return
        it, or ``None`` with nothing changed (A1-A3)."""
        raise NotImplementedError("ex07 PrefixCachingKVCacheManager.allocate_slots: What it must do is in its docstring. Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")

    def commit_written_blocks(self) -> None:
        """The step ran: register the full blocks it wrote (C1, C2)."""
        raise NotImplementedError("ex07 PrefixCachingKVCacheManager.commit_written_blocks: The step ran: register the full blocks it wrote (C1, C2). Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")

    def discard_unwritten_blocks(self) -> None:
        """The step failed: register none of the blocks it was to fill (C1)."""
        raise NotImplementedError("ex07 PrefixCachingKVCacheManager.discard_unwritten_blocks: The step failed: register none of the blocks it was to fill (C1). Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")

    # --- forks ---------------------------------------------------------------------------------
    def fork(self, parent: Any, child: Any) -> None:
        """``child`` shares every block of ``parent``: one more reference each, nothing copied (F1)."""
        raise NotImplementedError("ex07 PrefixCachingKVCacheManager.fork: ``child`` shares every block of ``parent``: one more reference each, nothing copied (F1). Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """The ``(src, dst)`` block copies the next forward pass must make first, each once (A2)."""
        raise NotImplementedError("ex07 PrefixCachingKVCacheManager.take_pending_copies: The ``(src, dst)`` block copies the next forward pass must make first, each once (A2). Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")

    def free(self, request: Any) -> None:
        """Give the request's blocks back, last block first, and forget it (C4, F2)."""
        raise NotImplementedError("ex07 PrefixCachingKVCacheManager.free: Give the request's blocks back, last block first, and forget it (C4, F2). Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")

    def check_invariants(self, live_request_ids: Iterable[str] | None = None) -> None:
        """Raise ``AssertionError`` naming the first thing wrong: a block whose ref count or place
        in the free queue disagrees with the tables; a cached hash that does not map to a block
        cached under that same hash (one block per hash); a request not in ``live_request_ids``
        that holds blocks."""
        raise NotImplementedError("ex07 PrefixCachingKVCacheManager.check_invariants: What it must do is in its docstring. Yours to write; stuck? course.hint('ex07') (notebooks/07_prefix_sharing_cow.ipynb)")
