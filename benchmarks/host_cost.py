"""The host side of an engine step at a real model's size, and whether a GPU would wait for it.

On a GPU the host queues a step's kernels and the device runs them; the step takes about the
longer of the two. The device's part of a decode step is bound by memory: every weight and
every cached K/V row the step needs is read once, so its floor is ``bytes / bandwidth``. The
host's part is Python and PyTorch's dispatch of a few hundred operators (plus the driver's
launch of each kernel), whatever the batch. Where the host takes longer than the memory, the
GPU idles between kernels: the step is *launch-bound*, and a CUDA graph (one launch for the
whole forward, ``minivllm/engine/graph_decode.py``) is what helps.

How the host is timed without a GPU: the engine's model -- a Qwen3-0.6B- or Llama-3-8B-shaped
``LlamaFamilyModel`` built from the public ``config.json`` shape (``minivllm.sim.model_spec``
presets, random weights, nothing downloaded) -- lives on PyTorch's ``meta`` device, whose
tensors have shapes and dtypes but no data. Every operator still goes through Python, the
module calls and PyTorch's dispatcher, and computes its output's shape; none does arithmetic.
The attention backend is the GPU's (``"triton"``) with its host code run as it is -- shape
checks, the split-KV choice, the partial buffers -- and only the kernel launch itself replaced
by a counter (:class:`LaunchCounter`). The model runner builds the step's inputs and attention
metadata from a real :class:`~minivllm.core.scheduler_output.SchedulerOutput` as it does on a GPU
(``ModelRunner.forward``), then the LM head runs on the rows that sample.

What the meta device leaves out, so the host times here are a *floor* on a GPU's: the CUDA
caching allocator's bookkeeping and the driver's kernel launch (a few microseconds per kernel,
``cudaLaunchKernel``); Triton's launcher (binding the arguments) for its kernels; the sampler's
read-back of the tokens, and the scheduler. The launch count per step is printed
(:func:`count_launches`), so that any per-launch cost can be added by hand. A floor makes the
verdict safe one way: a step called launch-bound here is at least as launch-bound on the GPU.
:func:`faithfulness` checks the other way on a CPU: at a shape where the arithmetic is
negligible (hidden size 64), the meta step's time against the same step computed on the CPU.

    python benchmarks/host_cost.py [--models qwen3-0.6b llama-3-8b] [--batches 1 8 64 256] [--repeats 5]

Decode steps: ``batch`` sequences of one new token, each with ``--context`` tokens cached.
Mixed steps: the same decodes plus one ``--chunk``-token prompt chunk (chunked prefill).
Memory time: the weights one step reads (decoder matmuls, the LM head, the norms; bfloat16) and
the K/V it reads and writes, at a T4's and an H100's peak bandwidth (``minivllm.sim.hardware``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minivllm import SamplingParams  # noqa: E402
from minivllm.core.scheduler_output import SchedulerOutput  # noqa: E402
from minivllm.engine.model_runner import ModelRunner  # noqa: E402
from minivllm.model.config import ModelConfig  # noqa: E402
from minivllm.model.layer_ops import TorchLayerOps  # noqa: E402
from minivllm.model.llama import LlamaFamilyModel  # noqa: E402
from minivllm.request import Request  # noqa: E402
from minivllm.sim.hardware import HARDWARE  # noqa: E402
from minivllm.sim.model_spec import _PRESET_CONFIGS, ModelSpec  # noqa: E402
from minivllm.transfer import select_rows  # noqa: E402

GPUS = {"T4": HARDWARE["T4"], "H100": HARDWARE["H100-SXM"]}
MODELS = ("qwen3-0.6b", "llama-3-8b")
BATCHES = (1, 8, 64, 256)
BLOCK_SIZE = 16
CONTEXT = 1024  # tokens cached per decode sequence
CHUNK = 512  # the mixed step's prompt chunk (its bytes and FLOPs)
HOST_CHUNK = 16  # the chunk the host runs: the same operators and metadata as 512 rows, less CPU arithmetic
DTYPE = torch.bfloat16


class LaunchCounter:
    """Stands in for one ``@triton.jit`` kernel: ``kernel[grid](*args)`` counts a launch and
    does nothing (the host code around it runs unchanged)."""

    def __init__(self, name: str, counts: dict[str, int]):
        self.name, self.counts = name, counts

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.counts[self.name] = self.counts.get(self.name, 0) + 1

        return launch


def triton_backend_without_launches(counts: dict[str, int] | None = None):
    """The ``"triton"`` backend with every kernel replaced by a :class:`LaunchCounter`; returns
    ``(backend, restore)``: call ``restore()`` to put the kernels back."""
    from minivllm.attention import triton_cache, triton_decode, triton_prefill
    from minivllm.attention.triton_backend import TritonAttentionBackend

    counts = {} if counts is None else counts
    backend = TritonAttentionBackend()
    patched = [(triton_decode, "_paged_decode_kernel"), (triton_decode, "_merge_splits_kernel"),
               (triton_prefill, "_paged_prefill_kernel"), (triton_cache, "_reshape_and_cache_kernel"),
               (triton_cache, "_reshape_and_cache_int8_kernel")]
    saved = [(mod, name, getattr(mod, name)) for mod, name in patched]
    for mod, name in patched:
        setattr(mod, name, LaunchCounter(name, counts))

    def restore() -> None:
        for mod, name, fn in saved:
            setattr(mod, name, fn)

    return backend, restore


def model_config(name: str, **overrides) -> ModelConfig:
    return ModelConfig.from_dict({**_PRESET_CONFIGS[name], **overrides})


def shrunk(cfg: ModelConfig, width: int = 1) -> ModelConfig:
    """``cfg`` with its layers, heads, KV heads and layout as they are, and every width that only
    sizes the arithmetic made tiny: head_dim ``4 * width``, hidden ``32 * width``, MLP ``64 * width``,
    a 512-token vocabulary. The host's work does not depend on those widths (the same modules,
    operators, metadata and kernel-launch decisions); what the CPU's arithmetic still costs is
    taken out by measuring at width 1 and 2 (:func:`host_seconds`); :func:`faithfulness` checks it."""
    from dataclasses import replace

    return replace(cfg, head_dim=2 * width, hidden_size=16 * width, intermediate_size=32 * width, vocab_size=512)


def build_runner(cfg: ModelConfig, backend, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 num_blocks: int = 1 << 16, kv_device: str = "meta") -> ModelRunner:
    """A model runner over ``cfg`` (random weights) on ``device``; its KV cache on ``kv_device``
    (``meta``: no memory, for a backend whose kernels are counted, not run)."""
    with torch.device(device):
        model = LlamaFamilyModel(cfg, backend, TorchLayerOps()).to(dtype)
    if device != "meta":
        model.rotary.reset_parameters()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(std=0.05)
    runner = ModelRunner(model.eval(), 1, BLOCK_SIZE, sampler=None)
    runner.kv_caches = model.allocate_kv_cache(num_blocks, BLOCK_SIZE, device=kv_device)
    return runner


def make_step(batch: int, context: int, chunk: int = 0, vocab: int = 1000) -> SchedulerOutput:
    """``batch`` decode entries of ``context`` cached tokens (+ one ``chunk``-token prompt)."""
    out = SchedulerOutput()
    params = SamplingParams(max_tokens=16, temperature=0.0)
    per_seq = -(-(context + 1) // BLOCK_SIZE)
    for i in range(batch):
        req = Request(f"d{i}", [(i * 7 + j) % vocab for j in range(context + 1)], params)
        out.add(req, context, 1, list(range(i * per_seq, (i + 1) * per_seq)))
    if chunk:
        req = Request("p", [(j * 3) % vocab for j in range(chunk)], params)
        base = batch * per_seq
        out.add(req, 0, chunk, list(range(base, base + -(-chunk // BLOCK_SIZE))))
    return out


def run_step(runner: ModelRunner, out: SchedulerOutput) -> torch.Tensor:
    """The step's host work: inputs and metadata, the forward, the LM head on sampling rows."""
    hidden, last_rows = runner.forward(out)
    rows = [r for r, s in zip(last_rows, out.sample, strict=True) if s]
    with torch.inference_mode():
        return runner.model.compute_logits(select_rows(hidden, rows))


class _OpCounter(TorchDispatchMode):
    """Counts the ATen operators that would launch a kernel (not views, not bare allocations)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if not (getattr(func, "is_view", False) or name.startswith(("empty", "view", "_unsafe_view", "alias",
                                                                   "detach", "lift_fresh"))):
            self.count += 1
        return func(*args, **(kwargs or {}))


def count_launches(runner: ModelRunner, out: SchedulerOutput, triton_counts: dict[str, int]) -> int:
    """Kernels one step would launch: ATen operators that compute, plus Triton kernels."""
    before = sum(triton_counts.values())
    with _OpCounter() as ops:
        run_step(runner, out)
    return ops.count + sum(triton_counts.values()) - before


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm: first-call caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_seconds(fns, repeats: int) -> tuple[float, float]:
    """``fns = {1: f, 2: g}``: the same step at width 1 and 2, measured in turn (so that a busy
    moment of the machine hits both alike). Returns the medians ``(t1, t2)``. ``t1`` is the host
    time reported: what the CPU's arithmetic still adds to it is less than ``t2 - t1`` (the
    arithmetic at least doubles from width 1 to 2), so ``t1`` is within ``t2 / t1 - 1`` of the
    host's own time, above it."""
    for fn in fns.values():
        fn()
    samples: dict[int, list[float]] = {w: [] for w in fns}
    for _ in range(repeats):
        for w, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[w].append(time.perf_counter() - t0)
    return statistics.median(samples[1]), statistics.median(samples[2])


def step_bytes(spec: ModelSpec, batch: int, context: int, chunk: int = 0, dtype_bytes: int = 2) -> float:
    """Bytes one step must move: the weights it reads (decoder matmuls, norms, the LM head --
    tied or not, a sampled row multiplies all of it), the cached K/V it reads, the K/V it writes."""
    weights = (spec.linear_params + spec.norm_params + spec.vocab_size * spec.hidden_size) * dtype_bytes
    kv_token = spec.kv_bytes_per_token()
    kv_read = batch * context * kv_token  # the prompt chunk reads its own new rows (counted as written)
    kv_written = (batch + chunk) * kv_token
    return weights + kv_read + kv_written


def step_flops(spec: ModelSpec, batch: int, context: int, chunk: int = 0) -> float:
    """FLOPs of the step: each decode token over its context, the chunk's tokens over the chunk
    (causal: half of it on average), the LM head for every sampling row."""
    return batch * spec.flops_per_token(context) + chunk * spec.flops_per_token(chunk // 2, sample=False) + (
        spec.lm_head_flops if chunk else 0)


def device_ms(spec: ModelSpec, gpu: str, batch: int, context: int, chunk: int = 0) -> float:
    """The device's floor for the step: its bytes at peak bandwidth or its FLOPs at peak
    dense throughput, whichever is longer."""
    hw = GPUS[gpu]
    return max(step_bytes(spec, batch, context, chunk) / hw.memory_bandwidth,
               step_flops(spec, batch, context, chunk) / hw.peak_flops) * 1e3


@dataclass
class Row:
    model: str
    step: str  # "decode" or "mixed"
    batch: int
    tokens: int
    launches: int
    host_ms: float
    cpu_arith: float  # bound on the CPU arithmetic left in host_ms, as a fraction of it (width 2 / width 1 - 1)
    host_per_layer_us: float
    bytes_gb: float
    memory_ms: dict  # GPU -> ms of the device's floor (bytes at peak bandwidth, or FLOPs at peak)
    verdict: dict  # GPU -> "launch-bound" (host > device floor) or "device-bound"

    def line(self) -> str:
        mem = "  ".join(f"{g} {ms:7.3f} ms {self.verdict[g]:<13}" for g, ms in self.memory_ms.items())
        return (f"{self.model:<11} {self.step:<6} {self.batch:>4} {self.tokens:>5} {self.launches:>6} "
                f"{self.host_ms:8.2f} {self.cpu_arith:+5.0%} {self.host_per_layer_us:8.0f} {self.bytes_gb:7.2f}  {mem}")


HEADER = (f"{'model':<11} {'step':<6} {'batch':>4} {'tok':>5} {'kernels':>6} {'host ms':>8} {'w2/w1':>5} "
          f"{'us/layer':>8} {'GB read':>7}  device floor (memory or FLOPs at peak)")


def measure(models=MODELS, batches=BATCHES, context: int = CONTEXT, chunk: int = CHUNK, repeats: int = 5,
            steps=("decode", "mixed")) -> list[Row]:
    """One :class:`Row` per (model, step kind, batch)."""
    rows = []
    counts: dict[str, int] = {}
    backend, restore = triton_backend_without_launches(counts)
    torch.set_flush_denormal(True)  # the counted kernels leave torch.empty's garbage (denormals: slow)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread drives a GPU's step; more would only add the CPU's arithmetic
    try:
        for name in models:
            cfg = model_config(name)
            spec = ModelSpec.from_config(cfg, name)  # the real shape: the bytes and FLOPs
            runners = {w: build_runner(shrunk(cfg, w), backend) for w in (1, 2)}  # the real structure
            for kind in steps:
                for batch in batches:
                    c = chunk if kind == "mixed" else 0
                    out = make_step(batch, context, min(c, HOST_CHUNK), 512)
                    launches = count_launches(runners[1], out, counts)
                    host, host2 = host_seconds({w: partial(run_step, r, out) for w, r in runners.items()}, repeats)
                    layer_calls = {}
                    for w, r in runners.items():
                        ids, pos, meta, _ = r.prepare_inputs(out)
                        with torch.inference_mode():
                            x = r.model.model.embed_tokens(ids)
                            cos, sin = r.model.rotary.cos_sin(pos, x.dtype)
                        layer_calls[w] = partial(_layer_call, r.model.model.layers[0], x, cos, sin, meta)
                    per_layer, _ = host_seconds(layer_calls, repeats)
                    mem = {g: device_ms(spec, g, batch, context, c) for g in GPUS}
                    rows.append(Row(name, kind, batch, batch + c, launches, host * 1e3, host2 / host - 1,
                                    per_layer * 1e6, step_bytes(spec, batch, context, c) / 1e9, mem,
                                    {g: "launch-bound" if host * 1e3 > ms else "device-bound" for g, ms in mem.items()}))
    finally:
        restore()
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    return rows


@torch.inference_mode()
def _layer_call(layer, x, cos, sin, meta):
    return layer(x, cos, sin, meta)


def verdict(rows: list[Row]) -> list[str]:
    """One sentence per (model, GPU): at which decode batches the host is the bottleneck."""
    lines = []
    for name in dict.fromkeys(r.model for r in rows):
        for gpu in GPUS:
            mine = [r for r in rows if r.model == name and r.step == "decode"]
            bound = [r.batch for r in mine if r.verdict[gpu] == "launch-bound"]
            ratio = [f"{r.host_ms / r.memory_ms[gpu]:.1f}x" for r in mine]
            what = (f"launch-bound at batch {', '.join(map(str, bound))}" if bound else "device-bound at every batch")
            lines.append(f"{name} on {gpu}: decode is {what}\n    (host / device time: {', '.join(ratio)} "
                         f"at batch {', '.join(str(r.batch) for r in mine)})")
    return lines


def graph_speedup(rows: list[Row], gpu: str, graph_host_ms: float = 0.05) -> dict[tuple[str, int], float]:
    """Predicted decode speed-up of replaying a captured graph: a step takes about the longer of
    host and device time; a replay costs the host ``graph_host_ms`` (one launch) instead of the
    eager forward, so ``max(host, memory) / max(graph_host_ms, memory)``. The device time is its
    floor (memory at peak bandwidth), so this is an upper bound where the step is memory-bound
    and a fair guess where it is launch-bound."""
    out = {}
    for r in rows:
        if r.step == "decode":
            mem = r.memory_ms[gpu]
            out[(r.model, r.batch)] = max(r.host_ms, mem) / max(graph_host_ms, mem)
    return out


def faithfulness(name: str = "qwen3-0.6b", repeats: int = 5) -> dict[str, dict[str, float]]:
    """Is the shrunken step's time the host's? Steps of ``name``'s layers and heads at width 1
    and at width 2 (:func:`shrunk`), in milliseconds: if the CPU's arithmetic mattered, doubling
    the widths would show (the matmuls grow fourfold, the rest twofold). And the batch-8 decode
    with every tensor on PyTorch's ``meta`` device, which does no arithmetic at all but computes
    each operator's output shape in Python: slower than a host, so not a stand-in for one."""
    counts: dict[str, int] = {}
    backend, restore = triton_backend_without_launches(counts)
    cases = {"decode 8": make_step(8, CONTEXT, 0, 512), "decode 256": make_step(256, CONTEXT, 0, 512),
             "mixed 256": make_step(256, CONTEXT, HOST_CHUNK, 512)}
    times: dict[str, dict[str, float]] = {}
    torch.set_flush_denormal(True)
    try:
        runners = {w: build_runner(shrunk(model_config(name), w), backend) for w in (1, 2)}
        for case, out in cases.items():
            t = {f"width {w}": _median_seconds(lambda: run_step(r, out), repeats) * 1e3  # noqa: B023
                 for w, r in runners.items()}
            t["ratio"] = t["width 2"] / t["width 1"]
            times[case] = t
        meta = build_runner(shrunk(model_config(name)), backend, device="meta")
        times["decode 8"]["meta"] = _median_seconds(lambda: run_step(meta, cases["decode 8"]), 2) * 1e3
    finally:
        restore()
        torch.set_flush_denormal(False)
    return times


def markdown(rows: list[Row]) -> str:
    gpus = list(GPUS)
    head = ("| model | step | batch | tokens | kernels | host ms | width 2 | host µs / layer | GB read | "
            + " | ".join(f"{g} device ms | {g}" for g in gpus) + " |")
    lines = [head, "|" + "---|" * (9 + 2 * len(gpus))]
    for r in rows:
        lines.append(f"| {r.model} | {r.step} | {r.batch} | {r.tokens} | {r.launches} | {r.host_ms:.2f} | {r.cpu_arith:+.0%} | "
                     f"{r.host_per_layer_us:.0f} | {r.bytes_gb:.2f} | "
                     + " | ".join(f"{r.memory_ms[g]:.3f} | {r.verdict[g]}" for g in gpus) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(_PRESET_CONFIGS))
    ap.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    ap.add_argument("--context", type=int, default=CONTEXT)
    ap.add_argument("--chunk", type=int, default=CHUNK)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown too")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for case, t in faithfulness().items():
        print(f"faithfulness, qwen3-0.6b {case}: width 1 {t['width 1']:.2f} ms, width 2 {t['width 2']:.2f} ms "
              f"(x{t['ratio']:.2f})" + (f"; every tensor on meta {t['meta']:.1f} ms" if "meta" in t else ""))
    rows = measure(args.models, args.batches, args.context, args.chunk, args.repeats)
    print(f"context {args.context} tokens per decode sequence, mixed = decodes + a {args.chunk}-token chunk "
          f"(host: a {HOST_CHUNK}-token one); "
          f"bytes in bfloat16; host on {torch.__version__}, 1 CPU thread")
    print(HEADER)
    for r in rows:
        print(r.line())
    print()
    for line in verdict(rows):
        print(line)
    for gpu in GPUS:
        sp = graph_speedup(rows, gpu)
        print(f"predicted CUDA-graph decode speed-up on {gpu}: "
              + ", ".join(f"{m} b{b} {s:.1f}x" for (m, b), s in sp.items()))
    if args.markdown:
        print()
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Row", "asdict", "faithfulness", "graph_speedup", "markdown", "measure", "verdict"]
