"""The plots draw any EngineStats: a simulator run, or statistics built by hand the way the
engine fills them."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from minivllm import workloads as w
from minivllm.metrics import EngineStats, StepStats
from minivllm.sim import CostModel, Simulator, get_hardware, plots, preset
from minivllm.sim.analysis import effective_batch, useful_seqs


@pytest.fixture(scope="module")
def runs() -> dict[str, EngineStats]:
    trace = w.chat(24, seed=0)
    out = {}
    for label, kw in (("static", dict(scheduler="static")), ("continuous", {})):
        sim = Simulator(preset("llama-3-8b"), "A100-80GB", max_num_seqs=4, max_model_len=4096, **kw)
        out[label] = sim.run(trace)
    return out


def engine_like_stats() -> EngineStats:
    """Two steps of a static batch of 2: a padded prefill, then a decode with one idle seat."""
    steps = [
        StepStats(0, 10.0, 0.5, 2, 0, 13, 0, 7, 2, 64, 13, 32, 0, num_batched_seqs=2),
        StepStats(1, 10.5, 0.1, 1, 0, 0, 1, 1, 2, 64, 14, 32, 0, num_batched_seqs=2),
    ]
    return EngineStats(steps=steps)


def test_idle_static_seats_are_not_useful(runs):
    prefill, decode = engine_like_stats().steps
    assert useful_seqs(prefill) == 2  # prompt padding sits inside real sequences
    assert useful_seqs(decode) == 1  # one idle seat
    assert effective_batch(runs["static"]) < effective_batch(runs["continuous"])


def test_batch_occupancy(runs):
    fig = plots.plot_batch_occupancy(runs, max_num_seqs=4)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == len(runs)  # one panel per run: no run hides under another
    static, continuous = fig.axes
    assert static.get_ylim()[0] == 0 and static.get_xlim()[0] == 0
    # useful work and idle seats for static batching; nothing idle for continuous batching
    assert len(static.collections) == 2 and len(continuous.collections) == 1
    labels = [t.get_text() for t in static.get_legend().get_texts()]
    assert labels == ["sequences doing useful work", "seats computed for nothing", "max_num_seqs = 4"]
    assert "B_eff" in static.get_title(loc="left")
    # steps on the x axis by default, the run's clock on request
    steps = len(runs["static"].steps)
    assert static.collections[0].get_paths()[0].vertices[:, 0].max() == steps
    fig2 = plots.plot_batch_occupancy(engine_like_stats(), x="time")
    assert fig2.axes[0].collections[0].get_paths()[0].vertices[:, 0].min() == 0.0
    with pytest.raises(ValueError, match="x must be"):
        plots.plot_batch_occupancy(runs, x="wall")


def test_kv_memory_map(runs):
    fig = plots.plot_kv_memory(runs)
    blocks_ax, tokens_ax = fig.axes
    assert len(blocks_ax.get_lines()) == 2 * len(runs)
    peak = max(max(line.get_ydata()) for line in tokens_ax.get_lines())
    assert peak == max(max(r.column("slots_reserved")) for r in runs.values())


def test_roofline_with_measured_points(runs):
    cm = CostModel(preset("llama-3-8b"), get_hardware("A100-80GB"))
    fig = plots.plot_throughput_roofline(cm, runs, context_len=256, max_batch=64)
    ax = fig.axes[0]
    model_curve = ax.get_lines()[2]
    ys = list(model_curve.get_ydata())
    assert ys == sorted(ys)  # throughput never falls as the batch grows
    assert len(ax.collections) >= 1  # measured decode steps drawn as dots
    xs, rates = plots.decode_points(runs["continuous"])
    assert xs and all(r > 0 for r in rates)


def test_latency_cdf(runs):
    fig = plots.plot_latency_cdf(runs, "ttft", "chat")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["static (24 requests)", "continuous (24 requests)"]
    assert ax.get_ylim()[0] == 0 and ax.get_xscale() == "log"
    for line in ax.get_lines()[:2]:  # one step curve per run, ending at 100 %
        assert line.get_ydata()[-1] == 1.0
