"""Where an engine step's time goes: scheduling, building the batch, the model, sampling, output.

Serves one seeded trace (token-id prompts, lognormal lengths, greedy, ``ignore_eos``) on the
real engine and times each phase of every step by wrapping the engine's own methods:

* ``schedule``         ``Scheduler.schedule`` (with the KV manager's allocations)
* ``prepare inputs``   ``ModelRunner.prepare_inputs`` (flat batch, slots, ``AttentionMetadata``)
* ``model forward``    the decoder over the flat batch (attention included)
* ``lm head``          logits for the rows that sample
* ``sample``           ``Sampler.__call__``
* ``update``           ``Scheduler.update_from_output`` (tokens appended, stop rules, frees)
* ``outputs``          ``OutputProcessor.process`` (detokenizing, ``RequestOutput``)

"other" is the rest of ``LLMEngine.step`` (the step loop, statistics, block commits).

    python benchmarks/step_profile.py [--requests 128] [--threads 1] [--max-num-seqs 64] [--ops]

``--ops`` serves the trace a second time under ``torch.profiler`` and prints the operators that
take the most time (matrix multiplies of the linear layers, attention, the K/V gathers, ...).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections import defaultdict

import torch

from minivllm import LLM, SamplingParams
from minivllm.workloads import LogNormalLengths, fixed

PROMPT = LogNormalLengths(mean=120, sigma=0.8, low=4, high=400)
OUTPUT = LogNormalLengths(mean=150, sigma=0.8, low=4, high=400)


def timed(totals: dict, name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - t0

    return wrapper


def instrument(llm: LLM) -> dict[str, float]:
    """Wrap the engine's phases (instance attributes shadow the methods) and return the totals."""
    totals: dict[str, float] = defaultdict(float)
    e = llm.engine
    e.scheduler.schedule = timed(totals, "schedule", e.scheduler.schedule)
    e.scheduler.update_from_output = timed(totals, "update", e.scheduler.update_from_output)
    e.runner.prepare_inputs = timed(totals, "prepare inputs", e.runner.prepare_inputs)
    e.runner.sampler = _TimedSampler(e.runner.sampler, totals)
    e.model.compute_logits = timed(totals, "lm head", e.model.compute_logits)
    forward = e.model.forward
    e.model.forward = timed(totals, "model forward", forward)
    e.output_processor.process = timed(totals, "outputs", e.output_processor.process)
    e.step = timed(totals, "step", e.step)
    return totals


class _TimedSampler:
    def __init__(self, inner, totals):
        self.inner, self.totals = inner, totals

    def __call__(self, logits, requests):
        t0 = time.perf_counter()
        try:
            return self.inner(logits, requests)
        finally:
            self.totals["sample"] += time.perf_counter() - t0


def make_trace(n: int, seed: int):
    import random

    rng = random.Random(seed)
    return fixed(PROMPT.sample(rng, n), OUTPUT.sample(rng, n), seed=seed, name="profile")


def warm_engine(requests: int, max_num_seqs: int, seed: int = 0):
    """An engine warmed up on the trace's first prompts, and the trace's prompts and params."""
    llm = LLM(max_num_seqs=max_num_seqs, max_model_len=1024, cpu_threads=torch.get_num_threads())
    vocab = llm.engine.model_config.vocab_size
    trace = make_trace(requests, seed)
    prompts = [it.prompt_token_ids(vocab) for it in trace]
    params = [SamplingParams(temperature=0, max_tokens=it.output_len, ignore_eos=True) for it in trace]
    llm.generate(prompts[:8], params[:8], use_tqdm=False)  # warm-up
    return llm, prompts, params


def profile(requests: int, max_num_seqs: int, seed: int = 0) -> tuple[dict[str, float], float, int]:
    llm, prompts, params = warm_engine(requests, max_num_seqs, seed)
    totals = instrument(llm)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    return totals, wall, sum(len(o.outputs[0].token_ids) for o in outs)


def op_profile(requests: int, max_num_seqs: int, seed: int = 0, top: int = 12) -> str:
    """The same trace under ``torch.profiler``: a table of the operators with the most self time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    llm, prompts, params = warm_engine(requests, max_num_seqs, seed)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        llm.generate(prompts, params, use_tqdm=False)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    lines = ["| operator | calls | self time (s) | share of all operator time |", "|---|---:|---:|---:|"]
    for e in events[:top]:
        lines.append(f"| `{e.key}` | {e.count} | {e.self_cpu_time_total / 1e6:.2f} | "
                     f"{e.self_cpu_time_total / total:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", action="store_true", help="also: the top operators under torch.profiler")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"$ python benchmarks/step_profile.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    totals, wall, tokens = profile(args.requests, args.max_num_seqs, args.seed)
    step = totals.pop("step")
    forward = totals["model forward"]
    rows = [(k, v) for k, v in totals.items()]
    rows.append(("other", step - sum(totals.values())))
    print(f"{args.requests} requests, {tokens} output tokens in {wall:.2f} s = {tokens / wall:,.0f} tok/s; "
          f"torch threads {torch.get_num_threads()}\n")
    print("| phase | seconds | share of step time |")
    print("|---|---:|---:|")
    for name, secs in sorted(rows, key=lambda r: -r[1]):
        print(f"| {name} | {secs:.2f} | {secs / step:.1%} |")
    print(f"| **all steps** | {step:.2f} | 100% |")
    print(f"\nmodel forward is {forward / step:.0%} of the step; everything around it "
          f"{1 - forward / step:.0%}")
    if args.ops:
        print("\ntorch.profiler, the same trace again (operators' self time, the profiler's own cost "
              "included):\n")
        print(op_profile(args.requests, args.max_num_seqs, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
