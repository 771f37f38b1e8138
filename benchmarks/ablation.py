"""The chapter's headline as one ablation: from static batching to the full stack, one step at a time.

One workload, seven settings, each adding one technique to the one before:

1. **static batching**: batches of ``B`` padded prompts decoded in lock step, every request
   holding a ``max_model_len`` region of the KV cache (``scheduler="static"``,
   ``kv_cache="contiguous"``); ``B`` is the number of such regions the memory holds;
2. **+ continuous batching**: iteration-level scheduling, still one max-length region per request
   (``kv_cache="contiguous"``: at most ``B`` requests run at once, as in Orca);
3. **+ paged KV cache**: blocks of 16 tokens allocated as a sequence grows, so the same memory
   holds as many sequences as their actual lengths allow (``kv_cache="paged"``);
4. **+ chunked prefill**: prompts cut into pieces that share a step's token budget with decodes;
5. **+ prefix caching**: the shared system prompt's K/V computed once and reused;
6. **+ int8 KV cache**: ``kv_cache_dtype="int8"``, so the same bytes hold more tokens;
7. **+ speculative decoding**: a draft model proposes ``k`` tokens, the target verifies them.

Every setting gets the same KV-cache memory and runs the same trace: a shared system prompt
followed by a chat-like user turn, exactly ``output_len`` greedy tokens per request, every request
queued at once (an offline batch: throughput, not latency, is the figure). It runs twice:

* **engine**: the real engine with the tiny model on this machine's CPU, output tokens per second
  of wall clock (median over interleaved rounds), greedy outputs compared across settings;
* **simulator**: the same scheduler and KV-cache manager at GPU scale (Llama-3 70B with 4-bit
  weights on one H100, as in the chapter's section 7), simulated output tokens per second. Its
  draft model is Llama-3 8B (4-bit) whose drafts are accepted with an assumed probability
  (``--acceptance-rate``): the simulator has no model to tell which drafts a target would keep.

"No paging" is a real code path in both, not an estimate: the contiguous KV cache manager
(``minivllm/core/contiguous_kv.py``) cuts the same pool into ``max_model_len`` regions.

    python benchmarks/ablation.py                    # the full run (a few minutes on 2 cores)
    python benchmarks/ablation.py --quick            # small trace, well under a minute
    python benchmarks/ablation.py --json out.json --plot ablation.png
    python benchmarks/ablation.py --store benchmarks/results   # the record notebook 10 reads

``measure(...)`` returns the figures as a dict; ``table(...)`` and ``plot(...)`` draw them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import minivllm
from minivllm import LLM
from minivllm import workloads as w
from minivllm.engine.core_client import local_core
from minivllm.math_utils import cdiv
from minivllm.model.config import ModelConfig
from minivllm.sim import Simulator, get_hardware, preset

BLOCK_SIZE = 16
# What the contiguous cache reserves per request: the model's whole context, as a server without
# paging must (it cannot know how long an answer will be): the tiny model's 2,048 tokens, and
# Llama-3's native 8,192 in the simulator.
MAX_MODEL_LEN = 2048
SIM_MAX_MODEL_LEN = 8192
MAX_NUM_SEQS = 256  # the engine's default seat limit, for every continuous setting
# The workload: a 256-token system prompt shared by every request, then a user turn and an answer
# with ShareGPT-like spreads, scaled down ~2.5x so that a request fits the tiny model's context.
SYSTEM_PROMPT_LEN = 256
USER = w.LogNormalLengths(mean=64, sigma=0.8, low=4, high=512)
OUTPUT = w.LogNormalLengths(mean=128, sigma=0.9, low=4, high=768)
QUICK_OUTPUT = w.LogNormalLengths(mean=32, sigma=0.9, low=4, high=192)  # --quick, on the engine
# The engine's KV memory: room for this many max-length sequences (8 x 2048 tokens). Small, so
# that memory decides how many requests run at once, as it does on a GPU.
ENGINE_MAX_LEN_SEQS = 8
SIM_MODEL = ("llama-3-70b", "int4")  # preset name, weight format (K/V in bf16 until step 6)
SIM_DRAFT = ("llama-3-8b", "int4")
SIM_HARDWARE = "H100-SXM"
NUM_SPECULATIVE_TOKENS = 4
ACCEPTANCE_RATE = 0.7  # assumption for the simulator (notebook 11 uses the same)
RESULTS_NAME = "ablation.json"


@dataclass(frozen=True)
class Setting:
    name: str  # the row label
    adds: str  # what this step changes, in a few words
    args: dict  # engine arguments, cumulative


def settings(draft: object) -> list[Setting]:
    """The seven settings; ``draft`` is the speculative draft model (a checkpoint directory for
    the engine, a ``ModelSpec`` for the simulator)."""
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}
    steps = [
        ("static batching", "padded batches of B, max-length KV regions",
         dict(scheduler="static", kv_cache="contiguous", enable_chunked_prefill=False,
              enable_prefix_caching=False)),
        ("+ continuous batching", "iteration-level scheduling",
         dict(scheduler="continuous")),
        ("+ paged KV cache", "16-token blocks instead of max-length regions",
         dict(kv_cache="paged")),
        ("+ chunked prefill", "prompts share a step's token budget with decodes",
         dict(enable_chunked_prefill=True)),
        ("+ prefix caching", "the system prompt's K/V computed once",
         dict(enable_prefix_caching=True)),
        ("+ int8 KV cache", "8-bit K/V: more tokens in the same bytes",
         dict(kv_cache_dtype="int8")),
        ("+ speculative decoding", f"a draft model proposes k={NUM_SPECULATIVE_TOKENS} tokens",
         dict(speculative_config=spec)),
    ]
    out, args = [], {}
    for name, adds, change in steps:
        args = {**args, **change}
        out.append(Setting(name, adds, dict(args)))
    return out


def make_trace(requests: int, seed: int, output: w.LogNormalLengths = OUTPUT) -> w.Trace:
    """The ablation's workload: every request = the shared system prompt + its own user turn."""
    return w.shared_prefix(requests, prefix_len=SYSTEM_PROMPT_LEN, seed=seed, user=USER, output=output,
                           name="ablation")


def static_batch_size(num_blocks: int, max_model_len: int = MAX_MODEL_LEN) -> int:
    """How many max-length regions a pool of ``num_blocks`` holds: the static batch ``B``, and
    the most requests the contiguous cache lets run at once."""
    return min(num_blocks // cdiv(max_model_len, BLOCK_SIZE), MAX_NUM_SEQS)


def _seats(setting: Setting, batch: int) -> int:
    return batch if setting.args["scheduler"] == "static" else MAX_NUM_SEQS


def _figures(s, batch: int, kv_blocks: int, running: list[int], summary: dict) -> dict:
    """One setting's counters, the same for the engine and the simulator: what explains its bar."""
    return {
        "adds": s.adds,
        "kv_blocks": kv_blocks,
        "seats": _seats(s, batch),
        "mean_running": statistics.fmean(running),
        "peak_running": max(running),
        "steps": summary["num_steps"],
        "padding_tokens": summary["padding_tokens"],
        "prefill_tokens": summary["prefill_tokens"],
        "prefix_hit_rate": summary["prefix_hit_rate"],
        "acceptance_rate": summary["spec_acceptance_rate"],
        "preemptions": summary["preemptions"],
    }


# --- the real engine ------------------------------------------------------------------------
def engine_kv_memory(max_len_seqs: int = ENGINE_MAX_LEN_SEQS) -> int:
    """Bytes of a float32 KV cache that hold ``max_len_seqs`` sequences of ``MAX_MODEL_LEN``."""
    cfg = ModelConfig.from_file(minivllm.TINY_MODEL_DIR)
    return max_len_seqs * MAX_MODEL_LEN * cfg.kv_bytes_per_token(4)


def measure_engine(traces: list[w.Trace], max_len_seqs: int = ENGINE_MAX_LEN_SEQS,
                   only: list[str] | None = None, threads: int = 1) -> dict:
    """Serve each trace of ``traces`` (one per round: the same workload, another seed, so that no
    round finds the last one's prompts in the prefix cache) with every setting, the settings
    interleaved; per setting the median output tokens/s over rounds, the ratio to static batching
    (median of the per-round ratios), KV blocks, requests running (mean and peak, last round),
    prefix hits, the acceptance rate, and whether its greedy tokens match (:func:`same_outputs`)."""
    memory = engine_kv_memory(max_len_seqs)
    batch = max_len_seqs
    chosen = [s for s in settings(str(minivllm.TINY_DRAFT_MODEL_DIR)) if only is None or s.name in only]
    vocab = ModelConfig.from_file(minivllm.TINY_MODEL_DIR).vocab_size
    warm = [it.prompt_token_ids(vocab)[-40:] for it in traces[0][:2]]  # not the system prompt
    warm_params = [it.sampling_params() for it in traces[0][:2]]
    llms = {}
    for s in chosen:
        llm = LLM(minivllm.TINY_MODEL_DIR, dtype="float32", device="cpu", cpu_threads=threads,
                  max_model_len=MAX_MODEL_LEN, kv_cache_memory=memory, max_num_seqs=_seats(s, batch),
                  seed=0, **s.args)
        llm.generate(warm, warm_params, use_tqdm=False)
        llms[s.name] = llm
    speeds: dict[str, list[float]] = {s.name: [] for s in chosen}
    outputs: dict[str, list[list[int]]] = {s.name: [] for s in chosen}
    results: dict[str, dict] = {}
    for trace in traces:
        prompts = [it.prompt_token_ids(vocab) for it in trace]
        params = [it.sampling_params() for it in trace]
        for s in chosen:
            llm = llms[s.name]
            llm.reset_stats()
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            speeds[s.name].append(trace.num_output_tokens / (time.perf_counter() - start))
            outputs[s.name] += [list(o.outputs[0].token_ids) for o in outs]
            stats = llm.stats()
            summary = stats.summary()
            running = stats.column("num_running")
            results[s.name] = _figures(s, batch, local_core(llm).kv.num_blocks, running, summary)
    base = chosen[0].name
    for s in chosen:
        r = results[s.name]
        r["output_tokens_per_s"] = statistics.median(speeds[s.name])
        r["vs_static"] = statistics.median(x / b for x, b in zip(speeds[s.name], speeds[base], strict=True))
        r["rounds_tokens_per_s"] = speeds[s.name]
    return {
        "trace": traces[0].describe() + (f" (and {len(traces) - 1} more draws, one per round)"
                                         if len(traces) > 1 else ""),
        "requests": len(traces[0]),
        "model": "tiny model (minivllm/tiny_model), float32",
        "device": f"CPU, {threads} torch thread{'s' if threads > 1 else ''}",
        "kv_cache_memory_bytes": memory,
        "static_batch": batch,
        "rounds": len(traces),
        "settings": results,
        "same_outputs": same_outputs(outputs),
    }


def same_outputs(outputs: dict[str, list[list[int]]]) -> dict[str, bool]:
    """Whether each setting's greedy tokens equal those of the first setting of the same KV
    format (float32 settings against static batching, int8 ones against int8 alone): every
    technique here except the 8-bit cache is exact; the 8-bit cache rounds K and V, and
    speculative decoding over it keeps the target's greedy tokens."""
    names = list(outputs)
    ref_fp = outputs[names[0]]
    int8 = [n for n in names if "int8" in n]
    ref_int8 = outputs[int8[0]] if int8 else None
    out = {}
    seen_int8 = False
    for n in names:
        seen_int8 = seen_int8 or "int8" in n
        ref = ref_int8 if seen_int8 else ref_fp
        out[n] = outputs[n] == ref
    return out


# --- the simulator --------------------------------------------------------------------------
def measure_sim(trace: w.Trace, acceptance_rate: float = ACCEPTANCE_RATE, hardware: str = SIM_HARDWARE,
                only: list[str] | None = None) -> dict:
    """The same settings on the simulator at GPU scale; memory is what the GPU has left after the
    weights (and the draft model's weights, when there is one)."""
    model = preset(SIM_MODEL[0], weight_dtype=SIM_MODEL[1])
    draft = preset(SIM_DRAFT[0], weight_dtype=SIM_DRAFT[1])
    probe = Simulator(model, hardware, max_model_len=SIM_MAX_MODEL_LEN, kv_cache="contiguous",
                      enable_prefix_caching=False, max_num_seqs=MAX_NUM_SEQS)
    batch = static_batch_size(probe.num_kv_blocks, SIM_MAX_MODEL_LEN)
    chosen = [s for s in settings(draft) if only is None or s.name in only]
    results = {}
    for s in chosen:
        extra = {"acceptance_rate": acceptance_rate} if "speculative_config" in s.args else {}
        sim = Simulator(model, hardware, max_model_len=SIM_MAX_MODEL_LEN, max_num_seqs=_seats(s, batch),
                        seed=0, **s.args, **extra)
        stats = sim.run(trace)
        summary = sim.summary()
        running = stats.column("num_running")
        results[s.name] = {
            **_figures(s, batch, sim.num_kv_blocks, running, summary),
            "output_tokens_per_s": summary["output_tokens_per_s"],
            "span_s": summary["total_time_s"],
        }
    base = results[chosen[0].name]["output_tokens_per_s"]
    for r in results.values():
        r["vs_static"] = r["output_tokens_per_s"] / base
    hw = get_hardware(hardware)
    return {
        "trace": trace.describe(),
        "requests": len(trace),
        "output_tokens": trace.num_output_tokens,
        "model": f"{model.name}, {SIM_MODEL[1]} weights ({model.weight_bytes / 1e9:.1f} GB)",
        "draft_model": f"{draft.name}, {SIM_DRAFT[1]} weights, acceptance rate {acceptance_rate} (assumed)",
        "device": f"simulated {hw.name}",
        "static_batch": batch,
        "acceptance_rate": acceptance_rate,
        "settings": results,
    }


# --- the whole run ----------------------------------------------------------------------------
def measure(quick: bool = False, seed: int = 0, engine_requests: int | None = None,
            sim_requests: int | None = None, rounds: int | None = None,
            acceptance_rate: float = ACCEPTANCE_RATE, skip_engine: bool = False,
            skip_sim: bool = False, threads: int = 1) -> dict:
    """Both halves of the ablation. The engine and the simulator draw their traces from the same
    generator and seed; the simulator's GPU holds hundreds of sequences, so it gets more requests
    (else every setting would run the whole trace in one batch)."""
    engine_requests = engine_requests or (16 if quick else 128)
    sim_requests = sim_requests or (1000 if quick else 3000)
    rounds = rounds or (1 if quick else 3)
    out: dict = {
        "command": "",
        "date": datetime.date.today().isoformat(),
        "quick": quick,
        "seed": seed,
        "max_model_len": {"engine": MAX_MODEL_LEN, "sim": SIM_MAX_MODEL_LEN},
        "settings": [{"name": s.name, "adds": s.adds} for s in settings("draft")],
    }
    if not skip_engine:
        output = QUICK_OUTPUT if quick else OUTPUT
        traces = [make_trace(engine_requests, seed + r, output) for r in range(rounds)]
        out["engine"] = measure_engine(traces, threads=threads)
    if not skip_sim:
        out["sim"] = measure_sim(make_trace(sim_requests, seed), acceptance_rate)
    return out


def _cell(x: float, fmt: str) -> str:
    return "—" if x != x else format(x, fmt)


def table(result: dict) -> list[str]:
    """One markdown table: per setting, both halves side by side."""
    eng, sim = result.get("engine"), result.get("sim")
    head = "| setting | adds |"
    rule = "|---|---|"
    if eng:
        head += " engine tok/s | × static | running (mean / peak) | greedy tokens |"
        rule += "---:|---:|---:|---|"
    if sim:
        head += " simulator tok/s | × static | running (mean / peak) |"
        rule += "---:|---:|---:|"
    rows = [head, rule]
    for s in result["settings"]:
        name = s["name"]
        line = f"| {name} | {s['adds']} |"
        if eng and name in eng["settings"]:
            r = eng["settings"][name]
            same = "same" if eng["same_outputs"][name] else "**differ**"
            line += (f" {r['output_tokens_per_s']:,.0f} | {r['vs_static']:.2f}× | "
                     f"{r['mean_running']:.1f} / {r['peak_running']} | {same} |")
        if sim and name in sim["settings"]:
            r = sim["settings"][name]
            line += (f" {r['output_tokens_per_s']:,.0f} | {r['vs_static']:.2f}× | "
                     f"{r['mean_running']:.0f} / {r['peak_running']} |")
        rows.append(line)
    return rows


def _parts(result: dict, engine_label: str, sim_label: str):
    """``(key, label, part)`` for each half of ``result`` that ran: the engine's, the simulator's."""
    for key, label in (("engine", engine_label), ("sim", sim_label)):
        if result.get(key):
            yield key, label, result[key]


def details(result: dict) -> list[str]:
    """What each half ran on and the figures that explain the bars."""
    lines = []
    for key, label, part in _parts(result, "Engine", "Simulator"):
        lines.append(f"{label}: {part['model']} on {part['device']}; {part['trace']}; "
                     f"static batch B = {part['static_batch']} (the max-length regions its KV memory holds)")
        if key == "sim":
            lines.append(f"  draft: {part['draft_model']}")
        s = part["settings"]
        for name, r in s.items():
            extra = []
            if r["padding_tokens"]:
                extra.append(f"{r['padding_tokens']:,} padding rows")
            if r["prefix_hit_rate"] == r["prefix_hit_rate"] and r["prefix_hit_rate"] > 0:
                extra.append(f"prefix hits {r['prefix_hit_rate']:.0%}")
            if r["acceptance_rate"] == r["acceptance_rate"]:
                extra.append(f"drafts accepted {r['acceptance_rate']:.0%}")
            if r["preemptions"]:
                extra.append(f"{r['preemptions']} preemptions")
            lines.append(f"  {name}: {r['kv_blocks']:,} KV blocks, {r['steps']:,} steps, "
                         f"{r['prefill_tokens']:,} prompt tokens computed" + "".join(f", {e}" for e in extra))
    return lines


def verdicts(result: dict) -> list[str]:
    """Sentences that set the measured ratios beside the chapter's "~10x" and "5-24x"."""
    lines = []
    for _key, label, part in _parts(result, "the tiny model on this CPU", "Llama-3 70B on a simulated H100"):
        s = part["settings"]
        names = list(s)
        full = s[names[-1]]["vs_static"]
        best_name = max(names, key=lambda n: s[n]["vs_static"])
        best = s[best_name]["vs_static"]
        pair = s.get("+ paged KV cache", {}).get("vs_static", float("nan"))
        where = "inside" if 5 <= best <= 24 else "below" if best < 5 else "above"
        ten = "reaches" if best >= 10 else "falls short of"
        lines.append(
            f"{label}: continuous batching with paging {pair:.1f}× static batching, the whole stack "
            f"{full:.1f}×, the best setting ({best_name.lstrip('+ ')}) {best:.1f}×: {where} the "
            f"chapter's 5-24×, and it {ten} the chapter's ~10×."
        )
    return lines


def step_gains(part: dict) -> dict[str, float]:
    """Each setting's throughput over the one before it (the first: 1.0)."""
    s = part["settings"]
    names = list(s)
    return {n: s[n]["output_tokens_per_s"] / s[names[max(i - 1, 0)]]["output_tokens_per_s"]
            for i, n in enumerate(names)}


def notes(result: dict) -> list[str]:
    """Per half, what each step bought, and why the 8-bit cache and speculation pay or do not:
    the counters behind the bars (KV blocks, requests running, drafts accepted, steps)."""
    lines = []
    for _key, label, part in _parts(result, "engine", "simulator"):
        s = part["settings"]
        gains = step_gains(part)
        lines.append(f"{label}, each step over the one before: "
                     + ", ".join(f"{n.lstrip('+ ')} {g:.2f}×" for n, g in list(gains.items())[1:]))
        names = list(s)
        if "+ int8 KV cache" in s and names.index("+ int8 KV cache") > 0:
            prev = s[names[names.index("+ int8 KV cache") - 1]]
            now = s["+ int8 KV cache"]
            bound = ("memory no longer limited the batch, so the extra room bought no extra sequences"
                     if now["peak_running"] <= prev["peak_running"] else
                     f"the batch grew from {prev['peak_running']} to {now['peak_running']} at its peak")
            lines.append(f"  int8 KV: {now['kv_blocks'] / prev['kv_blocks']:.1f}× the blocks in the same bytes; "
                         f"{bound}; throughput {gains['+ int8 KV cache']:.2f}×")
        if "+ speculative decoding" in s and names.index("+ speculative decoding") > 0:
            prev = s[names[names.index("+ speculative decoding") - 1]]
            now = s["+ speculative decoding"]
            lines.append(f"  speculation: {now['acceptance_rate']:.0%} of drafts accepted, "
                         f"{prev['steps']:,} -> {now['steps']:,} steps, "
                         f"{now['kv_blocks']:,} KV blocks (the draft's K/V shares the pool); "
                         f"throughput {gains['+ speculative decoding']:.2f}×")
    return lines


def plot(result: dict):
    """Horizontal bars, one panel per half: throughput per setting, the ratio to static batching
    written beside each bar."""
    import matplotlib.pyplot as plt

    parts = [(k, t) for k, t in (("engine", "engine: tiny model, CPU (measured)"),
                                 ("sim", "simulator: Llama-3 70B int4, H100")) if k in result]
    fig, axes = plt.subplots(1, len(parts), figsize=(6.5 * len(parts), 3.8), squeeze=False)
    for ax, (key, title) in zip(axes[0], parts, strict=True):
        s = result[key]["settings"]
        names = list(s)
        values = [s[n]["output_tokens_per_s"] for n in names]
        colors = ["#9e9e9e"] + ["#4c72b0"] * (len(names) - 1)
        bars = ax.barh(range(len(names)), values, color=colors)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_xlabel("output tokens/s")
        ax.set_title(title, fontsize=10)
        ax.set_xlim(0, max(values) * 1.22)
        for bar, n in zip(bars, names, strict=True):
            ax.annotate(f"{s[n]['vs_static']:.1f}×", (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                        xytext=(4, 0), textcoords="offset points", va="center", fontsize=9)
    fig.suptitle("Each bar adds one technique to the one above; × = throughput over static batching",
                 fontsize=10)
    sim = result.get("sim", {})
    caption = ("Same trace and same KV memory in every bar. Without paging, each request reserves the "
               "model's whole context (contiguous KV cache: 2,048 tokens for the tiny model, 8,192 for "
               "Llama-3),\nso static batching gets B = the regions that fit, and continuous batching runs "
               "at most B requests until paging.")
    if sim:
        caption += f" Simulated drafts are accepted with probability {sim['acceptance_rate']} (assumed)."
    fig.text(0.01, 0.01, caption, fontsize=7.5, va="bottom")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def load_record(directory: Path | None = None) -> dict | None:
    """The stored full run (``--store``), or None when there is none."""
    path = (directory or Path(__file__).resolve().parent / "results") / RESULTS_NAME
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small traces, one round (well under a minute)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-requests", type=int, default=None, help="default 128 (quick: 24)")
    ap.add_argument("--sim-requests", type=int, default=None, help="default 2000 (quick: 300)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved engine rounds (default 3; quick: 1)")
    ap.add_argument("--acceptance-rate", type=float, default=ACCEPTANCE_RATE,
                    help="the simulator's chance that a draft is accepted (an assumption)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of every engine (1: the engine's own choice for the tiny model)")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("--plot", type=Path, default=None, help="save the bar chart here (PNG)")
    ap.add_argument("--store", type=Path, default=None, metavar="DIR",
                    help=f"also write DIR/{RESULTS_NAME} (the record notebook 10 reads)")
    args = ap.parse_args(argv)
    command = "python benchmarks/ablation.py" + "".join(f" {a}" for a in argv)
    print(f"$ {command}\n")
    t0 = time.perf_counter()
    result = measure(args.quick, args.seed, args.engine_requests, args.sim_requests, args.rounds,
                     args.acceptance_rate, args.skip_engine, args.skip_sim, args.threads)
    result["command"] = command
    print("\n".join(table(result)))
    print()
    print("\n".join(details(result)))
    print()
    print("\n".join(notes(result)))
    print()
    print("\n".join(verdicts(result)))
    print(f"\n{len(result['settings'])} settings in {time.perf_counter() - t0:.0f} s.")
    for path in [args.json] + ([args.store / RESULTS_NAME] if args.store else []):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result).savefig(args.plot, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
