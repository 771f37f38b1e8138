"""Cases for ex07_prefix_cache: the hash chain, prefix-cache lookups, fork and copy-on-write,
then whole traces against minivllm's own ``KVCacheManager`` (prefix caching on), then the tiny
model served with the student's manager: prefix hits, ``n > 1`` and beam search.

Hash values are not fixed (any deterministic hash will do), so the hash cases check the
structure: what a block's hash must and must not depend on. Block ids in the unit cases follow
from exercise 04's rules (front of the free queue out, freed blocks to the back, tail first)
and are worked out by hand. The trace cases replay minivllm's scheduler over both managers
(``minivllm.course.kv_replay``); the engine cases compare tokens with minivllm's own engine.
"""

from __future__ import annotations

from functools import lru_cache

from minivllm import course
from minivllm.course.grading import Case, Mismatch, case, expect, expect_raises
from minivllm.course.harness import TraceRequest, beam_search, expect_same_tokens
from minivllm.course.kv_replay import PROMPTS, KVSetup, compare_with_minivllm, random_kv_trace
from minivllm.course.runtime import one_cpu_thread
from minivllm.request import Request

CASES: list[Case] = []


def _manager(ex, num_blocks: int = 16, block_size: int = 4):
    return ex.PrefixCachingKVCacheManager(num_blocks, block_size)


def _run_step(kv, request: Request, num_new: int, hits=()) -> list[int]:
    """Plan ``num_new`` tokens of ``request`` (after its ``hits``) and let the step run."""
    table = kv.allocate_slots(request, num_new, hits)
    assert table is not None, f"allocate_slots refused {request.request_id!r} with {kv.num_free_blocks} free blocks"
    request.num_computed_tokens += len(hits) * kv.block_size + num_new
    kv.commit_written_blocks()
    return table


def _admit(kv, request: Request) -> tuple[list[int], int]:
    """Admit a new request the way the scheduler does: look up, then allocate the rest."""
    hits, num_hit = kv.get_computed_blocks(request)
    return _run_step(kv, request, request.num_tokens - num_hit, hits), num_hit


def _refs(kv, ids) -> list[int]:
    return [kv.pool.ref_count(i) for i in ids]


# --- what this file is built on ------------------------------------------------------------------
@case(CASES, "built on your own exercise 04", "PrefixCachingKVCacheManager",
      "this file keeps its blocks in course.working('ex04_block_allocator').BlockPool: your exercise 04 once "
      "it passes its checks, the reference until then -- and then the cases below grade your code over it")
def _(ex):
    _admit(_manager(ex), Request("a", list(range(1, 10))))  # your code runs first (a stub stops here)
    if ex.__course_source__ == "exercises" and ex.ex04.__course_source__ != "exercises":
        report = course.verdict(course.load("ex04_block_allocator"))
        raise NotImplementedError(
            f"this file runs on the reference exercise 04: yours does not pass its checks yet "
            f"({report.summary_line().strip()}); the other cases grade your exercise 07 over the "
            "reference allocator. Pass exercise 04, then check this one again"
        )


# --- hashing ---------------------------------------------------------------------------------------
@case(CASES, "hash_block: an int that depends on the parent, the tokens and the extra keys", "hash_block",
      "hash a tuple of all three; equal inputs must give equal hashes")
def _(ex):
    h = ex.hash_block(None, [1, 2, 3, 4])
    if not isinstance(h, int):
        raise Mismatch("an int", type(h).__name__, "hash_block(None, [1, 2, 3, 4])")
    expect(ex.hash_block(None, (1, 2, 3, 4)), h, "the same block again (as a tuple)")
    variants = {
        "another parent": ex.hash_block(12345, [1, 2, 3, 4]),
        "other tokens": ex.hash_block(None, [1, 2, 3, 5]),
        "the same tokens in another order": ex.hash_block(None, [2, 1, 3, 4]),
        "extra keys ('salt',)": ex.hash_block(None, [1, 2, 3, 4], ("salt",)),
    }
    same = [what for what, v in variants.items() if v == h]
    expect(same, [], "variants that hash like hash_block(None, [1, 2, 3, 4])")


@case(CASES, "block_hashes: full blocks only, each chained to the one before", "block_hashes",
      "a trailing partial block gets no hash; block i's parent is block i-1's hash")
def _(ex):
    tokens = list(range(100, 120))
    hs = ex.block_hashes(tokens, 8)
    h0 = ex.hash_block(None, tokens[:8])
    expect(hs, [h0, ex.hash_block(h0, tokens[8:16])], "block_hashes(20 tokens, block_size 8)")
    expect(ex.block_hashes(tokens[:16], 8), hs, "16 tokens: the same two full blocks")
    expect(ex.block_hashes(tokens[:7], 8), [], "7 tokens: no full block")
    expect(ex.block_hashes(tokens[8:20], 8, parent=h0), hs[1:], "the tokens after block 0, chained to it")


@case(CASES, "the same tokens at another position are another block", "block_hashes",
      "a block's K/V depends on every token before it, so its hash must too")
def _(ex):
    a = [7, 8, 9, 10]
    hs = ex.block_hashes(a + a + a, 4)
    expect(len(set(hs)), 3, "distinct hashes among three identical blocks in a row")


@case(CASES, "cache_salt enters the first block and, through the chain, every one", "block_hashes",
      "the salt is the first block's extra key, (cache_salt,); later blocks inherit it from their parent")
def _(ex):
    tokens = list(range(30, 42))
    salted, plain = ex.block_hashes(tokens, 4, "tenant-a"), ex.block_hashes(tokens, 4)
    h0 = ex.hash_block(None, tokens[:4], ("tenant-a",))
    expect(salted[:2], [h0, ex.hash_block(h0, tokens[4:8])], "salted hashes of blocks 0 and 1")
    expect([a == b for a, b in zip(salted, plain)], [False, False, False], "salted == unsalted, per block")
    expect(ex.block_hashes(tokens[4:], 4, "tenant-a", parent=h0), salted[1:], "continuing a salted chain")


# --- lookups ---------------------------------------------------------------------------------------
@case(CASES, "get_computed_blocks: the longest cached run, in whole blocks", "get_computed_blocks",
      "L1: look the request's block hashes up in order, from its first block, and stop at the first miss")
def _(ex):
    kv = _manager(ex)
    a = Request("a", list(range(1, 11)))  # 10 tokens: blocks 0, 1 full, block 2 partial
    expect(kv.get_computed_blocks(a), ([], 0), "an empty cache")
    table, _ = _admit(kv, a)
    b = Request("b", list(range(1, 9)) + [99, 98, 97])
    hits, n = kv.get_computed_blocks(b)
    expect((list(hits), n), (table[:2], 8), "b shares a's first 8 tokens")
    c = Request("c", list(range(1, 5)) + [50, 51, 52, 53, 54])
    hits, n = kv.get_computed_blocks(c)
    expect((list(hits), n), (table[:1], 4), "c shares a's first 4 tokens")
    d = Request("d", [42] + list(range(2, 11)))
    expect(kv.get_computed_blocks(d)[1], 0, "d differs from a in its first token")
    e = Request("e", list(range(1, 5)) + [0, 0, 0, 0] + list(range(9, 13)))
    expect(kv.get_computed_blocks(e)[1], 4, "e matches a's block 0, not block 1, then a's tokens again")


@case(CASES, "never the whole prompt: its last token must be computed", "get_computed_blocks",
      "a prompt of exactly k cached blocks may reuse only k - 1 of them")
def _(ex):
    kv = _manager(ex)
    _admit(kv, Request("a", list(range(1, 14))))  # 13 tokens: 3 full blocks
    got = [kv.get_computed_blocks(Request(f"p{n}", list(range(1, n + 1))))[1] for n in (4, 5, 8, 9, 12, 13)]
    expect(got, [0, 4, 4, 8, 8, 12], "cached tokens for prompts of 4/5/8/9/12/13 of a's tokens")


@case(CASES, "a block joins the cache only after the step that writes it", "get_computed_blocks",
      "allocate_slots plans the step; commit_written_blocks says it ran; a failed step registers nothing")
def _(ex):
    kv = _manager(ex)
    a = Request("a", list(range(1, 10)))
    kv.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    probe = Request("probe", list(range(1, 10)) + [77])
    expect(kv.get_computed_blocks(probe)[1], 0, "before the step ran")
    kv.discard_unwritten_blocks()
    expect(kv.get_computed_blocks(probe)[1], 0, "after the step failed")
    kv.commit_written_blocks()
    expect(kv.get_computed_blocks(probe)[1], 0, "after the failed step, and then a commit (of no step)")
    b = Request("b", list(range(1, 10)))
    _run_step(kv, b, 9)
    expect(kv.get_computed_blocks(probe)[1], 8, "after a step that ran")


@case(CASES, "a failed step's blocks are considered at the commit of the step that runs them again",
      "commit_written_blocks",
      "C1: a failed step considers nothing; the request, planned again, has its full blocks considered at the "
      "next commit, like any full block not considered before")
def _(ex):
    kv = _manager(ex)
    a = Request("a", list(range(1, 10)))  # 9 tokens: blocks 0, 1 full, block 2 partial
    table = kv.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    kv.discard_unwritten_blocks()  # the step failed: its K/V was never written
    a.num_computed_tokens = 0  # the caller runs the request's tokens again
    expect(kv.allocate_slots(a, 9), table, "allocate_slots for the same 9 tokens again (its table)")
    a.num_computed_tokens = 9
    kv.commit_written_blocks()
    probe = Request("probe", list(range(1, 10)) + [77])
    expect(kv.get_computed_blocks(probe), (table[:2], 8), "a lookup of a's tokens after the step that ran")


@case(CASES, "a block not registered when it became full never is", "commit_written_blocks",
      "C1, C2: a commit registers only the blocks that became full in its step; a block skipped then "
      "because another block held its hash stays unregistered, even once that other block is evicted")
def _(ex):
    kv = _manager(ex, num_blocks=8)
    a, b = Request("a", list(range(1, 7))), Request("b", list(range(1, 7)))
    for r in (a, b):  # one step for both: neither finds a hit, both fill a block 0 of tokens 1-4
        expect(kv.allocate_slots(r, 6) is not None, True, f"{r.request_id}'s 6 tokens fit in 8 free blocks")
        r.num_computed_tokens = 6
    kv.commit_written_blocks()
    table_a, table_b = kv.get_block_ids("a"), kv.get_block_ids("b")
    expect(kv.cached_block_ids(), {table_a[0]}, "cached_block_ids(): a's block 0 only (b's has the same hash)")
    kv.free(a)
    _admit(kv, Request("filler", list(range(30, 54))))  # 24 tokens: every free block, a's included
    probe = Request("probe", list(range(1, 9)) + [99])
    expect(kv.get_computed_blocks(probe)[1], 0, "the prefix of tokens 1-4 after a's block 0 was handed out")
    b.all_token_ids += [7, 8]  # b fills its block 1 in the next step
    _run_step(kv, b, 2)
    expect(kv.cached_block_ids() & set(table_b), {table_b[1]},
           "b's blocks in cached_block_ids() after b filled its block 1 (its block 0 became full a step before)")
    expect(kv.get_computed_blocks(probe)[1], 0, "tokens 1-8 looked up: b's block 0 was never registered")


@case(CASES, "cached_block_ids: the blocks registered now, held or free", "cached_block_ids",
      "a block enters at the commit of the step that filled it and leaves when the pool hands it out again; "
      "which cached block the pool hands out first follows the order free gives blocks back (C4: last first)")
def _(ex):
    kv = _manager(ex, num_blocks=6)
    expect(kv.cached_block_ids(), set(), "a new manager")
    a = Request("a", list(range(1, 10)))  # blocks 0, 1 full, 2 partial
    table, _ = _admit(kv, a)
    expect(kv.cached_block_ids(), set(table[:2]), "after a's 9 tokens ran")
    kv.free(a)  # free queue: 3, 4, 5, 2, 1, 0
    expect(kv.cached_block_ids(), set(table[:2]), "after a ended (its blocks are free, still cached)")
    b = Request("b", list(range(20, 38)))  # 18 tokens: blocks 3, 4, 5, 2 full, block 1 partial
    _admit(kv, b)
    expect(kv.cached_block_ids(), {0, 3, 4, 5, 2}, "after b took 5 blocks, a's block 1 among them")


@case(CASES, "hits are shared, not copied; freed cached blocks stay hits", "get_computed_blocks",
      "a hit is attached to the new request's table with one more reference; nothing is copied")
def _(ex):
    kv = _manager(ex, num_blocks=6)
    a = Request("a", list(range(1, 11)))
    table_a, _ = _admit(kv, a)
    b = Request("b", list(range(1, 9)) + [60, 61, 62])
    table_b, hit = _admit(kv, b)
    expect((hit, table_b[:2], _refs(kv, table_a[:2]), kv.num_used_blocks),
           (8, table_a[:2], [2, 2], 4), "(b's cached tokens, b's first blocks, their ref counts, blocks in use)")
    kv.free(a)
    kv.free(b)
    expect(kv.num_used_blocks, 0, "blocks in use after both ended")
    c = Request("c", list(range(1, 9)) + [70])
    table_c, hit = _admit(kv, c)
    expect((hit, table_c[:2]), (8, table_a[:2]), "c, after a and b left: (cached tokens, first blocks)")


@case(CASES, "eviction takes the block freed longest ago", "get_computed_blocks",
      "free blocks keep their contents until the pool hands them out, oldest-freed first")
def _(ex):
    kv = _manager(ex, num_blocks=6)
    a = Request("a", list(range(1, 10)))  # blocks 0, 1 full (cached), 2 partial
    _admit(kv, a)
    kv.free(a)  # free queue: 3, 4, 5, 2, 1, 0
    b = Request("b", list(range(20, 32)))  # takes 3, 4, 5; all three full
    expect(_admit(kv, b)[0], [3, 4, 5], "b's table")
    kv.free(b)  # free queue: 2, 1, 0, 5, 4, 3
    c = Request("c", list(range(40, 52)))
    expect(_admit(kv, c)[0], [2, 1, 0], "c's table: a's old blocks go first")
    expect(kv.get_computed_blocks(Request("a2", list(range(1, 10))))[1], 0, "a's prefix after c took its blocks")
    hits, n = kv.get_computed_blocks(Request("b2", list(range(20, 33))))
    expect((list(hits), n), ([3, 4, 5], 12), "b's prefix: still cached")


# --- fork and copy-on-write --------------------------------------------------------------------------
def _forked(ex, prompt_len: int = 6):
    kv = _manager(ex, num_blocks=6)
    parent = Request("p", list(range(1, prompt_len + 1)))
    _admit(kv, parent)
    child = Request("p#1", list(parent.all_token_ids))
    child.num_computed_tokens = parent.num_computed_tokens
    kv.fork(parent, child)
    return kv, parent, child


@case(CASES, "fork shares every block, copies nothing", "fork",
      "the child's table lists the parent's blocks; each block gets one more reference")
def _(ex):
    kv, parent, child = _forked(ex)
    expect((kv.get_block_ids("p#1"), _refs(kv, [0, 1])), ([0, 1], [2, 2]), "(child's table, ref counts)")
    expect((kv.num_used_blocks, kv.num_referenced_blocks, kv.take_pending_copies()), (2, 4, []),
           "(blocks in use, blocks referenced, pending copies)")


@case(CASES, "copy-on-write at the first write into a shared block", "allocate_slots",
      "A2: a block the new tokens land in that another table also lists (ref_count > 1) is replaced by a fresh "
      "block, and (shared, fresh) is handed over once by take_pending_copies")
def _(ex):
    kv, parent, child = _forked(ex)  # 6 tokens: block 0 full, block 1 holds 2 of 4
    child.all_token_ids.append(11)  # child writes position 6, in the shared block 1
    expect(kv.allocate_slots(child, 1), [0, 2], "child's table after its first write")
    expect((kv.take_pending_copies(), kv.take_pending_copies(), _refs(kv, [0, 1, 2])), ([(1, 2)], [], [2, 1, 1]),
           "(copies, copies asked for again, ref counts of blocks 0, 1, 2)")
    child.num_computed_tokens = 7
    parent.all_token_ids.append(12)  # the parent now holds block 1 alone: no copy
    expect((kv.allocate_slots(parent, 1), kv.take_pending_copies()), ([0, 1], []), "the parent's write")
    parent.num_computed_tokens = 7
    parent.all_token_ids.append(13)
    kv.allocate_slots(parent, 1)
    parent.num_computed_tokens = 8
    parent.all_token_ids.append(14)  # position 8 opens a new block; shared block 0 is not written
    expect((kv.allocate_slots(parent, 1), kv.take_pending_copies()), ([0, 1, 3], []), "the parent's block 2")


@case(CASES, "a full shared block is never copied", "allocate_slots",
      "A2: the new tokens' positions say which blocks are written; full blocks before them are only read")
def _(ex):
    kv, parent, child = _forked(ex, prompt_len=8)  # two full blocks
    child.all_token_ids.append(11)
    expect((kv.allocate_slots(child, 1), kv.take_pending_copies()), ([0, 1, 2], []), "(child's table, copies)")
    expect(_refs(kv, [0, 1, 2]), [2, 2, 1], "ref counts of blocks 0, 1, 2")


@case(CASES, "only the blocks the new tokens land in are copied", "allocate_slots",
      "A2: positions num_computed .. num_computed + num_new - 1, and nothing after them (lookahead room "
      "included), are written")
def _(ex):
    kv = _manager(ex, num_blocks=8)
    parent = Request("p", list(range(1, 7)))
    kv.allocate_slots(parent, 6, num_lookahead_tokens=6)  # room reserved ahead: blocks 0, 1, 2
    parent.num_computed_tokens = 6
    child = Request("p#1", list(range(1, 7)))
    child.num_computed_tokens = 6
    kv.fork(parent, child)
    expect((kv.allocate_slots(child, 0), kv.take_pending_copies()), ([0, 1, 2], []), "child plans 0 new tokens")
    expect((kv.allocate_slots(child, 2, num_lookahead_tokens=4), kv.take_pending_copies()), ([0, 3, 2], [(1, 3)]),
           "child plans positions 6, 7 (block 1) and 4 lookahead slots (8-11, in shared block 2)")
    expect((kv.allocate_slots(child, 3), kv.take_pending_copies()), ([0, 3, 4], [(2, 4)]),
           "then positions 6, 7, 8 (block 2 is still shared)")
    expect(_refs(kv, range(5)), [2, 1, 1, 1, 1], "ref counts of blocks 0-4")


@case(CASES, "a copy the pool cannot supply changes nothing", "allocate_slots",
      "A3: count the copies and the new blocks, and check that they fit, before making any of them")
def _(ex):
    kv, parent, child = _forked(ex)
    filler = Request("filler", list(range(30, 46)))
    _admit(kv, filler)  # the last 4 free blocks
    child.all_token_ids.append(11)
    expect(kv.allocate_slots(child, 1), None, "child's write with no free block")
    expect((kv.get_block_ids("p#1"), _refs(kv, [0, 1]), kv.take_pending_copies()), ([0, 1], [2, 2], []),
           "(child's table, ref counts, pending copies) after the refusal")
    kv.free(filler)  # free queue: 5, 4, 3, 2 (tail first)
    expect(kv.allocate_slots(child, 1), [0, 5], "child's write once blocks are free")
    expect(kv.take_pending_copies(), [(1, 5)], "pending copies")


@case(CASES, "free hits count against the free blocks", "allocate_slots",
      "A3: a hit nobody holds is one of the free blocks; attaching it takes it out of the free queue, so it "
      "cannot also be a fresh block. Count such hits before deciding that the request fits")
def _(ex):
    kv = _manager(ex, num_blocks=6)
    a = Request("a", list(range(1, 10)))
    table_a, _ = _admit(kv, a)
    kv.free(a)  # a's blocks 0, 1 stay cached, and free
    filler = Request("filler", list(range(30, 46)))
    _admit(kv, filler)  # 4 blocks: the only ones left free are a's cached blocks 0 and 1
    b = Request("b", list(range(1, 9)) + [60, 61, 62])
    hits, num_hit = kv.get_computed_blocks(b)
    expect((list(hits), num_hit, kv.num_free_blocks), (table_a[:2], 8, 2), "(b's hits, cached tokens, free blocks)")
    try:
        got = kv.allocate_slots(b, 3, hits)
    except ValueError as err:
        raise AssertionError(f"allocate_slots(b, 3, its 2 free hits) with 2 free blocks raised ValueError: {err} "
                             "-- b needs its 2 hits and 1 fresh block, 3 in all; it must return None") from None
    expect(got, None, "allocate_slots(b, 3, its 2 hits) with only the 2 hits free")
    expect((kv.get_block_ids("b"), _refs(kv, table_a[:2]), kv.num_free_blocks, kv.take_pending_copies()),
           ([], [0, 0], 2, []), "(b's table, the hits' ref counts, free blocks, copies) after the refusal")
    expect(kv.get_computed_blocks(b)[1], 8, "b's cached tokens after the refusal")
    kv.free(filler)
    expect(kv.allocate_slots(b, 3, hits), table_a[:2] + [2], "b's table once the filler's blocks are free")


@case(CASES, "a request freed with a copy pending takes the copy with it", "free",
      "F2: a copy into a block the request held must not reach the next forward pass")
def _(ex):
    kv, parent, child = _forked(ex)
    child.all_token_ids.append(11)
    expect(kv.allocate_slots(child, 1), [0, 2], "child's table after its first write (block 1 copied into 2)")
    kv.free(child)  # preempted before the step ran
    expect((kv.take_pending_copies(), _refs(kv, [0, 1, 2]), kv.num_used_blocks), ([], [1, 1, 0], 2),
           "(pending copies, ref counts of blocks 0-2, blocks in use) after the child was freed")


@case(CASES, "check_invariants notices books that disagree with the tables", "check_invariants",
      "compare every block's ref_count and place in the free queue with the tables; with live_request_ids, "
      "no other request may hold blocks")
def _(ex):
    kv, parent, child = _forked(ex)
    b = Request("b", list(range(1, 5)) + [40, 41])
    _admit(kv, b)  # a hit on block 0: three tables list it
    kv.check_invariants(["p", "p#1", "b"])  # healthy books pass
    kv.check_invariants()
    expect_raises(AssertionError, lambda: kv.check_invariants(["p", "b"]), "check_invariants without p#1, which holds blocks")
    for what, corrupt, undo in (
        ("a shared block with one reference too many (pool.touch)", lambda: kv.pool.touch([0]),
         lambda: kv.pool.free([0])),
        ("a free block taken out of the free queue (pool.touch)", lambda: kv.pool.touch([5]),
         lambda: kv.pool.free([5])),
    ):
        corrupt()
        expect_raises(AssertionError, kv.check_invariants, f"check_invariants() after {what}")
        undo()
    kv.check_invariants(["p", "p#1", "b"])


@case(CASES, "freeing one side of a fork leaves the other intact", "fork",
      "the parent's blocks stay with the child until the child lets go too")
def _(ex):
    kv, parent, child = _forked(ex)
    kv.free(parent)
    expect((kv.get_block_ids("p#1"), _refs(kv, [0, 1]), kv.num_used_blocks), ([0, 1], [1, 1], 2),
           "(child's table, ref counts, blocks in use) after the parent ended")
    kv.free(child)
    expect(kv.num_used_blocks, 0, "blocks in use after the child ended")


# --- whole traces against minivllm's KVCacheManager ---------------------------------------------------
SYSTEM = tuple(range(1, 13))  # a 12-token "system prompt": 3 blocks of 4
OTHER = (5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 3, 3)


def _compare(ex, trace, setup, label=""):
    return compare_with_minivllm(lambda: ex.PrefixCachingKVCacheManager(setup.num_blocks, setup.block_size),
                                 trace, setup, caching=True, label=label)


@case(CASES, "a shared system prompt, requests arriving over time", "PrefixCachingKVCacheManager",
      "same block tables as minivllm's at every step: later requests start on the cached blocks")
def _(ex):
    trace = [TraceRequest(f"u{i}", SYSTEM + tuple(range(20 + i, 23 + 2 * i)), 6, arrival_step=2 * i) for i in range(6)]
    _compare(ex, trace, KVSetup(num_blocks=40, block_size=4))


@case(CASES, "n > 1: siblings fork off their leader and copy on write", "PrefixCachingKVCacheManager",
      "a fork shares everything; the first write into the shared last block copies it")
def _(ex):
    trace = [TraceRequest("a", SYSTEM + (40, 41), 8, n=3), TraceRequest("b", SYSTEM + (42,), 5, n=2, arrival_step=3)]
    _compare(ex, trace, KVSetup(num_blocks=40, block_size=4))


@case(CASES, "a small pool: eviction, preemption, readmission from the cache", "PrefixCachingKVCacheManager",
      "preempted requests find their own blocks in the cache if nobody took them")
def _(ex):
    trace = [TraceRequest(f"r{i}", (SYSTEM, OTHER)[i % 2] + tuple(range(30 + i, 33 + i)), 9, arrival_step=i // 3)
             for i in range(8)]
    _compare(ex, trace, KVSetup(num_blocks=16, block_size=4, max_num_seqs=8, max_num_batched_tokens=16))


@case(CASES, "preempted out of a step after a prefix hit: nothing unwritten is shared", "PrefixCachingKVCacheManager",
      "register blocks in commit_written_blocks (after the step), never when allocating them")
def _(ex):
    prefix = tuple(range(10, 26))  # 4 blocks of 4
    trace = [TraceRequest("long", prefix + (1, 2, 3), 4, priority=9),
             TraceRequest("same-prefix", prefix + (7,), 4, priority=1, arrival_step=1),
             TraceRequest("urgent", tuple(range(40, 52)), 4, priority=2, arrival_step=1)]
    _compare(ex, trace, KVSetup(num_blocks=7, block_size=4, max_num_batched_tokens=14, policy="priority"))


@case(CASES, "tenants with a cache_salt share nothing with each other", "PrefixCachingKVCacheManager",
      "the salt changes the first block's hash, and so every hash after it")
def _(ex):
    trace = [TraceRequest(f"t{i}", SYSTEM + (60 + i,), 4, arrival_step=2 * i, cache_salt=("a", "b", "a", None)[i])
             for i in range(4)]
    _compare(ex, trace, KVSetup(num_blocks=30, block_size=4))


@case(CASES, "40 random traces (seeded): prefixes, forks, salts, priorities, aborts", "PrefixCachingKVCacheManager",
      "compare step by step with minivllm's manager; the note says which trace and step")
def _(ex):
    for seed in range(40):
        setup = KVSetup(num_blocks=10 + seed % 12, block_size=4, max_num_seqs=1 + seed % 8,
                        max_num_batched_tokens=(8, 16, 64)[seed % 3],
                        policy="priority" if seed % 4 == 3 else "fcfs")
        trace = random_kv_trace(seed, 4 + seed % 10, prefixes=[SYSTEM, OTHER[:8]], max_n=3,
                                priorities=3 if seed % 4 == 3 else 1, salts=(None, None, "t1"),
                                abort_every=4 if seed % 5 == 0 else 0)
        _compare(ex, trace, setup, label=f"seed {seed}")


# --- the tiny model, served with the student's manager ------------------------------------------------
ENGINE_ARGS = dict(max_model_len=64, dtype="float32")
STORY = ("Once upon a time there was a little fox who lived in a quiet forest near a river. Every "
         "morning she walked to the water to drink, and every evening she came home to her den.")


def _greedy():
    from minivllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _llm(kv, **args):
    from minivllm import LLM

    pool = {"kv_cache": kv} if kv is not None else {"num_kv_blocks": 64}
    return LLM(debug_checks=True, **pool, **ENGINE_ARGS, **args)


def _shared_prefix_prompts(llm) -> list[list[int]]:
    """Three prompts on one 32-token prefix (two blocks of 16), and one of another story."""
    story = llm.engine.tokenizer.encode(STORY)[:32]
    tails = [" and then she saw a bird", " who liked apples", " and"]
    prompts = [story + llm.engine.tokenizer.encode(t, add_special_tokens=False) for t in tails]
    return prompts + [llm.engine.tokenizer.encode(PROMPTS[3])]


def _generate(llm, prompts, params, first: int = 1) -> dict[str, tuple[list[int], int]]:
    """``prompts[:first]`` first (their blocks join the cache), then the rest together.
    Returns ``{index: (token ids, cached prompt tokens)}``."""
    out = {}
    for group in (prompts[:first], prompts[first:]):
        for o in llm.generate(group, params, use_tqdm=False):
            out[str(len(out))] = (list(o.outputs[0].token_ids), o.num_cached_tokens)
    return out


@lru_cache(maxsize=2)
def _reference_prefix_run() -> dict[str, tuple[list[int], int]]:
    with one_cpu_thread():
        llm = _llm(None, enable_prefix_caching=False)
        return _generate(llm, _shared_prefix_prompts(llm), _greedy())


@case(CASES, "serves the tiny model with prefix hits: the tokens of a run without caching", "PrefixCachingKVCacheManager",
      "pass the cases above first; debug_checks=True checks every K/V read against what was written")
def _(ex):
    from minivllm.core.interfaces import ForkingKVCacheManager, check_implements

    expected = {k: v[0] for k, v in _reference_prefix_run().items()}
    for num_blocks in (64, 6):  # plenty, and so few that blocks are evicted and requests preempted
        kv = ex.PrefixCachingKVCacheManager(num_blocks, 16)
        check_implements(kv, ForkingKVCacheManager, "your PrefixCachingKVCacheManager")
        with one_cpu_thread():
            llm = _llm(kv)
            got = _generate(llm, _shared_prefix_prompts(llm), _greedy())
        expect_same_tokens(expected, {k: v[0] for k, v in got.items()}, f"{num_blocks} blocks")
        cached = [got[k][1] for k in ("1", "2")]
        if min(cached) < 32:
            raise Mismatch([32, 32], cached, f"{num_blocks} blocks: cached prompt tokens of the two requests "
                           "that share the first one's 32-token prefix")
        expect(kv.num_used_blocks, 0, f"{num_blocks} blocks: blocks in use after every request ended")
        if num_blocks == 6 and llm.stats().summary()["preemptions"] == 0:
            raise AssertionError("6 blocks: the run was meant to evict cached blocks and preempt a request")


def _parallel(kv, prompts_from_llm: bool = True):
    from minivllm import SamplingParams

    with one_cpu_thread():
        llm = _llm(kv)
        prompts = [llm.engine.tokenizer.encode(p) for p in PROMPTS[:2]]
        outs = llm.generate(prompts, SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=12), use_tqdm=False)
    samples = {f"{o.request_id}[{c.index}]": list(c.token_ids) for o in outs for c in o.outputs}
    copies = sum(s.num_cow_copies for s in llm.stats().steps)
    return samples, copies


@lru_cache(maxsize=1)
def _reference_parallel():
    return _parallel(None)


@case(CASES, "serves n > 1: forks share the prompt, copy on write, same samples as minivllm", "PrefixCachingKVCacheManager",
      "siblings fork off the first request after its first token and must each copy the shared last block")
def _(ex):
    expected, _ = _reference_parallel()
    kv = ex.PrefixCachingKVCacheManager(32, 16)
    got, copies = _parallel(kv)
    expect_same_tokens(expected, got, "n=3, temperature 1, seed 11")
    if copies == 0:
        raise AssertionError("no copy-on-write copy was made: the forks never shared a block they wrote into")
    expect(kv.num_used_blocks, 0, "blocks in use after every request ended")


def _beams(kv):
    with one_cpu_thread():
        llm = _llm(kv)
        prompts = [llm.engine.tokenizer.encode(p) for p in PROMPTS[4:6]]
        beams = beam_search(llm, prompts, width=3, max_tokens=8)
    return {f"{i}/{j}": tokens for i, found in enumerate(beams) for j, tokens in enumerate(found)}


@lru_cache(maxsize=1)
def _reference_beams():
    return _beams(None)


@case(CASES, "serves beam search: same beams as minivllm", "PrefixCachingKVCacheManager",
      "beam search forks a beam for each surviving continuation and drops the others")
def _(ex):
    kv = ex.PrefixCachingKVCacheManager(48, 16)
    expect_same_tokens(_reference_beams(), _beams(kv), "beam width 3, 8 tokens")
    expect(kv.num_used_blocks, 0, "blocks in use after the search")
