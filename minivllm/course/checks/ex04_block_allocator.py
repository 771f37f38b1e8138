"""Cases for ex04_block_allocator: the pool's rules (P1-P5 of the exercise), the manager's
(M1-M6), then whole traces served by minivllm's scheduler over the student's manager and over
minivllm's own ``KVCacheManager`` (prefix caching off), then the tiny model.

The pool's block ids are graded, because its order is its contract (exercise 07's eviction
order is the free queue's). The manager's are not: its cases check table sizes, that refused
calls change nothing, and the pool's books; the trace cases compare the scheduler's decisions
step by step (``minivllm.course.kv_replay``), with every K/V read checked against what was
written for it; the engine cases compare greedy tokens with minivllm's own engine.
"""

from __future__ import annotations

import re
from functools import lru_cache

from minivllm.course.grading import Case, Mismatch, case, expect, expect_raises
from minivllm.course.harness import TraceRequest, expect_same_tokens
from minivllm.course.kv_replay import (
    PROMPTS,
    KVSetup,
    audit_pool,
    compare_with_minivllm,
    pool_problem,
    random_kv_trace,
)
from minivllm.course.runtime import one_cpu_thread
from minivllm.engine.core_client import local_core
from minivllm.request import Request

CASES: list[Case] = []


def _req(rid: str, num_tokens: int) -> Request:
    return Request(rid, list(range(1, num_tokens + 1)))


def _books(pool, n: int) -> tuple[list[int], list[int]]:
    """(free queue, every block's reference count): the pool's state as P5 reports it."""
    return pool.free_block_ids(), [pool.ref_count(b) for b in range(n)]


def _step(kv, request: Request, n: int) -> list[int]:
    """Plan ``n`` tokens of ``request`` and let the step run (its tokens are now stored)."""
    table = kv.allocate_slots(request, n)
    if table is None:
        raise Mismatch("a block table", None, f"allocate_slots({request.request_id!r}, {n}) with "
                       f"{kv.num_free_blocks} free blocks")
    request.num_computed_tokens += n
    return table


def _remembers(obj, request: Request, depth: int = 3) -> bool:
    """Whether ``request`` (or its id) is a key or an item of a container in ``obj``'s attributes,
    ``depth`` levels down (the pool's are not searched): what a manager keeps about it."""
    seen = (request, request.request_id)

    def walk(value, level: int) -> bool:
        if isinstance(value, dict):
            if any(k is request or k == request.request_id for k in value):
                return True
            items = list(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            items = list(value)
        else:
            return False
        return any(v is request or (isinstance(v, str) and v in seen) for v in items) or (
            level > 0 and any(walk(v, level - 1) for v in items))

    return any(walk(v, depth) for k, v in vars(obj).items() if k != "pool")


def _healthy(kv, live: list[str], what: str) -> None:
    """The pool's books agree with the tables of ``live`` (and nobody else holds a block)."""
    problem = pool_problem(kv.pool, kv.num_blocks, {rid: kv.get_block_ids(rid) for rid in live})
    if problem:
        raise AssertionError(f"{what}: {problem}")


# --- the pool ------------------------------------------------------------------------------------
@case(CASES, "a fresh pool hands out blocks from the front, in id order", "BlockPool.allocate",
      "P1 and P2: a new pool queues 0, 1, 2, ...; allocate takes from the front; each block handed out "
      "has ref_count 1")
def _(ex):
    pool = ex.BlockPool(6)
    expect(_books(pool, 6), ([0, 1, 2, 3, 4, 5], [0] * 6), "(free queue, ref counts) of a new pool of 6")
    expect(pool.allocate(2), [0, 1], "first allocate(2)")
    expect(pool.allocate(3), [2, 3, 4], "then allocate(3)")
    expect(_books(pool, 6), ([5], [1, 1, 1, 1, 1, 0]), "(free queue, ref counts)")
    expect((pool.allocate(0), pool.num_free_blocks), ([], 1), "(allocate(0), num_free_blocks)")


@case(CASES, "all or nothing: a request the pool cannot meet takes nothing", "BlockPool.allocate",
      "P2: check that enough blocks are free before you take the first one")
def _(ex):
    pool = ex.BlockPool(4)
    pool.allocate(3)
    expect_raises(ValueError, lambda: pool.allocate(2), "allocate(2) with 1 free block")
    expect(_books(pool, 4), ([3], [1, 1, 1, 0]), "(free queue, ref counts) after the refused allocate")
    expect_raises(ValueError, lambda: pool.allocate(-1), "allocate(-1)")
    expect(_books(pool, 4), ([3], [1, 1, 1, 0]), "(free queue, ref counts) after allocate(-1)")
    expect(pool.allocate(1), [3], "allocate(1) afterwards")


@case(CASES, "freed blocks join the back of the queue, in the order given", "BlockPool.free",
      "P3: a block whose last reference goes is appended to the free queue; the front is handed out first")
def _(ex):
    pool = ex.BlockPool(5)
    pool.allocate(3)
    pool.free([2, 0])
    expect(_books(pool, 5), ([3, 4, 2, 0], [0, 1, 0, 0, 0]), "(free queue, ref counts) after freeing 2, then 0")
    expect(pool.allocate(4), [3, 4, 2, 0], "the next allocate(4)")


@case(CASES, "a shared block is free only when its last holder lets go", "BlockPool.free",
      "P3/P4: free drops ONE reference; only a block whose count reaches 0 is free again; freeing a free block "
      "is an error")
def _(ex):
    pool = ex.BlockPool(3)
    pool.allocate(2)
    pool.touch([1])  # a second holder, as after a fork or a prefix-cache hit (exercise 07)
    expect(_books(pool, 3), ([2], [1, 2, 0]), "(free queue, ref counts) after touch([1])")
    pool.free([1])
    expect(_books(pool, 3), ([2], [1, 1, 0]), "(free queue, ref counts) after one free([1])")
    pool.free([1])
    expect(_books(pool, 3), ([2, 1], [1, 0, 0]), "(free queue, ref counts) after a second free([1])")
    expect_raises(ValueError, lambda: pool.free([1]), "freeing block 1 a third time")
    expect_raises(ValueError, lambda: pool.free([2]), "freeing block 2, which was never allocated")


@case(CASES, "a free or touch that raises changes nothing", "BlockPool.free",
      "P3/P6: check every id (a block of the pool, a reference left to drop for each time it is listed) "
      "before the first change")
def _(ex):
    pool = ex.BlockPool(6)
    pool.allocate(4)
    pool.touch([1])  # block 1: two references; 0, 2, 3: one; 4, 5: free
    before = _books(pool, 6)
    for what, call in (
        ("free([0, 2, 2]) (block 2 has one reference)", lambda: pool.free([0, 2, 2])),
        ("free([3, 1, 1, 1]) (block 1 has two references)", lambda: pool.free([3, 1, 1, 1])),
        ("free([0, 4]) (block 4 is free)", lambda: pool.free([0, 4])),
        ("free([0, 6]) in a pool of 6", lambda: pool.free([0, 6])),
        ("free([0, -1])", lambda: pool.free([0, -1])),
        ("touch([4, 6]) in a pool of 6", lambda: pool.touch([4, 6])),
        ("touch([5, -6])", lambda: pool.touch([5, -6])),
        ("ref_count(6) in a pool of 6", lambda: pool.ref_count(6)),
        ("ref_count(-1)", lambda: pool.ref_count(-1)),
    ):
        expect_raises(ValueError, call, what)
        expect(_books(pool, 6), before, f"(free queue, ref counts) after the refused {what}")
    pool.free([1, 1])
    expect(_books(pool, 6), ([4, 5, 1], [1, 0, 1, 1, 0, 0]), "(free queue, ref counts) after free([1, 1])")


@case(CASES, "touch takes a free block out of the middle of the queue", "BlockPool.touch",
      "P4: the touched block leaves the free queue with one reference; the others keep their order")
def _(ex):
    pool = ex.BlockPool(5)
    pool.allocate(5)
    pool.free([3, 1, 4])  # free queue: 3 1 4 (exercise 07: blocks that keep cached contents)
    pool.touch([1])
    expect(_books(pool, 5), ([3, 4], [1, 1, 1, 0, 0]), "(free queue, ref counts) after touch([1])")
    expect(pool.allocate(2), [3, 4], "allocate(2) afterwards")
    pool.free([1])
    expect(pool.free_block_ids(), [1], "free queue after freeing block 1 again")


# P7 is a rule about cost, so it is graded by what cost does: the same calls in a pool 200 times
# larger. A pool that never scans times them alike (the reference: within 1.5x); one that scans
# its free queue (``list.pop(0)``, ``remove``, ``in``) takes 20-200x as long per call. The verdict
# sits far from both: the best of several rounds per size, interleaved, so a busy machine slows
# both sides alike, and a round of a slow pool stops as soon as it has shown it.
_SMALL_POOL, _LARGE_POOL, _COST_CALLS, _COST_ROUNDS, _COST_LIMIT = 1_000, 200_000, 200, 5, 8.0
_COST_WHAT = {
    "allocate_many": "block of allocate(num_blocks // 2)",
    "allocate": "allocate(1) then free of that block",
    "touch_held": "touch then free of a held block",
    "touch_free": "touch then free of a block from the middle of the free queue",
}


def _pool_costs(ex, num_blocks: int, stop_after: dict[str, float]) -> dict[str, float]:
    """Seconds per call (per block for ``allocate_many``) of each kind in ``_COST_WHAT``, in a new
    pool of ``num_blocks`` with half its blocks held; a kind stops early, after a multiple of 20
    calls, once it has spent more than ``stop_after[kind]`` per call."""
    import gc
    import time

    pool = ex.BlockPool(num_blocks)
    middle = num_blocks // 2 + num_blocks // 4  # free, and not reached by 'allocate' below
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        held = pool.allocate(num_blocks // 2)  # free queue: num_blocks // 2, ..., num_blocks - 1
        costs = {"allocate_many": (time.perf_counter() - start) / (num_blocks // 2)}
        for kind in ("allocate", "touch_held", "touch_free"):
            done, spent = 0, 0.0
            while done < _COST_CALLS and spent <= stop_after.get(kind, float("inf")) * max(done, 1):
                start = time.perf_counter()
                for i in range(done, done + 20):
                    if kind == "allocate":
                        pool.free(pool.allocate(1))
                    elif kind == "touch_held":
                        pool.touch([held[i]])
                        pool.free([held[i]])
                    else:
                        pool.touch([middle + i])
                        pool.free([middle + i])
                spent += time.perf_counter() - start
                done += 20
            costs[kind] = spent / done
    finally:
        if gc_was_on:
            gc.enable()
    return costs


def _best(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {kind: min(r[kind] for r in rounds) for kind in _COST_WHAT}


@case(CASES, "free, touch and allocate cost the same in a pool 200 times larger", "BlockPool",
      "P7: no call may scan the pool or the free queue (a list's pop(0), remove or `in` do); keep a "
      "structure that finds a block, and drops one from the middle of the queue, without a search")
def _(ex):
    small = _best([_pool_costs(ex, _SMALL_POOL, {}) for _ in range(_COST_ROUNDS)])
    stop_after = {kind: 4 * _COST_LIMIT * cost for kind, cost in small.items()}
    large_rounds: list[dict[str, float]] = []
    for _ in range(_COST_ROUNDS):
        large_rounds.append(_pool_costs(ex, _LARGE_POOL, stop_after))
        large = _best(large_rounds)
        if len(large_rounds) >= 2 and any(large[k] > stop_after[k] for k in large):
            break  # two rounds agree that it scans: no need to wait for the rest
    for kind, what in _COST_WHAT.items():
        ratio = large[kind] / small[kind]
        if ratio > _COST_LIMIT:
            raise Mismatch(f"at most {_COST_LIMIT:g}x", f"{ratio:.0f}x",
                           f"time per {what}, a pool of {_LARGE_POOL:,} blocks against one of "
                           f"{_SMALL_POOL:,} (best of {len(large_rounds)} rounds): the call scans")


@case(CASES, "a pool of no blocks, or of a number that is not an int, is refused", "BlockPool.__init__",
      "raise ValueError for num_blocks < 1 (and for a float or a bool)")
def _(ex):
    for bad in (0, -3, 2.5, True):
        expect_raises(ValueError, lambda bad=bad: ex.BlockPool(bad), f"BlockPool({bad!r})")
    expect(ex.BlockPool(1).num_free_blocks, 1, "BlockPool(1).num_free_blocks")


# --- the manager -----------------------------------------------------------------------------------
@case(CASES, "a table holds ceil(tokens / block_size) blocks and grows in place",
      "PagedKVCacheManager.allocate_slots",
      "M1: count the blocks that computed + new + lookahead tokens need; add only what is missing; keep the "
      "blocks already in the table where they are")
def _(ex):
    kv = ex.PagedKVCacheManager(num_blocks=8, block_size=4)
    r = _req("r", 20)
    sizes, tables = [], []
    for n in (5, 3, 1, 4, 3):  # positions 0-4, 5-7, 8, 9-12, 13-15
        tables.append(_step(kv, r, n))
        sizes.append(len(tables[-1]))
    expect(sizes, [2, 2, 3, 4, 4], "table length after 5, +3, +1, +4, +3 tokens (blocks of 4)")
    grown = [tables[i][: len(tables[i - 1])] == tables[i - 1] for i in range(1, len(tables))]
    expect(grown, [True] * 4, "each table starts with the blocks of the one before")
    expect(kv.get_block_ids("r"), tables[-1], "get_block_ids('r') == the last table returned")
    expect(len(set(tables[-1])), 4, "distinct blocks in r's table")
    expect((kv.num_used_blocks, kv.num_free_blocks, kv.num_reserved_slots, kv.num_referenced_blocks),
           (4, 4, 16, 4), "(used blocks, free blocks, reserved slots, referenced blocks)")
    _healthy(kv, ["r"], "the pool's books")


@case(CASES, "lookahead reserves room up front; a table never shrinks", "PagedKVCacheManager.allocate_slots",
      "M1: num_lookahead_tokens count like new tokens when sizing the table (static batching reserves a "
      "request's worst case this way), and a later call with less lookahead keeps what was reserved")
def _(ex):
    kv = ex.PagedKVCacheManager(num_blocks=6, block_size=4)
    r = _req("r", 5)
    expect(len(_table(kv, r, 5, 10)), 4, "blocks for 5 tokens + 10 lookahead")
    r.num_computed_tokens = 5
    expect(len(_table(kv, r, 1)), 4, "blocks after the next token (no lookahead)")
    expect(kv.num_free_blocks, 2, "free blocks")
    s = _req("s", 3)
    expect(len(_table(kv, s, 0, 8)), 2, "a new request: 0 tokens + 8 lookahead")


def _table(kv, request: Request, n: int, lookahead: int = 0) -> list[int]:
    """``allocate_slots`` where the pool has room: ``None`` is reported as the refusal it is."""
    table = kv.allocate_slots(request, n, num_lookahead_tokens=lookahead)
    if table is None:
        raise AssertionError(
            f"allocate_slots({request.request_id!r}, {n}, num_lookahead_tokens={lookahead}) returned None "
            f"with {kv.num_free_blocks} free blocks, enough for the table it needs (M1, M3)")
    return table


@case(CASES, "the lists a caller gets are its own", "PagedKVCacheManager.get_block_ids",
      "M7: a caller that changes the list allocate_slots or get_block_ids returned changes nothing in the manager")
def _(ex):
    kv = ex.PagedKVCacheManager(num_blocks=6, block_size=4)
    a = _req("a", 8)
    table = _table(kv, a, 8)
    kept = list(table)
    table.append(5)
    kv.get_block_ids("a").clear()
    kv.get_block_ids("nobody").append(4)
    expect((kv.get_block_ids("a"), kv.get_block_ids("nobody")), (kept, []),
           "(a's table, an unknown request's table) after callers changed the lists they were given")
    a.num_computed_tokens = 8
    grown = _table(kv, a, 1)
    expect(grown[:2], kept, "a's table after one more token starts with the blocks it had")
    grown.clear()
    expect(kv.num_referenced_blocks, 3, "referenced blocks after a caller cleared the list it got")
    _healthy(kv, ["a"], "the pool's books")


@case(CASES, "refused: nothing changes, and a refused new request leaves no trace",
      "PagedKVCacheManager.allocate_slots",
      "M2/M3: return None before taking anything, and create a request's table only once its blocks are "
      "taken; exactly enough free blocks is enough")
def _(ex):
    kv = ex.PagedKVCacheManager(num_blocks=3, block_size=4)
    a, b = _req("a", 13), _req("b", 5)
    _step(kv, a, 8)  # 2 blocks
    before = (_books(kv.pool, 3), kv.get_block_ids("a"), kv.num_referenced_blocks)
    expect(kv.allocate_slots(b, 5), None, "b (new) needs 2 blocks, 1 is free")
    expect(kv.allocate_slots(a, 5), None, "a needs 2 more blocks, 1 is free")
    after = (_books(kv.pool, 3), kv.get_block_ids("a"), kv.num_referenced_blocks)
    expect(after, before, "((free queue, ref counts), a's table, referenced blocks) after both refusals")
    expect(kv.get_block_ids("b"), [], "b's table after its refusal")
    if _remembers(kv, b):
        raise AssertionError("the manager keeps an entry for b (an empty table?) after refusing it: a request "
                             "the pool could not admit must leave no trace")
    kv.free(b)  # b never got a table: nothing to give back
    expect(kv.num_free_blocks, 1, "free blocks after free(b) of the refused b")
    expect(len(_table(kv, a, 4)), 3, "a asks for 4 tokens (exactly the 1 free block)")
    expect((kv.num_free_blocks, kv.allocate_slots(b, 1)), (0, None), "(free blocks, b asks for 1 token)")
    _healthy(kv, ["a"], "the pool's books after the refusals")


@case(CASES, "free gives back every block, once", "PagedKVCacheManager.free",
      "M4/M5: give the request's whole table back through self.pool.free, then forget the table")
def _(ex):
    kv = ex.PagedKVCacheManager(num_blocks=6, block_size=4)
    a, b = _req("a", 12), _req("b", 4)
    table_a = _step(kv, a, 12)
    _step(kv, b, 4)
    kv.free(a)
    expect((kv.get_block_ids("a"), kv.num_free_blocks, kv.num_referenced_blocks), ([], 5, 1),
           "(a's table, free blocks, referenced blocks) after free(a)")
    expect(sorted(kv.pool.free_block_ids()[-3:]), sorted(table_a), "the last 3 blocks of the free queue")
    kv.free(a)  # twice, and a request that never held blocks: nothing happens
    kv.free(_req("never-admitted", 3))
    expect(kv.num_free_blocks, 5, "free blocks after freeing a again and an unknown request")
    _healthy(kv, ["b"], "the pool's books")
    expect(len(kv.allocate_slots(_req("c", 20), 20) or []), 5, "c's 20 tokens: every free block")
    kv.free(b)
    _healthy(kv, ["c"], "the pool's books after c took everything and b left")


class _MisreportingPool:
    """A pool whose P5 reports a free queue (and count of free blocks) other than its own: books that
    have gone wrong in a way ``BlockPool``'s own methods cannot produce."""

    def __init__(self, pool, free_ids: list[int], num_free: int | None = None):
        self._pool, self._free = pool, list(free_ids)
        self._num_free = len(self._free) if num_free is None else num_free

    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    def free_block_ids(self) -> list[int]:
        return list(self._free)

    def __getattr__(self, name: str):
        return getattr(self._pool, name)


def _expect_named(kv, live, what: str, name) -> None:
    """``kv.check_invariants(live)`` raises ``AssertionError`` and its message names ``name``."""
    call = "check_invariants()" if live is None else f"check_invariants({live!r})"
    try:
        kv.check_invariants(live)
    except AssertionError as e:
        if not re.search(rf"(?<![\w]){re.escape(str(name))}(?![\w])", str(e)):
            raise AssertionError(f"{call} after {what} raised, but its message does not name "
                                 f"{name!r} (M8): {str(e)!r}") from None
        return
    raise AssertionError(f"{call} after {what} raised nothing (M8)")


@case(CASES, "check_invariants names what is wrong with corrupted books", "PagedKVCacheManager.check_invariants",
      "M8: C1-C4 and num_free_blocks, each on books corrupted on purpose; the message names the block "
      "or the request; healthy books pass")
def _(ex):
    def manager():
        kv = ex.PagedKVCacheManager(num_blocks=10, block_size=4)
        alpha, bravo = _req("alpha", 9), _req("bravo", 13)
        _step(kv, alpha, 9)  # 3 blocks
        _step(kv, bravo, 13)  # 4 blocks; 3 stay free
        return kv, kv.get_block_ids("alpha"), kv.get_block_ids("bravo"), kv.pool.free_block_ids()

    kv, ta, tb, free = manager()
    kv.check_invariants()  # healthy books pass
    kv.check_invariants(["alpha", "bravo", "gone"])
    kv.free(_req("bravo", 13))
    kv.check_invariants(["alpha"])  # a freed request holds nothing
    _expect_named(kv, [], "alpha kept its blocks (C4)", "alpha")

    kv, ta, tb, free = manager()
    _expect_named(kv, ["alpha"], "bravo kept its blocks (C4)", "bravo")
    kv.pool.touch([tb[1]])
    _expect_named(kv, None, f"pool.touch([{tb[1]}]) of a held block (C1)", tb[1])

    kv, ta, tb, free = manager()
    kv.pool.free([ta[2]])
    _expect_named(kv, None, f"pool.free([{ta[2]}]) of a held block (C1/C2)", ta[2])

    kv, ta, tb, free = manager()
    orphan = kv.pool.allocate(1)[0]
    _expect_named(kv, None, f"pool.allocate(1) behind the manager's back (block {orphan}, C1)", orphan)

    for what, reported, name in (
        (f"a free queue that also lists held block {tb[0]} (C2)", free + [tb[0]], tb[0]),
        (f"a free queue missing free block {free[1]} (C2)", free[:1] + free[2:], free[1]),
        (f"a free queue listing block {free[2]} twice (C3)", free + [free[2]], free[2]),
    ):
        kv, ta, tb, free = manager()
        kv.pool = _MisreportingPool(kv.pool, reported)
        _expect_named(kv, None, what, name)
    kv, ta, tb, free = manager()
    kv.pool = _MisreportingPool(kv.pool, free, len(free) + 1)
    expect_raises(AssertionError, kv.check_invariants,
                  "check_invariants() with num_free_blocks one more than the free queue's length")


@case(CASES, "a block size that is not a positive int is refused", "PagedKVCacheManager.__init__",
      "raise ValueError for block_size < 1 (and for a float); a bad num_blocks is the pool's to refuse")
def _(ex):
    for bad in (0, -1, 4.0):
        expect_raises(ValueError, lambda bad=bad: ex.PagedKVCacheManager(8, bad), f"block_size={bad!r}")
    expect_raises(ValueError, lambda: ex.PagedKVCacheManager(0, 16), "num_blocks=0")
    kv = ex.PagedKVCacheManager(8, 16)
    expect((kv.num_blocks, kv.block_size, kv.num_free_blocks, kv.pool.num_free_blocks), (8, 16, 8, 8),
           "(num_blocks, block_size, num_free_blocks, pool.num_free_blocks) of a new manager")


# --- whole traces against minivllm's KVCacheManager ---------------------------------------------------
def _compare(ex, trace, setup, label=""):
    return compare_with_minivllm(lambda: ex.PagedKVCacheManager(setup.num_blocks, setup.block_size),
                                 trace, setup, caching=False, label=label)


@case(CASES, "a pool too small for everyone: preemption and readmission", "PagedKVCacheManager",
      "the scheduler must make the same decisions over your manager as over minivllm's at every step: same "
      "requests, tokens, preemptions, blocks in use and per request (block ids may differ)")
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
        block_size = (4, 1, 2, 8)[seed % 4]  # the same memory (7-14 blocks of 4 tokens) cut otherwise
        setup = KVSetup(num_blocks=(7 + seed % 8) * 4 // block_size + 1, block_size=block_size,
                        max_num_seqs=1 + seed % 8, max_num_batched_tokens=(8, 16, 64)[seed % 3],
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
        if kv is not None:
            audit_pool(local_core(llm))
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
