"""Per-request block tables over a :class:`BlockPool`: the paged KV cache's bookkeeping.

The manager speaks in requests and token counts; the pool speaks in blocks. A request's block
table is the list of physical blocks holding its logical blocks 0, 1, 2, ... A request only
ever owns ``ceil(tokens / block_size)`` blocks, so at most ``block_size - 1`` slots per request
are reserved but empty: that is why paging wastes almost nothing.

With prefix caching, every *full* block is registered under a hash of its tokens chained with
the hash of the block before it -- once its K/V is written, that is at the end of the step that
fills it (:meth:`KVCacheManager.commit_written_blocks`), never earlier: a request that is
preempted, or a step that fails, must not leave behind a registered block whose contents were
never computed. A new request looks up its prompt's block hashes in order and reuses the
longest run of hits (never the whole prompt: the last prompt token must be computed so that
there are logits to sample from).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from minivllm.core.block_pool import BlockHash, BlockPool, KVCacheBlock, hash_block
from minivllm.math_utils import cdiv
from minivllm.request import Request


class KVCacheManager:
    """Paged KV cache: blocks are taken on demand and returned when a request ends."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_caching: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_to_block_ids: dict[str, list[int]] = {}
        self._num_cached_blocks: dict[str, int] = {}
        # copy-on-write: requests whose block tables may point at blocks another request
        # also uses (after fork), and the (src, dst) block copies the next step must do first
        self._forked: set[str] = set()
        self.pending_copies: list[tuple[int, int]] = []
        self.num_cow_copies = 0
        # blocks that this step fills, registered in the prefix cache once the step has run:
        # (request, number of its tokens whose K/V the step leaves in the cache)
        self._filled_this_step: list[tuple[Request, int]] = []

    # --- sizes ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.block_pool.num_used_blocks

    @property
    def num_reserved_slots(self) -> int:
        """Token slots set aside for running requests (here: whole blocks in use)."""
        return self.block_pool.num_used_blocks * self.block_size

    def get_block_ids(self, request_id: str) -> list[int]:
        return self.req_to_block_ids.get(request_id, [])

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        return self.req_to_blocks.get(request_id, [])

    # --- prefix cache --------------------------------------------------------------------
    def block_hashes(self, request: Request) -> list[BlockHash]:
        """Extend ``request.block_hashes`` to cover every full block of its tokens.

        Block ``i``'s hash chains block ``i - 1``'s (see :func:`hash_block`); a request's
        ``cache_salt`` enters the first block's hash, and through the chain every later one.
        """
        hashes = request.block_hashes
        bs = self.block_size
        tokens = request.all_token_ids
        num_full = len(tokens) // bs
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), num_full):
            salt = (request.cache_salt,) if (i == 0 and request.cache_salt is not None) else None
            parent = hash_block(parent, tokens[i * bs : (i + 1) * bs], salt)
            hashes.append(parent)
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest run of cached full blocks at the start of the request's tokens.

        Returns ``(blocks, num_tokens_they_hold)``. Nothing is reserved until
        :meth:`allocate_slots` is called with these blocks.
        """
        if not self.enable_caching:
            return [], 0
        # Never hit the last token: it must be computed to produce logits.
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        lookup = self.block_pool.get_cached_block
        for h in self.block_hashes(request)[:max_hit_blocks]:
            block = lookup(h)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    # --- allocation ----------------------------------------------------------------------
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Make room for ``num_new_tokens`` more tokens of ``request``.

        ``new_computed_blocks`` are prefix-cache hits (from :meth:`get_computed_blocks`) to
        attach first. ``num_lookahead_tokens`` reserves room beyond that (used by the static
        baseline to reserve a request's worst case up front).

        Returns the request's block table (its block ids, the manager's own list: do not
        modify it), or ``None`` if the pool cannot supply the blocks, in which case *nothing*
        changed: no block taken, no reference count touched.
        """
        rid = request.request_id
        ids = self.req_to_block_ids.get(rid)
        computed = request.num_computed_tokens
        bs = self.block_size
        if ids is not None and not new_computed_blocks and (not self._forked or rid not in self._forked):
            # fast path (most decode steps): the new tokens fit in the blocks already held
            end = computed + num_new_tokens
            if end + num_lookahead_tokens <= len(ids) * bs:
                if end % bs < num_new_tokens and self.enable_caching:  # a block fills up
                    self._filled_this_step.append((request, end))
                return ids
        blocks = self.req_to_blocks.get(rid)
        num_have = (len(blocks) if blocks else 0) + len(new_computed_blocks)
        num_computed = computed + len(new_computed_blocks) * bs
        num_new_blocks = cdiv(num_computed + num_new_tokens + num_lookahead_tokens, bs) - num_have
        pool = self.block_pool
        # Copy-on-write: held blocks that this step writes into but that others share.
        forked = blocks and self._forked and rid in self._forked
        shared = self._shared_blocks_to_write(rid, blocks, num_computed, num_new_tokens) if forked else []
        # Hits sitting in the free queue stop being available once we take them.
        num_free_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0) if new_computed_blocks else 0
        if max(num_new_blocks, 0) + len(shared) > pool.num_free_blocks - num_free_hits:
            return None
        if shared:
            self._copy_on_write(rid, blocks, shared)
        if blocks is None:
            blocks = self.req_to_blocks[rid] = []
            self.req_to_block_ids[rid] = []
        ids = self.req_to_block_ids[rid]
        if new_computed_blocks:
            pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            ids.extend(b.block_id for b in new_computed_blocks)
            self._num_cached_blocks[rid] = len(blocks)
        if num_new_blocks > 0:
            new_blocks = pool.get_new_blocks(num_new_blocks)
            blocks.extend(new_blocks)
            ids.extend(b.block_id for b in new_blocks)
        end = num_computed + num_new_tokens
        if self.enable_caching and end // bs > self._num_cached_blocks.get(rid, 0):
            self._filled_this_step.append((request, end))
        return ids

    def commit_written_blocks(self) -> None:
        """The step's forward pass has run: register the blocks it filled in the prefix cache.

        A request preempted during the step no longer holds its blocks and registers nothing;
        one preempted and admitted again in the same step registers only what it computes now.
        """
        filled, self._filled_this_step = self._filled_this_step, []
        for request, end in filled:
            blocks = self.req_to_blocks.get(request.request_id)
            if blocks:
                self._cache_full_blocks(request, blocks, min(end, request.num_computed_tokens))

    def discard_unwritten_blocks(self) -> None:
        """The step failed: its blocks hold no trustworthy K/V, so register none of them."""
        self._filled_this_step = []

    def _shared_blocks_to_write(
        self, rid: str, blocks: list[KVCacheBlock], num_computed: int, num_new_tokens: int
    ) -> list[int]:
        """Indices (in the block table) of shared blocks that tokens
        ``[num_computed, num_computed + num_new_tokens)`` would write into."""
        if rid not in self._forked or num_new_tokens <= 0:
            return []
        first = num_computed // self.block_size
        last = min((num_computed + num_new_tokens - 1) // self.block_size, len(blocks) - 1)
        return [i for i in range(first, last + 1) if blocks[i].ref_cnt > 1]

    def _copy_on_write(self, rid: str, blocks: list[KVCacheBlock], indices: list[int]) -> None:
        """Give the request private copies of shared blocks before it writes into them."""
        fresh = self.block_pool.get_new_blocks(len(indices))
        ids = self.req_to_block_ids[rid]
        for i, new in zip(indices, fresh, strict=True):
            old = blocks[i]
            self.pending_copies.append((old.block_id, new.block_id))
            blocks[i], ids[i] = new, new.block_id
            self.block_pool.free_blocks([old])  # drop our reference; the others keep theirs
            self.num_cow_copies += 1
        # copies are private and may be partly filled: never register them in the prefix cache
        self._num_cached_blocks[rid] = min(self._num_cached_blocks.get(rid, 0), indices[0])

    def fork(self, parent: Request, child: Request) -> None:
        """Let ``child`` share every block of ``parent`` (reference counts go up; no copy).

        Both become copy-on-write: whichever first writes into a shared block gets a copy.
        """
        blocks = self.req_to_blocks.get(parent.request_id, [])
        if child.request_id in self.req_to_blocks:
            raise ValueError(f"request {child.request_id!r} already holds blocks")
        self.block_pool.touch(blocks)
        self.req_to_blocks[child.request_id] = list(blocks)
        self.req_to_block_ids[child.request_id] = [b.block_id for b in blocks]
        self._num_cached_blocks[child.request_id] = self._num_cached_blocks.get(parent.request_id, 0)
        child.block_hashes = list(parent.block_hashes)
        self._forked.update((parent.request_id, child.request_id))

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) block copies to perform before the next forward pass."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    @property
    def num_referenced_blocks(self) -> int:
        """Sum of block-table lengths: what the requests would hold without any sharing."""
        return sum(len(ids) for ids in self.req_to_block_ids.values())

    def _cache_full_blocks(self, request: Request, blocks: list[KVCacheBlock], num_tokens: int) -> None:
        """Register the blocks that will be full once ``num_tokens`` tokens are written
        (only tokens the request already has: lookahead room is never hashed)."""
        num_full = min(num_tokens, len(request.all_token_ids)) // self.block_size
        rid = request.request_id
        start = self._num_cached_blocks.get(rid, 0)
        if num_full <= start:
            return
        hashes = self.block_hashes(request)
        self.block_pool.cache_full_blocks(blocks[start:num_full], hashes[start:num_full])
        self._num_cached_blocks[rid] = num_full

    def trim(self, request: Request, num_tokens: int) -> None:
        """Keep only the blocks that hold the request's first ``num_tokens`` token slots and
        return the rest to the pool, last first: after speculative decoding rejected drafts, the
        blocks taken for them (and lookahead room the next step does not need) go back. Those
        blocks were never registered in the prefix cache (only blocks full of the request's
        own tokens are), and a request that shares blocks (after a fork) is left alone."""
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid)
        keep = cdiv(num_tokens, self.block_size)
        if not blocks or len(blocks) <= keep or rid in self._forked:
            return
        ids = self.req_to_block_ids[rid]
        tail = blocks[keep:]
        del blocks[keep:], ids[keep:]
        self._num_cached_blocks[rid] = min(self._num_cached_blocks.get(rid, 0), keep)
        self.block_pool.free_blocks(reversed(tail))

    def free(self, request: Request) -> None:
        """Return a request's blocks, tail first (so its shared prefix is evicted last)."""
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, None)
        ids = self.req_to_block_ids.pop(rid, None)
        self._num_cached_blocks.pop(rid, None)
        self._forked.discard(rid)
        if self.pending_copies and ids:  # copies into its private blocks are moot now
            mine = set(ids)
            self.pending_copies = [(src, dst) for src, dst in self.pending_copies if dst not in mine]
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

    # --- invariants ----------------------------------------------------------------------
    def check_invariants(self, live_request_ids: Iterable[str] | None = None) -> None:
        """Every block is free (ref 0, in the free queue) or referenced exactly as many times
        as block tables point at it. Raises ``AssertionError`` naming the first violation."""
        counts = [0] * self.num_blocks
        for rid, blocks in self.req_to_blocks.items():
            assert [b.block_id for b in blocks] == self.req_to_block_ids[rid], f"block ids of {rid} out of sync"
            for b in blocks:
                counts[b.block_id] += 1
        pool = self.block_pool
        in_queue = [False] * self.num_blocks
        for b in pool.free_queue:
            in_queue[b.block_id] = True
        assert sum(in_queue) == pool.num_free_blocks, "free queue length mismatch"
        for b in pool.blocks:
            if b.ref_cnt != counts[b.block_id] or (b.ref_cnt == 0) != in_queue[b.block_id]:
                raise AssertionError(
                    f"block {b.block_id}: ref_cnt {b.ref_cnt}, {counts[b.block_id]} block-table "
                    f"references, in free queue = {in_queue[b.block_id]}"
                )
        for value, b in self.block_pool.cached_blocks.items():
            assert b.block_hash is not None and b.block_hash.value == value, (
                f"hash map points at block {b.block_id} that holds another hash"
            )
        if live_request_ids is not None:
            extra = set(self.req_to_blocks) - set(live_request_ids)
            assert not extra, f"blocks held by requests that are not live: {sorted(extra)[:5]}"
