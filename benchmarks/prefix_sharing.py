"""Prefix caching and copy-on-write sharing, measured on the real engine with the tiny model.

Part 1: 64 requests share a 512-token system prompt, each with its own question. The same
requests run with and without prefix caching, in one run: prompt tokens actually computed,
KV blocks in use (peak), time to first token, hit rate.

Part 2: memory saved by sharing blocks between sequences of one request: parallel sampling
(n=4, forked after one prefill) and beam search (width 4). Saving = 1 - physical blocks in use
/ blocks referenced by block tables (what the sequences would need without sharing), averaged
over steps and at the peak. The vLLM paper (Kwon et al. 2023, section 6.3) reports 6.1-9.8%
for parallel sampling and 37.6-55.2% for beam search on its traces (Alpaca/ShareGPT, OPT-13B);
the figures here are for short tiny-model prompts, so they differ.

    python benchmarks/prefix_sharing.py [--requests 64] [--system-tokens 512]
"""

from __future__ import annotations

import argparse
import sys
import time

from minivllm import LLM, BeamSearchParams, SamplingParams
from minivllm.engine.core_client import local_core

SYSTEM_TEXT = (
    "You are a patient storyteller for children. You answer every question with a short, kind "
    "story about animals who live near the river and the old forest. "
)
ANIMALS = ["fox", "owl", "rabbit", "bear", "duck", "mouse", "frog", "deer"]
PLACES = ["river", "forest", "hill", "garden", "lake", "meadow", "barn", "cave"]


def system_prompt(llm: LLM, n_tokens: int) -> list[int]:
    ids = llm.tokenizer(SYSTEM_TEXT).input_ids
    body = llm.tokenizer(SYSTEM_TEXT, add_special_tokens=False).input_ids
    while len(ids) < n_tokens:
        ids += body
    return ids[:n_tokens]


def question(llm: LLM, i: int) -> list[int]:
    text = f" Question {i}: what did the {ANIMALS[i % 8]} find near the {PLACES[(i // 8) % 8]}?"
    return llm.tokenizer(text, add_special_tokens=False).input_ids


def make_llm(make_kv=None, caching: bool = True, **engine_args) -> LLM:
    """minivllm's own KV manager, or ``make_kv(caching)`` (a plug-in, e.g. exercise 07's) over a
    pool of the same size."""
    if make_kv is None:
        return LLM(enable_prefix_caching=caching, **engine_args)
    blocks = local_core(LLM(**engine_args)).kv.num_blocks  # the default pool for this model
    return LLM(kv_cache=make_kv(blocks, caching), **engine_args)


def sharing_part(args, make_kv=None) -> list[str]:
    """``make_kv(num_blocks, caching)``: a KV cache manager to measure instead of minivllm's."""
    rows = ["| prefix caching | prompt tokens computed | peak KV blocks in use | mean TTFT (s) | hit rate | wall (s) |",
            "|---|---:|---:|---:|---:|---:|"]
    results = {}
    for caching in (False, True):
        llm = make_llm(make_kv, caching, max_num_seqs=args.requests)
        sys_ids = system_prompt(llm, args.system_tokens)
        prompts = [sys_ids + question(llm, i) for i in range(args.requests)]
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
        # the first request warms the cache, as a long-running server's would be
        llm.generate(prompts[:1], params, use_tqdm=False)
        llm.reset_stats()
        t0 = time.perf_counter()
        llm.generate(prompts[1:], params, use_tqdm=False)
        wall = time.perf_counter() - t0
        s = llm.stats().summary()
        results[caching] = s
        rows.append(f"| {'on' if caching else 'off'} | {s['prefill_tokens']} | {s['peak_kv_blocks_used']} "
                    f"| {s['mean_ttft_s']:.3f} | {s['prefix_hit_rate']:.1%} | {wall:.1f} |")
    off, on = results[False], results[True]
    rows.append("")
    rows.append(f"prompt tokens computed: {on['prefill_tokens'] / off['prefill_tokens']:.1%} of the uncached run; "
                f"peak blocks: {on['peak_kv_blocks_used'] / off['peak_kv_blocks_used']:.1%}; "
                f"mean TTFT: {off['mean_ttft_s'] / on['mean_ttft_s']:.1f}x faster with caching")
    return rows


def saving(stats) -> tuple[float, float]:
    steps = [s for s in stats.steps if s.kv_blocks_referenced]
    mean = 1 - sum(s.kv_blocks_used for s in steps) / sum(s.kv_blocks_referenced for s in steps)
    peak = max(steps, key=lambda s: s.kv_blocks_referenced)
    return mean, 1 - peak.kv_blocks_used / peak.kv_blocks_referenced


def fork_part(args, make_kv=None) -> list[str]:
    rows = ["| workload | KV memory saved (mean over steps) | saved at the peak | vLLM paper |", "|---|---:|---:|---:|"]
    llm = make_llm(make_kv, caching=False)
    # prompts of ~160 tokens: a shortened system prompt and a story opening
    head = system_prompt(llm, 150)
    texts = [head + llm.tokenizer(f" Once upon a time, a little {a} lived near the {p}.",
                                  add_special_tokens=False).input_ids for a, p in zip(ANIMALS, PLACES)]
    llm.generate(texts, SamplingParams(n=4, temperature=1.0, max_tokens=args.max_tokens, seed=0), use_tqdm=False)
    mean, peak = saving(llm.stats())
    rows.append(f"| parallel sampling n=4 | {mean:.1%} | {peak:.1%} | 6.1-9.8% |")
    llm = make_llm(make_kv, caching=False)
    llm.beam_search(texts, BeamSearchParams(beam_width=4, max_tokens=args.max_tokens))
    mean, peak = saving(llm.stats())
    rows.append(f"| beam search width 4 | {mean:.1%} | {peak:.1%} | 37.6-55.2% |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--system-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    print(f"$ python benchmarks/prefix_sharing.py {' '.join(sys.argv[1:] if argv is None else argv)}\n")
    print(f"{args.requests} requests: the same {args.system_tokens}-token system prompt + a distinct question, "
          f"{args.max_tokens} greedy tokens each (the first request runs before timing, as a warm server's would)\n")
    print("\n".join(sharing_part(args)))
    print()
    print("\n".join(fork_part(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
