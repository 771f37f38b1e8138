"""Pictures and printouts the Part I notebooks share, drawn from per-step scheduler decisions.

- :func:`lanes` / :func:`plot_lanes` turn the steps of a run (``minivllm.course.harness``
  records, on the engine or a replay) into one lane per request: waiting, prefill (or
  recompute after a preemption), decode, done;
- :func:`budget_split` / :func:`plot_budget` / :func:`describe_step` show how each step's token
  budget was spent: decode tokens, prompt slices, and what was left over;
- :func:`plot_static_seats` draws a static batch's seats: useful steps vs idle steps.

Every x axis counts steps, so a picture does not change from one machine to the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minivllm.course.harness import TraceRequest

WAIT, PREFILL, DECODE, DONE, ABSENT = 1, 3, 2, 0, -1


def lanes(trace: Sequence[TraceRequest], steps: Sequence) -> tuple[list[str], list[list[int]]]:
    """``(request ids, states[request][step])`` with states WAIT / PREFILL / DECODE / DONE /
    ABSENT (not arrived yet). A step computes *decode* for a request when it computes one token
    after the whole prompt; anything else is prefill (a prompt chunk, or the recomputation of a
    preempted request). ``steps`` items need ``.step``, ``.batch``, ``.finished`` and, if there
    were preemptions, ``.preempted``."""
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
                decoding = in_batch[rid] == 1 and computed[rid] >= prompt[rid]
                col.append(DECODE if decoding else PREFILL)
            elif st.step >= arrival[rid]:
                col.append(WAIT)
            else:
                col.append(ABSENT)
        for rid, n in in_batch.items():
            computed[rid] += n
        for rid in getattr(st, "preempted", ()):
            computed[rid] = 0
        done.update(st.finished)
        grid.append(col)
    states = [[grid[t][i] for t in range(len(grid))] for i in range(len(ids))]
    return ids, states


def plot_lanes(trace: Sequence[TraceRequest], steps: Sequence, upto: int | None = None, ax=None, title: str = ""):
    """One horizontal lane per request over the steps: grey waiting, dark prefill, light
    decode, white done. ``upto`` blanks out the future (for a slider)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ids, states = lanes(trace, steps)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.3 * len(ids) + 1.6))
    # grid values: 0 absent, 1 done, 2 waiting, 3 decode, 4 prefill
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
        handles=[Patch(color="#cfcfcf", label="waiting"), Patch(color="#1d3557", label="prefill / recompute"),
                 Patch(color="#8ecae6", label="decode")],
        fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0), ncols=3, frameon=False,
    )
    ax.set_title(title or "Requests over steps", pad=18)
    return ax


@dataclass
class BudgetSplit:
    """How one step spent its token budget."""

    step: int
    decode: list[str]  # requests that computed one token after their prompt
    prompt: list[tuple[str, int]]  # (request, tokens) of prompt slices and recomputations
    budget: int

    @property
    def decode_tokens(self) -> int:
        return len(self.decode)

    @property
    def prompt_tokens(self) -> int:
        return sum(n for _, n in self.prompt)

    @property
    def unused(self) -> int:
        return self.budget - self.decode_tokens - self.prompt_tokens


def budget_split(trace: Sequence[TraceRequest], steps: Sequence, budget: int) -> list[BudgetSplit]:
    """One :class:`BudgetSplit` per step of a replay (same rule as :func:`lanes`)."""
    prompt = {r.request_id: r.prompt_len for r in trace}
    computed = dict.fromkeys(prompt, 0)
    out = []
    for st in steps:
        decode, slices = [], []
        for rid, n in st.batch:
            if n == 1 and computed[rid] >= prompt[rid]:
                decode.append(rid)
            else:
                slices.append((rid, n))
            computed[rid] += n
        for rid in getattr(st, "preempted", ()):
            computed[rid] = 0
        out.append(BudgetSplit(st.step, decode, slices, budget))
    return out


def describe_step(split: BudgetSplit) -> str:
    """``step 7: budget 16 = 3 decode (r0 r1 r2) + 13 prompt (doc 13) + 0 unused``."""
    decode = f"{split.decode_tokens} decode" + (f" ({' '.join(split.decode)})" if split.decode else "")
    prompt = f"{split.prompt_tokens} prompt" + (
        f" ({', '.join(f'{r} {n}' for r, n in split.prompt)})" if split.prompt else "")
    return f"step {split.step}: budget {split.budget} = {decode} + {prompt} + {split.unused} unused"


def plot_budget(trace: Sequence[TraceRequest], steps: Sequence, budget: int, ax=None, title: str = ""):
    """Stacked bars, one per step: the decode tokens (one per decoding request), then each
    prompt slice in its request's colour, up to the budget line."""
    import matplotlib.pyplot as plt

    splits = budget_split(trace, steps, budget)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.2))
    colours = plt.get_cmap("tab20").colors
    colour = {r.request_id: colours[(2 * i + 1) % len(colours)] for i, r in enumerate(trace)}
    xs = [s.step for s in splits]
    ax.bar(xs, [s.decode_tokens for s in splits], width=0.8, color="#2a6f97", label="decode tokens")
    labelled: set[str] = set()
    for s in splits:
        bottom = s.decode_tokens
        for rid, n in s.prompt:
            label = None if labelled else "prompt tokens (one colour per request)"
            labelled.add(rid)
            ax.bar(s.step, n, bottom=bottom, width=0.8, color=colour[rid], edgecolor="white",
                   linewidth=0.5, label=label)
            if n >= 0.12 * budget:
                ax.text(s.step, bottom + n / 2, rid, ha="center", va="center", fontsize=6, rotation=90)
            bottom += n
    ax.axhline(budget, color="crimson", linestyle="--", linewidth=1, label=f"budget ({budget} tokens)")
    ax.set_ylim(0, 1.15 * budget)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens computed")
    ax.set_title(title or "How each step spends its token budget", pad=18)
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0), ncols=3, frameon=False)
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
