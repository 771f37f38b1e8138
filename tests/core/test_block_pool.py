"""BlockPool / KVCacheManager: allocation, freeing, prefix-cache hits, and invariants under
random operation sequences (hypothesis state machine)."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minivllm.core.block_pool import BlockPool
from minivllm.core.contiguous_kv import ContiguousKVCacheManager
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams


def req(rid: str, tokens: list[int], salt: str | None = None) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=1000, ignore_eos=True), cache_salt=salt)


def test_free_queue_order_and_refcounts():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    assert (a.block_id, b.block_id) == (0, 1) and a.ref_cnt == b.ref_cnt == 1
    assert pool.num_free_blocks == 2
    pool.free_blocks([b, a])
    assert [blk.block_id for blk in pool.free_queue] == [2, 3, 1, 0]
    with pytest.raises(ValueError, match="asked for 5 blocks but only 4"):
        pool.get_new_blocks(5)


def test_allocate_grows_by_whole_blocks_and_fails_without_side_effects():
    kv = KVCacheManager(num_blocks=4, block_size=4, enable_caching=False)
    r = req("a", list(range(10)))
    table = kv.allocate_slots(r, 10)
    assert table == [0, 1, 2]  # ceil(10 / 4) blocks, taken from the front of the free queue
    r.num_computed_tokens = 10
    assert kv.allocate_slots(r, 2) == [0, 1, 2]  # slots 10, 11 fit in block 2
    r.num_computed_tokens = 12
    assert len(kv.allocate_slots(r, 1)) == 4  # a 4th block for slot 12
    r.num_computed_tokens = 13
    before = (kv.num_free_blocks, list(kv.get_block_ids("a")))
    assert kv.allocate_slots(r, 4) is None  # would need a 5th block
    assert (kv.num_free_blocks, kv.get_block_ids("a")) == before
    kv.free(r)
    assert kv.num_free_blocks == 4
    kv.check_invariants([])


def test_prefix_hit_never_covers_the_whole_prompt():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = req("a", list(range(8)))
    kv.allocate_slots(a, 8)
    a.num_computed_tokens = 8
    assert kv.get_computed_blocks(req("x", list(range(8))))[1] == 0  # not written yet
    kv.commit_written_blocks()  # the step ran: a's blocks hold K/V and may be shared
    b = req("b", list(range(8)))  # identical 2-block prompt
    blocks, n = kv.get_computed_blocks(b)
    assert n == 4 and len(blocks) == 1  # the last block is recomputed, so its last token has logits


def test_contiguous_reserves_max_model_len():
    kv = ContiguousKVCacheManager(num_blocks=10, block_size=4, max_model_len=16)
    assert kv.num_regions == 2
    a, b, c = req("a", [1]), req("b", [1]), req("c", [1])
    assert kv.get_block_ids("a") == []
    assert len(kv.allocate_slots(a, 1)) == 4 and kv.allocate_slots(b, 1) is not None
    assert kv.allocate_slots(c, 1) is None
    assert kv.num_reserved_slots == 32
    kv.free(a)
    assert kv.allocate_slots(c, 1) is not None
    kv.check_invariants(["b", "c"])
    with pytest.raises(ValueError, match="needs 5 blocks.*only 4"):
        ContiguousKVCacheManager(num_blocks=4, block_size=4, max_model_len=17)


class KVCacheMachine(RuleBasedStateMachine):
    """Random allocate / grow / free / abort sequences, with prefix caching on, must keep every
    block either free or referenced exactly as often as block tables point at it."""

    def __init__(self):
        super().__init__()
        self.kv = KVCacheManager(num_blocks=12, block_size=4, enable_caching=True)
        self.live: dict[str, Request] = {}
        self.n = 0

    @rule(prefix=st.sampled_from([[], [7, 7, 7, 7], [7, 7, 7, 7, 8, 8, 8, 8]]),
          extra=st.lists(st.integers(0, 3), min_size=1, max_size=14))
    def admit(self, prefix, extra):
        r = req(f"r{self.n}", prefix + extra)
        self.n += 1
        hits, num_hit = self.kv.get_computed_blocks(r)
        refs = [b.ref_cnt for b in hits]
        free_before = self.kv.num_free_blocks
        got = self.kv.allocate_slots(r, r.num_tokens - num_hit, hits)
        if got is None:
            assert [b.ref_cnt for b in hits] == refs, "failed allocation touched reference counts"
            assert self.kv.num_free_blocks == free_before
            return
        r.num_computed_tokens = r.num_tokens
        self.kv.commit_written_blocks()
        self.live[r.request_id] = r

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def grow(self, data):
        r = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        k = data.draw(st.integers(1, 6))
        r.all_token_ids.extend([5] * k)  # tokens exist (sampled) before their slots are asked for
        if self.kv.allocate_slots(r, k) is not None:
            r.num_computed_tokens += k
            self.kv.commit_written_blocks()
        else:
            del r.all_token_ids[-k:]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        r = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        self.kv.free(r)

    @invariant()
    def consistent(self):
        self.kv.check_invariants(list(self.live))
        for r in self.live.values():
            assert len(self.kv.get_block_ids(r.request_id)) * 4 >= r.num_computed_tokens


TestKVCacheMachine = KVCacheMachine.TestCase
TestKVCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
