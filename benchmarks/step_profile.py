"""Where an engine step's time goes: scheduling, building the batch, the model, sampling, output.

Serves one seeded trace (token-id prompts, lognormal lengths, greedy, ``ignore_eos``) on the
real engine and times each phase of every step without touching the engine's methods: the
engine is built with ``engine_core=`` a factory that puts a timing wrapper around its executor
(and, inside the model runner, around the model and the sampler it was given), and a step
listener (``EngineCore.add_step_listener``) reads when each step started and ended:

* ``schedule``         the step's start to the executor's: ``Scheduler.schedule`` (with the KV
                       manager's allocations) and completing the plan
* ``prepare inputs``   the rest of ``ModelRunner.execute``: the flat batch, slots,
                       ``AttentionMetadata``, copy-on-write copies
* ``model forward``    the decoder over the flat batch (attention included)
* ``lm head``          logits for the rows that sample
* ``sample``           the ``Sampler``
* ``update``           the executor's end to the step's: block commits, forks,
                       ``Scheduler.update_from_output`` (tokens appended, stop rules, frees), statistics
* ``outputs``          everything between steps: ``OutputProcessor.process`` (detokenizing,
                       ``RequestOutput``) and ``LLM.generate``'s routing

    python benchmarks/step_profile.py [--requests 128] [--threads 1] [--max-num-seqs 64] [--ops] [--functions]

``--ops`` serves the trace a second time under ``torch.profiler`` and prints the operators that
take the most time (matrix multiplies of the linear layers, attention, the K/V gathers, ...).
``--functions`` serves it under ``cProfile`` and prints the functions with the most time of their
own: minivllm's C++ kernels (``minivllm_cpu_kernels.*``), which are called through pybind and so
are not operators torch.profiler sees, stand there beside ``torch._C._nn.linear`` and the Python.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from minivllm import LLM, SamplingParams
from minivllm.core.engine_core import EngineCore
from minivllm.core.messages import EngineCoreOutputs
from minivllm.workloads import LogNormalLengths, fixed

PROMPT = LogNormalLengths(mean=120, sigma=0.8, low=4, high=400)
OUTPUT = LogNormalLengths(mean=150, sigma=0.8, low=4, high=400)


class _Timed:
    """Calls ``inner`` and adds the seconds it took to ``totals[name]``."""

    def __init__(self, inner, totals: dict[str, float], name: str):
        self.inner, self.totals, self.name = inner, totals, name

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.totals[self.name] += time.perf_counter() - t0


class _TimedModel:
    """The model as the model runner sees it (called, and ``compute_logits``), timed."""

    def __init__(self, model, totals: dict[str, float]):
        self.forward = _Timed(model, totals, "model forward")
        self.compute_logits = _Timed(model.compute_logits, totals, "lm head")

    def __call__(self, *args):
        return self.forward(*args)


class TimedExecutor:
    """The engine's executor, with the times of its last ``execute`` kept (``started``, ``ended``)."""

    def __init__(self, inner, totals: dict[str, float]):
        self.inner, self.totals = inner, totals
        self.started = self.ended = 0.0

    def execute(self, out):
        self.started = time.perf_counter()
        try:
            return self.inner.execute(out)
        finally:
            self.ended = time.perf_counter()
            self.totals["execute"] += self.ended - self.started


def timing_core(totals: dict[str, float]):
    """An ``engine_core=`` factory: minivllm's ``EngineCore`` over a :class:`TimedExecutor`
    around the engine's model runner, whose model and sampler are timed as well."""

    def factory(scheduler, runner, **kwargs) -> EngineCore:
        runner.model = _TimedModel(runner.model, totals)
        runner.sampler = _Timed(runner.sampler, totals, "sample")
        core = EngineCore(scheduler, TimedExecutor(runner, totals), **kwargs)

        def phases(step: EngineCoreOutputs) -> None:
            executor = core.executor
            totals["schedule"] += executor.started - step.start_time
            totals["update"] += step.timestamp - executor.ended
            totals["step"] += step.timestamp - step.start_time

        core.add_step_listener(phases)
        return core

    return factory


def make_trace(n: int, seed: int):
    import random

    rng = random.Random(seed)
    return fixed(PROMPT.sample(rng, n), OUTPUT.sample(rng, n), seed=seed, name="profile")


def warm_engine(requests: int, max_num_seqs: int, seed: int = 0, engine_core=None):
    """An engine warmed up on the trace's first prompts, and the trace's prompts and params."""
    llm = LLM(max_num_seqs=max_num_seqs, max_model_len=1024, cpu_threads=torch.get_num_threads(),
              engine_core=engine_core)
    vocab = llm.engine.model_config.vocab_size
    trace = make_trace(requests, seed)
    prompts = [it.prompt_token_ids(vocab) for it in trace]
    params = [SamplingParams(temperature=0, max_tokens=it.output_len, ignore_eos=True) for it in trace]
    llm.generate(prompts[:8], params[:8], use_tqdm=False)  # warm-up
    return llm, prompts, params


def profile(requests: int, max_num_seqs: int, seed: int = 0) -> tuple[dict[str, float], float, int]:
    """Seconds per phase over the trace (the warm-up not counted), the wall time, the tokens."""
    totals: dict[str, float] = defaultdict(float)
    llm, prompts, params = warm_engine(requests, max_num_seqs, seed, engine_core=timing_core(totals))
    totals.clear()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    inside = totals["model forward"] + totals["lm head"] + totals["sample"]
    totals["prepare inputs"] = totals.pop("execute") - inside
    totals["outputs"] = wall - totals["step"]
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


def function_profile(requests: int, max_num_seqs: int, seed: int = 0, top: int = 12) -> str:
    """The same trace under ``cProfile``: a table of the functions with the most time of their own."""
    import cProfile
    import pstats

    llm, prompts, params = warm_engine(requests, max_num_seqs, seed)
    profiler = cProfile.Profile()
    profiler.enable()
    llm.generate(prompts, params, use_tqdm=False)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, primitive calls, own, cumulative, callers)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])
    total = sum(v[2] for v in stats.values())
    lines = ["| function | calls | own time (s) | share of all |", "|---|---:|---:|---:|"]
    for (file, line, name), (calls, _, own, _, _) in rows[:top]:
        where = name if file == "~" else f"{Path(file).name}:{line} {name}"
        lines.append(f"| `{where}` | {calls} | {own:.2f} | {own / total:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", action="store_true", help="also: the top operators under torch.profiler")
    ap.add_argument("--functions", action="store_true", help="also: the top functions under cProfile")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"$ python benchmarks/step_profile.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    totals, wall, tokens = profile(args.requests, args.max_num_seqs, args.seed)
    totals.pop("step")
    forward = totals["model forward"]
    print(f"{args.requests} requests, {tokens} output tokens in {wall:.2f} s = {tokens / wall:,.0f} tok/s; "
          f"torch threads {torch.get_num_threads()}\n")
    print("| phase | seconds | share of the time |")
    print("|---|---:|---:|")
    for name, secs in sorted(totals.items(), key=lambda r: -r[1]):
        print(f"| {name} | {secs:.2f} | {secs / wall:.1%} |")
    print(f"| **all** | {wall:.2f} | 100% |")
    print(f"\nmodel forward is {forward / wall:.0%} of the time; everything around it "
          f"{1 - forward / wall:.0%}")
    if args.ops:
        print("\ntorch.profiler, the same trace again (operators' self time, the profiler's own cost "
              "included):\n")
        print(op_profile(args.requests, args.max_num_seqs, args.seed))
    if args.functions:
        print("\ncProfile, the same trace again (each function's own time, the profiler's cost included):\n")
        print(function_profile(args.requests, args.max_num_seqs, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
