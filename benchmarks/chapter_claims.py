"""Check the chapter's numbers with our scheduler, KV managers and cost model.

    python benchmarks/chapter_claims.py            # full run (< 2 minutes on a laptop CPU)
    python benchmarks/chapter_claims.py --quick    # smaller traces, a few seconds

Prints one markdown table: each claim of the chapter (paraphrased), the figure we get, the
setup and assumptions behind it, and whether we agree. Then a few detail tables. Every
scheduling decision comes from the real ``Scheduler`` / ``StaticBatchScheduler`` and the real
KV-cache managers; only time comes from the roofline cost model (``minivllm/sim``), so the
absolute numbers inherit its assumptions (see ``docs/simulator.md``).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field

from minivllm import workloads as w
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.request import Request
from minivllm.sim import CostModel, Simulator, get_hardware, preset
from minivllm.sim.analysis import (
    decode_only_steps,
    effective_batch,
    mean_running,
    productive_fraction,
    saturated_throughput,
)

GB = 1e9
GPU_8B = "A100-80GB"  # the GPU of the vLLM paper's experiments; every Llama-3 8B run uses it
MB = 1e6
KIB = 1024


@dataclass
class Config:
    quick: bool
    seed: int
    chat_requests: int  # chat trace size for the batching comparisons
    straggler_len: int  # the outlier's output length in the straggler example
    think_tokens: int  # thinking tokens per reasoning query
    think_requests: int

    @classmethod
    def make(cls, quick: bool, seed: int) -> Config:
        if quick:
            return cls(True, seed, chat_requests=120, straggler_len=3000, think_tokens=30_000, think_requests=0)
        return cls(False, seed, chat_requests=800, straggler_len=30_000, think_tokens=30_000, think_requests=8)


@dataclass
class Row:
    section: str
    claim: str
    ours: str
    setup: str
    verdict: str


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def add(self, *args: str) -> None:
        self.rows.append(Row(*args))


def near(x: float, target: float, rel: float) -> bool:
    """``x`` within ``rel`` (a fraction) of ``target``: how we read a chapter's "~target"."""
    return abs(x - target) <= rel * target


def in_range(x: float, lo: float, hi: float) -> bool:
    return lo <= x <= hi


def verdict(ok: bool, yes: str, no: str) -> str:
    return f"**agree**{': ' + yes if yes else ''}" if ok else f"**disagree**: {no}"


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def fmt_bytes(b: float) -> str:
    return f"{b / GB:.1f} GB" if b >= GB else f"{b / MB:.2f} MB"


# --- §2.1 padding ---------------------------------------------------------------------------
PADDING_PROMPTS = [10, 12, 8, 14, 9500, 11, 13, 9]


def claim_padding(cfg: Config, rep: Report) -> None:
    model = preset("llama-3-8b")
    trace = w.fixed(PADDING_PROMPTS, 1, name="pad")
    sim = Simulator(model, GPU_8B, scheduler="static", max_num_seqs=8, max_model_len=16384)
    stats = sim.run(trace)
    first = stats.steps[0]
    real, padding = first.num_prefill_tokens, first.num_padding_tokens
    token_share = real / (real + padding)
    short_real = real - max(PADDING_PROMPTS)
    short_share = short_real / (7 * max(PADDING_PROMPTS))
    cm = sim.cost_model
    flops_share = cm.prefill_step(PADDING_PROMPTS).flops / cm.prefill_step([max(PADDING_PROMPTS)] * 8).flops
    rep.add(
        "2.1",
        "B=8, prompts {10, 12, 8, 14, 9 500, 11, 13, 9}: padded to 8 x 9,500, ~1 % of prefill work useful",
        f"{real:,} real of {real + padding:,} computed rows = **{pct(token_share)}** useful "
        f"({pct(flops_share)} of FLOPs, attention included); the 7 short prompts alone fill "
        f"{pct(short_share)} of their padded rows",
        "real StaticBatchScheduler, first (prefill) step; FLOPs from the cost model, Llama-3 8B. "
        "The chapter's brace lists nine numbers for B=8: '9, 500' is 9,500 typeset with a thin space",
        verdict(
            near(token_share, 0.01, 0.5),
            "",
            f"~1 % matches only the short prompts' share ({pct(short_share)}); the 9,500-token prompt "
            f"is useful work too, so {pct(token_share)} of the rows are productive. Either way "
            f"padding wastes {pct(1 - token_share)} of the step",
        ),
    )


# --- §2.2 / §3.3 static batching at B = 8 ------------------------------------------------------
def claim_static_b8(cfg: Config, rep: Report, cache: dict) -> None:
    model = preset("llama-3-8b")
    trace = w.chat(cfg.chat_requests, seed=cfg.seed)
    static = Simulator(model, GPU_8B, scheduler="static", max_num_seqs=8, max_model_len=8192)
    cont = Simulator(model, GPU_8B, max_num_seqs=8, max_model_len=8192)
    s_stats, c_stats = static.run(trace), cont.run(trace)
    mean_ctx = statistics.fmean(it.prompt_len + it.output_len / 2 for it in trace)
    ideal = static.cost_model.decode_throughput(8, round(mean_ctx))
    s_tput = s_stats.summary()["output_tokens_per_s"]
    c_tput = c_stats.summary()["output_tokens_per_s"]
    s_beff, c_beff = effective_batch(s_stats), effective_batch(c_stats)
    cache["chat_trace"] = trace
    rep.add(
        "2.2",
        "static batching at B=8 on chat reaches ~15 % of an ideal, always-full batched decode",
        f"static: **{pct(s_tput / ideal)}** of ideal ({s_tput:,.0f} vs {ideal:,.0f} tok/s); "
        f"continuous at the same B=8: {pct(c_tput / ideal)}",
        f"{len(trace)} ShareGPT-like requests (mean prompt {statistics.fmean(trace.prompt_lens):.0f}, "
        f"output {statistics.fmean(trace.output_lens):.0f}), all at t=0; Llama-3 8B bf16, {GPU_8B}; "
        f"ideal = 8 sequences decoding every step at the mean context ({mean_ctx:.0f} tokens)",
        verdict(
            near(s_tput / ideal, 0.15, 0.5),
            "",
            f"static batching does lose most of the throughput ({pct(1 - s_tput / ideal)}), but with "
            "ShareGPT-like lengths not ~85 %; that needs a heavier output tail (straggler row)",
        ),
    )
    cache["static_b8"] = s_stats
    cache["continuous_b8"] = c_stats
    rep.add(
        "3.3",
        "B_eff ~0.3 B for static batching; B_eff -> B for continuous batching",
        f"B_eff/B = **{s_beff / 8:.2f}** static, **{c_beff / 8:.2f}** continuous (B=8)",
        "same runs; B_eff = time-weighted mean of sequences doing useful work per step "
        "(idle static seats excluded)",
        verdict(
            near(s_beff / 8, 0.3, 0.34) and c_beff / 8 > 0.85,
            "",
            f"static {s_beff / 8:.2f} B and continuous {c_beff / 8:.2f} B",
        ),
    )
    rep.details.append(
        f"### Static vs continuous at B = 8 (Llama-3 8B, {GPU_8B}, chat trace)\n\n"
        "| scheduler | output tok/s | B_eff | productive rows | mean TTFT (s) | mean e2e (s) |\n"
        "|---|---:|---:|---:|---:|---:|\n"
        + "\n".join(
            f"| {name} | {st.summary()['output_tokens_per_s']:,.0f} | {effective_batch(st):.2f} | "
            f"{pct(productive_fraction(st))} | {st.summary()['mean_ttft_s']:.1f} | {st.summary()['mean_e2e_s']:.1f} |"
            for name, st in (("static", s_stats), ("continuous", c_stats))
        )
    )


def claim_straggler(cfg: Config, rep: Report) -> None:
    model = preset("llama-3-8b")
    long = cfg.straggler_len
    # two batches' worth: 15 requests of 300 tokens and one outlier in the first batch
    outs = [300] * 3 + [long] + [300] * 12
    trace = w.fixed([100] * len(outs), outs, name="tail")
    res = {}
    for name, kw in (("static", dict(scheduler="static")), ("continuous", {})):
        sim = Simulator(model, GPU_8B, max_num_seqs=8, max_model_len=long + 512, **kw)
        st = sim.run(trace)
        short = [m for rid, m in st.requests.items() if rid != "tail-3"]
        res[name] = (statistics.fmean(m.e2e_latency for m in short), max(m.finished_time for m in short))
    (s_lat, s_done), (c_lat, c_done) = res["static"], res["continuous"]
    rep.add(
        "2.2",
        "a 30,000-token outlier holds a batch of ~300-token answers hostage",
        f"the 15 short requests: mean latency **{s_lat:.1f} s** static vs **{c_lat:.1f} s** continuous; "
        f"all done after {s_done:.1f} s vs {c_done:.1f} s. The outlier's batch runs at "
        f"B_eff/B = {(7 * 300 + long) / (8 * long):.2f}",
        f"16 requests (100-token prompts), 15 answer 300 tokens, one answers {long:,}; B=8; "
        f"Llama-3 8B, {GPU_8B}" + (" (quick mode: a 3,000-token outlier)" if cfg.quick else ""),
        verdict(
            s_lat > 2 * c_lat,
            "the second static batch waits for the outlier; continuous batching lets the short "
            "requests flow through the other seats",
            f"short requests wait {s_lat:.1f} s static vs {c_lat:.1f} s continuous",
        ),
    )


# --- §3 / §4.3 equal memory: static vs Orca-style vs paged -------------------------------------
def claim_equal_memory(cfg: Config, rep: Report, cache: dict) -> None:
    model = preset("llama-3-8b")
    trace = cache.get("chat_trace") or w.chat(cfg.chat_requests, seed=cfg.seed)
    hw = GPU_8B
    setups = {
        "static, contiguous": dict(scheduler="static", kv_cache="contiguous"),
        "continuous, contiguous (Orca-style)": dict(kv_cache="contiguous"),
        "continuous, paged (vLLM)": dict(),
    }
    results = {}
    blocks = None
    for name, kw in setups.items():
        sim = Simulator(model, hw, max_num_seqs=256, max_model_len=8192, **kw)
        blocks = sim.num_kv_blocks
        st = sim.run(trace)
        cache[f"equal:{name}"] = st
        results[name] = (st.summary(), effective_batch(st), mean_running(st))
    # the vLLM paper's chatbot setup: prompts cut to 1,024, answers to 1,024, 2,048-token context
    short = w.chat(
        cfg.chat_requests, seed=cfg.seed,
        prompt=w.LogNormalLengths(161.31, 1.0, 4, 1024), output=w.LogNormalLengths(337.99, 1.0, 4, 1024),
    )
    util_2k = {}
    for name, kw in (("contiguous", dict(kv_cache="contiguous")), ("paged", {})):
        sim = Simulator(model, hw, max_num_seqs=256, max_model_len=2048, **kw)
        util_2k[name] = sim.run(short).summary()["mean_kv_utilization"]
    tput = {k: v[0]["output_tokens_per_s"] for k, v in results.items()}
    base = tput["static, contiguous"]
    orca = tput["continuous, contiguous (Orca-style)"]
    paged = tput["continuous, paged (vLLM)"]
    kv_tokens = blocks * 16
    setup = (
        f"Llama-3 8B bf16 on A100-80GB (the vLLM paper's GPU), {kv_tokens:,} KV token slots for all three, "
        f"max_model_len 8,192, max_num_seqs 256, {len(trace)} chat requests at t=0"
    )
    rep.add(
        "3",
        "iteration-level scheduling (Orca) gives ~4x over static batching",
        f"**x{orca / base:.1f}** ({orca:,.0f} vs {base:,.0f} tok/s)",
        setup + f"; both reserve max_model_len per request, so at most {blocks // 512} run at once",
        verdict(near(orca / base, 4, 0.5), "", f"we get x{orca / base:.1f}"),
    )
    vs_b8 = ""
    if "static_b8" in cache:  # same model, GPU and trace: static batching with 8 seats
        b8 = cache["static_b8"].summary()["output_tokens_per_s"]
        vs_b8 = f"; x{paged / b8:.1f} over static B=8 (row 2.2)"
    rep.add(
        "1, 8",
        "continuous batching + PagedAttention: 5-24x over naive static batching",
        f"**x{paged / base:.1f}** over static batching at equal memory{vs_b8}",
        setup,
        verdict(
            in_range(paged / base, 5, 24),
            "inside the range; the gain grows with the spread of output lengths and with "
            "max_model_len (memory stranded by contiguous reservations)",
            f"x{paged / base:.1f}: with few requests every setup drains quickly and the ratio shrinks "
            "(run without --quick)",
        ),
    )
    u = {k: v[0]["mean_kv_utilization"] for k, v in results.items()}
    c_run, p_run = results["continuous, contiguous (Orca-style)"][2], results["continuous, paged (vLLM)"][2]
    rep.add(
        "4.3",
        "KV utilisation ~96 % paged vs 20-40 % contiguous; 2-5x more sequences in the batch",
        f"paged **{pct(u['continuous, paged (vLLM)'])}**; contiguous **{pct(u['continuous, contiguous (Orca-style)'])}** "
        f"reserving 8,192 and **{pct(util_2k['contiguous'])}** reserving 2,048 (paged {pct(util_2k['paged'])}); "
        f"running sequences x{p_run / c_run:.1f} ({p_run:.0f} vs {c_run:.0f})",
        "utilisation = K/V tokens stored / token slots reserved, averaged over steps; same runs, plus the "
        "vLLM paper's chatbot cut (prompts and answers <= 1,024, context 2,048)",
        verdict(
            u["continuous, paged (vLLM)"] > 0.9 and in_range(util_2k["contiguous"], 0.2, 0.4),
            "paging wastes under one block per request; contiguous utilisation is mean live length / "
            f"reserved length, so it is {pct(util_2k['contiguous'])} with 2k reservations but only "
            f"{pct(u['continuous, contiguous (Orca-style)'])} with 8k ones",
            "contiguous utilisation is mean live length / reserved length: "
            f"{pct(util_2k['contiguous'])} (2k) and {pct(u['continuous, contiguous (Orca-style)'])} (8k)",
        ),
    )
    if "static_b8" in cache:
        st = cache["static_b8"]
        results = {"static, B=8": (st.summary(), effective_batch(st), mean_running(st)), **results}
    rep.details.append(
        f"### Equal memory (Llama-3 8B bf16, {GPU_8B}, same KV pool)\n\n"
        "| setup | output tok/s | vs static | requests running (mean) | KV utilisation | preemptions |\n"
        "|---|---:|---:|---:|---:|---:|\n"
        + "\n".join(
            f"| {k} | {v[0]['output_tokens_per_s']:,.0f} | x{v[0]['output_tokens_per_s'] / base:.1f} | "
            f"{v[2]:.0f} | {pct(v[0]['mean_kv_utilization'])} | {v[0]['preemptions']} |"
            for k, v in results.items()
        )
    )


# --- §1 roofline crossover ------------------------------------------------------------------
def claim_roofline(cfg: Config, rep: Report) -> None:
    h100 = get_hardware("H100-SXM")
    lines = [
        "### Decode crossover batch B* on H100 (compute time = memory time)\n",
        "| model | weights | B* pure roofline, no KV | B* with efficiencies, no KV | B* with efficiencies, 1k context |",
        "|---|---|---:|---:|---:|",
    ]
    knees = {}
    for name in ("llama-3-8b", "llama-3-70b"):
        for wd in ("bf16", "int4"):
            spec = preset(name, weight_dtype=wd)
            pure = CostModel(spec, h100, 1.0, 1.0, 0.0).crossover_batch(0)
            eff = CostModel(spec, h100)
            knees[(name, wd)] = (pure, eff.crossover_batch(0), eff.crossover_batch(1024))
            k = knees[(name, wd)]
            ctx = "never" if k[2] == float("inf") else f"{k[2]:.0f}"
            lines.append(f"| {name} | {wd} | {k[0]:.0f} | {k[1]:.0f} | {ctx} |")
    rep.details.append("\n".join(lines))
    p8, p70i4 = knees[("llama-3-8b", "bf16")][0], knees[("llama-3-70b", "int4")][0]
    rep.add(
        "1",
        "decode is memory-bound at batch 1 and turns compute-bound from batch ~32",
        f"weights-only knee on H100: **B~{p8:.0f}** with 16-bit weights, **B~{p70i4:.0f}** for 70B int4 "
        f"(~{knees[('llama-3-70b', 'int4')][1]:.0f} at 60 %/80 % efficiency); with 1k-token contexts "
        "the KV reads keep 8B decode memory-bound at any batch",
        "B* = (weight bytes / bandwidth) / (FLOPs per token / peak - KV bytes per token / bandwidth); "
        f"H100 ridge point {h100.ridge_point:.0f} FLOP/byte",
        verdict(
            near(p8, 32, 0.5),
            "",
            f"with 16-bit weights the knee is ~bytes-per-weight x ridge / 2 = ~{p8:.0f} on H100 "
            f"(~{get_hardware('A100-80GB').ridge_point:.0f} on A100); int4 weights bring it to "
            f"~{p70i4:.0f}. GQA attention does ~8 FLOPs per KV byte, so long contexts push the knee out",
        ),
    )


# --- §4 / §6 KV bytes ------------------------------------------------------------------------
def claim_kv_bytes(cfg: Config, rep: Report) -> None:
    m = preset("llama-3-70b")
    per_tok = m.kv_bytes_per_token("bf16")
    mha = 2 * m.num_layers * m.num_heads * m.head_dim * 2
    seq32k = 32_768 * per_tok
    rep.add(
        "4",
        "Llama-3 70B, GQA-8, 32k context: ~1.2 MB of KV per token, ~40 GB per sequence",
        f"**{per_tok / KIB:.0f} KiB/token** ({per_tok:,.0f} B) and **{fmt_bytes(seq32k)}** per 32k sequence "
        f"in 16-bit; without GQA (64 KV heads): {mha / KIB / KIB:.2f} MiB/token, {fmt_bytes(32_768 * mha)}",
        "2 (K,V) x 80 layers x 8 KV heads x 128 dims x 2 bytes",
        verdict(
            near(per_tok, 1.2 * MB, 0.2),
            "",
            f"1.2 MB/token is {1.2 * MB / per_tok:.1f}x the GQA-8 figure and {1.2 * MB / mha:.2f}x the "
            "no-GQA one (it is close to no-GQA stored at 8 bits); the chapter's 40 GB follows from its 1.2 MB x 32k",
        ),
    )
    h100 = get_hardware("H100-SXM")
    int4 = preset("llama-3-70b", "int4", "bf16")
    kv_room = h100.memory_bytes * 0.9 - int4.weight_bytes
    rep.add(
        "4",
        "an 80 GB GPU fits ~20 such max-length slots; a 200-token chat uses ~0.6 % of a 32k slot",
        f"80 GB / 40 GB = **2** slots with the chapter's figures; with ours, after 70B int4 weights "
        f"({fmt_bytes(int4.weight_bytes)}): **{kv_room / seq32k:.1f}** 16-bit slots, "
        f"{kv_room / (seq32k / 2):.1f} int8; 200 / 32,768 = **{pct(200 / 32_768)}**",
        "90 % of 80 GB usable; 16-bit weights (141 GB) do not fit one 80 GB GPU at all",
        verdict(near(kv_room / seq32k, 20, 0.3), "", "~20 is inconsistent with the chapter's own 40 GB "
                "(80/40 = 2)") + "; " + verdict(near(200 / 32_768, 0.006, 0.1), "0.6 %", "") ,
    )
    think = 30_000 * m.kv_bytes_per_token("int8")
    rep.add(
        "6",
        "a 30k-token sequence needs ~12 GB of KV even with GQA-8 and INT8",
        f"**{fmt_bytes(think)}** at int8 ({fmt_bytes(30_000 * per_tok)} at 16-bit)",
        "30,000 x 2 x 80 x 8 x 128 x 1 byte (int8 scales ignored)",
        verdict(
            near(think, 12 * GB, 0.2),
            "",
            f"12 GB is {12 * GB / think:.1f}x our figure; it would need {12 * GB / 30_000 / 1e3:.0f} kB per "
            "token, more than GQA-8 even at 16-bit",
        ),
    )


def claim_prefix_sharing(cfg: Config, rep: Report) -> None:
    trace = w.shared_prefix(32, prefix_len=2048, seed=cfg.seed)
    used = {}
    for caching in (False, True):
        kv = KVCacheManager(num_blocks=32 * 256, block_size=16, enable_caching=caching)
        for it in trace:  # 32 concurrent requests, each admitted with its whole prompt
            req = Request(it.request_id, it.prompt_token_ids(128_256))
            hits, num_hit = kv.get_computed_blocks(req)
            assert kv.allocate_slots(req, req.num_tokens - num_hit, hits) is not None
            req.num_computed_tokens = req.num_tokens
            kv.commit_written_blocks()  # its prefill ran: the blocks hold K/V now
        used[caching] = kv.num_used_blocks
    saved_blocks = used[False] - used[True]
    m = preset("llama-3-70b")
    saved16 = saved_blocks * 16 * m.kv_bytes_per_token("bf16")
    saved8 = saved_blocks * 16 * m.kv_bytes_per_token("int8")
    rep.add(
        "4.4",
        "a 2k-token system prompt shared by 32 requests saves ~60 GB of HBM",
        f"{used[False]:,} -> {used[True]:,} blocks in the real KVCacheManager: **{saved_blocks:,} blocks** "
        f"= 31 x 128; Llama-3 70B: **{fmt_bytes(saved16)}** at 16-bit, {fmt_bytes(saved8)} at int8",
        "32 concurrent requests = 2,048 shared + own user turn; block 16; prefix caching on vs off",
        verdict(
            near(saved16, 60 * GB, 0.25),
            "",
            f"~60 GB needs ~{60 * GB / (31 * 2048) / MB:.2f} MB/token, i.e. the chapter's 1.2 MB/token; "
            f"with GQA-8 the saving is {fmt_bytes(saved16)} (still a quarter of an H100)",
        ),
    )


# --- §6 / §7 Llama-3 70B int4 + int8 KV on one H100 -------------------------------------------
def claim_70b(cfg: Config, rep: Report, cache: dict) -> None:
    model = preset("llama-3-70b", weight_dtype="int4", kv_dtype="int8")
    hw = get_hardware("H100-SXM")
    trace = w.chat(max(cfg.chat_requests, 400), seed=cfg.seed + 1)
    sim = Simulator(model, hw, max_num_seqs=64, max_model_len=32_768)
    st = sim.run(trace)
    cache["70b"] = (sim.cost_model, st)
    s = sim.summary()
    kv_bytes = sim.num_kv_blocks * sim.kv_block_bytes
    kv_tokens = sim.num_kv_blocks * 16
    full = [x for x in decode_only_steps(st) if x.num_decode_tokens == 64]
    per_token = statistics.fmean(x.duration / x.num_decode_tokens for x in full)
    step_ms = statistics.fmean(x.duration for x in full) * 1e3
    sat = saturated_throughput(st)
    tok_per_usd = sat * 3600 / hw.usd_per_hour
    setup = (
        f"Llama-3 70B, int4 weights (AWQ-style, {model.bits_per_linear_weight:.2f} bits) + int8 KV, "
        "one H100-SXM at 90 % memory, "
        f"max_num_seqs 64, {len(trace)} chat requests at t=0; no speculative decoding"
    )
    rep.add(
        "7",
        "HBM: ~35 GB weights + ~35 GB peak KV on one H100",
        f"weights **{fmt_bytes(model.weight_bytes)}** ({fmt_bytes(model.naive_weight_bytes)} at a flat 4 bits); "
        f"KV pool **{fmt_bytes(kv_bytes)}** = {kv_tokens:,} tokens",
        "16-bit embeddings/LM head and group-128 scales and zeros kept; 10 % of memory and an activation "
        "reserve withheld",
        verdict(
            near(model.weight_bytes, 35 * GB, 0.2) and near(kv_bytes, 35 * GB, 0.2),
            "within 20 %",
            "more than 20 % off",
        ),
    )
    rep.add(
        "7",
        "~2,000-5,000 tokens/s per H100 on chat at a saturated batch of ~64",
        f"**{sat:,.0f} output tok/s** while the batch is full ({s['output_tokens_per_s']:,.0f} over the "
        "whole trace, ramp-down included)",
        setup,
        verdict(in_range(sat, 2000, 5000), "", f"{sat:,.0f} tok/s"),
    )
    rep.add(
        "7",
        "~0.1-0.5 ms decode cost per token",
        f"**{per_token * 1e3:.2f} ms** per token at batch 64 (each step: {step_ms:.1f} ms)",
        setup,
        verdict(
            in_range(per_token, 1e-4, 5e-4),
            f"as GPU time per token amortised over the batch; each user still waits a whole step "
            f"({step_ms:.0f} ms) per token",
            f"{per_token * 1e3:.2f} ms",
        ),
    )
    rep.add(
        "7",
        "~1-10 million output tokens per dollar",
        f"**{tok_per_usd / 1e6:.1f} M tokens/$** at ${hw.usd_per_hour:.2f}/h",
        "price is an assumption (hardware table); tokens/$ = saturated tok/s x 3600 / price",
        verdict(in_range(tok_per_usd, 1e6, 10e6), "", f"{tok_per_usd / 1e6:.1f} M/$"),
    )
    # concurrency and cost of reasoning queries
    per_think = (cfg.think_tokens + 200) * model.kv_bytes_per_token()
    fit = kv_bytes / per_think
    chat_len = statistics.fmean(it.prompt_len + it.output_len for it in trace)
    conc_sim = ""
    if cfg.think_requests:
        think = w.fixed([200] * cfg.think_requests, cfg.think_tokens, name="think")
        rsim = Simulator(model, hw, max_num_seqs=64, max_model_len=32_768)
        rst = rsim.run(think)
        rs = rsim.summary()
        e2e = [m.e2e_latency for m in rst.requests.values()]
        lat_lo, lat_hi = min(e2e), max(e2e)
        gpu_s = rs["total_time_s"] / cfg.think_requests
        conc = mean_running(rst)
        conc_sim = f"; simulated: **{conc:.1f}** running on average ({rs['preemptions']} preemptions)"
        lat_text = (
            f"simulated {cfg.think_requests} queries of {cfg.think_tokens:,} thinking tokens: latency "
            f"**{lat_lo:.0f}-{lat_hi:.0f} s** each, **{gpu_s:.0f} GPU-s** per query amortised = "
            f"**{1 / gpu_s:.3f} queries/s** ({rs['output_tokens_per_s']:,.0f} tok/s)"
        )
    else:
        conc = int(fit)
        step = sim.cost_model.decode_step(conc, cfg.think_tokens // 2)
        lat_lo = lat_hi = cfg.think_tokens * step.time
        gpu_s = lat_hi / conc
        lat_text = (
            f"estimate (quick mode, no simulation): {conc} concurrent queries, {step.time * 1e3:.1f} ms per "
            f"step at mid-length -> latency **~{lat_hi:.0f} s**, **~{gpu_s:.0f} GPU-s** per query, "
            f"{1 / gpu_s:.3f} queries/s"
        )
    rep.add(
        "6",
        "4-8 concurrent reasoning sequences per GPU, against 32+ for chat",
        f"KV pool / 30k-token sequence = **{fit:.1f}**{conc_sim}; "
        f"chat (mean {chat_len:.0f} tokens): room for **{kv_tokens / chat_len:.0f}**",
        "same 70B int4 + int8-KV H100 setup",
        verdict(in_range(fit, 4, 8) and kv_tokens / chat_len >= 32, "", f"{fit:.1f} reasoning sequences"),
    )
    weight_pass = (model.body_weight_bytes + model.lm_head_bytes) / hw.memory_bandwidth
    rep.add(
        "7",
        "a 30k-thinking-token query costs ~6-30 s; ~1 query/s per H100 at saturation",
        lat_text,
        "same setup; 200-token prompts; every query thinks exactly 30k tokens; no speculative decoding",
        verdict(
            in_range(gpu_s, 6, 30) and near(1 / gpu_s, 1, 0.5),
            "",
            f"a sequence gets at most one token per weight pass (>= {weight_pass * 1e3:.0f} ms at peak "
            f"bandwidth), so a 30k chain takes minutes; amortised GPU time is ~{gpu_s:.0f} s because only "
            f"~{fit:.0f} chains fit in KV. 6-30 s is 30k tokens / chat-level throughput (1-5k tok/s), and "
            "1 query/s would need ~30k tok/s (and contradicts 6-30 s per query)",
        ),
    )


# --- §3.1 chunked prefill -------------------------------------------------------------------
def claim_chunked(cfg: Config, rep: Report) -> None:
    model = preset("llama-3-8b")
    chat = w.chat(32, seed=cfg.seed + 2, output=w.LogNormalLengths(600, 0.3, 300, 2000))
    big = w.fixed([30_000], [50], arrival=[0.5], name="doc")
    trace = w.merge(chat, big)
    res = {}
    for name, kw in (
        ("chunked", dict(enable_chunked_prefill=True, max_num_batched_tokens=2048)),
        ("unchunked", dict(enable_chunked_prefill=False, max_num_batched_tokens=32_768)),
    ):
        sim = Simulator(model, GPU_8B, max_num_seqs=64, max_model_len=32_768, **kw)
        st = sim.run(trace)
        # the longest gap between two tokens of a chat request is the longest step it sat through
        worst = max(x.duration for x in st.steps if x.num_decode_tokens)
        res[name] = (worst, st.requests["doc-0"].ttft, st.summary()["total_time_s"])
    c, u = res["chunked"], res["unchunked"]
    rep.add(
        "3.1",
        "chunked prefill (~2k prefill tokens per step) keeps a 30k-token prompt from freezing decode",
        f"longest step seen by decoding requests **{u[0] * 1e3:.0f} ms** unchunked vs **{c[0] * 1e3:.0f} ms** "
        f"with a 2,048-token budget; the long prompt's TTFT {u[1]:.2f} s vs {c[1]:.2f} s; "
        f"total busy time {c[2] / u[2] - 1:+.1%}",
        f"32 chat requests decoding when a 30,000-token prompt arrives at t=0.5 s; Llama-3 8B, {GPU_8B}",
        verdict(u[0] > 3 * c[0], "the stall shrinks by the chunk ratio, at almost no cost",
                "the stall barely changes"),
    )


def print_report(rep: Report, cfg: Config, argv: list[str], elapsed: float) -> None:
    print(f"$ python {shlex.join(argv)}\n")
    print(
        f"Mode: {'quick' if cfg.quick else 'full'}, seed {cfg.seed}. Cost model: roofline with "
        f"{CostModel.flops_efficiency:.0%} of peak FLOP/s, {CostModel.bandwidth_efficiency:.0%} of peak "
        f"bandwidth, {CostModel.step_overhead_s * 1e3:.1f} ms per step. Prices: "
        + ", ".join(f"{h.name} ${h.usd_per_hour:.2f}/h" for h in map(get_hardware, ("H100-SXM", "A100-80GB")))
        + " (assumptions).\n"
    )
    print("| § | The chapter says | We get | Setup and assumptions | Verdict |")
    print("|---|---|---|---|---|")
    for r in rep.rows:
        print(f"| {r.section} | {r.claim} | {r.ours} | {r.setup} | {r.verdict} |")
    for d in rep.details:
        print("\n" + d)
    print(f"\n{len(rep.rows)} claims checked in {elapsed:.1f} s.")


def save_plots(cache: dict, out_dir: str) -> list[str]:
    """The three simulator plots, drawn from this run's statistics."""
    from pathlib import Path

    from minivllm.sim import plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = {
        "batch_occupancy.png": plots.plot_batch_occupancy(
            {"static B=8": cache["static_b8"], "continuous B=8": cache["continuous_b8"]}, max_num_seqs=8
        ),
        "kv_memory.png": plots.plot_kv_memory(
            {k.split(":", 1)[1]: v for k, v in cache.items() if k.startswith("equal:") and "static" not in k}
        ),
        "decode_roofline.png": plots.plot_throughput_roofline(
            cache["70b"][0], {"70B int4 chat run": cache["70b"][1]}, context_len=512
        ),
    }
    for name, fig in figs.items():
        fig.savefig(out / name, dpi=110)
    return [str(out / name) for name in figs]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller traces (a few seconds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plots", metavar="DIR", help="also save the occupancy, KV-memory and roofline plots")
    args = ap.parse_args(argv)
    cfg = Config.make(args.quick, args.seed)
    rep = Report()
    cache: dict = {}
    t0 = time.perf_counter()
    claim_padding(cfg, rep)
    claim_static_b8(cfg, rep, cache)
    claim_straggler(cfg, rep)
    claim_equal_memory(cfg, rep, cache)
    claim_roofline(cfg, rep)
    claim_kv_bytes(cfg, rep)
    claim_prefix_sharing(cfg, rep)
    claim_70b(cfg, rep, cache)
    claim_chunked(cfg, rep)
    print_report(rep, cfg, ["benchmarks/chapter_claims.py", *argv], time.perf_counter() - t0)
    if args.plots:
        print("\nPlots: " + ", ".join(save_plots(cache, args.plots)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
