"""How many times each kind of step would make the host wait for a GPU, counted on any machine.

Serves a few prompts (greedy and seeded sampling) through each configuration -- plain, 8-bit
KV cache, chunked prefill, n-gram and draft-model speculation -- one step at a time under
:class:`minivllm.engine.host_syncs.HostSyncCounter`, and prints per step kind the most syncs any
step of that kind made, and where they come from (``file:line``).

    python benchmarks/host_syncs.py [--sites]

``tests/engine/test_host_syncs.py`` holds a plain decode step to ``DECODE_SYNC_BUDGET``;
``scripts/gpu_check.sh`` counts the real ones on a GPU (``tests/engine/test_gpu_device.py``).
"""

from __future__ import annotations

import argparse
from collections import Counter

from minivllm import LLM, TINY_DRAFT_MODEL_DIR, SamplingParams
from minivllm.engine.host_syncs import count_step_syncs

PROMPTS = ["Once upon a time", "The little fox went to the forest and", "Mia had a red ball. " * 6,
           "One sunny day, Leo"]
PARAMS = {
    "greedy": SamplingParams(max_tokens=10, temperature=0, ignore_eos=True),
    "sampled": SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, top_k=20, seed=3, ignore_eos=True),
}
CONFIGS = {
    "plain": {},
    "int8 KV": {"kv_cache_dtype": "int8"},
    "chunked (24-token budget)": {"max_num_batched_tokens": 24},
    "n-gram, k = 3": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
    "draft model, k = 3": {"speculative_config": {"model": TINY_DRAFT_MODEL_DIR, "num_speculative_tokens": 3}},
}
KINDS = ("prefill", "mixed", "decode", "speculative")


def measure(args: dict, params: SamplingParams) -> tuple[dict[str, int], dict[str, Counter]]:
    """Step kind -> the most syncs of a step of that kind, and the sites of that step."""
    sites: dict[str, Counter] = {}
    counts = count_step_syncs(LLM(engine_core_process=False, seed=0, **args), PROMPTS, params, sites)
    return {kind: max(steps) for kind, steps in counts.items()}, sites


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", action="store_true", help="print where each step kind's syncs come from")
    opts = parser.parse_args()
    print("| configuration | sampling | " + " | ".join(KINDS) + " |")
    print("|---|---|" + "---|" * len(KINDS))
    details = []
    for name, args in CONFIGS.items():
        for pname, params in PARAMS.items():
            most, sites = measure(args, params)
            print(f"| {name} | {pname} | " + " | ".join(str(most[k]) if k in most else "-" for k in KINDS) + " |")
            details.extend((name, pname, kind, sites[kind]) for kind in KINDS if kind in sites)
    if opts.sites:
        for name, pname, kind, where in details:
            print(f"\n{name}, {pname}, {kind}:")
            for site, n in where.most_common():
                print(f"  {n} x {site}")


if __name__ == "__main__":
    main()
