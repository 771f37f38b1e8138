"""Pictures of a serving run, drawn from :class:`~minivllm.metrics.EngineStats`.

Every function takes the statistics of one run, or a ``{label: stats}`` dict to overlay
several (static vs continuous, paged vs contiguous), and returns a matplotlib ``Figure``. The
engine and the simulator fill the same ``EngineStats``, so the same call draws a tiny-model run
on a laptop and a simulated H100 run. Times on the x axis are relative to the run's first step
(wall clock for the engine, simulated clock for the simulator).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from minivllm.metrics import EngineStats, StepStats
from minivllm.sim.analysis import decode_only_steps, finished_requests, useful_seqs


def _runs(stats: EngineStats | Mapping[str, EngineStats]) -> dict[str, EngineStats]:
    if isinstance(stats, EngineStats):
        return {"run": stats}
    return dict(stats)


def _times(steps: Sequence[StepStats]) -> list[float]:
    t0 = steps[0].start_time if steps else 0.0
    return [s.start_time - t0 for s in steps]


def plot_batch_occupancy(
    stats: EngineStats | Mapping[str, EngineStats], max_num_seqs: int | None = None, x: str = "step"
) -> Figure:
    """Seats in the batch at every step, one panel per run: the sequences doing useful work
    (filled) and, on top, the seats computed for nothing (hatched: static batching's finished
    members, whose rows are thrown away). A dashed line marks ``max_num_seqs``.

    ``x="step"`` (default) counts steps, so the picture is the same on every machine;
    ``x="time"`` uses the run's clock (wall clock for the engine, simulated for the simulator).
    Each panel's title gives ``B_eff``, the mean number of useful sequences per step.
    Static batching shows one rectangle per batch: full while every member decodes, then as
    low as its stragglers until the batch ends. Continuous batching stays near the cap while
    requests are waiting.
    """
    if x not in ("step", "time"):
        raise ValueError(f"x must be 'step' or 'time', got {x!r}")
    runs = _runs(stats)
    fig, axes = plt.subplots(len(runs), 1, figsize=(9.5, 1.9 * len(runs) + 0.9), sharex=True, sharey=True,
                             squeeze=False)
    top = max([max_num_seqs or 0] + [s.num_batched_seqs for r in runs.values() for s in r.steps])
    for ax, (label, run), colour in zip(axes[:, 0], runs.items(), plt.get_cmap("tab10").colors, strict=False):
        steps = run.steps
        xs = list(range(len(steps))) if x == "step" else _times(steps)
        end = len(steps) if x == "step" else (xs[-1] + steps[-1].duration if steps else 0.0)
        useful = [useful_seqs(s) for s in steps]
        computed = [s.num_batched_seqs for s in steps]
        # step="post" holds each value until the next x: repeat the last one at the end
        xs_, useful_, computed_ = xs + [end], useful + useful[-1:], computed + computed[-1:]
        ax.fill_between(xs_, useful_, step="post", color=colour, alpha=0.85, linewidth=0,
                        label="sequences doing useful work")
        if any(c > u for c, u in zip(computed, useful, strict=True)):
            ax.fill_between(xs_, useful_, computed_, step="post", facecolor="white", edgecolor=colour,
                            hatch="////", linewidth=0, label="seats computed for nothing")
        if max_num_seqs:
            ax.axhline(max_num_seqs, color="black", linestyle="--", linewidth=1, zorder=3,
                       label=f"max_num_seqs = {max_num_seqs}")
        b_eff = sum(useful) / len(steps) if steps else 0.0
        ax.set_title(f"{label}: {len(steps)} steps, B_eff = {b_eff:.2f} useful sequences per step",
                     loc="left", fontsize=9)
        ax.set_ylabel("sequences")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    axes[0, 0].set_ylim(0, 1.15 * top if top else 1)
    axes[0, 0].set_xlim(left=0)
    axes[-1, 0].set_xlabel("step" if x == "step" else "time (s)")
    fig.suptitle("Batch occupancy", fontsize=10)
    fig.tight_layout()
    return fig


def plot_kv_memory(stats: EngineStats | Mapping[str, EngineStats]) -> Figure:
    """KV cache over time. Left: blocks in use vs the pool size. Right: token K/V actually
    stored vs token slots reserved for them; the gap is the memory a manager wastes
    (a few partly filled tail blocks when paged, most of each region when contiguous)."""
    fig, (ax_blocks, ax_tokens) = plt.subplots(1, 2, figsize=(11, 3.5))
    for label, run in _runs(stats).items():
        steps = run.steps
        t = _times(steps)
        line = ax_blocks.plot(t, [s.kv_blocks_used for s in steps], label=f"{label}: used")
        color = line[0].get_color()
        ax_blocks.plot(t, [s.kv_blocks_total for s in steps], color=color, linestyle=":", label=f"{label}: total")
        ax_tokens.plot(t, [s.slots_reserved for s in steps], color=color, label=f"{label}: slots reserved")
        ax_tokens.fill_between(t, [s.tokens_stored for s in steps], color=color, alpha=0.3, label=f"{label}: tokens stored")
    ax_blocks.set_title("KV blocks in use")
    ax_blocks.set_xlabel("time (s)")
    ax_blocks.set_ylabel("blocks")
    ax_tokens.set_title("Tokens stored vs slots reserved")
    ax_tokens.set_xlabel("time (s)")
    ax_tokens.set_ylabel("token slots")
    for ax in (ax_blocks, ax_tokens):
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def decode_points(stats: EngineStats) -> tuple[list[int], list[float]]:
    """``(batch sizes, tokens/s)`` of the decode-only steps of a run (no prefill, no padding)."""
    steps = [s for s in decode_only_steps(stats) if s.duration > 0]
    return [s.num_decode_tokens for s in steps], [s.num_decode_tokens / s.duration for s in steps]


def plot_throughput_roofline(
    cost_model,
    stats: EngineStats | Mapping[str, EngineStats] | None = None,
    context_len: int = 1024,
    max_batch: int = 512,
) -> Figure:
    """Decode tokens/s against batch size on a log-log roofline.

    Curves from ``cost_model`` (a :class:`~minivllm.sim.CostModel`): the memory roof (tokens/s
    if only bytes mattered), the compute roof, and the modelled throughput, whose knee is the
    crossover batch. Dots: decode-only steps measured in ``stats`` (a simulator run lands on
    the curve; a real-engine run on a CPU shows where the tiny model actually sits).
    """
    fig, ax = plt.subplots(figsize=(7, 4.5))
    batches = sorted({int(round(2 ** (i / 4))) for i in range(0, int(4 * max_batch.bit_length()) + 1)})
    batches = [b for b in batches if 1 <= b <= max_batch]
    mem, comp, model = [], [], []
    for b in batches:
        c = cost_model.decode_step(b, context_len)
        mem.append(b / c.memory_time)
        comp.append(b / c.compute_time)
        model.append(b / c.time)
    name = f"{cost_model.model.name} on {cost_model.hardware.name}"
    ax.plot(batches, mem, linestyle="--", label="memory roof (bytes / bandwidth)")
    ax.plot(batches, comp, linestyle="--", label="compute roof (FLOPs / peak)")
    ax.plot(batches, model, linewidth=2, label=f"model: {name}, context {context_len}")
    knee = cost_model.crossover_batch(context_len)
    if knee != float("inf") and knee <= max_batch:
        ax.axvline(knee, color="grey", linestyle=":", label=f"crossover B* = {knee:.0f}")
    if stats is not None:
        for label, run in _runs(stats).items():
            xs, ys = decode_points(run)
            if xs:
                ax.scatter(xs, ys, s=8, alpha=0.5, label=f"measured decode steps: {label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("decode batch size (sequences)")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Decode throughput vs batch size")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def plot_latency_cdf(
    stats: EngineStats | Mapping[str, EngineStats],
    metric: str = "ttft",
    prefix: str = "",
    percentiles: Sequence[float] = (90, 99),
) -> Figure:
    """Share of requests (those whose id starts with ``prefix``) served within a time, one
    curve per run: a curve further left is faster. The x axis is logarithmic (a millisecond
    and a minute on one picture); dotted lines mark the ``percentiles``' heights."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, run in _runs(stats).items():
        values = sorted(
            v for m in finished_requests(run, prefix).values() if (v := getattr(m, metric)) is not None
        )
        if values:
            shares = [(i + 1) / len(values) for i in range(len(values))]
            ax.step(values, shares, where="post", label=f"{label} ({len(values)} requests)")
    for q in percentiles:
        ax.axhline(q / 100, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate(f"p{q:g}", (1.0, q / 100), xycoords=("axes fraction", "data"), fontsize=7,
                    xytext=(2, -3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"{metric} (s, log scale)")
    ax.set_ylabel(f"share of {prefix or 'all'} requests")
    ax.set_title(f"{metric} distribution" + (f" of {prefix} requests" if prefix else ""))
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
