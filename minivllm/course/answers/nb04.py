"""Notebook 04's answers: the block allocator."""

from __future__ import annotations

from minivllm.course.answers import question


def _new_blocks(stored: int, new: int, lookahead: int = 0, block_size: int = 16) -> int:
    """Blocks minivllm's own KVCacheManager adds to a request's table that holds ``stored``
    tokens when it makes room for ``new`` more (and ``lookahead`` reserved beyond them)."""
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.request import Request

    kv = KVCacheManager(num_blocks=64, block_size=block_size, enable_caching=False)
    request = Request("r", list(range(1, stored + new + 1)))
    before = 0
    if stored:
        before = len(kv.allocate_slots(request, stored))
        request.num_computed_tokens = stored
    return len(kv.allocate_slots(request, new, num_lookahead_tokens=lookahead)) - before


@question("nb04.new_blocks", "blocks of 16: how many new blocks for 48 tokens stored and 1 more? For 47 "
          "stored? For a new request of 5 prompt tokens with a lookahead of 20?")
def new_blocks() -> str:
    at_48, at_47, fresh = _new_blocks(48, 1), _new_blocks(47, 1), _new_blocks(0, 5, lookahead=20)
    return (
        f"- **48 stored + 1**: {at_48}. The three blocks are full, and token 49 (position 48) is the "
        "first of logical block 3.\n"
        f"- **47 stored + 1**: {at_47}. Position 47 is the last slot of block 2, which the request "
        "already holds.\n"
        f"- **5 new tokens, lookahead 20**: {fresh}. Room for 5 + 20 = 25 tokens is "
        "ceil(25 / 16) blocks, and a request seen for the first time holds none yet.\n\n"
        "The rule in all three: a table must cover ceil((stored + new + lookahead) / block_size) "
        "blocks; the new ones are that minus what it holds, never below 0. (Counted by minivllm's "
        "own `KVCacheManager`.)"
    )
