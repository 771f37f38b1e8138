"""Cases for ex09_reasoning: KV bytes per token, how many sequences fit, and a scheduling policy.

Expected values come from minivllm, never from the reference answer: bytes per token from
``ModelSpec.kv_bytes_per_token``; pool sizes from the ``Simulator``'s own sizing; how many
sequences fit from allocating them, one by one, in a real ``KVCacheManager``; the policy's
unit cases from its written specification; its effect from the simulator (against FCFS on a
mixed chat + reasoning trace) and from the tiny model served by ``LLM`` (against FCFS's tokens).
"""

from __future__ import annotations

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


# --- the policy: unit cases from its specification -------------------------------------------------
def req(rid: str, max_tokens: int | None, arrival: float, priority: int = 0, computed: int = 0) -> Request:
    r = Request(rid, [1, 2, 3], SamplingParams(max_tokens=max_tokens), arrival_time=arrival, priority=priority)
    r.num_computed_tokens = computed
    return r


def ids(requests) -> list[str]:
    return [r.request_id for r in requests]


def waiting_order(policy, requests: list[Request]) -> list[str]:
    """The order the scheduler's waiting queue serves ``requests`` in (it sorts by the key as a
    tuple, ties in insertion order)."""
    return ids(sorted(requests, key=lambda r: tuple(policy.waiting_key(r))))


@case(CASES, "short and long requests", "ChatFirstPolicy.rank",
      "(priority, 0 or 1): long when max_tokens > long_output_tokens, or no limit at all")
def _(ex):
    p = ex.ChatFirstPolicy()
    limit = ex.LONG_OUTPUT_TOKENS
    for max_tokens, want in ((16, (0, 0)), (limit, (0, 0)), (limit + 1, (0, 1)), (30_000, (0, 1)), (None, (0, 1))):
        got = p.rank(req("r", max_tokens, 0.0))
        if tuple(got) != want:
            raise Mismatch(want, got, f"max_tokens={max_tokens}, long_output_tokens={limit}")


@case(CASES, "priority comes first; the threshold is the policy's own", "ChatFirstPolicy.rank",
      "the first element is request.priority; compare max_tokens with self.long_output_tokens")
def _(ex):
    p = ex.ChatFirstPolicy(long_output_tokens=16)
    for rid, max_tokens, priority, want in (("a", 16, 0, (0, 0)), ("b", 17, 0, (0, 1)), ("c", 17, -2, (-2, 1)),
                                           ("d", 8, 3, (3, 0))):
        got = p.rank(req(rid, max_tokens, 0.0, priority))
        if tuple(got) != want:
            raise Mismatch(want, got, f"max_tokens={max_tokens}, priority={priority}, long_output_tokens=16")


@case(CASES, "chat first, then reasoning, each first come first served", "ChatFirstPolicy.waiting_key",
      "the smallest key is admitted first: rank, then arrival time")
def _(ex):
    p = ex.ChatFirstPolicy()
    mix = [req("think-0", 30_000, 0.0), req("chat-1", 300, 1.0), req("think-2", 8000, 2.0),
           req("chat-3", 50, 3.0), req("chat-4", 2048, 4.0)]
    expect(waiting_order(p, mix), ["chat-1", "chat-3", "chat-4", "think-0", "think-2"])


@case(CASES, "arrival order holds whatever the submission order", "ChatFirstPolicy.waiting_key",
      "a preempted request re-enters the queue later but keeps its place: order by arrival time, "
      "not by when it was queued")
def _(ex):
    p = ex.ChatFirstPolicy()
    # queued newest first, as after preemptions: the key alone must restore arrival order
    mix = [req("think-9", 9000, 9.0), req("think-5", 9000, 5.0), req("think-1", 9000, 1.0),
           req("chat-7", 10, 7.0), req("chat-2", 10, 2.0)]
    expect(waiting_order(p, mix), ["chat-2", "chat-7", "think-1", "think-5", "think-9"])


@case(CASES, "an explicit priority outranks the length", "ChatFirstPolicy.waiting_key",
      "rank = (priority, long): a long request with priority -1 goes before short ones with priority 0")
def _(ex):
    p = ex.ChatFirstPolicy()
    mix = [req("chat", 10, 0.0), req("vip-think", 30_000, 5.0, priority=-1), req("batch-chat", 10, 1.0, priority=2)]
    expect(waiting_order(p, mix), ["vip-think", "chat", "batch-chat"])


@case(CASES, "the victim: the newest of the least important", "ChatFirstPolicy.choose_victim",
      "a long request before any short one; among them the latest arrival (it loses the least)")
def _(ex):
    p = ex.ChatFirstPolicy()
    running = [req("think-old", 30_000, 0.0, computed=20_000), req("chat-a", 100, 1.0, computed=50),
               req("think-new", 30_000, 2.0, computed=3_000), req("chat-b", 100, 3.0, computed=10)]
    expect(p.choose_victim(list(running)).request_id, "think-new")


@case(CASES, "only chat running; one request", "ChatFirstPolicy.choose_victim",
      "with one rank running, the latest arrival; a single request is its own victim")
def _(ex):
    p = ex.ChatFirstPolicy()
    running = [req("chat-a", 100, 0.0), req("chat-c", 100, 2.0), req("chat-b", 100, 1.0)]
    expect(p.choose_victim(list(running)).request_id, "chat-c", "three chats (admitted out of arrival order)")
    only = req("think", 30_000, 0.0)
    expect(p.choose_victim([only]).request_id, "think", "one request")


@case(CASES, "priority before length; the scheduler's list untouched", "ChatFirstPolicy.choose_victim",
      "the least important rank is the largest (priority, long); do not sort the list in place")
def _(ex):
    p = ex.ChatFirstPolicy()
    running = [req("low-chat", 100, 0.0, priority=1), req("think", 30_000, 1.0), req("chat", 100, 2.0)]
    before = ids(running)
    expect(p.choose_victim(running).request_id, "low-chat", "priority 1 chat vs priority 0 reasoning")
    expect(ids(running), before, "the running list after choose_victim")


@case(CASES, "chat may push reasoning out, never the reverse", "ChatFirstPolicy.may_preempt",
      "only a strictly more important rank may take a running request's place")
def _(ex):
    p = ex.ChatFirstPolicy()
    chat, think = req("chat", 100, 5.0), req("think", 30_000, 1.0)
    expect(p.may_preempt(chat, think), True, "waiting chat, running reasoning")
    expect(p.may_preempt(think, chat), False, "waiting reasoning, running chat")


@case(CASES, "never within a rank, whoever came first", "ChatFirstPolicy.may_preempt",
      "an older request of the same rank must not evict a newer one: they would take turns (thrashing)")
def _(ex):
    p = ex.ChatFirstPolicy()
    for kind, max_tokens in (("chat", 100), ("think", 30_000)):
        old, new = req(f"{kind}-old", max_tokens, 0.0), req(f"{kind}-new", max_tokens, 9.0)
        expect(p.may_preempt(old, new), False, f"waiting {old.request_id}, running {new.request_id}")
        expect(p.may_preempt(new, old), False, f"waiting {new.request_id}, running {old.request_id}")


@case(CASES, "explicit priorities", "ChatFirstPolicy.may_preempt",
      "compare ranks: (priority, long)")
def _(ex):
    p = ex.ChatFirstPolicy()
    vip = req("vip-think", 30_000, 9.0, priority=-1)
    chat = req("chat", 100, 0.0)
    expect(p.may_preempt(vip, chat), True, "priority -1 reasoning vs priority 0 chat")
    expect(p.may_preempt(chat, vip), False, "priority 0 chat vs priority -1 reasoning")


@case(CASES, "it is a SchedulingPolicy", "ChatFirstPolicy",
      "a name and the three methods of minivllm.core.policies.SchedulingPolicy")
def _(ex):
    p = ex.ChatFirstPolicy()
    p.waiting_key(req("r", 10, 0.0))  # a stub fails here first
    if not isinstance(p, SchedulingPolicy):
        raise Mismatch("a SchedulingPolicy", type(p).__name__)
    expect(make_policy(p) is p, True, "make_policy accepts it as it is")
    if not isinstance(p.name, str) or not p.name:
        raise Mismatch("a non-empty name", p.name)


# --- the policy in the simulator and on the engine -------------------------------------------------
class ThrashGuard:
    """Wraps a policy and stops a run whose preemptions never end (a policy that lets two
    requests evict each other in turn can loop inside one scheduler step forever)."""

    def __init__(self, policy, limit: int):
        self.policy, self.limit, self.allowed = policy, limit, 0
        self.name = getattr(policy, "name", "policy")

    def waiting_key(self, request: Request) -> tuple:
        return self.policy.waiting_key(request)

    def choose_victim(self, running: list[Request]) -> Request:
        return self.policy.choose_victim(running)

    def may_preempt(self, incoming: Request, victim: Request) -> bool:
        allowed = self.policy.may_preempt(incoming, victim)
        if allowed:
            self.allowed += 1
            if self.allowed > self.limit:
                raise Mismatch(
                    f"at most {self.limit} preemptions for admission", f"more: {incoming.request_id} "
                    f"and {victim.request_id} keep evicting each other", "thrashing",
                )
        return allowed


# A mixed trace at GPU scale: ShareGPT-like chat and reasoning chains of 2,500-12,000 tokens
# (every one longer than the 2,048-token threshold), nobody setting a priority, in a KV cache
# of 3,500 blocks (56k tokens) of a 4-bit Llama-3-70B with a 16-bit KV cache on an H100.
SIM_CHAT_P_SPEEDUP = 20.0  # chat p90 and p99 TTFT at least this many times lower than FCFS
SIM_REASONING_KEEP = 0.95  # reasoning throughput at least this share of FCFS's


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


@case(CASES, "mixed chat + reasoning on a simulated H100, no priorities set", "ChatFirstPolicy",
      f"chat p90 and p99 TTFT {SIM_CHAT_P_SPEEDUP:g}x lower than FCFS, reasoning throughput within "
      f"{100 * (1 - SIM_REASONING_KEEP):g} % of FCFS's; the note shows your figures")
def _(ex):
    policy = ex.ChatFirstPolicy()
    policy.waiting_key(req("r", 10, 0.0))  # a stub fails here first
    base, base_summary = fcfs_sim()
    stats, summary = simulate(ThrashGuard(policy, limit=5000))
    trace = sim_trace()
    if summary["output_tokens"] != trace.num_output_tokens:
        raise Mismatch(trace.num_output_tokens, summary["output_tokens"], "output tokens served")
    got = request_percentiles(stats, "ttft", "chat", (90, 99))
    want = request_percentiles(base, "ttft", "chat", (90, 99))
    keep = class_throughput(stats, "reasoning") / class_throughput(base, "reasoning")
    note = (f"chat TTFT p90 {got[90]:.2f} s, p99 {got[99]:.2f} s (FCFS: {want[90]:.2f} s, {want[99]:.2f} s); "
            f"reasoning throughput {keep:.1%} of FCFS's; {summary['preemptions']} preemptions "
            f"(FCFS: {base_summary['preemptions']})")
    for q in (90, 99):
        if got[q] * SIM_CHAT_P_SPEEDUP > want[q]:
            raise Mismatch(f"chat p{q} TTFT <= {want[q] / SIM_CHAT_P_SPEEDUP:.2f} s", f"{got[q]:.2f} s", note)
    if keep < SIM_REASONING_KEEP:
        raise Mismatch(f">= {SIM_REASONING_KEEP:.0%} of FCFS's reasoning throughput", f"{keep:.1%}", note)


# On the tiny model: four long requests fill a 20-block pool; three chat requests arrive at step
# 64, when the pool is full. Nobody sets a priority; the threshold is 16 tokens.
ENGINE_THRESHOLD = 16
ENGINE_TRACE = (
    [TraceRequest(f"think-{i}", p, 100) for i, p in enumerate(
        ["Once upon a time", "The old man said", "In the morning the cat", "She opened the door and"])]
    + [TraceRequest(f"chat-{i}", p, 12, arrival_step=64) for i, p in enumerate(["Hello, how are", "The sky is", "A dog and a"])]
)


def serve_tiny(policy):
    from minivllm import LLM

    llm = LLM(scheduling_policy=policy, num_kv_blocks=20, max_model_len=160, enable_prefix_caching=False,
              debug_checks=True)
    with one_cpu_thread():
        return run_trace(llm, ENGINE_TRACE, max_steps=2000)


@cache
def fcfs_tiny():
    return serve_tiny("fcfs")


@case(CASES, "serves the tiny model: FCFS's greedy tokens, chat first", "ChatFirstPolicy",
      "a policy changes the order, never the tokens; the chat requests should start as soon as they "
      "arrive, and only long requests be preempted")
def _(ex):
    policy = ex.ChatFirstPolicy(long_output_tokens=ENGINE_THRESHOLD)
    policy.waiting_key(req("r", 10, 0.0))  # a stub fails here first
    ref = fcfs_tiny()
    run = serve_tiny(ThrashGuard(policy, limit=500))
    expect(sorted(run.tokens), sorted(ref.tokens), "requests finished")
    for rid, tokens in ref.tokens.items():
        expect(run.tokens[rid], tokens, f"greedy tokens of {rid}")
    if not run.preemptions:
        raise Mismatch("some preemption (the pool is too small for everyone)", "none")
    chat_victims = sorted(rid for rid in run.preemptions if rid.startswith("chat"))
    expect(chat_victims, [], "chat requests preempted")
    for r in ENGINE_TRACE:
        if r.request_id.startswith("chat") and run.wait(r.request_id) >= ref.wait(r.request_id):
            raise Mismatch(f"first token in fewer than {ref.wait(r.request_id)} steps (FCFS)",
                           f"{run.wait(r.request_id)} steps", f"{r.request_id}, arrived at step {r.arrival_step}")
