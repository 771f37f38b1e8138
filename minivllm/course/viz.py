"""Small drivers and pictures the Part I notebooks share.

- :func:`run_batcher` runs a student's ``ContinuousScheduler`` (exercise 02) over a trace,
  optionally timing every step with the simulator's roofline cost model, so the student's
  own scheduler "serves" a GPU-scale workload;
- :func:`lanes` / :func:`plot_lanes` turn any list of per-step batches (from the student's
  scheduler or from :func:`minivllm.course.reference.run_reference`) into one lane per request:
  waiting, prefill, decode, done;
- :func:`plot_static_seats` draws a static batch's seats: useful steps vs idle steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from minivllm.course.reference import TraceRequest

WAIT, PREFILL, DECODE, DONE, ABSENT = 1, 3, 2, 0, -1


@dataclass
class BatcherStep:
    step: int
    batch: list[tuple[str, int]]
    finished: list[str]
    start: float = 0.0  # simulated seconds (0 when no cost model is given)
    duration: float = 0.0


@dataclass
class BatcherRun:
    steps: list[BatcherStep] = field(default_factory=list)
    first_token: dict[str, float] = field(default_factory=dict)  # request -> end of its first step
    finished_at: dict[str, float] = field(default_factory=dict)

    @property
    def total_time(self) -> float:
        return self.steps[-1].start + self.steps[-1].duration if self.steps else 0.0

    def mean_batch(self) -> float:
        return sum(len(s.batch) for s in self.steps) / len(self.steps) if self.steps else 0.0


def run_batcher(
    ex,
    trace: Sequence[TraceRequest],
    max_num_seqs: int,
    max_num_batched_tokens: int,
    cost_model=None,
    max_steps: int = 1_000_000,
) -> BatcherRun:
    """Serve ``trace`` with exercise 02's ``ContinuousScheduler`` from module ``ex``.

    Arrivals are in steps (``TraceRequest.arrival_step``). With a ``cost_model``
    (:class:`minivllm.sim.CostModel`) each step's duration is what that batch would take on
    the model's GPU; without one every step lasts 1 (time counts steps).
    """
    sched = ex.ContinuousScheduler(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    arrivals = sorted(trace, key=lambda r: r.arrival_step)
    cached: dict[str, int] = {}
    run = BatcherRun()
    clock, nxt = 0.0, 0
    for t in range(max_steps):
        while nxt < len(arrivals) and arrivals[nxt].arrival_step <= t:
            r = arrivals[nxt]
            sched.add_request(ex.Seq(r.request_id, r.prompt_len, r.output_len))
            nxt += 1
        if nxt == len(arrivals) and not sched.has_unfinished():
            return run
        res = sched.step()
        batch = [tuple(x) for x in res.batch]
        if cost_model is not None:
            duration = cost_model.step_cost([(cached.get(rid, 0), n, True) for rid, n in batch]).time
        else:
            duration = 1.0
        for rid, n in batch:
            cached[rid] = cached.get(rid, 0) + n
            run.first_token.setdefault(rid, clock + duration)
        for rid in res.finished:
            run.finished_at[rid] = clock + duration
        run.steps.append(BatcherStep(t, batch, list(res.finished), clock, duration))
        clock += duration
    raise RuntimeError(f"the scheduler did not finish the trace in {max_steps} steps")


def lanes(trace: Sequence[TraceRequest], steps: Sequence) -> tuple[list[str], list[list[int]]]:
    """``(request ids, states[request][step])`` with states WAIT / PREFILL / DECODE / DONE /
    ABSENT (not arrived). ``steps`` items need ``.step``, ``.batch`` and ``.finished``."""
    ids = [r.request_id for r in trace]
    arrival = {r.request_id: r.arrival_step for r in trace}
    prompt = {r.request_id: r.prompt_len for r in trace}
    computed = dict.fromkeys(ids, 0)
    done: set[str] = set()
    grid = []
    for st in steps:
        in_batch = dict(st.batch)
        col = []
        for rid in ids:
            if rid in done:
                col.append(DONE)
            elif rid in in_batch:
                col.append(PREFILL if computed[rid] < prompt[rid] else DECODE)
            elif st.step >= arrival[rid]:
                col.append(WAIT)
            else:
                col.append(ABSENT)
        for rid, n in in_batch.items():
            computed[rid] += n
        done.update(st.finished)
        grid.append(col)
    states = [[grid[t][i] for t in range(len(grid))] for i in range(len(ids))]
    return ids, states


def plot_lanes(trace: Sequence[TraceRequest], steps: Sequence, upto: int | None = None, ax=None, title: str = ""):
    """One horizontal lane per request over the steps: grey waiting, dark prefill, light
    decode, white done. ``upto`` greys out the future (for a slider)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ids, states = lanes(trace, steps)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.3 * len(ids) + 1.4))
    # -1 absent, 0 done, 1 waiting, 2 decode, 3 prefill
    cmap = ListedColormap(["#ffffff", "#f4f4f4", "#cfcfcf", "#8ecae6", "#1d3557"])
    grid = [[s + 1 for s in row] for row in states]
    if upto is not None:
        for row in grid:
            for t in range(upto + 1, len(row)):
                row[t] = 0
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=4, interpolation="nearest")
    ax.set_yticks(range(len(ids)), ids, fontsize=7)
    ax.set_xlabel("step")
    if upto is not None:
        ax.axvline(upto + 0.5, color="crimson", linewidth=1)
    ax.legend(
        handles=[Patch(color="#cfcfcf", label="waiting"), Patch(color="#1d3557", label="prefill"),
                 Patch(color="#8ecae6", label="decode")],
        fontsize=7, loc="upper right", ncols=3,
    )
    ax.set_title(title or "Requests over steps")
    return ax


def plot_static_seats(output_lens: Sequence[int], ax=None, title: str = ""):
    """A static batch decoding in lock step: each seat's useful steps (filled) and the steps
    it waits for the longest response (hatched)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.35 * len(output_lens) + 1.2))
    longest = max(output_lens, default=0)
    for i, n in enumerate(output_lens):
        ax.barh(i, n, color="#2a9d8f")
        ax.barh(i, longest - n, left=n, color="white", edgecolor="#e76f51", hatch="///", linewidth=0.5)
    ax.set_yticks(range(len(output_lens)), [f"seat {i}" for i in range(len(output_lens))], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("decode step")
    ax.set_title(title or "Static batch: useful steps (green) and idle steps (hatched)")
    return ax
