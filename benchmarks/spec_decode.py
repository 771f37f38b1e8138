"""Speculative decoding on the real engine with the tiny model: what drafts buy, and where not.

Every configuration serves the same greedy requests (prompts: the openings of held-out stories
of the tiny model's corpus), side by side in one run, in interleaved rounds; the figure is the
median over rounds of output tokens per second, and the speed-up is against no speculation in
the same round. Two loads:

* **batch 1**: one request at a time (what a single user sees: decode is one sequence per step);
* **saturated**: all requests at once (the engine's batch is as full as it gets).

Per configuration: the acceptance rate (accepted / verified drafts), the mean accepted length
(tokens a sequence gains per verification: accepted drafts + the token after them), output tokens
per engine step, the share of the engine's step time spent proposing drafts, and tokens per
second. Greedy output is checked to be identical to no
speculation for every configuration (a mismatch is an error).

    python benchmarks/spec_decode.py [--requests 48] [--max-tokens 128] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import minivllm  # noqa: E402
from minivllm import LLM, SamplingParams  # noqa: E402
from minivllm.attention import torch_ragged  # noqa: E402
from minivllm.engine.core_client import local_core

CONFIGS = {
    "none": None,
    "ngram k=4": {"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": None, "prompt_lookup_min": 2},
    "draft k=2": {"model": str(minivllm.TINY_DRAFT_MODEL_DIR), "num_speculative_tokens": 2, "disable_by_batch_size": None},
    "draft k=4": {"model": str(minivllm.TINY_DRAFT_MODEL_DIR), "num_speculative_tokens": 4, "disable_by_batch_size": None},
    "draft k=8": {"model": str(minivllm.TINY_DRAFT_MODEL_DIR), "num_speculative_tokens": 8, "disable_by_batch_size": None},
    # the engine's default rule: no drafts in a step of more than CPU_DISABLE_BY_BATCH_SIZE requests
    "draft k=4, auto": {"model": str(minivllm.TINY_DRAFT_MODEL_DIR), "num_speculative_tokens": 4},
    "ngram k=4, auto": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2},
    # the same, with verification rows attended one sequence at a time (as prompts are) instead
    # of batched like decodes: what the ragged backend's batching of short queries buys
    "draft k=4, unbatched": {"model": str(minivllm.TINY_DRAFT_MODEL_DIR), "num_speculative_tokens": 4, "disable_by_batch_size": None},
}
UNBATCHED = ", unbatched"


def story_prompts(n: int, words: int = 12) -> list[str]:
    """The first ``words`` words of ``n`` held-out stories (never seen in training)."""
    from draft_agreement import heldout_stories

    return [" ".join(story.split()[:words]) for story in heldout_stories(n)]


class ProposalTimer:
    """Time spent proposing drafts (the draft model's passes, or the n-gram lookup), measured
    around the model runner's ``SpeculativeDecoder.propose``."""

    def __init__(self, llm: LLM):
        self.seconds = 0.0
        decoder = local_core(llm).executor.speculative
        if decoder is not None:
            inner = decoder.propose

            def timed(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return inner(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - start

            decoder.propose = timed


def run(llm: LLM, prompts: list[str], params: SamplingParams, one_at_a_time: bool,
        timer: ProposalTimer) -> tuple[list, float, dict]:
    llm.reset_stats()
    timer.seconds = 0.0
    start = time.perf_counter()
    if one_at_a_time:
        outs = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
    else:
        outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    summary = llm.stats().summary()
    summary["proposal_share"] = timer.seconds / summary["total_time_s"]
    return [o.outputs[0].token_ids for o in outs], wall, summary


def measure(configs: dict = CONFIGS, requests: int = 48, batch1_requests: int = 6, max_tokens: int = 128,
            rounds: int = 3, **engine_args) -> dict:
    """``{config: {load: {...figures}}}`` for ``load`` in ("batch 1", "saturated")."""
    prompts = story_prompts(requests)
    loads = {"batch 1": (prompts[:batch1_requests], True), "saturated": (prompts, False)}
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    engines = {name: LLM(minivllm.TINY_MODEL_DIR, speculative_config=cfg, **engine_args)
               for name, cfg in configs.items()}
    timers = {name: ProposalTimer(llm) for name, llm in engines.items()}
    for llm in engines.values():  # warm-up
        llm.generate(prompts[:4], params, use_tqdm=False)
    walls = {(name, load): [] for name in engines for load in loads}
    batched = torch_ragged.MAX_BATCHED_QUERY_LEN
    figures: dict = {name: {} for name in engines}
    reference: dict = {}
    for _ in range(rounds):
        for load, (batch, one) in loads.items():
            for name, llm in engines.items():
                torch_ragged.MAX_BATCHED_QUERY_LEN = 1 if name.endswith(UNBATCHED) else batched
                try:
                    tokens, wall, summary = run(llm, batch, params, one, timers[name])
                finally:
                    torch_ragged.MAX_BATCHED_QUERY_LEN = batched
                if name == "none":
                    reference[load] = tokens
                elif tokens != reference[load]:
                    raise AssertionError(f"{name}: greedy output differs from no speculation ({load})")
                walls[(name, load)].append(wall)
                figures[name][load] = {
                    "output_tokens": summary["output_tokens"],
                    "acceptance_rate": summary["spec_acceptance_rate"],
                    "mean_accepted_length": summary["spec_mean_accepted_length"],
                    "tokens_per_step": summary["output_tokens_per_step"],
                    "proposal_share": summary["proposal_share"],
                }
    for name in engines:
        for load in loads:
            f = figures[name][load]
            f["wall_s"] = statistics.median(walls[(name, load)])
            f["tokens_per_s"] = f["output_tokens"] / f["wall_s"]
            f["speedup"] = statistics.median(
                b / w for w, b in zip(walls[(name, load)], walls[("none", load)], strict=True))
    return figures


def table(figures: dict) -> list[str]:
    rows = ["| drafts | load | acceptance | mean accepted length | tokens / step | proposing (share of step time) "
            "| output tok/s | speed-up |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, loads in figures.items():
        for load, f in loads.items():
            acc = "—" if f["acceptance_rate"] != f["acceptance_rate"] else f"{f['acceptance_rate']:.1%}"
            length = "—" if f["mean_accepted_length"] != f["mean_accepted_length"] else f"{f['mean_accepted_length']:.2f}"
            rows.append(f"| {name} | {load} | {acc} | {length} | {f['tokens_per_step']:.2f} | "
                        f"{f['proposal_share']:.0%} | {f['tokens_per_s']:.0f} | {f['speedup']:.2f}x |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=48, help="requests of the saturated load")
    ap.add_argument("--batch1-requests", type=int, default=6, help="requests served one at a time")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    configs = {name: CONFIGS[name] for name in dict.fromkeys(["none", *args.configs])}
    figures = measure(configs, args.requests, args.batch1_requests, args.max_tokens, args.rounds)
    print("\n".join(table(figures)))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
