"""Cases for ex09_reasoning: KV bytes per token, how many sequences fit, and a scheduling policy.

Expected values come from minivllm, never from the reference answer: bytes per token from
``ModelSpec.kv_bytes_per_token``; pool sizes from the ``Simulator``'s own sizing; how many
sequences fit from allocating them, one by one, in a real ``KVCacheManager``; the policy is
a design of the student's: its cases check the protocol and the written rules (the client's
priority first), then grade what it achieves -- chat latency percentiles on a simulated H100
against stated targets, the reasoning throughput it keeps against FCFS's, and the tiny model's
tokens served with it against FCFS's.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from functools import cache

from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.policies import SchedulingPolicy, make_policy
from minivllm.course.checks.ex10_costs import Only
from minivllm.course.grading import Case, Mismatch, case, expect, expect_raises
from minivllm.course.harness import TraceRequest, run_trace
from minivllm.course.runtime import one_cpu_thread
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams
from minivllm.sim import ModelSpec, Simulator, preset
from minivllm.sim.analysis import class_throughput, request_percentiles

CASES: list[Case] = []

# The protocol of part (a): what its functions may read (the exercise file lists the same).
MODEL_ATTRIBUTES = ("name", "num_layers", "num_kv_heads", "head_dim", "kv_dtype")
KV_DTYPES = ("fp32", "bf16", "fp8", "int8", "int4")
MODELS = ("llama-3-8b", "llama-3-70b", "qwen3-0.6b", "tiny")
GB = 1e9


def model_view(spec: ModelSpec) -> Only:
    return Only(spec, MODEL_ATTRIBUTES, "model")


@cache
def spec(name: str, kv_dtype: str, weights: str = "bf16") -> ModelSpec:
    return preset(name, weight_dtype=weights, kv_dtype=kv_dtype)


# --- expected values for part (a), from the simulator and the KV cache manager -------------------
def simulator_pool_blocks(model: ModelSpec, kv_memory_bytes: float, block_size: int) -> int:
    """Blocks the simulator carves out of ``kv_memory_bytes`` (0 if not even one block fits:
    the simulator refuses such a pool; with ``block_size=1`` it needs at least 2 blocks)."""
    if kv_memory_bytes < model.kv_bytes_per_token() * block_size:
        return 0
    sim = Simulator(model, "H100-SXM", kv_cache_memory=int(kv_memory_bytes), block_size=block_size, max_model_len=2)
    return sim.num_kv_blocks


def sequences_that_fit(num_blocks: int, block_size: int, seq_len: int) -> int:
    """Admit sequences of ``seq_len`` tokens into a real paged KV cache until one is refused."""
    if num_blocks == 0:
        return 0
    kv = KVCacheManager(num_blocks, block_size, enable_caching=False)
    admitted = 0
    while kv.allocate_slots(Request(f"s{admitted}", [1] * seq_len), seq_len) is not None:
        admitted += 1
    return admitted


def h100_kv_pool_bytes(model: ModelSpec) -> float:
    """The bytes the simulator leaves for the KV cache on an H100 with this model's weights."""
    sim = Simulator(model, "H100-SXM", max_model_len=32_768)
    return sim.num_kv_blocks * sim.kv_block_bytes


def expect_fit(ex, model: ModelSpec, memory: float, seq_len: int, block_size: int = 16, note: str = "") -> None:
    want = sequences_that_fit(simulator_pool_blocks(model, memory, block_size), block_size, seq_len)
    got = ex.max_concurrent_sequences(model_view(model), memory, seq_len, block_size)
    expect(got, want, note or f"{model.name}, {model.kv_dtype} KV, {memory:,.0f} bytes, {seq_len} tokens, block {block_size}")


# --- kv_bytes_per_token -------------------------------------------------------------------------
@case(CASES, "Llama-3-70B in 16-bit: GQA-8", "kv_bytes_per_token",
      "K and V, every layer, every KV head (8, not the 64 query heads), head_dim elements each")
def _(ex):
    m = spec("llama-3-70b", "bf16")
    expect(ex.kv_bytes_per_token(model_view(m)), m.kv_bytes_per_token())


@case(CASES, "4 models x 5 KV dtypes", "kv_bytes_per_token",
      "read the bits of the model's kv_dtype from DTYPE_BITS; int4 is half a byte per element")
def _(ex):
    for name in MODELS:
        for kv in KV_DTYPES:
            m = spec(name, kv)
            expect(ex.kv_bytes_per_token(model_view(m)), m.kv_bytes_per_token(), f"{name}, {kv} KV cache")


@case(CASES, "the chapter's 30k-token sequence, GQA-8, int8", "kv_bytes_per_token",
      "30,000 tokens x bytes per token; the chapter's ~12 GB is not what the shape gives")
def _(ex):
    m = spec("llama-3-70b", "int8")
    got = 30_000 * ex.kv_bytes_per_token(model_view(m))
    expect(got, 30_000 * m.kv_bytes_per_token(), "Llama-3-70B, 30,000 tokens, int8 KV (bytes)")


# --- max_concurrent_sequences -------------------------------------------------------------------
@case(CASES, "30k-token reasoning chains on an H100 (70B int4 weights), bf16 / int8 / int4 KV",
      "max_concurrent_sequences",
      "whole blocks in the pool, whole blocks per sequence; the pool's bytes come from the simulator")
def _(ex):
    for kv in ("bf16", "int8", "int4"):
        m = spec("llama-3-70b", kv, "int4")
        expect_fit(ex, m, h100_kv_pool_bytes(m), 30_000)


@case(CASES, "500-token chats in the same pools", "max_concurrent_sequences",
      "the same arithmetic; short sequences waste up to one partly filled block each")
def _(ex):
    for kv in ("bf16", "int8", "int4"):
        m = spec("llama-3-70b", kv, "int4")
        expect_fit(ex, m, h100_kv_pool_bytes(m), 500)


@case(CASES, "block boundaries: 16, 17 and 1 tokens per sequence", "max_concurrent_sequences",
      "a sequence of 17 tokens holds two blocks of 16, a sequence of 1 token holds one")
def _(ex):
    m = spec("tiny", "fp32")
    block_bytes = m.kv_bytes_per_token() * 16
    for seq_len in (16, 17, 1, 32, 33):
        expect_fit(ex, m, 10 * block_bytes, seq_len)


@case(CASES, "a partial block is no block", "max_concurrent_sequences",
      "bytes left after the last whole block hold nothing: round the pool down to whole blocks")
def _(ex):
    m = spec("llama-3-8b", "bf16")
    block_bytes = m.kv_bytes_per_token() * 16
    expect_fit(ex, m, 4 * block_bytes - 1, 16, note="one byte short of 4 blocks, 16-token sequences")
    expect_fit(ex, m, 4 * block_bytes, 64, note="exactly 4 blocks, one 64-token sequence")
    expect_fit(ex, m, 4 * block_bytes - 1, 64, note="one byte short of 4 blocks, one 64-token sequence")


@case(CASES, "other block sizes", "max_concurrent_sequences",
      "blocks of block_size tokens, for the pool and for each sequence")
def _(ex):
    m = spec("llama-3-8b", "int8")
    for block_size in (1, 32, 128):
        expect_fit(ex, m, 3e9, 1000, block_size)


@case(CASES, "too little memory, bad arguments", "max_concurrent_sequences",
      "0 when not one sequence fits; ValueError for seq_len < 1, block_size < 1, negative memory")
def _(ex):
    m = spec("llama-3-8b", "bf16")
    expect(ex.max_concurrent_sequences(model_view(m), 0, 100), 0, "no memory")
    expect(ex.max_concurrent_sequences(model_view(m), 1e6, 30_000), 0, "1 MB for a 30k-token sequence")
    expect_raises(ValueError, lambda: ex.max_concurrent_sequences(model_view(m), 1e9, 0), "seq_len 0")
    expect_raises(ValueError, lambda: ex.max_concurrent_sequences(model_view(m), 1e9, 10, 0), "block_size 0")
    expect_raises(ValueError, lambda: ex.max_concurrent_sequences(model_view(m), -1.0, 10), "negative memory")


# --- what a policy sees of a request -------------------------------------------------------------
# The attributes a policy may read (the exercise's docstring lists the same). No request id: the
# checks' ids say which requests are chat. ``sampling_params.max_tokens`` is the client's budget,
# not the answer's length: a chat client asks for 512, 1,024 or 2,048 tokens, a reasoning client
# for 16,384, and the answer ends where it ends, below that.
REQUEST_ATTRIBUTES = ("priority", "arrival_time", "sampling_params", "num_prompt_tokens", "num_computed_tokens")
CHAT_BUDGETS = (512, 1024, 2048)
REASONING_BUDGET = 16_384


def budget(request_id: str, output_len: int) -> int:
    """The ``max_tokens`` a client sent: reasoning requests (ids ``think-*``/``reasoning-*``) ask
    for :data:`REASONING_BUDGET`; chat ones for one of :data:`CHAT_BUDGETS` at or above the
    answer's length, drawn from the id (the same on every run)."""
    if request_id.startswith(("think", "reasoning")):
        return REASONING_BUDGET
    fits = [b for b in CHAT_BUDGETS if b >= output_len]
    return fits[zlib.crc32(request_id.encode()) % len(fits)]


class RequestView:
    """A read-only view of a scheduler's request with the attributes a policy may read, and
    ``sampling_params.max_tokens`` the client's budget instead of the answer's length."""

    def __init__(self, request: Request):
        params = dataclasses.replace(request.sampling_params,
                                     max_tokens=budget(request.request_id, request.sampling_params.max_tokens))
        object.__setattr__(self, "_seen", (request, params))

    def __getattr__(self, name: str):
        request, params = object.__getattribute__(self, "_seen")
        if name == "sampling_params":
            return params
        if name in REQUEST_ATTRIBUTES:
            return getattr(request, name)
        raise AttributeError(f"a policy reads only these request attributes: {', '.join(REQUEST_ATTRIBUTES)}; "
                             f"{name!r} is not one of them")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a policy may not change a request")

    def __repr__(self) -> str:
        return "<request>"


class Judged:
    """The student's policy as the scheduler sees it: every request it is shown is a
    :class:`RequestView` (one per request, so ``is`` works), its victim is mapped back, and a
    run whose push-outs never end is stopped (a policy that lets two requests evict each other
    in turn can loop inside one scheduler step forever)."""

    def __init__(self, policy, limit: int = 5000):
        self.policy, self.limit, self.allowed = policy, limit, 0
        self.name = getattr(policy, "name", "policy")
        self.views: dict[int, tuple[Request, RequestView]] = {}

    def view(self, request: Request) -> RequestView:
        seen = self.views.get(id(request))
        if seen is None or seen[0] is not request:
            seen = self.views[id(request)] = (request, RequestView(request))
        return seen[1]

    def waiting_key(self, request: Request) -> tuple:
        return self.policy.waiting_key(self.view(request))

    def choose_victim(self, running: list[Request]) -> Request:
        views = [self.view(r) for r in running]
        victim = self.policy.choose_victim(views)
        if [id(v) for v in views] != [id(self.view(r)) for r in running]:
            raise Mismatch("the running list as it was", "changed", "choose_victim reordered the scheduler's list")
        for r, v in zip(running, views, strict=True):
            if victim is v:
                return r
        raise Mismatch("one of the running requests", repr(victim), "choose_victim's result")

    def may_preempt(self, incoming: Request, victim: Request) -> bool:
        allowed = self.policy.may_preempt(self.view(incoming), self.view(victim))
        if allowed:
            self.allowed += 1
            if self.allowed > self.limit:
                raise Mismatch(
                    f"at most {self.limit} preemptions for admission", f"more: {incoming.request_id} "
                    f"and {victim.request_id} keep evicting each other", "thrashing",
                )
        return allowed


# --- the policy: the protocol and the written rules ---------------------------------------------
def req(rid: str, max_tokens: int | None, arrival: float, priority: int = 0, computed: int = 0) -> Request:
    r = Request(rid, [1, 2, 3], SamplingParams(max_tokens=max_tokens), arrival_time=arrival, priority=priority)
    r.num_computed_tokens = computed
    return r


def ids(requests) -> list[str]:
    return [r.request_id for r in requests]


def waiting_order(policy: Judged, requests: list[Request]) -> list[str]:
    """The order the scheduler's waiting queue serves ``requests`` in (a heap of the keys as
    tuples, ties in insertion order)."""
    return ids(sorted(requests, key=lambda r: tuple(policy.waiting_key(r))))


def a_mix(priorities: tuple[int, ...]) -> list[Request]:
    """Chat and reasoning requests of every given priority, arriving interleaved."""
    out, t = [], 0.0
    for p in priorities:
        for kind, length in (("chat", 300), ("think", 30_000), ("chat", 50), ("think", 8000), ("chat", 1500)):
            out.append(req(f"{kind}-p{p}-{len(out)}", length, t, priority=p, computed=int(100 * t)))
            t += 1.0
    return out


@case(CASES, "it is a SchedulingPolicy", "ChatFirstPolicy",
      "a non-empty name and the three methods of minivllm.core.policies.SchedulingPolicy; "
      "ChatFirstPolicy() needs no arguments; keys are tuples")
def _(ex):
    raw = ex.ChatFirstPolicy()
    p = Judged(raw)
    key = p.waiting_key(req("r", 10, 0.0))  # a stub fails here first
    if not isinstance(raw, SchedulingPolicy):
        raise Mismatch("a SchedulingPolicy", type(raw).__name__)
    expect(make_policy(raw) is raw, True, "make_policy accepts it as it is")
    if not isinstance(raw.name, str) or not raw.name:
        raise Mismatch("a non-empty name", raw.name)
    if not isinstance(key, tuple):
        raise Mismatch("a tuple", type(key).__name__, "waiting_key's result")
    mix = a_mix((0,))
    waiting_order(p, mix)  # the keys of one queue must compare with each other
    if not all(isinstance(p.may_preempt(a, b), bool) for a in mix for b in mix if a is not b):
        raise Mismatch("True or False", "something else", "may_preempt's result")


@case(CASES, "the victim is one of the running requests; the list is left as it was", "ChatFirstPolicy.choose_victim",
      "return a member of running; do not sort, pop or reorder the scheduler's list")
def _(ex):
    p = Judged(ex.ChatFirstPolicy())
    mix = a_mix((0,))
    for n in range(1, len(mix) + 1):
        running = list(mix[:n])
        before = ids(running)
        victim = p.choose_victim(running)
        if not any(victim is r for r in running):
            raise Mismatch("a member of running", getattr(victim, "request_id", victim), f"{n} running")
        expect(ids(running), before, f"the running list after choose_victim ({n} running)")


@case(CASES, "deterministic", "ChatFirstPolicy",
      "the same requests give the same keys, victims and answers, from a fresh policy or a used one")
def _(ex):
    mix = a_mix((0, 1))
    a, b = Judged(ex.ChatFirstPolicy()), Judged(ex.ChatFirstPolicy())
    for _ in range(2):
        expect([tuple(a.waiting_key(r)) for r in mix], [tuple(b.waiting_key(r)) for r in mix], "waiting keys")
        expect(a.choose_victim(list(mix)).request_id, b.choose_victim(list(mix)).request_id, "victim")


@case(CASES, "rule 1: the client's priority comes first in the queue", "ChatFirstPolicy.waiting_key",
      "every request with a smaller priority is admitted before any with a larger one, whatever "
      "its length or arrival")
def _(ex):
    p = Judged(ex.ChatFirstPolicy())
    mix = a_mix((2, 0, -1))  # the least important arrive first
    order = waiting_order(p, mix)
    prio = {r.request_id: r.priority for r in mix}
    got = [prio[rid] for rid in order]
    if got != sorted(got):
        first = next(i for i in range(1, len(got)) if got[i] < got[i - 1])
        raise Mismatch("priority -1 requests, then 0, then 2", f"{order[first - 1]} before {order[first]}",
                       f"queue order: {', '.join(order)}")


@case(CASES, "rule 1: the victim of the least important priority; no push-outs up",
      "ChatFirstPolicy.choose_victim",
      "the victim has the largest priority value running; a request never pushes out one with a "
      "smaller priority value")
def _(ex):
    p = Judged(ex.ChatFirstPolicy())
    mix = a_mix((0, 1, -1))
    for drop in range(len(mix)):
        running = mix[:drop] + mix[drop + 1:]
        victim = p.choose_victim(list(running))
        worst = max(r.priority for r in running)
        if victim.priority != worst:
            raise Mismatch(f"a priority {worst} request", f"{victim.request_id} (priority {victim.priority})",
                           f"running: {', '.join(ids(running))}")
    for incoming in mix:
        for victim in mix:
            if incoming.priority > victim.priority and p.may_preempt(incoming, victim):
                raise Mismatch(False, True, f"may_preempt({incoming.request_id}, {victim.request_id})")


@case(CASES, "rule 3: no two requests may each push the other out", "ChatFirstPolicy.may_preempt",
      "if a may take b's place, b may never take a's: they would evict each other in turn")
def _(ex):
    p = Judged(ex.ChatFirstPolicy())
    mix = a_mix((0, 1))
    for a in mix:
        for b in mix:
            if a is not b and p.may_preempt(a, b) and p.may_preempt(b, a):
                raise Mismatch("at most one of the two", "both", f"{a.request_id} and {b.request_id}")


# --- the policy in the simulator: the targets ----------------------------------------------------
# The trace and the targets, as notebook 09 (section 7) states them. ShareGPT-like chat, 200
# requests at 3 per second, and 40 reasoning chains of 2,500-12,000 tokens at 1 per second,
# nobody setting a priority, in a KV cache of 3,500 blocks (56k tokens) of a 4-bit Llama-3-70B
# with a 16-bit KV cache on a simulated H100, max_num_seqs 256. FCFS reaches a chat p90 and p99
# TTFT of about a minute.
TARGET_CHAT_TTFT_S = {90: 0.5, 99: 1.0}  # chat time to first token, seconds, at these percentiles
TARGET_REASONING_KEEP = 0.85  # reasoning output tokens/s, at least this share of FCFS's


def sim_trace():
    from minivllm import workloads

    long = workloads.LogNormalLengths(mean=4000, sigma=0.6, low=2500, high=12_000)
    chat = workloads.chat(200, seed=0, rate=3.0)
    reasoning = workloads.reasoning(40, seed=0, rate=1.0, output=long, priority=0)
    return workloads.merge(chat, reasoning)


def simulate(policy):
    sim = Simulator(preset("llama-3-70b", weight_dtype="int4", kv_dtype="bf16"), "H100-SXM",
                    max_num_seqs=256, max_model_len=16_384, num_kv_blocks=3500, scheduling_policy=policy)
    stats = sim.run(sim_trace())
    return stats, sim.summary()


@cache
def fcfs_sim():
    return simulate("fcfs")


@dataclass(frozen=True)
class Score:
    """What a policy reaches on the trace: the figures the targets are stated in."""

    chat_ttft_s: dict[int, float]
    reasoning_keep: float  # reasoning tokens/s as a share of FCFS's
    preemptions: int

    def line(self) -> str:
        return (f"chat TTFT p90 {self.chat_ttft_s[90]:.2f} s, p99 {self.chat_ttft_s[99]:.2f} s; reasoning "
                f"{self.reasoning_keep:.1%} of FCFS's tok/s; {self.preemptions} preemptions")


def score(policy) -> Score:
    """Run ``policy`` on the trace (stopped if it thrashes) and measure it; raises if a request
    is left unserved."""
    base, _ = fcfs_sim()
    guarded = policy if isinstance(policy, str) else Judged(policy, limit=5000)
    stats, summary = simulate(guarded)
    trace = sim_trace()
    if summary["output_tokens"] != trace.num_output_tokens:
        raise Mismatch(trace.num_output_tokens, summary["output_tokens"], "output tokens served")
    keep = class_throughput(stats, "reasoning") / class_throughput(base, "reasoning")
    return Score(request_percentiles(stats, "ttft", "chat", tuple(TARGET_CHAT_TTFT_S)), keep,
                 int(summary["preemptions"]))


def targets() -> str:
    chat = ", ".join(f"p{q} <= {s:g} s" for q, s in TARGET_CHAT_TTFT_S.items())
    return f"chat TTFT {chat}; reasoning throughput >= {TARGET_REASONING_KEEP:.0%} of FCFS's"


@case(CASES, "rule 2: the targets on a simulated H100 (chat + reasoning, no priorities set)", "ChatFirstPolicy",
      f"{targets()}; every request served; the note shows your figures")
def _(ex):
    policy = ex.ChatFirstPolicy()
    policy.waiting_key(req("r", 10, 0.0))  # a stub fails here first
    got = score(policy)
    note = f"yours: {got.line()}; FCFS: {score('fcfs').line()}"
    for q, limit in TARGET_CHAT_TTFT_S.items():
        if got.chat_ttft_s[q] > limit:
            raise Mismatch(f"chat p{q} TTFT <= {limit:g} s", f"{got.chat_ttft_s[q]:.2f} s", note)
    if got.reasoning_keep < TARGET_REASONING_KEEP:
        raise Mismatch(f">= {TARGET_REASONING_KEEP:.0%} of FCFS's reasoning throughput", f"{got.reasoning_keep:.1%}",
                       note)


# --- the policy on the engine ----------------------------------------------------------------------
# On the tiny model: four long requests fill a 20-block pool; three short ones arrive at step 64,
# when the pool is full, so that the policy's decisions are exercised (nobody sets a priority).
# FCFS makes them wait 36 steps for their first token; the target is a few.
ENGINE_TRACE = (
    [TraceRequest(f"think-{i}", p, 100) for i, p in enumerate(
        ["Once upon a time", "The old man said", "In the morning the cat", "She opened the door and"])]
    + [TraceRequest(f"chat-{i}", p, 12, arrival_step=64) for i, p in enumerate(["Hello, how are", "The sky is", "A dog and a"])]
)
TARGET_TINY_CHAT_WAIT_STEPS = 5  # engine steps from a chat request's arrival to its first token


def serve_tiny(policy):
    from minivllm import LLM

    llm = LLM(scheduling_policy=policy, num_kv_blocks=20, max_model_len=160, enable_prefix_caching=False,
              debug_checks=True)
    with one_cpu_thread():
        return run_trace(llm, ENGINE_TRACE, max_steps=2000)


@cache
def fcfs_tiny():
    return serve_tiny("fcfs")


def chat_waits(run) -> dict[str, int]:
    return {t.request_id: run.wait(t.request_id) for t in ENGINE_TRACE if t.request_id.startswith("chat")}


@case(CASES, "on the tiny model: FCFS's greedy tokens, chat served within a few steps", "ChatFirstPolicy",
      f"a policy changes the order, never the tokens; the pool is full when chat arrives: each chat "
      f"request's first token at most {TARGET_TINY_CHAT_WAIT_STEPS} engine steps after it arrives")
def _(ex):
    policy = ex.ChatFirstPolicy()
    policy.waiting_key(req("r", 10, 0.0))  # a stub fails here first
    ref = fcfs_tiny()
    run = serve_tiny(Judged(policy, limit=500))
    expect(sorted(run.tokens), sorted(ref.tokens), "requests finished")
    for rid, tokens in ref.tokens.items():
        expect(run.tokens[rid], tokens, f"greedy tokens of {rid}")
    waits, fcfs = chat_waits(run), chat_waits(ref)
    note = f"steps from arrival to first token, yours: {waits}; FCFS: {fcfs}"
    for rid, wait in waits.items():
        if wait > TARGET_TINY_CHAT_WAIT_STEPS:
            raise Mismatch(f"at most {TARGET_TINY_CHAT_WAIT_STEPS} steps", f"{wait} steps", f"{rid}'s wait; {note}")
