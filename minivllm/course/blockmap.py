"""The physical block map of a paged KV cache, frame by frame (notebooks 04 and 07).

A frame says, for every physical block of the pool, which requests' block tables point at it
(its reference count is how many), how many of its slots hold K/V, whether a free block still
holds a cached prefix, and what happened to get there. It is read through minivllm's
``KVCacheManager`` protocol -- ``get_block_ids`` for the tables, a request's
``num_computed_tokens`` for how far it is -- so it works the same with minivllm's own manager
and with the managers of exercises 04 and 07. Two extras are read when the manager has them:
which blocks are in the prefix cache, and the order of the free queue.

- :func:`snapshot`: one frame of a manager now (drive it by hand: allocate, append, free);
- :class:`BlockMapRecorder`: ``LLM(engine_core=recorder.core)`` records a frame after every
  engine step -- ``generate``, ``stream`` and ``beam_search`` alike -- captioned with what the
  step did (admissions and prefix hits, new blocks, preemptions, forks, copies, finishes);
- :func:`draw_block_map`, :func:`plot_key_frames`: pictures with matplotlib;
- :func:`show_block_maps`: a slider over the frames (ipywidgets 7 or 8), or without ipywidgets
  the key frames as a static figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from minivllm.core.engine_core import EngineCore

FREE_COLOR, CACHED_COLOR = "#ffffff", "#d9d9d9"
LABEL_BOX = dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none", alpha=0.8)
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"]


@dataclass
class BlockMapFrame:
    """The pool at one moment. ``tables``: request id -> its block ids (logical order);
    ``tokens``: request id -> tokens whose K/V it has in the cache; ``cached``: blocks
    registered in the prefix cache; ``free_queue``: free blocks, next handed out first (if the
    manager says); ``copies``: copy-on-write ``(src, dst)`` pairs of the step."""

    num_blocks: int
    block_size: int
    tables: dict[str, list[int]]
    tokens: dict[str, int]
    cached: frozenset[int] = frozenset()
    free_queue: list[int] | None = None
    copies: list[tuple[int, int]] = field(default_factory=list)
    caption: str = ""
    step: int | None = None

    def owners(self) -> list[list[str]]:
        """Per block, the requests whose tables point at it (their number is its ref count)."""
        out: list[list[str]] = [[] for _ in range(self.num_blocks)]
        for rid, table in self.tables.items():
            for block in table:
                out[block].append(rid)
        return out

    def ref_counts(self) -> list[int]:
        return [len(o) for o in self.owners()]

    def fill(self) -> list[int]:
        """Per block, how many of its slots hold K/V (the most any of its owners wrote)."""
        out = [0] * self.num_blocks
        bs = self.block_size
        for rid, table in self.tables.items():
            n = self.tokens.get(rid, 0)
            for i, block in enumerate(table):
                out[block] = max(out[block], min(max(n - i * bs, 0), bs))
        return out

    @property
    def num_used(self) -> int:
        return sum(1 for o in self.owners() if o)

    @property
    def cached_free(self) -> list[int]:
        held = {b for t in self.tables.values() for b in t}
        return sorted(self.cached - held)

    def table_text(self) -> str:
        """One line per request: its tokens and its block table."""
        lines = [f"{rid:>8} ({self.tokens.get(rid, 0):>3} tokens): {table}" for rid, table in self.tables.items()]
        head = f"{self.num_used} of {self.num_blocks} blocks in use"
        if self.cached_free:
            head += f"; free but cached: {self.cached_free}"
        return "\n".join([head, *lines])


# --- reading a manager --------------------------------------------------------------------------------
def cached_block_ids(kv) -> set[int]:
    """Blocks in the prefix cache: minivllm's ``block_pool.cached_blocks`` or exercise 07's
    ``cached_block_ids()`` (an empty set for a manager without a prefix cache)."""
    pool = getattr(kv, "block_pool", None)
    if pool is not None and isinstance(getattr(pool, "cached_blocks", None), dict):
        return {b.block_id for b in pool.cached_blocks.values()}
    cached = getattr(kv, "cached_block_ids", None)
    return set(cached()) if callable(cached) else set()


def free_queue_order(kv) -> list[int] | None:
    """Free block ids, the next to be handed out first: minivllm's ``block_pool.free_queue`` or
    the exercises' ``pool.free_block_ids()`` (``None`` if the manager has neither)."""
    pool = getattr(kv, "block_pool", None)
    if pool is not None and hasattr(pool, "free_queue"):
        return [b.block_id for b in pool.free_queue]
    free_ids = getattr(getattr(kv, "pool", None), "free_block_ids", None)
    return list(free_ids()) if callable(free_ids) else None


def snapshot(kv, requests: Iterable | Mapping[str, int], caption: str = "", step: int | None = None,
             copies: Sequence[tuple[int, int]] = ()) -> BlockMapFrame:
    """A frame of ``kv`` now. ``requests``: the requests to show (objects with ``request_id``
    and ``num_computed_tokens``), or ``{request id: tokens stored}``; requests that hold no
    block are left out."""
    if isinstance(requests, Mapping):
        counts = dict(requests)
    else:
        counts = {r.request_id: r.num_computed_tokens for r in requests}
    tables = {rid: list(kv.get_block_ids(rid)) for rid in counts}
    tables = {rid: t for rid, t in tables.items() if t}
    return BlockMapFrame(kv.num_blocks, kv.block_size, tables, {r: counts[r] for r in tables},
                         frozenset(cached_block_ids(kv)), free_queue_order(kv), list(copies), caption, step)


# --- recording an engine ------------------------------------------------------------------------------
class BlockMapRecorder:
    """Records a :class:`BlockMapFrame` after every engine step.

    ``LLM(..., engine_core=recorder.core)`` plugs it in; ``recorder.frames`` fills up as the
    engine runs. ``max_frames`` bounds the memory it keeps (the first frames are kept)."""

    def __init__(self, max_frames: int = 400):
        self.frames: list[BlockMapFrame] = []
        self.max_frames = max_frames
        self._tables: dict[str, list[int]] = {}

    def core(self, scheduler, executor, **kwargs) -> EngineCore:
        """minivllm's :class:`EngineCore`, with this recorder listening to every step."""
        core = EngineCore(scheduler, executor, **kwargs)
        core.add_step_listener(lambda result: self.record(core, result))
        return core

    def record(self, core: EngineCore, result) -> None:
        out = result.plan
        live = core.scheduler.live_requests()
        frame = snapshot(core.kv, live, step=len(self.frames), copies=out.blocks_to_copy)
        frame.caption = f"step {frame.step}: " + "; ".join(self._events(out, result, frame))
        self._tables = frame.tables
        if len(self.frames) < self.max_frames:
            self.frames.append(frame)

    def _events(self, out, result, frame: BlockMapFrame) -> list[str]:
        before, now = self._tables, frame.tables
        events = []
        for req, start, n in zip(out.requests, out.num_computed, out.num_new, strict=True):
            rid = req.request_id
            if rid not in before:  # it held nothing before this step: admitted now
                what = "readmitted" if req.num_preemptions else "admitted"
                hit = f", {start} from the prefix cache" if start else ""
                events.append(f"{rid} {what} ({n} tokens computed{hit})")
        for victim in out.preempted:
            events.append(f"{victim.request_id} preempted (freed {before.get(victim.request_id, [])})")
        siblings = set()
        for leader, kids in out.forks.items():
            siblings.update(k.request_id for k in kids)
            events.append(f"{leader} forked into {', '.join(k.request_id for k in kids)}")
        scheduled = {r.request_id for r in out.requests}
        for rid, table in now.items():  # forked by someone else (beam search): shares its blocks
            if rid not in before and rid not in scheduled and rid not in siblings:
                events.append(f"{rid} forked (shares {table})")
        for src, dst in out.blocks_to_copy:
            events.append(f"copy-on-write {src} -> {dst}")
        for rid, table in now.items():
            old = before.get(rid)
            if old is not None and len(table) > len(old):
                events.append(f"{rid} +block {table[len(old):]}")
        finished = list(result.finish_reasons)
        ended = set(finished) | {r.request_id for r in out.preempted}
        for rid in finished:
            events.append(f"{rid} finished (freed {before.get(rid, [])})")
        for rid in before:  # ended from outside the step (a beam dropped by beam search, an abort)
            if rid not in now and rid not in ended:
                events.append(f"{rid} dropped (released {before[rid]})")
        return events or ["decode"]


# --- pictures -------------------------------------------------------------------------------------------
def request_colors(frames: Iterable[BlockMapFrame]) -> dict[str, str]:
    """A colour per request, in order of first appearance (stable across frames)."""
    colors: dict[str, str] = {}
    for frame in frames:
        for rid in frame.tables:
            if rid not in colors:
                colors[rid] = PALETTE[len(colors) % len(PALETTE)]
    return colors


def _grid(num_blocks: int, columns: int | None) -> tuple[int, int]:
    cols = columns or min(16, max(4, round((2 * num_blocks) ** 0.5)))
    return cols, -(-num_blocks // cols)


def draw_block_map(frame: BlockMapFrame, ax=None, colors: Mapping[str, str] | None = None,
                   columns: int | None = None, title: str | None = None, legend: bool = True):
    """Draw the pool: one square per physical block, numbered. A held block has its owner's
    colour, dark for the slots holding K/V and light for reserved empty ones; a block shared by
    several tables is hatched and labelled with its reference count; a free block that still
    holds a cached prefix is grey; a copy-on-write destination has a red edge."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Patch, Rectangle

    colors = dict(colors) if colors is not None else request_colors([frame])
    cols, rows = _grid(frame.num_blocks, columns)
    if ax is None:
        _, ax = plt.subplots(figsize=(min(0.55 * cols + 2.8, 12), 0.55 * rows + 1.0))
    owners, fill = frame.owners(), frame.fill()
    copied_to = {dst for _, dst in frame.copies}
    cached = frame.cached
    for b in range(frame.num_blocks):
        r, c = divmod(b, cols)
        x, y = c, rows - 1 - r
        who = owners[b]
        edge = "#c0392b" if b in copied_to else "#555555"
        if who:
            color = colors.get(who[0], "#999999")
            light = to_rgba(color, 0.25)
            ax.add_patch(Rectangle((x, y), 0.92, 0.92, facecolor=light, edgecolor=edge,
                                   linewidth=2 if b in copied_to else 0.8))
            ax.add_patch(Rectangle((x, y), 0.92 * fill[b] / frame.block_size, 0.92, facecolor=color,
                                   edgecolor="none", hatch="///" if len(who) > 1 else None))
            if len(who) > 1:
                ax.text(x + 0.46, y + 0.3, f"x{len(who)}", ha="center", va="center", fontsize=8,
                        color="black", weight="bold", bbox=LABEL_BOX)
        else:
            face = CACHED_COLOR if b in cached else FREE_COLOR
            ax.add_patch(Rectangle((x, y), 0.92, 0.92, facecolor=face, edgecolor=edge, linewidth=0.8))
        ax.text(x + 0.06, y + 0.86, str(b), ha="left", va="top", fontsize=6, color="#222222", bbox=LABEL_BOX)
    ax.set_xlim(-0.1, cols + 0.1)
    ax.set_ylim(-0.1, rows + 0.1)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title if title is not None else frame.caption, fontsize=8, loc="left", wrap=True)
    if legend:
        handles = [Patch(facecolor=colors.get(rid, "#999999"), label=rid) for rid in frame.tables][:14]
        handles.append(Patch(facecolor=FREE_COLOR, edgecolor="#555555", label="free"))
        if frame.cached_free:
            handles.append(Patch(facecolor=CACHED_COLOR, edgecolor="#555555", label="free, cached prefix"))
        if any(len(o) > 1 for o in owners):
            handles.append(Patch(facecolor="#bbbbbb", hatch="///", label="shared (xN = ref count)"))
        if copied_to:
            handles.append(Patch(facecolor=FREE_COLOR, edgecolor="#c0392b", label="copy-on-write copy"))
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def key_frames(frames: Sequence[BlockMapFrame], k: int = 4) -> list[int]:
    """Indices of up to ``k`` frames worth looking at: the first, the first of each kind of
    event (preemption, readmission, fork, copy-on-write, prefix hit, finish), then the last."""
    if not frames:
        return []
    picks = [0]
    for word in ("preempted", "readmitted", "forked", "copy-on-write", "from the prefix cache", "finished"):
        i = next((i for i, f in enumerate(frames) if word in f.caption), None)
        if i is not None and i not in picks:
            picks.append(i)
    if len(frames) - 1 not in picks:
        picks.append(len(frames) - 1)
    if len(picks) > k:
        picks = picks[: k - 1] + [picks[-1]]
    return sorted(picks)


def plot_key_frames(frames: Sequence[BlockMapFrame], k: int = 4, columns: int | None = None,
                    indices: Sequence[int] | None = None):
    """The key frames (or ``indices``) side by side, stacked, with their captions."""
    import matplotlib.pyplot as plt

    picks = list(indices) if indices is not None else key_frames(frames, k)
    colors = request_colors(frames)
    cols, rows = _grid(frames[0].num_blocks, columns)
    fig, axes = plt.subplots(len(picks), 1, figsize=(min(0.55 * cols + 3.2, 12), (0.55 * rows + 0.9) * len(picks)),
                             squeeze=False)
    for ax, i in zip(axes[:, 0], picks, strict=True):
        draw_block_map(frames[i], ax, colors=colors, columns=columns)
    fig.tight_layout()
    return fig


def show_block_maps(frames: Sequence[BlockMapFrame], columns: int | None = None) -> None:
    """A slider (and a play button) over ``frames`` with ipywidgets 7 or 8; without ipywidgets,
    the key frames as a static figure. The block tables are printed under the picture."""
    import matplotlib.pyplot as plt

    if not frames:
        print("no frames recorded")
        return
    try:
        import ipywidgets as widgets
        from IPython.display import display
    except ImportError:
        widgets = None
    if widgets is None:
        plot_key_frames(frames, columns=columns)
        plt.show()
        for i in key_frames(frames):
            print(frames[i].caption)
            print(frames[i].table_text())
        return
    colors = request_colors(frames)

    def show(frame: int = 0) -> None:
        draw_block_map(frames[frame], colors=colors, columns=columns)
        plt.show()
        print(frames[frame].table_text())

    slider = widgets.IntSlider(value=0, min=0, max=len(frames) - 1, description="frame", continuous_update=False)
    play = widgets.Play(value=0, min=0, max=len(frames) - 1, interval=900, description="play")
    widgets.jslink((play, "value"), (slider, "value"))
    output = widgets.interactive_output(show, {"frame": slider})
    display(widgets.VBox([widgets.HBox([play, slider]), output]))
