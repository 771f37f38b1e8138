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
from dataclasses import dataclass, field

from minivllm.course.grading import Mismatch
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


@dataclass
class Served:
    """One run: the tokens and text of each request, and every step's decisions."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    decisions: list[list[tuple[str, int]]] = field(default_factory=list)
    preempted: list[list[str]] = field(default_factory=list)

    @property
    def num_preemptions(self) -> int:
        return sum(len(p) for p in self.preempted)


def protocol_only(factory):
    """``factory(config, kv)`` given only the ``KVCacheManager`` protocol of ``kv``."""

    def build(config, kv):
        return factory(config, ProtocolOnlyKV(kv))

    return build


def serve(
    scheduler,
    prompts: Sequence[str] = STORY_PROMPTS,
    arrivals: Sequence[int] | None = None,
    max_tokens: int | Sequence[int] = 16,
    max_steps: int = 500,
    ignore_eos: bool = False,
    **engine_args,
) -> Served:
    """Serve ``prompts`` (text or token ids; request ``i`` joins before step ``arrivals[i]``,
    wants ``max_tokens`` or ``max_tokens[i]`` tokens) greedily with
    ``LLM(scheduler=scheduler, **engine_args)``; record what every step decided."""
    from minivllm import LLM, SamplingParams

    _, dtype = configure()
    args = dict(dtype=dtype, seed=0, enable_prefix_caching=False, debug_checks=True)
    args.update(engine_args)
    engine = LLM(scheduler=scheduler, **args).engine
    served = Served()
    sched = engine.core.scheduler
    plan = sched.schedule

    def recording_schedule():
        out = plan()
        served.decisions.append(out.decisions())
        served.preempted.append([r.request_id for r in out.preempted])
        return out

    sched.schedule = recording_schedule
    arrivals = list(arrivals) if arrivals is not None else [0] * len(prompts)
    pending = sorted((t, i) for i, t in enumerate(arrivals))
    wanted = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            _, i = pending.pop(0)
            engine.add_request(f"p{i}", prompts[i], SamplingParams(temperature=0.0, max_tokens=wanted[i], ignore_eos=ignore_eos))
        if step >= max_steps:
            raise Mismatch("every request finished", f"{len(engine.core.scheduler.requests)} still unfinished",
                           f"after {max_steps} steps")
        for out in engine.step():
            if out.finished:
                served.tokens[out.request_id] = list(out.outputs[0].token_ids)
                served.texts[out.request_id] = out.outputs[0].text
        step += 1
    return served


def compare_on_engine(factory, arrivals: Sequence[int], label: str = "", **engine_args) -> tuple[Served, Served]:
    """Serve :data:`STORY_PROMPTS` with the student's scheduler and with minivllm's; raise
    :class:`Mismatch` at the first step whose decisions differ, or at the first request whose
    tokens differ. Returns ``(student's run, minivllm's run)``."""
    reference = serve("continuous", arrivals=arrivals, **engine_args)
    mine = serve(protocol_only(factory), arrivals=arrivals, **engine_args)
    where = f"{label}: " if label else ""
    settings = ", ".join(f"{k}={v}" for k, v in engine_args.items())
    for t, (want, got) in enumerate(zip(reference.decisions, mine.decisions, strict=False)):
        if want != got:
            raise Mismatch(want, got, f"{where}LLM({settings}), step {t}, (request, tokens)")
    if len(reference.decisions) != len(mine.decisions):
        raise Mismatch(f"{len(reference.decisions)} steps", f"{len(mine.decisions)} steps", f"{where}LLM({settings})")
    for rid, want in reference.tokens.items():
        got = mine.tokens.get(rid)
        if got != want:
            raise Mismatch(want, got, f"{where}greedy tokens of request {rid}")
    return mine, reference
