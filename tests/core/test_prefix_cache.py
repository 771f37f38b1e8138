"""Prefix caching and copy-on-write, block by block (block size 16, 10 usable blocks)."""

from __future__ import annotations

import pytest

from minivllm.core.block_pool import hash_block
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams

BS = 16


def req(rid, tokens, salt=None):
    return Request(rid, list(tokens), SamplingParams(max_tokens=50, ignore_eos=True), cache_salt=salt)


def admit(sched: Scheduler, r: Request) -> int:
    """Schedule one step in which ``r`` is admitted (all of its prompt), and let it run: the
    blocks it filled now hold K/V, so they join the prefix cache. Returns how many of its
    tokens the plan takes from the prefix cache (computed before the step)."""
    sched.add_request(r)
    out = sched.schedule()
    assert r in out.requests, "request was not admitted"
    sched.kv.commit_written_blocks()
    return out.num_computed[out.requests.index(r)]


@pytest.fixture
def sched():
    kv = KVCacheManager(num_blocks=10, block_size=BS, enable_caching=True)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=4096, max_model_len=1024), kv)


PREFIX = list(range(100, 148))  # 48 tokens = 3 full blocks


def test_hash_chain_hits_and_eviction_order(sched):
    kv = sched.kv
    a = req("a", PREFIX + list(range(7)))  # 55 tokens: 3 full blocks + 7
    admit(sched, a)
    a_blocks = kv.get_blocks("a")
    assert len(a_blocks) == 4
    h0 = hash_block(None, PREFIX[:16])
    h1 = hash_block(h0, PREFIX[16:32])
    h2 = hash_block(h1, PREFIX[32:48])
    assert [b.block_hash for b in a_blocks[:3]] == [h0, h1, h2]
    assert a_blocks[3].block_hash is None  # partial blocks are never hashed

    b = req("b", PREFIX + [7, 8, 9, 10, 11])  # same 48 tokens + 5
    assert admit(sched, b) == 48
    b_blocks = kv.get_blocks("b")
    assert b_blocks[:3] == a_blocks[:3] and all(blk.ref_cnt == 2 for blk in b_blocks[:3])
    assert b_blocks[3] not in a_blocks and kv.num_used_blocks == 5

    for r in (a, b):
        sched.finish_requests([r.request_id], r.status.FINISHED_ABORTED)
    assert kv.num_free_blocks == 10
    order = [blk.block_id for blk in kv.block_pool.free_queue]
    tails = [a_blocks[3].block_id, b_blocks[3].block_id]
    shared = [blk.block_id for blk in reversed(a_blocks[:3])]
    assert order[-5:] == tails + shared  # private tails go before the shared prefix, prefix last
    assert kv.block_pool.get_cached_block(h0) is a_blocks[0]  # still cached after the free

    c = req("c", range(5000, 5160))  # 160 unrelated tokens: every block
    admit(sched, c)
    assert kv.get_block_ids("c") == order  # taken in eviction order
    stale = [h for h in (h0, h1, h2) if kv.block_pool.get_cached_block(h) is not None]
    assert not stale, "a hash still points at a block that was handed to someone else"
    for value, blk in kv.block_pool.cached_blocks.items():
        assert blk.block_hash.value == value and blk in kv.get_blocks("c")


def test_a_whole_prompt_hit_still_computes_the_last_token(sched):
    admit(sched, req("a", PREFIX))
    sched.finish_requests(["a"], sched.requests["a"].status.FINISHED_ABORTED)
    b = req("b", PREFIX)  # identical 48-token prompt: 3 cached blocks
    assert admit(sched, b) == 32  # only 2 blocks: the 3rd holds the last prompt token
    assert b.num_computed_tokens == 48  # the plan computed the other 16


def test_failed_allocation_changes_no_reference_count(sched):
    kv = sched.kv
    admit(sched, req("a", PREFIX + [1]))  # 4 blocks, 3 hashed
    big = req("big", PREFIX + list(range(200, 300)))  # hits 3 blocks but needs 7 more: only 6 free
    hits, n = kv.get_computed_blocks(big)
    assert n == 48
    refs = [blk.ref_cnt for blk in kv.block_pool.blocks]
    free = kv.num_free_blocks
    assert kv.allocate_slots(big, big.num_tokens - n, hits) is None
    assert [blk.ref_cnt for blk in kv.block_pool.blocks] == refs and kv.num_free_blocks == free
    kv.check_invariants(["a"])


def test_cache_salt_isolates_tenants(sched):
    admit(sched, req("a", PREFIX + [1], salt="tenant-1"))
    assert admit(sched, req("b", PREFIX + [2], salt="tenant-2")) == 0
    assert admit(sched, req("c", PREFIX + [3], salt="tenant-1")) == 48


def test_fork_shares_blocks_and_copies_on_first_write():
    kv = KVCacheManager(num_blocks=10, block_size=BS)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=4096, max_model_len=1024), kv)
    parent = req("p", range(21))  # 1 full block + 5 tokens
    admit(sched, parent)
    child = req("c", range(21))
    sched.fork_request(parent, child)
    assert kv.get_block_ids("c") == kv.get_block_ids("p")
    assert all(b.ref_cnt == 2 for b in kv.get_blocks("p"))
    assert kv.num_used_blocks == 2 and kv.num_referenced_blocks == 4
    parent.all_token_ids.append(7)
    child.all_token_ids.append(8)
    out = sched.schedule()
    assert out.decisions() == [("p", 1), ("c", 1)]
    # the parent wrote first: it got the copy of the shared partial block
    assert len(out.blocks_to_copy) == 1
    src, dst = out.blocks_to_copy[0]
    assert kv.get_block_ids("p") == [kv.get_block_ids("c")[0], dst] and kv.get_block_ids("c")[1] == src
    assert kv.get_blocks("p")[0].ref_cnt == 2  # the full block stays shared
    kv.check_invariants(["p", "c"])
    sched.finish_requests(["p", "c"], parent.status.FINISHED_ABORTED)
    assert kv.num_free_blocks == 10
