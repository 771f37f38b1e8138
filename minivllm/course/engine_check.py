"""Serve the tiny model with a student's scheduler and with minivllm's own, and compare.

The last check of exercises 02 and 03: the student's class goes into ``LLM(scheduler=...)``
(its KV cache manager wrapped in :class:`~minivllm.course.reference.ProtocolOnlyKV`, with
``debug_checks=True`` so that every K/V read is checked to have been written for that very
token), requests arrive over several steps, and the run must keep the limits after every step
(:func:`~minivllm.course.reference.within_limits`), make the same decision at every step and
produce the same greedy tokens as ``LLM(scheduler="continuous")`` with the same settings. The
step count is bounded, so a scheduler that never retires anyone fails instead of looping.
"""

from __future__ import annotations

from collections.abc import Sequence

from minivllm.course.harness import (
    TraceRequest,
    TraceResult,
    TraceRun,
    expect_same_steps,
    expect_same_tokens,
    run_trace,
)
from minivllm.course.reference import SCHEDULER_FIELDS, protocol_only, within_limits
from minivllm.course.runtime import configure
from minivllm.engine.core_client import local_core

# Prompts in the tiny model's world, of ragged lengths (5 to about 60 tokens).
STORY_PROMPTS = [
    "Once upon a time",
    "The little fox lived in a den at the edge of the forest. One morning she",
    "Tom went to the market and",
    "Mia had a red ball. She played with it every day in the garden behind her house. "
    "One warm day, the ball rolled under the fence, and Mia",
    "A bird sat on a branch",
    "Sam and Lily were friends. They liked to build towers of blocks. Lily",
    "In the morning the sun came up over the hills, and the old man",
    "The old man smiled",
]


def story_trace(arrivals: Sequence[int], max_tokens: int = 16) -> list[TraceRequest]:
    """:data:`STORY_PROMPTS` as a trace: request ``p{i}`` joins before step ``arrivals[i]`` and
    wants ``max_tokens`` tokens, greedily, stopping early at the end of its story (EOS)."""
    return [TraceRequest(f"p{i}", p, max_tokens, at, ignore_eos=False)
            for i, (p, at) in enumerate(zip(STORY_PROMPTS, arrivals, strict=True))]


def compare_on_engine(factory, arrivals: Sequence[int], label: str = "", max_tokens: int = 16,
                      **engine_args) -> tuple[TraceResult, TraceResult]:
    """Serve :func:`story_trace` with minivllm's scheduler, then with ``factory``'s (given only
    the KV cache manager's protocol), step by step; raise at the first step that breaks a limit
    or whose decisions differ (the batch, the preempted, the ended, the KV blocks in use, the
    queue), or at the first request whose tokens differ. Returns ``(its run, minivllm's)``."""
    from minivllm import LLM

    _, dtype = configure()
    args = dict(dtype=dtype, seed=0, enable_prefix_caching=False, debug_checks=True, **engine_args)
    trace = story_trace(arrivals, max_tokens)
    reference_llm = LLM(scheduler="continuous", **args)
    reference = run_trace(reference_llm, trace, max_steps=500)
    limits = local_core(reference_llm).scheduler.config
    settings = "LLM(" + ", ".join(f"{k}={v}" for k, v in engine_args.items()) + ")"
    mine = TraceRun(LLM(scheduler=protocol_only(factory), **args), trace, label=label, max_steps=500,
                    checks=[within_limits(limits.max_num_seqs, limits.max_num_batched_tokens, label, settings)])
    expect_same_steps(reference, mine, SCHEDULER_FIELDS, label, settings)
    expect_same_tokens(reference.tokens, mine.result.tokens, f"{label + ': ' if label else ''}greedy tokens")
    return mine.result, reference
