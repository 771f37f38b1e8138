"""Cases for ex04_block_allocator: the pool, then the manager's tables, then whole traces
against minivllm's own ``KVCacheManager`` (prefix caching off), then the tiny model served
with the student's manager.

Block ids in the unit cases are worked out by hand from the rules in the exercise's docstring
(front of the free queue out, freed blocks to the back, tail first). The trace cases replay
minivllm's scheduler over both managers (``minivllm.course.kv_replay``) and compare every
step's block tables; the engine cases compare greedy tokens with minivllm's own engine.
"""

from __future__ import annotations

from functools import lru_cache

from minivllm.course.grading import Case, case, expect, expect_raises
from minivllm.course.harness import TraceRequest, expect_same_tokens
from minivllm.course.kv_replay import PROMPTS, KVSetup, compare_with_minivllm, random_kv_trace
from minivllm.course.runtime import one_cpu_thread
from minivllm.request import Request

CASES: list[Case] = []


def _req(rid: str, num_tokens: int) -> Request:
    return Request(rid, list(range(1, num_tokens + 1)))


def _ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def _refs(pool) -> list[int]:
    return [b.ref_cnt for b in pool.blocks]


# --- the pool ------------------------------------------------------------------------------------
@case(CASES, "a fresh pool hands out blocks from the front", "BlockPool.allocate",
      "take blocks from the front of self.free_queue; each one handed out has ref_cnt 1")
def _(ex):
    pool = ex.BlockPool(6)
    expect(_ids(pool.allocate(2)), [0, 1], "first allocate(2)")
    expect(_ids(pool.allocate(3)), [2, 3, 4], "then allocate(3)")
    expect(_refs(pool), [1, 1, 1, 1, 1, 0], "reference counts")
    expect(pool.num_free_blocks, 1, "free blocks left")
    expect(_ids(pool.allocate(0)), [], "allocate(0)")


@case(CASES, "all or nothing: a request the pool cannot meet takes nothing", "BlockPool.allocate",
      "check that enough blocks are free before you take the first one")
def _(ex):
    pool = ex.BlockPool(4)
    pool.allocate(3)
    expect_raises(ValueError, lambda: pool.allocate(2), "allocate(2) with 1 free block")
    expect(pool.num_free_blocks, 1, "free blocks after the refused allocate")
    expect(list(pool.free_queue), [3], "free queue after the refused allocate")
    expect(_refs(pool), [1, 1, 1, 0], "reference counts after the refused allocate")


@case(CASES, "freed blocks join the back of the queue, in the order given", "BlockPool.free",
      "a freed block is appended to the free queue; the oldest free block is handed out first")
def _(ex):
    pool = ex.BlockPool(5)
    a = pool.allocate(3)
    pool.free([a[2], a[0]])
    expect(list(pool.free_queue), [3, 4, 2, 0], "free queue after freeing blocks 2 then 0")
    expect(_ids(pool.allocate(4)), [3, 4, 2, 0], "the next allocate(4)")


@case(CASES, "a shared block is free only when its last holder lets go", "BlockPool.free",
      "free drops ONE reference; only a block whose count reaches 0 is free again; freeing a free "
      "block is an error")
def _(ex):
    pool = ex.BlockPool(3)
    a = pool.allocate(2)
    pool.touch([a[1]])  # a second holder, as after a fork or a prefix-cache hit
    pool.free([a[1]])
    expect((a[1].ref_cnt, pool.num_free_blocks), (1, 1), "(ref_cnt of block 1, free blocks) after one free")
    pool.free([a[1]])
    expect((a[1].ref_cnt, list(pool.free_queue)), (0, [2, 1]), "(ref_cnt, free queue) after the second free")
    expect_raises(ValueError, lambda: pool.free([a[1]]), "freeing block 1 a third time")


# --- the manager -----------------------------------------------------------------------------------
@case(CASES, "how many blocks a table must grow by, at block boundaries", "PagedKVCacheManager.num_new_blocks",
      "count the blocks the first computed + new + lookahead tokens need, minus those held")
def _(ex):
    kv = ex.PagedKVCacheManager(num_blocks=8, block_size=4)
    new = _req("new", 9)
    got = [kv.num_new_blocks(new, n) for n in (1, 3, 4, 5, 8, 9)]
    expect(got, [1, 1, 1, 2, 2, 3], "a request that holds nothing, 1/3/4/5/8/9 new tokens")
    expect(kv.num_new_blocks(new, 3, 6), 3, "3 new tokens + 6 lookahead")
    r = _req("r", 12)
    kv.allocate_slots(r, 4)  # one full block
    r.num_computed_tokens = 4
    expect(kv.num_new_blocks(r, 1), 1, "4 tokens stored in 1 block, 1 more: position 4 opens block 1")
    kv.allocate_slots(r, 1)
    r.num_computed_tokens = 5
    got = [kv.num_new_blocks(r, n) for n in (3, 4)]
    expect(got, [0, 1], "5 stored in 2 blocks, then 3 or 4 more")


@case(CASES, "a request's table grows one block at a time, from any free block", "PagedKVCacheManager.allocate_slots",
      "a table grows by whole blocks only when its tokens no longer fit; return the block ids")
def _(ex):
    kv = ex.PagedKVCacheManager(num_blocks=8, block_size=4)
    r, s = _req("r", 6), _req("s", 3)
    expect(kv.allocate_slots(r, 6), [0, 1], "r's prompt of 6 tokens")
    r.num_computed_tokens = 6
    expect(kv.allocate_slots(s, 3), [2], "s's prompt of 3 tokens")
    s.num_computed_tokens = 3
    tables = []
    for _ in range(3):  # r decodes positions 6, 7, 8
        tables.append(kv.allocate_slots(r, 1))
        r.num_computed_tokens += 1
    expect(tables, [[0, 1], [0, 1], [0, 1, 3]], "r's table before computing positions 6, 7 and 8")
    expect((kv.get_block_ids("r"), kv.get_block_ids("s")), ([0, 1, 3], [2]), "get_block_ids")
    expect((kv.num_used_blocks, kv.num_reserved_slots), (4, 16), "(used blocks, reserved slots)")


@case(CASES, "refused: nothing changes", "PagedKVCacheManager.allocate_slots",
      "return None before taking anything; a new request that is refused must not get a table")
def _(ex):
    kv = ex.PagedKVCacheManager(num_blocks=3, block_size=4)
    a, b = _req("a", 13), _req("b", 5)
    expect(kv.allocate_slots(a, 8), [0, 1], "a's first 8 tokens")
    a.num_computed_tokens = 8
    expect(kv.allocate_slots(b, 5), None, "b needs 2 blocks, 1 is free")
    expect(kv.allocate_slots(a, 5), None, "a needs 2 more blocks, 1 is free")
    expect((kv.num_free_blocks, kv.get_block_ids("a"), kv.get_block_ids("b"), kv.num_referenced_blocks),
           (1, [0, 1], [], 2), "(free blocks, a's table, b's table, referenced blocks) after both refusals")
    expect(sorted(kv.tables), ["a"], "requests with a table (self.tables) after both refusals")
    expect(kv.allocate_slots(b, 4), [2], "b asks for 4 tokens instead")


@case(CASES, "lookahead reserves room up front", "PagedKVCacheManager.allocate_slots",
      "num_lookahead_tokens count like new tokens when sizing the table (static batching reserves a "
      "request's worst case this way)")
def _(ex):
    kv = ex.PagedKVCacheManager(num_blocks=6, block_size=4)
    r = _req("r", 5)
    expect(kv.allocate_slots(r, 5, num_lookahead_tokens=10), [0, 1, 2, 3], "5 tokens + 10 lookahead")
    r.num_computed_tokens = 5
    expect(kv.allocate_slots(r, 1), [0, 1, 2, 3], "the next token fits in the reserved room")


@case(CASES, "free returns the blocks tail first", "PagedKVCacheManager.free",
      "give a request's blocks back last block first, then forget its table")
def _(ex):
    kv = ex.PagedKVCacheManager(num_blocks=6, block_size=4)
    a, b, c = _req("a", 12), _req("b", 4), _req("c", 20)
    kv.allocate_slots(a, 12)
    kv.allocate_slots(b, 4)
    kv.free(a)
    expect((kv.get_block_ids("a"), kv.num_free_blocks), ([], 5), "(a's table, free blocks) after free(a)")
    expect(kv.allocate_slots(c, 20), [4, 5, 2, 1, 0], "c's 5 blocks: the never-used ones, then a's, tail first")
    kv.free(a)  # twice, and a request that never held blocks: nothing happens
    kv.free(_req("never-admitted", 3))
    expect(kv.num_free_blocks, 0, "free blocks after freeing a again and an unknown request")


@case(CASES, "slot mapping: logical position -> physical slot", "PagedKVCacheManager.slot_mapping",
      "slot = physical block id * block_size + offset in the block")
def _(ex):
    kv = ex.PagedKVCacheManager(num_blocks=5, block_size=4)
    x, r, y = _req("x", 4), _req("r", 12), _req("y", 8)
    kv.allocate_slots(x, 4)  # block 0
    kv.allocate_slots(r, 4)  # block 1
    kv.allocate_slots(y, 8)  # blocks 2, 3
    kv.free(x)  # free queue: 4, 0
    r.num_computed_tokens = 4
    expect(kv.allocate_slots(r, 8), [1, 4, 0], "r's table")
    expect(kv.slot_mapping("r", 0, 12), [4, 5, 6, 7, 16, 17, 18, 19, 0, 1, 2, 3], "r, positions 0..11")
    expect(kv.slot_mapping("r", 3, 6), [7, 16, 17], "r, positions 3..5 (across a block boundary)")
    expect(kv.slot_mapping("y", 6, 8), [14, 15], "y, positions 6..7")
    expect(kv.slot_mapping("r", 5, 5), [], "an empty range")


# --- whole traces against minivllm's KVCacheManager ---------------------------------------------------
def _compare(ex, trace, setup, label=""):
    return compare_with_minivllm(lambda: ex.PagedKVCacheManager(setup.num_blocks, setup.block_size),
                                 trace, setup, caching=False, label=label)


@case(CASES, "a pool too small for everyone: preemption and readmission", "PagedKVCacheManager",
      "same block tables as minivllm's allocator at every step; the note says which step differs")
def _(ex):
    trace = [TraceRequest(f"r{i}", tuple(range(1 + i, 8 + 2 * i)), 10, arrival_step=i // 2) for i in range(6)]
    _compare(ex, trace, KVSetup(num_blocks=16, block_size=4, max_num_seqs=6, max_num_batched_tokens=32))


@case(CASES, "chunked prefill across block boundaries", "PagedKVCacheManager",
      "a chunk can end in the middle of a block; the next chunk continues in the same block")
def _(ex):
    trace = [TraceRequest("long", tuple(range(1, 31)), 6), TraceRequest("short", (5, 6, 7), 9, arrival_step=1)]
    _compare(ex, trace, KVSetup(num_blocks=20, block_size=4, max_num_batched_tokens=7))


@case(CASES, "static batching reserves each request's worst case", "PagedKVCacheManager",
      "the static scheduler calls allocate_slots once, with num_lookahead_tokens, and never again")
def _(ex):
    trace = [TraceRequest(f"s{i}", tuple(range(2, 5 + 3 * i)), 3 + 2 * i) for i in range(5)]
    _compare(ex, trace, KVSetup(num_blocks=24, block_size=4, max_num_seqs=3, scheduler="static",
                                enable_chunked_prefill=True))


@case(CASES, "40 random traces (seeded): tight pools, chunks, priorities, aborts", "PagedKVCacheManager",
      "compare step by step with minivllm's allocator; the note says which trace and step")
def _(ex):
    for seed in range(40):
        setup = KVSetup(num_blocks=7 + seed % 8, block_size=4, max_num_seqs=1 + seed % 8,
                        max_num_batched_tokens=(8, 16, 64)[seed % 3],
                        policy="priority" if seed % 4 == 3 else "fcfs")
        trace = random_kv_trace(seed, 4 + seed % 10, priorities=3 if seed % 4 == 3 else 1,
                                abort_every=4 if seed % 5 == 0 else 0)
        _compare(ex, trace, setup, label=f"seed {seed}")


# --- the tiny model, served with the student's manager ------------------------------------------------
ENGINE_ARGS = dict(max_model_len=128, dtype="float32")
MAX_TOKENS = 24


@lru_cache(maxsize=4)
def reference_tokens(scheduler: str) -> dict[str, list[int]]:
    """Greedy tokens of :data:`PROMPTS` from minivllm's own engine (a pool that never fills)."""
    return _serve(None, scheduler, 64)[0]


def _serve(kv, scheduler: str, num_blocks: int):
    from minivllm import LLM, SamplingParams

    pool = {"kv_cache": kv} if kv is not None else {"num_kv_blocks": num_blocks}
    with one_cpu_thread():
        llm = LLM(scheduler=scheduler, enable_prefix_caching=False if kv is None else None,
                  max_num_seqs=4 if scheduler == "static" else 8, debug_checks=True, **pool, **ENGINE_ARGS)
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    tokens = {o.request_id: list(o.outputs[0].token_ids) for o in outs}
    return tokens, llm


@case(CASES, "serves the tiny model under preemption: minivllm's greedy tokens", "PagedKVCacheManager",
      "pass the cases above first; debug_checks=True checks every K/V read against what was written")
def _(ex):
    from minivllm.core.interfaces import KVCacheManagerInterface, check_implements

    kv = ex.PagedKVCacheManager(num_blocks=12, block_size=16)
    check_implements(kv, KVCacheManagerInterface, "your PagedKVCacheManager")
    expected = reference_tokens("continuous")
    got, llm = _serve(kv, "continuous", 12)
    expect_same_tokens(expected, got, "12 blocks of 16 tokens for 8 requests of up to 31 tokens")
    if llm.stats().summary()["preemptions"] == 0:
        raise AssertionError("the run preempted nobody: the pool was meant to be too small for all 8")
    expect(kv.num_used_blocks, 0, "blocks in use after every request ended")


@case(CASES, "serves the tiny model with static batching (lookahead)", "PagedKVCacheManager",
      "static batching reserves prompt + max_tokens at admission through num_lookahead_tokens")
def _(ex):
    kv = ex.PagedKVCacheManager(num_blocks=16, block_size=16)
    got, _ = _serve(kv, "static", 16)
    expect_same_tokens(reference_tokens("static"), got, "static batches of 4")
    expect(kv.num_used_blocks, 0, "blocks in use after every request ended")
