"""Speculative decoding in the simulator: drafts accepted by chance, priced on the roofline.

The simulator has no model, so it cannot know which drafts a target would accept; it takes the
standard analysis's assumption instead: each draft is accepted with probability
``acceptance_rate``, independently, and a step keeps the drafts up to the first rejection (so a
verification of ``k`` drafts gives ``(1 - a^(k+1)) / (1 - a)`` tokens on average). Everything
else is the engine's: the scheduler reserves the lookahead slots, schedules ``1 + k`` rows per
verified request and rolls rejected drafts back, and the engine core counts acceptances.

What a step costs on top of the target's pass (``CostModel.step_cost`` of the scheduled rows, the
LM head on every verified row):

* ``method="ngram"``: nothing (a lookup on the host, next to a GPU step);
* ``method="draft_model"``: ``k`` passes of the draft model, batched over every request that
  proposes, as the engine's draft proposer runs them: the first over the tokens whose draft K/V
  is missing (the whole sequence the first time, then the one or two tokens the last verification
  added), each later one a single row per request.

The draft model's weights and its K/V (its own tensors over the target's block tables) come out
of the memory the KV pool is sized from, as in the engine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.sim.cost_model import CostModel
from minivllm.spec_decode.config import SpeculativeConfig


def check_acceptance_rate(value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"acceptance_rate must be a number in [0, 1], got {value!r} ({type(value).__name__})")
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise ValueError(f"acceptance_rate must be in [0, 1] (the chance that a draft is accepted), got {value}")
    return float(value)


@dataclass
class _DraftKV:
    num_tokens: int  # the request's tokens when its drafts were proposed (all with draft K/V)
    num_proposed: int  # drafts proposed then: the first k - 1 of them wrote draft K/V too


class SimulatedDrafts:
    """Proposes placeholder drafts, decides how many of the verified ones are accepted, and
    prices the draft model's passes (``draft_cost``: a :class:`CostModel` of the draft model on
    the same GPU; None for n-gram drafts)."""

    def __init__(self, config: SpeculativeConfig, acceptance_rate: float, draft_cost: CostModel | None,
                 max_model_len: int, seed: int | None, placeholder_token: int = 0):
        self.config = config
        self.acceptance_rate = check_acceptance_rate(acceptance_rate)
        self.draft_cost = draft_cost
        self.max_model_len = max_model_len
        self.placeholder_token = placeholder_token
        self.rng = random.Random(0 if seed is None else seed)
        self._draft_kv: dict[str, _DraftKV] = {}

    def _num_accepted(self, num_drafts: int) -> int:
        a, rng, m = self.acceptance_rate, self.rng, 0
        while m < num_drafts and rng.random() < a:
            m += 1
        return m

    def step(self, out: SchedulerOutput, sampled: dict[str, list[int]]) -> tuple[dict[str, list[int]],
                                                                                 dict[str, list[int]], float]:
        """``(accepted drafts, drafts for the next step, seconds of draft-model passes)``."""
        for rid in (*out.finished_req_ids, *(r.request_id for r in out.preempted)):
            self._draft_kv.pop(rid, None)  # ended, or back to the queue: its draft K/V is gone
        accepted: dict[str, list[int]] = {}
        proposals: dict[str, list[int]] = {}
        first_pass: list[tuple[int, int, int]] = []  # (cached, rows, 1) per proposing request
        later: list[tuple[int, int]] = []  # (tokens, drafts) per proposing request
        k = self.config.num_speculative_tokens
        for req, done, n in zip(out.requests, out.num_computed, out.num_new, strict=True):
            rid = req.request_id
            if rid not in sampled:
                continue
            drafts = out.spec_token_ids.get(rid, ())
            m = self._num_accepted(len(drafts))
            if drafts:
                accepted[rid] = list(drafts[:m])
            num_tokens = done + (n - len(drafts)) + m + 1  # after this step
            num = self.config.num_drafts(req.length_limit, self.max_model_len, num_tokens)
            if not num:
                continue
            proposals[rid] = [self.placeholder_token] * num
            if self.draft_cost is not None:
                prev = self._draft_kv.get(rid)
                have = 0 if prev is None else prev.num_tokens + min(m, prev.num_proposed - 1)
                first_pass.append((have, num_tokens - have, 1))
                later.append((num_tokens, num))
                self._draft_kv[rid] = _DraftKV(num_tokens, num)
        if not first_pass:
            return accepted, proposals, 0.0
        draft_time = self.draft_cost.step_cost(first_pass).time
        for j in range(1, k):  # pass j + 1 feeds draft j at position tokens + j - 1
            rows = [(t + j - 1, 1, 1) for t, num in later if num > j]
            if not rows:
                break
            draft_time += self.draft_cost.step_cost(rows).time
        return accepted, proposals, draft_time
