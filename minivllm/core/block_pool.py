"""The physical KV-cache blocks: a fixed pool, reference counts, and a free queue.

A *block* holds the K/V of ``block_size`` consecutive tokens of one sequence (in every layer).
The pool never moves data; it only decides which block id a sequence may write next.

Free blocks wait in :class:`FreeBlockQueue` in eviction order: the block at the front is the
next one handed out. With prefix caching, a freed block keeps its hash and its contents, so a
later request with the same prefix can take it back out of the middle of the queue (a cache
hit) as long as nobody has been handed that block yet. That is why the queue is a doubly
linked list: removal from the middle is O(1).

Invariant: ``ref_cnt == 0`` exactly for the blocks in the free queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MAX_BLOCKS = 1 << 24  # 16.7M blocks: 268M tokens at block_size 16, more than any GPU holds


class BlockHash:
    """Identity of a full block's contents *and everything before it*.

    ``value`` is a 64-bit hash of the parent block's value, this block's tokens and extra keys,
    so equal values mean equal prefixes, unless two chains collide in 64 bits somewhere. The
    block's own token ids and extra keys are kept too, and a lookup compares them exactly; the
    prefix *before* the block is trusted to its parent's value (as in vLLM). The hash is
    computed once.
    """

    __slots__ = ("value", "token_ids", "extra_keys")

    def __init__(self, value: int, token_ids: tuple[int, ...], extra_keys: tuple | None = None):
        self.value = value
        self.token_ids = token_ids
        self.extra_keys = extra_keys

    def __hash__(self) -> int:
        return self.value

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BlockHash)
            and self.value == other.value
            and self.token_ids == other.token_ids
            and self.extra_keys == other.extra_keys
        )

    def __repr__(self) -> str:
        return f"BlockHash({self.value & 0xFFFFFFFF:#x}, {len(self.token_ids)} tokens)"


def hash_block(parent: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple | None = None) -> BlockHash:
    tokens = tuple(token_ids)
    parent_value = parent.value if parent is not None else 0
    return BlockHash(hash((parent_value, tokens, extra_keys)), tokens, extra_keys)


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        h = None if self.block_hash is None else hex(self.block_hash.value & 0xFFFF)
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={h})"


class FreeBlockQueue:
    """Doubly linked list of free blocks; front = evicted first."""

    def __init__(self, blocks: Iterable[KVCacheBlock]):
        self._head = KVCacheBlock(-1)  # sentinels
        self._tail = KVCacheBlock(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self.num_free_blocks = 0
        for b in blocks:
            self.append(b)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail:
            raise IndexError("no free blocks")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free
        last.next_free, block.prev_free = block, last
        block.next_free, self._tail.prev_free = self._tail, block
        self.num_free_blocks += 1

    def __iter__(self):
        b = self._head.next_free
        while b is not self._tail:
            yield b
            b = b.next_free

    def __len__(self) -> int:
        return self.num_free_blocks


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if num_blocks > MAX_BLOCKS:
            raise ValueError(
                f"num_blocks={num_blocks} is more than {MAX_BLOCKS} blocks: the pool keeps one Python "
                f"object per block (~{num_blocks * 100 / 2**30:.0f} GiB of bookkeeping); use a larger "
                "block_size or a smaller pool"
            )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        # prefix cache: hash value -> block (the block's BlockHash confirms the exact tokens)
        self.cached_blocks: dict[int, KVCacheBlock] = {}
        self.num_evictions = 0  # cached blocks whose contents were overwritten

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.free_queue.num_free_blocks

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Take ``n`` blocks from the front of the free queue (evicting their cached contents)."""
        if n > self.free_queue.num_free_blocks:
            raise ValueError(f"asked for {n} blocks but only {self.free_queue.num_free_blocks} are free")
        out = []
        for _ in range(n):
            block = self.free_queue.popleft()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: KVCacheBlock) -> None:
        value = block.block_hash.value
        if self.cached_blocks.get(value) is block:
            del self.cached_blocks[value]
        block.block_hash = None
        self.num_evictions += 1

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        block = self.cached_blocks.get(block_hash.value)
        if block is None or block.block_hash != block_hash:  # absent, or a 64-bit collision
            return None
        return block

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on blocks found in the cache (pulling free ones out of the queue)."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; blocks reaching zero join the back of the free
        queue in the order given (so pass a request's blocks tail first: its shared prefix
        then sits behind its private tail and is evicted last)."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], hashes: Sequence[BlockHash]) -> None:
        """Register blocks whose ``block_size`` tokens are all written, under their hashes."""
        cached = self.cached_blocks
        for block, block_hash in zip(blocks, hashes):
            if block.block_hash is None:
                block.block_hash = block_hash
                # If identical contents are already cached under another block, keep that one.
                cached.setdefault(block_hash.value, block)
