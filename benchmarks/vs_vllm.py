"""minivllm beside the real vLLM (its CPU build): one trace, both engines, one machine, one run.

The same seeded trace of token-id prompts (lognormal lengths, prompts and outputs up to 400
tokens) is served by

1. minivllm, in this process: ``LLM(max_num_seqs=64, max_model_len=1024)``;
2. vLLM's CPU build, in a subprocess started with ``--vllm-python`` (an interpreter of the
   virtualenv made by ``scripts/setup_vllm_venv.sh``), which runs ``benchmarks/vllm_driver.py``:
   the trace goes there as JSON and the output token ids and timings come back as JSON.

Both load the shipped tiny model (fp32), run every request greedy with ``ignore_eos`` so it
produces exactly its trace output length, and are warmed up by a short ``generate`` that is not
timed. The script prints both output-token throughputs, their ratio, and how many outputs are
token-for-token identical (greedy decoding of the same fp32 model should agree; a difference
names the first request and token where they part).

``--repeats N`` runs N rounds (minivllm, then vLLM, fresh engines each time) and reports the
best throughput of each: on a machine shared with other work, the best round is the one least
disturbed. ``--busy`` runs a competing CPU-bound process (a torch matmul loop) through each
engine's whole run, to see how each engine copes with a machine it does not have to itself.

    python benchmarks/vs_vllm.py --vllm-python ~/.cache/minivllm/vllm-venv/bin/python
        [--num-requests 128] [--max-num-seqs 64] [--seed 0] [--threads N] [--vllm-threads N]
        [--vllm-multiprocessing] [--busy] [--busy-threads 2] [--repeats 1] [--profile] [--quick]
        [--equal-threads]   # each engine's default threads, 1 vs 1 and 2 vs 2, in one run

Without ``--vllm-python``, or when vLLM does not import with that interpreter, it says so and
exits with status 0 (the comparison is optional; nothing else needs vLLM).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

import minivllm
from minivllm import LLM, SamplingParams
from minivllm.engine.cpu_threads import machine_cpu_seconds
from minivllm.model import ModelConfig
from minivllm.workloads import LogNormalLengths, Trace, chat

DRIVER = Path(__file__).with_name("vllm_driver.py")
TORCH_DEFAULT_THREADS = torch.get_num_threads()  # before --threads changes it
MAX_MODEL_LEN = 1024
# Chat-shaped lengths (as in benchmarks/throughput.py), clipped so that prompt + output <= 800
# fits max_model_len with room to spare.
PROMPT = LogNormalLengths(mean=64, sigma=0.8, low=4, high=400)
OUTPUT = LogNormalLengths(mean=128, sigma=0.9, low=4, high=400)
# --quick: a few short requests, enough to exercise every path in seconds.
QUICK_REQUESTS = 8
QUICK_PROMPT = LogNormalLengths(mean=24, sigma=0.6, low=4, high=64)
QUICK_OUTPUT = LogNormalLengths(mean=12, sigma=0.6, low=2, high=32)
# Warm-up: the first requests of the trace, a few tokens each, not timed.
WARMUP_REQUESTS = 2
WARMUP_MAX_TOKENS = 8

NO_VLLM_PYTHON = (
    "SKIPPED: no --vllm-python given. To compare with vLLM, install its CPU build into a "
    "separate virtualenv with `scripts/setup_vllm_venv.sh [VENV_DIR]` and pass the python it "
    "prints: python benchmarks/vs_vllm.py --vllm-python VENV_DIR/bin/python"
)

# A competing CPU-bound process for --busy: square a matrix until stopped, or until its parent
# is gone (so a benchmark killed mid-run leaves nothing spinning). torch is the course's own
# dependency, so this needs nothing new; argv: its thread count, the benchmark's pid.
BUSY_LOOP = """
import os, sys, torch
torch.set_num_threads(int(sys.argv[1]))
a = torch.randn(384, 384)
while os.getppid() == int(sys.argv[2]):
    b = a @ a
"""


@dataclass
class EngineRun:
    """One engine's side of the comparison."""

    engine: str  # e.g. "minivllm 0.1.0"
    threads: str  # how many cores it computed on, and why (printed as recorded)
    load_s: float  # building the engine (model load, KV-cache allocation)
    warmup_s: float
    elapsed_s: float  # the timed generate() of the whole trace
    outputs: list[list[int]]  # generated token ids, in trace order
    load_average: float  # 1-minute load average just before the engine started
    other_cores: float | None = None  # cores other processes kept busy meanwhile (CpuMeter)
    competitor_cores: float | None = None  # cores the --busy competitor got meanwhile
    profile: str | None = None  # where the timed generate's time went (--profile)

    def output_tokens_per_s(self) -> float:
        return sum(len(o) for o in self.outputs) / self.elapsed_s


@dataclass
class Mismatch:
    """Where two engines' outputs first part: request ``index``, output token ``position``."""

    index: int
    position: int
    ours: int | None  # None: that output ended before ``position``
    theirs: int | None


# --- how busy the machine was --------------------------------------------------------------
def own_cpu_seconds() -> float:
    """CPU seconds of this process (all its threads) and of its children that have exited."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds a running process has used (user + system), from ``/proc/<pid>/stat``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class CpuMeter:
    """How many cores, on average over a stretch of wall time, other processes kept busy and
    how many the ``--busy`` competitor (a running child, pid ``competitor``) got.

    others = (machine CPU time - this benchmark's CPU time - the competitor's) / wall time.
    Each figure is None where ``/proc`` does not exist.
    """

    def __init__(self, competitor: int | None = None) -> None:
        self.competitor = competitor
        self.start = self._sample()

    def _sample(self) -> tuple[float | None, float, float | None, float]:
        mine = process_cpu_seconds(self.competitor) if self.competitor else 0.0
        return machine_cpu_seconds(), own_cpu_seconds(), mine, time.perf_counter()

    def stop(self) -> tuple[float | None, float | None]:
        """(cores used by other processes, cores the competitor got) since construction."""
        machine1, own1, comp1, wall1 = self._sample()
        machine0, own0, comp0, wall0 = self.start
        wall = wall1 - wall0
        if comp0 is None or comp1 is None or machine0 is None or machine1 is None:
            return None, None
        competitor = (comp1 - comp0) / wall
        others = max(0.0, (machine1 - machine0) - (own1 - own0) - (comp1 - comp0)) / wall
        return others, (competitor if self.competitor else None)


def measured(run: Callable[[], EngineRun], busy_threads: int | None) -> EngineRun:
    """``run()`` with the competitor going (if any), and the CPU use around it recorded."""
    with busy_cpu(busy_threads) as competitor:
        meter = CpuMeter(competitor.pid if competitor else None)
        result = run()
        result.other_cores, result.competitor_cores = meter.stop()
    return result


# --- the trace, as both engines receive it ------------------------------------------------
def build_trace(num_requests: int, seed: int, quick: bool) -> Trace:
    if quick:
        return chat(QUICK_REQUESTS, seed=seed, prompt=QUICK_PROMPT, output=QUICK_OUTPUT,
                    name="vsvllm")
    if num_requests < WARMUP_REQUESTS:
        raise ValueError(f"--num-requests must be >= {WARMUP_REQUESTS}, got {num_requests}")
    return chat(num_requests, seed=seed, prompt=PROMPT, output=OUTPUT, name="vsvllm")


def trace_request(trace: Trace, model_dir: str, vocab_size: int, max_num_seqs: int) -> dict:
    """The JSON document both engines run from (the format ``vllm_driver.py`` reads)."""
    return {
        "model": str(model_dir),
        "prompts": [it.prompt_token_ids(vocab_size) for it in trace],
        "max_tokens": [it.output_len for it in trace],
        "warmup_requests": WARMUP_REQUESTS,
        "warmup_max_tokens": WARMUP_MAX_TOKENS,
        "llm_args": {
            "dtype": "float32",
            "enforce_eager": True,  # no torch.compile: both engines run eager PyTorch
            "max_model_len": MAX_MODEL_LEN,
            "max_num_seqs": max_num_seqs,
        },
    }


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


# --- minivllm, in this process ------------------------------------------------------------
def profile_summary(profiler: cProfile.Profile, elapsed_s: float, top: int = 8) -> str:
    """Where minivllm's timed generate went: attention (everything under minivllm/attention,
    counted from its outermost calls), the linear layers, and the top functions by own time."""
    # (file, line, name) -> (primitive calls, calls, own time, cumulative time, callers)
    stats = pstats.Stats(profiler).stats
    attention = max((cum for (file, _, _), (_, _, _, cum, _) in stats.items()
                     if f"minivllm{os.sep}attention{os.sep}" in file), default=0.0)
    linear = sum(tot for (_, _, name), (_, _, tot, _, _) in stats.items()
                 if name == "<built-in method torch._C._nn.linear>")
    lines = [f"minivllm profile of the timed generate ({elapsed_s:.2f} s with cProfile on): "
             f"attention {attention:.2f} s ({attention / elapsed_s:.0%}), "
             f"linear layers {linear:.2f} s ({linear / elapsed_s:.0%}); most own time:"]
    ranked = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    for (file, line, name), (_, calls, tot, _, _) in ranked:
        where = name if file == "~" else f"{Path(file).name}:{line}({name})"
        lines.append(f"  {tot:6.2f} s  {calls:7d} calls  {where}")
    return "\n".join(lines)


def run_minivllm(request: dict, threads: int | None, profile: bool = False) -> EngineRun:
    torch.set_num_threads(TORCH_DEFAULT_THREADS)
    load_average = os.getloadavg()[0]
    args = request["llm_args"]
    t0 = time.perf_counter()
    llm = LLM(request["model"], dtype=args["dtype"], max_model_len=args["max_model_len"],
              max_num_seqs=args["max_num_seqs"], cpu_threads=threads)
    load_s = time.perf_counter() - t0

    prompts = request["prompts"]
    t0 = time.perf_counter()
    llm.generate(prompts[: request["warmup_requests"]], greedy(request["warmup_max_tokens"]),
                 use_tqdm=False)
    warmup_s = time.perf_counter() - t0

    params = [greedy(n) for n in request["max_tokens"]]
    profiler = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    outs = llm.generate(prompts, params, use_tqdm=False)
    if profiler is not None:
        profiler.disable()
    elapsed_s = time.perf_counter() - t0

    used = torch.get_num_threads()
    how = ("the engine's choice for this model" if threads is None
           else f"--threads {threads}; torch's default {TORCH_DEFAULT_THREADS}")
    return EngineRun(
        engine=f"minivllm {minivllm.__version__}",
        threads=f"{plural(used, 'torch thread')} ({how})",
        load_s=load_s, warmup_s=warmup_s, elapsed_s=elapsed_s,
        outputs=[list(o.outputs[0].token_ids) for o in outs], load_average=load_average,
        profile=None if profiler is None else profile_summary(profiler, elapsed_s),
    )


# --- vLLM, in its own interpreter ---------------------------------------------------------
def vllm_env(threads: int | None, multiprocessing: bool) -> dict[str, str]:
    """The environment the vLLM subprocess runs in: ours, minus what minivllm set for itself."""
    env = dict(os.environ)
    # minivllm switches Triton to its interpreter on CPU machines; vLLM must run as it would
    # on its own.
    env.pop("TRITON_INTERPRET", None)
    env["HF_HUB_OFFLINE"] = "1"  # a local model directory: never look anything up
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def probe_vllm(python: str, env: dict[str, str]) -> tuple[str | None, str]:
    """(vLLM's version, "") when ``import vllm`` works with ``python``, else (None, why)."""
    try:
        done = subprocess.run(
            [python, "-c", "import vllm; print(vllm.__version__)"],
            capture_output=True, text=True, env=env, timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"exit status {done.returncode}"
    return done.stdout.strip().splitlines()[-1], ""


def describe_vllm_threads(result: dict) -> str:
    """How many cores vLLM's model ran on, from what the driver saw in its worker."""
    worker = result.get("worker") or {}
    env = result["env"]
    cores = worker.get("cores")
    where = f" on cores {cores}" if cores is not None else ""
    if env.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "1":
        bind = env.get("VLLM_CPU_OMP_THREADS_BIND") or "auto"
        why = f"worker process, VLLM_CPU_OMP_THREADS_BIND={bind}"
    else:
        why = "in-process engine, no OMP binding"
    if env.get("OMP_NUM_THREADS"):
        why += f", OMP_NUM_THREADS={env['OMP_NUM_THREADS']}"
    threads = worker.get("torch_threads", result["torch_threads"])
    return f"{plural(threads, 'torch thread')}{where} ({why})"


def run_vllm(python: str, request: dict, env: dict[str, str], timeout: float) -> EngineRun:
    """Run ``vllm_driver.py`` on ``request`` and read its result back."""
    with tempfile.TemporaryDirectory(prefix="vs_vllm_") as tmp:
        request_path, result_path = Path(tmp, "request.json"), Path(tmp, "result.json")
        log_path = Path(tmp, "vllm.log")
        request_path.write_text(json.dumps(request))
        load_average = os.getloadavg()[0]
        with open(log_path, "w") as log:
            done = subprocess.run(
                [python, str(DRIVER), str(request_path), str(result_path)],
                stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout,
            )
        if done.returncode != 0 or not result_path.exists():
            tail = "\n".join(log_path.read_text().splitlines()[-40:])
            raise RuntimeError(f"vLLM driver failed with exit status {done.returncode}:\n{tail}")
        result = json.loads(result_path.read_text())
    return EngineRun(
        engine=f"vLLM {result['vllm_version']} (CPU build, enforce_eager)",
        threads=describe_vllm_threads(result),
        load_s=result["load_s"], warmup_s=result["warmup_s"], elapsed_s=result["elapsed_s"],
        outputs=result["outputs"], load_average=load_average,
    )


# --- comparison ---------------------------------------------------------------------------
def first_mismatch(
    ours: Sequence[Sequence[int]], theirs: Sequence[Sequence[int]]
) -> Mismatch | None:
    """The first request (and token) where the two lists of outputs differ, or None."""
    if len(ours) != len(theirs):
        raise ValueError(
            f"{len(ours)} outputs against {len(theirs)}: the engines saw different traces")
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if list(a) == list(b):
            continue
        position = next((p for p, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return Mismatch(index, position, a[position] if position < len(a) else None,
                        b[position] if position < len(b) else None)
    return None


def count_identical(ours: Sequence[Sequence[int]], theirs: Sequence[Sequence[int]]) -> int:
    return sum(list(a) == list(b) for a, b in zip(ours, theirs, strict=True))


@contextmanager
def busy_cpu(threads: int | None) -> Iterator[subprocess.Popen | None]:
    """Run a CPU-bound competitor while the block runs (``threads=None``: no competitor).
    Yields the competitor's process."""
    if threads is None:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(threads), str(os.getpid())])
    try:
        time.sleep(1.0)  # let it import torch and start multiplying before we measure
        if proc.poll() is not None:
            raise RuntimeError(f"the --busy competitor exited at once (status {proc.returncode})")
        yield proc
    finally:
        proc.terminate()
        proc.wait()


# --- report -------------------------------------------------------------------------------
def report(trace: Trace, request: dict, rounds: Sequence[tuple[EngineRun, EngineRun]], busy: str,
           argv: Sequence[str]) -> str:
    """The printout: setup, one table row per engine and round, throughputs, ratio, agreement."""
    llm_args = request["llm_args"]
    lines = [
        f"$ python benchmarks/vs_vllm.py {' '.join(argv)}",
        trace.describe(),
        f"model: {Path(request['model']).name} ({llm_args['dtype']}), greedy, ignore_eos, "
        f"max_num_seqs {llm_args['max_num_seqs']}, max_model_len {llm_args['max_model_len']}; "
        f"{os.cpu_count()} CPUs",
        f"competing load: {busy}",
        "load avg: 1-minute load average as the engine started; others / competitor: cores kept "
        "busy by processes outside this benchmark / by the --busy competitor, on average over "
        "the engine's whole run (load, warm-up, timed generate)",
        "",
        "| round | engine | threads | load avg | others | competitor | load (s) | time (s) "
        "| output tok/s |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for number, pair in enumerate(rounds, 1):
        for r in pair:
            lines.append(
                f"| {number} | {r.engine} | {r.threads} | {r.load_average:.2f} | "
                f"{cores(r.other_cores)} | {cores(r.competitor_cores)} | {r.load_s:.1f} | "
                f"{r.elapsed_s:.2f} | {r.output_tokens_per_s():.0f} |")
    ratios = [ours.output_tokens_per_s() / theirs.output_tokens_per_s() for ours, theirs in rounds]
    lines.append("")
    if len(rounds) == 1:
        lines.append(f"minivllm / vLLM output throughput: {ratios[0]:.2f}x")
    else:
        best_ours = max(ours.output_tokens_per_s() for ours, _ in rounds)
        best_theirs = max(theirs.output_tokens_per_s() for _, theirs in rounds)
        lines += [
            f"best of {len(rounds)} rounds: minivllm {best_ours:.0f} output tok/s, "
            f"vLLM {best_theirs:.0f} output tok/s",
            f"minivllm / vLLM output throughput (best / best): {best_ours / best_theirs:.2f}x; "
            f"per round: {', '.join(f'{x:.2f}x' for x in ratios)}",
        ]
    n = len(request["prompts"])
    same = [count_identical(ours.outputs, theirs.outputs) for ours, theirs in rounds]
    per_round = " (per round)" if len(rounds) > 1 else ""
    lines.append("greedy outputs token-for-token identical: "
                 + ", ".join(f"{k}/{n}" for k in same) + per_round)
    for ours, theirs in rounds:
        miss = first_mismatch(ours.outputs, theirs.outputs)
        if miss is not None:
            lines.append(
                f"first difference: request {miss.index} (prompt "
                f"{len(request['prompts'][miss.index])} tokens), output token {miss.position}: "
                f"minivllm {miss.ours}, vLLM {miss.theirs}")
            break
    lines += [ours.profile for ours, _ in rounds if ours.profile]
    return "\n".join(lines)


def cores(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", help="python of a virtualenv with vLLM's CPU build")
    ap.add_argument("--num-requests", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads for minivllm")
    ap.add_argument("--vllm-threads", type=int, default=None,
                    help="OMP_NUM_THREADS for vLLM (default: its own choice)")
    ap.add_argument("--vllm-multiprocessing", action="store_true",
                    help="run vLLM's engine core and model worker in separate processes, "
                         "where VLLM_CPU_OMP_THREADS_BIND pins the worker's threads")
    ap.add_argument("--equal-threads", action="store_true",
                    help="three comparisons in one run: each engine's default threads, 1 vs 1, 2 vs 2 "
                         "(--threads / --vllm-threads are then ignored)")
    ap.add_argument("--busy", action="store_true", help="run a CPU-bound competitor throughout")
    ap.add_argument("--busy-threads", type=int, default=2, help="torch threads of the competitor")
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds of (minivllm, vLLM), each with fresh engines; reports the best")
    ap.add_argument("--profile", action="store_true",
                    help="run minivllm's timed generate under cProfile and say where time went "
                         "(its throughput then includes the profiler's overhead)")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_REQUESTS} short requests")
    ap.add_argument("--vllm-timeout", type=float, default=3600.0, help="seconds")
    args = ap.parse_args(argv)
    for name in ("num_requests", "max_num_seqs", "threads", "vllm_threads", "busy_threads",
                 "repeats"):
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if not args.vllm_python:
        print(NO_VLLM_PYTHON)
        return 0
    version, why = probe_vllm(args.vllm_python, vllm_env(args.vllm_threads, args.vllm_multiprocessing))
    if version is None:
        print(f"SKIPPED: vLLM cannot be imported with {args.vllm_python}: {why}\n"
              "Run scripts/setup_vllm_venv.sh to (re)build that environment.")
        return 0

    trace = build_trace(args.num_requests, args.seed, args.quick)
    vocab = ModelConfig.from_file(minivllm.TINY_MODEL_DIR).vocab_size
    request = trace_request(trace, minivllm.TINY_MODEL_DIR, vocab, args.max_num_seqs)
    busy_threads = args.busy_threads if args.busy else None
    busy = (f"1 process squaring a 384x384 matrix with {busy_threads} torch threads, through "
            "each engine's whole run" if args.busy else "none started by this script")
    configs = (EQUAL_THREADS if args.equal_threads else
               [(thread_label(args.threads, args.vllm_threads), args.threads, args.vllm_threads)])
    summary = []
    for label, ours_threads, their_threads in configs:
        env = vllm_env(their_threads, args.vllm_multiprocessing)
        rounds = []
        for _ in range(args.repeats):  # alternate the engines, so both meet the same noise
            ours = measured(lambda t=ours_threads: run_minivllm(request, t, args.profile), busy_threads)
            theirs = measured(lambda e=env: run_vllm(args.vllm_python, request, e, args.vllm_timeout),
                              busy_threads)
            for run in (ours, theirs):
                got = [len(o) for o in run.outputs]
                if got != request["max_tokens"]:
                    raise RuntimeError(f"{run.engine} returned output lengths {got[:8]}..., "
                                       f"expected {request['max_tokens'][:8]}...")
            rounds.append((ours, theirs))
        if len(configs) > 1:
            print(f"\n### threads: {label}\n")
        print(report(trace, request, rounds, busy, argv))
        summary.append((label, rounds))
    if len(configs) > 1:
        print("\n" + thread_summary(summary))
    return 0


# --equal-threads: each engine's own choice, then both on 1 thread, then both on 2
EQUAL_THREADS = [("each engine's default", None, None), ("1 vs 1", 1, 1), ("2 vs 2", 2, 2)]


def thread_label(ours: int | None, theirs: int | None) -> str:
    return f"{'default' if ours is None else ours} vs {'default' if theirs is None else theirs}"


def thread_summary(summary) -> str:
    """One row per thread configuration: the best round of each engine and their ratio."""
    lines = ["| threads (minivllm vs vLLM) | minivllm output tok/s | vLLM output tok/s | minivllm / vLLM "
             "(best / best) | per round |", "|---|---:|---:|---:|---|"]
    for label, rounds in summary:
        ours = max(o.output_tokens_per_s() for o, _ in rounds)
        theirs = max(t.output_tokens_per_s() for _, t in rounds)
        per_round = ", ".join(f"{o.output_tokens_per_s() / t.output_tokens_per_s():.2f}x" for o, t in rounds)
        lines.append(f"| {label} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f}x | {per_round} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
