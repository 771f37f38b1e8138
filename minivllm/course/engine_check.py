"""Serve the tiny model with a student's scheduler and with minivllm's own, and compare.

The last check of exercises 02 and 03: the student's class goes into ``LLM(scheduler=...)``
(its KV cache manager wrapped in :class:`~minivllm.course.scheduling.ProtocolOnlyKV`, with
``debug_checks=True`` so that every K/V read is checked to have been written for that very
token), requests arrive over several steps, and the run must make the same decision at every
step and produce the same greedy tokens as ``LLM(scheduler="continuous")`` with the same
settings. The step count is bounded, so a scheduler that never retires anyone fails instead of
looping.
"""

from __future__ import annotations

from collections.abc import Sequence

from minivllm.course.harness import (
    TraceRequest,
    TraceResult,
    TraceRun,
    expect_same_steps,
    expect_same_tokens,
)
from minivllm.course.reference import DECISIONS
from minivllm.course.runtime import configure
from minivllm.course.scheduling import ProtocolOnlyKV

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


def protocol_only(factory):
    """``factory(config, kv)`` given only the ``KVCacheManager`` protocol of ``kv``."""

    def build(config, kv):
        return factory(config, ProtocolOnlyKV(kv))

    return build


def _run(scheduler, prompts, arrivals, max_tokens, max_steps, ignore_eos, engine_args) -> TraceRun:
    from minivllm import LLM

    _, dtype = configure()
    args = dict(dtype=dtype, seed=0, enable_prefix_caching=False, debug_checks=True)
    args.update(engine_args)
    arrivals = list(arrivals) if arrivals is not None else [0] * len(prompts)
    wanted = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    trace = [TraceRequest(f"p{i}", p, wanted[i], arrivals[i], ignore_eos=ignore_eos) for i, p in enumerate(prompts)]
    return TraceRun(LLM(scheduler=scheduler, **args), trace, max_steps=max_steps)


def serve(
    scheduler,
    prompts: Sequence[str | list[int]] = STORY_PROMPTS,
    arrivals: Sequence[int] | None = None,
    max_tokens: int | Sequence[int] = 16,
    max_steps: int = 500,
    ignore_eos: bool = False,
    **engine_args,
) -> TraceResult:
    """Serve ``prompts`` (text or token ids; request ``p{i}`` joins before step ``arrivals[i]``,
    wants ``max_tokens`` or ``max_tokens[i]`` tokens) greedily with
    ``LLM(scheduler=scheduler, **engine_args)``; every step is recorded."""
    return _run(scheduler, prompts, arrivals, max_tokens, max_steps, ignore_eos, engine_args).finish()


def compare_on_engine(factory, arrivals: Sequence[int], label: str = "", max_tokens: int = 16,
                      **engine_args) -> tuple[TraceResult, TraceResult]:
    """Serve :data:`STORY_PROMPTS` with minivllm's scheduler, then with the student's, step by
    step; raise at the first step whose decisions differ (the batch, the preempted, the ended,
    the KV blocks in use), or at the first request whose tokens differ. Returns ``(student's
    run, minivllm's run)``."""
    reference = serve("continuous", arrivals=arrivals, max_tokens=max_tokens, **engine_args)
    mine = _run(protocol_only(factory), STORY_PROMPTS, arrivals, max_tokens, 500, False, engine_args)
    settings = "LLM(" + ", ".join(f"{k}={v}" for k, v in engine_args.items()) + ")"
    expect_same_steps(reference, mine, DECISIONS, label, settings)
    expect_same_tokens(reference.tokens, mine.result.tokens, f"{label + ': ' if label else ''}greedy tokens")
    return mine.result, reference
