"""Notebook 07's answers: prefix caching and copy-on-write."""

from __future__ import annotations

from minivllm.course.answers import question

BLOCK = 16


def _tokens_from_cache(prompt_len: int) -> int:
    """Prompt tokens minivllm's KVCacheManager serves from its cache for a prompt whose every
    full block another request has just written."""
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.request import Request

    kv = KVCacheManager(num_blocks=16, block_size=BLOCK)
    writer = Request("writer", list(range(1, prompt_len + 1)))
    kv.allocate_slots(writer, prompt_len)
    writer.num_computed_tokens = prompt_len
    kv.commit_written_blocks()  # the step that wrote them has run
    return kv.get_computed_blocks(Request("again", list(range(1, prompt_len + 1))))[1]


def _copied_index(stored: int) -> tuple[list[int], list[int]]:
    """Two forked requests hold ``stored`` tokens; one writes position ``stored``. Returns the
    logical indices of the blocks copied, and of the blocks added, in minivllm's manager."""
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.request import Request

    kv = KVCacheManager(num_blocks=16, block_size=BLOCK, enable_caching=False)
    parent = Request("parent", list(range(1, stored + 1)))
    kv.allocate_slots(parent, stored)
    parent.num_computed_tokens = stored
    child = Request("child", list(range(1, stored + 1)))
    child.num_computed_tokens = stored
    kv.fork(parent, child)
    before = list(kv.get_block_ids("child"))
    child.all_token_ids.append(0)
    after = kv.allocate_slots(child, 1)
    copied_ids = {src for src, _ in kv.take_pending_copies()}
    return [i for i, b in enumerate(before) if b in copied_ids], list(range(len(before), len(after)))


def _names(ids) -> str:
    return " and ".join(str(i) for i in ids) or "none"


@question("nb07.hits_and_copies", "a 48-token prompt with all three blocks cached: how many tokens come from "
          "the cache? Forked requests share [4, 9] with 20 tokens stored: which block is copied when one writes "
          "position 20, and later, once 32 tokens are stored, which when it writes position 32?")
def hits_and_copies() -> str:
    hit = _tokens_from_cache(48)
    table = [4, 9]
    copied_20, _ = _copied_index(20)
    copied_32, added_32 = _copied_index(32)
    return (
        f"**{hit} tokens**, not 48: a hit may never cover the whole prompt, since its last token must be "
        f"computed to give the logits of the first output token. That token, position 47, is in "
        f"block {47 // BLOCK}, which a lookup never returns: the hit is the {hit // BLOCK} blocks "
        f"before it, and block {47 // BLOCK} is computed again.\n\n"
        f"**Position 20** is in logical block {20 // BLOCK}: the writer gets a copy of block "
        f"{_names(table[i] for i in copied_20)}, which both tables point at, and writes into the copy; "
        f"block {table[0]}, full and only ever read again, stays "
        "shared.\n\n"
        f"**Position 32** (with 32 tokens stored, both blocks full) is the first slot of logical block "
        f"{32 // BLOCK}: the writer gets {len(added_32)} new block of its own, and "
        f"{'nothing is copied' if not copied_32 else 'block ' + _names(copied_32) + ' is copied'}. "
        "(Counted by minivllm's own `KVCacheManager`.)"
    )
