"""Running a plan without a model: the simulator's executor, and the course's replays.

:class:`ModelFreeExecutor` is the engine core's executor when there are no tensors. It gives
every row that samples a token and keeps the clock the core reads:

* **time**: with a :class:`~minivllm.sim.cost_model.CostModel` (the simulator) a step takes its
  roofline time (``step_costs`` keeps every step's :class:`~minivllm.sim.cost_model.StepCost`);
  without one, ``step_time`` (1 second: a replay whose unit is the step);
* **tokens**: ``placeholder_token`` for every row (the simulator: only lengths matter), or, with
  ``vocab > 1``, a token below ``vocab`` from a generator seeded with ``(seed, call)``, in batch
  order, then every sibling forking off a leader that sampled (replays whose stop tokens and
  parallel samples need real choices);
* speculative decoding's drafts, accepted by chance (``drafts``: ``minivllm/sim/speculation.py``);
* for checks of a step loop's failure handling, :class:`Faults` -- rows that fail as rows with
  non-finite logits do, calls that raise or are interrupted -- and, with ``logprobs``, a
  ``Logprobs`` entry for every sampled token and a ``prompt_logprobs`` entry for every request
  starting its prompt, so that a check can see them reach the output. ``log`` (if given) gets
  ``"execute"`` at every call, with the plan's ``finished_req_ids`` when it has any.

The engine, the simulator, exercise 08's replays of a step loop and the KV-manager replays all
run :class:`~minivllm.core.engine_core.EngineCore` (or a student's loop) over the same
scheduler and KV cache manager; only the executor differs.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from minivllm.core.interfaces import Logprobs, ModelRunnerOutput
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.sim.cost_model import CostModel, StepCost, scheduled_rows
from minivllm.sim.speculation import SimulatedDrafts


class InjectedInterrupt(KeyboardInterrupt):
    """A Ctrl-C the executor raises in the middle of a step (a subclass, so that a replay never
    swallows a real one)."""


@dataclass(frozen=True)
class Faults:
    """Failures to inject, keyed by the executor's call (the engine's step number): rows named in
    ``fail_rows[call]`` fail (with their unforked siblings), and with ``token_for_failed_rows`` a
    failed row without siblings comes with a token anyway (an executor that drew one before it
    noticed); ``raise_at[call]`` is ``"error"`` (a ``RuntimeError``) or ``"interrupt"`` (an
    :class:`InjectedInterrupt`)."""

    fail_rows: Mapping[int, Sequence[str]] = field(default_factory=dict)
    raise_at: Mapping[int, str] = field(default_factory=dict)
    token_for_failed_rows: bool = False


class ModelFreeExecutor:
    """``execute(plan) -> ModelRunnerOutput`` without a model; :meth:`clock` is the time it has
    spent (see the module doc)."""

    def __init__(
        self,
        cost_model: CostModel | None = None,
        *,
        placeholder_token: int = 0,
        vocab: int = 1,
        seed: int = 0,
        step_time: float = 1.0,
        drafts: SimulatedDrafts | None = None,
        faults: Faults | None = None,
        logprobs: bool = False,
        log: list[str] | None = None,
    ):
        self.cost_model = cost_model
        self.placeholder_token, self.vocab, self.seed, self.step_time = placeholder_token, vocab, seed, step_time
        self.drafts = drafts  # priced by the cost model: speculation needs one
        if drafts is not None and cost_model is None:
            raise ValueError("simulated drafts are priced by a cost model: give cost_model too")
        self.faults = faults if faults is not None else Faults()
        self.logprobs, self.log = logprobs, log
        self.now = 0.0
        self.calls = 0
        self.step_costs: list[StepCost] = []

    def clock(self) -> float:
        """Seconds spent so far: the engine core's clock."""
        return self.now

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        call, self.calls = self.calls, self.calls + 1
        if self.log is not None:  # what the plan told it: the requests that ended since the last plan
            ended = sorted(out.finished_req_ids)
            self.log.append(f"execute (told {ended} ended)" if ended else "execute")
        if self.cost_model is None:
            self.now += self.step_time
        kind = self.faults.raise_at.get(call)
        if kind == "interrupt":
            raise InjectedInterrupt(f"interrupted in step {call}")
        if kind is not None:
            raise RuntimeError(f"the executor failed in step {call}")
        result = ModelRunnerOutput()
        failing = self.faults.fail_rows.get(call)
        if self.vocab > 1 or failing:
            self._draw(out, call, result, set(failing or ()))
        else:  # the simulator's case, once per simulated step: the placeholder for every row
            token, forks = self.placeholder_token, out.forks
            new = result.new_token_ids = {r.request_id: [token] for r, s in zip(out.requests, out.sample) if s}
            for leader, kids in forks.items() if forks else ():
                if leader in new:
                    new.update((kid.request_id, [token]) for kid in kids)
        if self.cost_model is not None:
            cost = self.cost_model.step_cost(scheduled_rows(out))
            if self.drafts is not None:  # drafts for the plan's requests (a fork's come later)
                accepted, result.draft_token_ids, draft_time = self.drafts.step(out, result.new_token_ids)
                for rid, drafts in accepted.items():  # the accepted drafts come before the token
                    result.new_token_ids[rid] = drafts + result.new_token_ids[rid]
                cost = dataclasses.replace(cost, draft_time=draft_time)
            self.step_costs.append(cost)
            self.now += cost.time
        if self.logprobs:
            self._add_logprobs(out, result)
        return result

    def _draw(self, out: SchedulerOutput, call: int, result: ModelRunnerOutput, failing: set[str]) -> None:
        """Tokens from the seeded generator (or the placeholder), in batch order with each
        leader's forking siblings after it; the rows named in ``failing`` fail."""
        rng = random.Random(self.seed * 100_003 + call) if self.vocab > 1 else None
        for req in out.sampling_requests:
            kids = out.forks.get(req.request_id, ())
            for rid in [req.request_id] + [kid.request_id for kid in kids]:
                token = rng.randrange(self.vocab) if rng is not None else self.placeholder_token
                if req.request_id in failing:
                    result.failed[rid] = f"row of {req.request_id} is not finite (step {call})"
                    if kids or not self.faults.token_for_failed_rows:
                        continue
                result.new_token_ids[rid] = [token]

    @staticmethod
    def _add_logprobs(out: SchedulerOutput, result: ModelRunnerOutput) -> None:
        for rid, tokens in result.new_token_ids.items():
            token = tokens[-1]
            result.logprobs[rid] = Logprobs(token, -0.25 * (token + 1), token + 1, [(token, -0.25)])
        for req, computed in zip(out.requests, out.num_computed, strict=True):
            if computed == 0:
                result.prompt_logprobs[req.request_id] = (0, [None])
