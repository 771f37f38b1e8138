"""Decode through captured CUDA graphs against the eager forward, on a GPU.

    python benchmarks/graph_decode.py [--batches 1 8 32] [--tokens 64]

For each batch: the tiny model serves ``batch`` requests (16-token prompts, ``--tokens`` greedy
output tokens, ``ignore_eos``) twice, with ``cuda_graphs=False`` and ``cuda_graphs=True``
(``minivllm/engine/graph_decode.py``: the decode forward captured once per batch bucket, then
replayed). Prints the time of each (after a warm-up run that compiles and captures), the
speed-up, and whether every request's tokens are identical. A graph replays the same kernels on
the same buffers, so the tokens should be identical; the one thing that may differ is the
split-KV choice (a bucket decides it from ``max_model_len``, the eager step from the step's
longest sequence), which reorders a sum: then the first differing token is printed.
Prediction (docs/benchmarks.md, from benchmarks/host_cost.py): where the eager step is
launch-bound the speed-up approaches host time / device time; the tiny model is launch-bound
at every batch here. Without CUDA: prints SKIPPED and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def serve(llm, batch: int, params) -> tuple[float, list[list[int]]]:
    prompts = [{"prompt_token_ids": [(7 * i + j) % 500 + 3 for j in range(16)]} for i in range(batch)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, [list(o.outputs[0].token_ids) for o in outs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device (the graphs are captured on a GPU)")
        return 0
    from minivllm import LLM, SamplingParams

    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    engines = {flag: LLM(attention_backend="triton", cuda_graphs=flag, max_num_seqs=max(args.batches),
                         max_model_len=256) for flag in (False, True)}
    print(f"{torch.cuda.get_device_name()}: tiny model, {args.tokens} tokens per request")
    print("batch   eager s  graphs s  speed-up  tokens")
    all_same = True
    for batch in args.batches:
        times, tokens = {}, {}
        for flag, llm in engines.items():
            serve(llm, batch, params)  # warm-up: compile, capture the buckets it reaches
            times[flag], tokens[flag] = serve(llm, batch, params)
        same = tokens[True] == tokens[False]
        all_same &= same
        note = "identical" if same else "DIFFER"
        if not same:
            i = next(i for i, (a, b) in enumerate(zip(tokens[False], tokens[True], strict=True)) if a != b)
            j = next((j for j, (a, b) in enumerate(zip(tokens[False][i], tokens[True][i])) if a != b), None)
            note += f" (request {i}, first at token {j})"
        print(f"{batch:>5} {times[False]:>9.3f} {times[True]:>9.3f} {times[False] / times[True]:>8.2f}x  {note}")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
