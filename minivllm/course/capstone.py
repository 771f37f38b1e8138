"""The capstone: the student's own mini-vLLM, assembled from the exercises, serving the model.

Every exercise from 02 on writes one part of the engine behind one of minivllm's plug-in
protocols. :func:`assemble` puts the student's parts together into one engine:

=================  ===========================================================================
part               whose code
=================  ===========================================================================
scheduler          ex03 ``ChunkedScheduler`` (built on ex02's); else ex02 ``ContinuousScheduler``
                   alone (whole prompts, no preemption); else the reference ex03
KV cache manager   ex07 ``PrefixCachingKVCacheManager``, on ex04's ``BlockPool`` (each the
                   student's where it passes its checks, the reference where not)
attention          ex05 ``PagedAttentionBackend``; on a GPU (or asked) ex06's Triton decode
                   kernel for decode-only steps, ex05's backend for the others
step loop          ex08 ``StepLoop``
=================  ===========================================================================

A part is the student's if their file passes its checks, else the reference stands in; the
table (:meth:`Engine.table`) says which, and how the student's file did
(:meth:`Engine.stand_ins` lists the parts where the reference stood in). Exercise 03's
scheduler admits requests without asking the prefix cache and cannot fork, so the engine is
served twice (:func:`check_engine`): all of it the student's, on a trace with chunked prompts
and preemption; then with minivllm's ``Scheduler`` in its place
(:meth:`Engine.under_minivllm_scheduler`), on a trace with prefix hits, ``n > 1`` forks and
preemption. Both must give minivllm's own engine's tokens, step for step the same decisions,
and every request a time to first token.

:func:`serve_engine_trace` serves the second trace with only the step loop replaced: exercise
08's engine case.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from minivllm.course.grading import TODO, CaseResult, Mismatch, Report
from minivllm.course.harness import (
    TraceRequest,
    TraceResult,
    beam_search,
    expect_same_steps,
    run_trace,
)
from minivllm.course.loader import exercise_names, load, load_or_error, use_solutions
from minivllm.course.reference import DECISIONS
from minivllm.course.verdicts import verdict, working

BLOCK_SIZE = 16
MAX_MODEL_LEN = 128


# --- which code each part runs -----------------------------------------------------------------
@dataclass(frozen=True)
class Part:
    """One row of the capstone's table."""

    role: str  # "scheduler", "KV cache manager", "  under it", ...
    what: str  # the class (and what of it runs)
    exercise: str  # "ex03_chunked_prefill", or "minivllm"
    whose: str  # "yours" or "reference" (or "minivllm")
    checks: str  # how the student's file fares on its checks, e.g. "✓ 14/14"
    group: str = ""  # the part a row belongs to: "scheduler", "kv", "attention", "step loop"


def _checks_of(module: ModuleType | None) -> str:
    """How the student's file fares on its checks; "—" for the reference (graded by its own
    tests, not here)."""
    if module is None or module.__course_source__ == "solutions":
        return "—"
    report = verdict(module)
    n, ok = len(report.results), report.num_passed
    counts = report.counts()
    extra = ", ".join(f"{counts[k]} {k}" for k in ("fail", "error", "todo") if counts[k])
    return f"✓ {ok}/{n}" if report.passed else f"✗ {ok}/{n} ({extra})"


def _whose(module: ModuleType) -> str:
    return "yours" if module.__course_source__ == "exercises" else "reference"


def _pick(name: str) -> tuple[ModuleType, ModuleType]:
    """``(the module to run, the student's module)``: the student's file if it passes its
    checks (under ``MINIVLLM_SOLUTIONS=1`` that file is the reference), else the reference."""
    mine = load(name)
    if mine.__course_source__ == "solutions" or verdict(mine).passed:
        return mine, mine
    return load(name, solutions=True), mine


def _part(role: str, what: str, runs: ModuleType, mine: ModuleType, group: str) -> Part:
    return Part(role, what, mine.__exercise__, _whose(runs), _checks_of(mine), group)


@dataclass
class Engine:
    """The parts of an engine, and how to build an ``LLM`` from them (fresh instances each
    time: a KV cache manager holds the state of the requests it serves)."""

    parts: list[Part]
    scheduler: Any  # a class or factory for LLM(scheduler=...), or "continuous"
    make_kv: Callable[[int, int], Any]  # (num_blocks, block_size) -> a KV cache manager
    make_backend: Callable[[], Any]  # -> an attention backend
    step_loop: type
    chunked_prefill: bool = True  # the scheduler cuts prompts into chunks
    preempts: bool = True  # the scheduler preempts when the pool is full
    looks_up_prefixes: bool = False  # the scheduler asks the KV cache manager for prefix hits
    forks: bool = False  # n > 1 forks off the first sample (copy-on-write)

    def _args(self, engine_args: dict) -> dict:
        args = dict(max_model_len=MAX_MODEL_LEN, dtype=course_dtype(), enable_chunked_prefill=self.chunked_prefill)
        if not self.chunked_prefill:
            args["max_num_batched_tokens"] = MAX_MODEL_LEN
        return {**args, **engine_args}

    def llm(self, num_kv_blocks: int, **engine_args):
        """An ``LLM`` serving the tiny model with these parts (``debug_checks=True``)."""
        from minivllm import LLM

        return LLM(scheduler=self.scheduler, kv_cache=self.make_kv(num_kv_blocks, BLOCK_SIZE),
                   attention_backend=self.make_backend(), engine_core=self.step_loop,
                   **self._args({"debug_checks": True, **engine_args}))

    def minivllm_llm(self, num_kv_blocks: int, **engine_args):
        """minivllm's own engine with the same settings: same pool, chunking, prefix caching."""
        from minivllm import LLM

        return LLM(num_kv_blocks=num_kv_blocks, block_size=BLOCK_SIZE, enable_prefix_caching=self.looks_up_prefixes,
                   **self._args(engine_args))

    def under_minivllm_scheduler(self) -> Engine:
        """The same KV cache manager, attention and step loop under minivllm's ``Scheduler``,
        which looks up the prefix cache at admission and forks ``n > 1`` samples."""
        row = Part("scheduler", "Scheduler (prefix-cache lookups, forks)", "minivllm", "minivllm", "—", "scheduler")
        parts = [row] + [p for p in self.parts if p.group != "scheduler"]
        return replace(self, parts=parts, scheduler="continuous", chunked_prefill=True, preempts=True,
                       looks_up_prefixes=True, forks=True)

    def table(self) -> str:
        """The parts as a text table: part, class, exercise, whose code ran, the checks."""
        rows = [("part", "what runs", "exercise", "whose", "your file's checks")]
        rows += [(p.role, p.what, p.exercise, p.whose, p.checks) for p in self.parts]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    @property
    def all_yours(self) -> bool:
        return all(p.whose != "reference" for p in self.parts)

    def stand_ins(self) -> list[Part]:
        """The parts where the reference ran because the student's file does not pass its checks
        (nothing stands in when the reference itself is graded)."""
        return [p for p in self.parts if p.whose == "reference" and p.checks.startswith("✗")]


def course_dtype() -> str:
    from minivllm.course.runtime import engine_dtype

    return engine_dtype()


def assemble(step_loop: ModuleType | type | None = None, triton: bool | None = None) -> Engine:
    """The student's engine. ``step_loop``: exercise 08's module (or a core class); default
    ``course.working("ex08_engine_step")``. ``triton``: use exercise 06's kernel for decode
    steps (default: when a CUDA GPU is present; the Triton interpreter on a CPU is slow)."""
    parts: list[Part] = []
    scheduler, chunked, preempts = _scheduler(parts)
    make_kv = _kv_cache(parts)
    make_backend = _attention(parts, triton)
    step_class = _step_loop(parts, step_loop)
    return Engine(parts, scheduler, make_kv, make_backend, step_class, chunked, preempts)


def _scheduler(parts: list[Part]) -> tuple[type, bool, bool]:
    ex03, mine03 = _pick("ex03_chunked_prefill")
    ex02_mine = load("ex02_continuous")
    if ex03 is not mine03 and verdict(ex02_mine).passed and ex02_mine.__course_source__ == "exercises":
        parts.append(_part("scheduler", "ContinuousScheduler (whole prompts, no preemption)", ex02_mine, ex02_mine,
                           "scheduler"))
        parts.append(Part("  not used", "ChunkedScheduler", "ex03_chunked_prefill", "—", _checks_of(mine03),
                          "scheduler"))
        return ex02_mine.ContinuousScheduler, False, False
    cls = ex03.ChunkedScheduler
    parts.append(_part("scheduler", "ChunkedScheduler.schedule", ex03, mine03, "scheduler"))
    base = sys.modules[cls.__mro__[1].__module__]
    parts.append(_part("  under it", "ContinuousScheduler.update_from_output", base, ex02_mine, "scheduler"))
    return cls, True, True


def _kv_cache(parts: list[Part]) -> Callable[[int, int], Any]:
    ex07, mine07 = _pick("ex07_prefix_cache")
    parts.append(_part("KV cache manager", "PrefixCachingKVCacheManager", ex07, mine07, "kv"))
    parts.append(_part("  under it", "BlockPool", ex07.ex04, load("ex04_block_allocator"), "kv"))
    return ex07.PrefixCachingKVCacheManager


def _attention(parts: list[Part], triton: bool | None) -> Callable[[], Any]:
    import torch

    ex05, mine05 = _pick("ex05_paged_attention_ref")
    if not (torch.cuda.is_available() if triton is None else triton):
        parts.append(_part("attention", "PagedAttentionBackend", ex05, mine05, "attention"))
        return ex05.PagedAttentionBackend
    ex06, mine06 = _pick("ex06_triton_kernel")
    parts.append(_part("attention", "PagedDecodeBackend (decode-only steps)", ex06, mine06, "attention"))
    parts.append(_part("  other steps", "PagedAttentionBackend", ex05, mine05, "attention"))

    def make() -> Any:
        backend = ex06.PagedDecodeBackend()
        backend.reference = ex05.PagedAttentionBackend()  # steps with prompt tokens: your ex05
        return backend

    return make


def _step_loop(parts: list[Part], step_loop: ModuleType | type | None) -> type:
    if step_loop is None:
        step_loop = working("ex08_engine_step")
    if isinstance(step_loop, ModuleType):
        checks = "—" if getattr(step_loop, "__course_report__", None) is None else _checks_of(step_loop)
        parts.append(Part("step loop", "StepLoop.run_step", "ex08_engine_step", _whose(step_loop), checks, "step loop"))
        return step_loop.StepLoop
    parts.append(Part("step loop", step_loop.__name__, "—", "yours", "—", "step loop"))
    return step_loop


def step_loop_runs(core_class: type) -> None:
    """Run one step of ``core_class`` on a fake executor: a stub raises ``NotImplementedError``
    here, cheaply, before anything is assembled."""
    from minivllm.course.core_replay import CoreSetup, run_core

    run_core(core_class, [TraceRequest("probe", (1, 2), 1)], CoreSetup())


# --- serving a trace ---------------------------------------------------------------------------
STORY = (
    "Once upon a time there was a little fox who lived in a quiet forest near a river. Every "
    "morning she walked to the water to drink, and every evening she came home to her den."
)

# Chunked prompts (a budget of 32 tokens) and a pool too small for all of them: preemption.
CHUNKS_AND_PREEMPTION = [
    TraceRequest("fox", STORY, 20),
    TraceRequest("ball", "Mia had a red ball. She played with it every day in the garden behind her house. "
                 "One warm day, the ball rolled under the fence, and Mia", 20, arrival_step=1),
    TraceRequest("time", "Once upon a time", 24, arrival_step=1),
    TraceRequest("market", "Tom went to the market and", 24, arrival_step=2),
    TraceRequest("friends", "Sam and Lily were friends. They liked to build towers of blocks. Lily", 20,
                 arrival_step=3),
    TraceRequest("sun", "In the morning the sun came up over the hills, and the old man", 16, arrival_step=5),
]
# The story again: its first blocks are in the prefix cache by the time the others arrive;
# two samples of one prompt fork; the pool is small enough to preempt.
PREFIX_FORKS_AND_PREEMPTION = [
    TraceRequest("story", STORY, 16),
    TraceRequest("story-then", STORY + " One day she", 16, arrival_step=3),
    TraceRequest("story-again", STORY + " She liked", 12, arrival_step=6),
    TraceRequest("two", "The little fox", 16, arrival_step=1, n=2, temperature=0.8, seed=7),
    TraceRequest("bird", "A bird sat on a branch", 20, arrival_step=2),
    TraceRequest("smile", "The old man smiled", 20, arrival_step=4),
]
POOLS = {"chunks": 9, "prefix": 11}  # KV blocks of 16 tokens (tuned to preempt; see check_engine)
TOKEN_BUDGET = 32
SUMMARY_KEYS = ("num_steps", "output_tokens", "prefill_tokens", "decode_tokens", "preemptions",
                "prefill_tokens_skipped", "peak_kv_blocks_used")


@dataclass
class Served:
    """What the capstone compares of one run: its steps and completions (keyed
    ``"request[index]"``), the prompt tokens served from the cache, the run's counts, and the
    beams of a beam search."""

    run: TraceResult
    beams: list[list[int]] = field(default_factory=list)
    tokens: dict[str, list[int]] = field(init=False)
    texts: dict[str, str] = field(init=False)
    cached: dict[str, int] = field(init=False)
    decisions: list[list[tuple[str, int]]] = field(init=False)
    summary: dict[str, float] = field(init=False)
    cow_copies: int = field(init=False)
    no_ttft: list[str] = field(init=False)  # finished requests without a first-token time

    def __post_init__(self) -> None:
        stats, run = self.run.stats, self.run
        key = {rid: f"{rid.partition('#')[0]}[{rid.partition('#')[2] or 0}]" for rid in run.tokens}
        self.tokens = {key[rid]: tokens for rid, tokens in run.tokens.items()}
        self.texts = {key[rid]: text for rid, text in run.texts.items()}
        self.cached, self.decisions = run.cached, run.decisions
        self.summary = {k: stats.summary()[k] for k in SUMMARY_KEYS}
        self.cow_copies = sum(s.num_cow_copies for s in stats.steps)
        self.no_ttft = sorted(rid for rid, m in stats.requests.items()
                              if m.finished_time is not None and m.first_token_time is None)


def serve(llm, trace: Sequence[TraceRequest], max_steps: int = 600) -> Served:
    """Serve ``trace`` on ``llm``'s engine, request ``i`` joining before step ``arrival_step``."""
    return Served(run_trace(llm, trace, max_steps=max_steps))


def compare_served(expected: Served, got: Served, label: str) -> None:
    """Raise at the first difference: a step's decisions (batch, preempted, ended, KV blocks in
    use), a completion's tokens, the prompt tokens served from the cache, the run's counts, a
    missing TTFT, the beams."""
    expect_same_steps(expected.run, got.run, DECISIONS, label)
    for key, want in expected.tokens.items():
        if got.tokens.get(key) != want:
            raise Mismatch(want, got.tokens.get(key), f"{label}: the tokens of {key}")
    if got.cached != expected.cached:
        raise Mismatch(expected.cached, got.cached, f"{label}: prompt tokens served from the prefix cache")
    if got.summary != expected.summary:
        keys = [k for k in expected.summary if expected.summary[k] != got.summary.get(k)]
        raise Mismatch({k: expected.summary[k] for k in keys}, {k: got.summary.get(k) for k in keys},
                       f"{label}: the run's statistics")
    if got.no_ttft:
        raise Mismatch([], got.no_ttft, f"{label}: finished requests without a time to first token")
    if got.beams != expected.beams:
        raise Mismatch(expected.beams, got.beams, f"{label}: beam search's beams")


def serve_engine_trace(step_loop: type | None) -> Served:
    """Exercise 08's engine case: the prefix/fork/preemption trace and a beam search, served
    with ``LLM(engine_core=step_loop)`` over minivllm's scheduler (committing left to the core)
    and paged KV cache manager; ``None``: minivllm's own engine."""
    from minivllm import LLM
    from minivllm.course.runtime import one_cpu_thread

    args = dict(max_model_len=MAX_MODEL_LEN, dtype=course_dtype(), max_num_batched_tokens=TOKEN_BUDGET,
                num_kv_blocks=POOLS["prefix"])

    def make():
        if step_loop is None:
            return LLM(**args)
        return LLM(engine_core=step_loop, debug_checks=True, **args)

    with one_cpu_thread():
        served = serve(make(), PREFIX_FORKS_AND_PREEMPTION)
        served.beams = beam_search(make(), ["Tom went to the market and"], width=2, max_tokens=6, max_steps=100)[0]
    return served


# --- checking the assembled engine -------------------------------------------------------------
@dataclass
class CapstoneRun:
    label: str
    engine: Engine
    yours: Served
    minivllm: Served


def run_engine(engine: Engine) -> list[CapstoneRun]:
    """Serve the capstone's traces with ``engine`` and with minivllm's own engine: all the
    student's parts on the chunk/preemption trace; the same under minivllm's scheduler on the
    prefix/fork/preemption trace."""
    from minivllm.course.runtime import one_cpu_thread

    runs = []
    with one_cpu_thread():
        for label, parts, trace, pool in (
            ("your engine", engine, CHUNKS_AND_PREEMPTION, POOLS["chunks"] if engine.preempts else 64),
            ("under minivllm's scheduler", engine.under_minivllm_scheduler(), PREFIX_FORKS_AND_PREEMPTION,
             POOLS["prefix"]),
        ):
            budget = {"max_num_batched_tokens": TOKEN_BUDGET} if parts.chunked_prefill else {}
            runs.append(CapstoneRun(label, parts, serve(parts.llm(pool, **budget), trace),
                                    serve(parts.minivllm_llm(pool, **budget), trace)))
    return runs


def check_engine(engine: Engine) -> list[CapstoneRun]:
    """Both runs must match minivllm's own engine; each trace must also have done what it is
    there for (a guard on the traces: preemption, prefix hits, copy-on-write)."""
    runs = run_engine(engine)
    for run in runs:
        compare_served(run.minivllm, run.yours, run.label)
    first, second = runs[0].minivllm, runs[1].minivllm
    if engine.preempts and first.summary["preemptions"] == 0:
        raise AssertionError("the chunk/preemption trace no longer preempts: retune POOLS['chunks']")
    if second.summary["preemptions"] == 0 or second.summary["prefill_tokens_skipped"] == 0 or second.cow_copies == 0:
        raise AssertionError(f"the prefix/fork trace lost a feature: {second.summary}, {second.cow_copies} copies")
    return runs


# --- the capstone's line on the scoreboard ----------------------------------------------------------
CAPSTONE = "capstone"
PREREQUISITES = ("ex02_continuous", "ex03_chunked_prefill", "ex04_block_allocator", "ex05_paged_attention_ref",
                 "ex06_triton_kernel", "ex07_prefix_cache", "ex08_engine_step")


def _capstone_case(step_loop: ModuleType) -> None:
    """Serve the tiny model with the engine assembled from every part; its own line on the
    scoreboard, after the exercises it needs pass their own checks."""
    step_loop_runs(step_loop.StepLoop)  # a stub fails here, before anything is assembled
    check_engine(assemble(step_loop))


def capstone_report(solutions: bool | None = None) -> Report:
    """The capstone's scoreboard line: ``todo`` ("needs ex02, ex05") until every exercise it is
    assembled from passes its own checks; then the engine of all those parts must serve the tiny
    model with minivllm's tokens and decisions."""
    from minivllm.course.grading import Case, run_case

    case_ = Case("your whole engine, the parts of exercises 02-08, serving the tiny model", CAPSTONE, _capstone_case,
                 "notebook 08's capstone section shows which part disagrees: serve its traces there")
    absent = [name.split("_")[0] for name in PREREQUISITES if name not in exercise_names()]
    if absent:
        report = Report(CAPSTONE, "exercises")
        report.results.append(CaseResult(case_, TODO, f"needs {', '.join(absent)}, which this copy of the course has not"))
        return report

    modules = {name: load_or_error(name, solutions) for name in PREREQUISITES}
    broken = [name.split("_")[0] for name, module in modules.items() if isinstance(module, BaseException)]
    if broken:
        report = Report(CAPSTONE, "solutions" if (use_solutions() if solutions is None else solutions) else "exercises")
        report.results.append(CaseResult(case_, TODO, f"needs {', '.join(broken)} (a file that does not import)"))
        return report
    source = modules["ex08_engine_step"].__course_source__
    report = Report(CAPSTONE, source)
    missing = [name.split("_")[0] for name, module in modules.items() if not verdict(module).passed]
    if missing:
        report.results.append(CaseResult(case_, TODO, f"needs {', '.join(missing)} (each passing its own checks)"))
    else:
        report.results.append(run_case(case_, modules["ex08_engine_step"]))
    return report
