# This file is generated from solutions/ex02_continuous.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex02` or `pytest -m ex02`.
"""Exercise 02: the three moves of an iteration-level scheduler (admit, decode, retire).

Notebook: notebooks/02_continuous_batching.ipynb. Check your work with
``course.check(course.load("ex02_continuous"))`` there, or ``pytest -m ex02``.

``ContinuousScheduler.step()`` below is the whole serving loop of one iteration; you write the
three methods it calls. The check runs your scheduler and minivllm's real ``Scheduler`` on the
same request traces, step by step, and compares which requests each one puts in the batch, with
how many tokens, and which requests leave.

The rules (they are the rules of ``minivllm.core.scheduler.Scheduler`` with chunked prefill
off and a KV cache large enough never to fill):

- each step has a budget of ``max_num_batched_tokens`` tokens;
- running requests go first, oldest first, one decode token each, while budget is left;
- then waiting requests are admitted in arrival order while a seat is free
  (``len(running) < max_num_seqs``) and the budget still covers the *whole* prompt; the first
  request that does not fit stops admission for this step (no skipping ahead);
- after the model runs, every request in the batch has one more output token; a request whose
  output reached ``max_tokens`` leaves the batch at the end of the step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

NOTEBOOK = "notebooks/02_continuous_batching.ipynb"


@dataclass
class Seq:
    """A request as this scheduler sees it: only lengths, no token ids."""

    request_id: str
    prompt_len: int
    max_tokens: int  # the request ends once it has generated this many tokens
    num_computed: int = 0  # tokens whose K/V are in the cache
    num_output: int = 0  # tokens generated so far

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output


@dataclass
class StepResult:
    batch: list[tuple[str, int]]  # (request_id, tokens computed this step), in batch order
    finished: list[str]  # requests that left the batch at the end of the step, in batch order


class ContinuousScheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int):
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Seq] = deque()  # arrival order
        self.running: list[Seq] = []  # admission order (oldest first)

    def add_request(self, seq: Seq) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> StepResult:
        """One iteration: decode the running, admit the waiting, run the model, retire."""
        budget = self.max_num_batched_tokens
        decodes, budget = self.schedule_decodes(budget)
        admitted = self.admit(budget)
        batch = decodes + admitted
        for seq, num_new in batch:  # the model runs: K/V written, one token sampled each
            seq.num_computed += num_new
            seq.num_output += 1
        finished = self.retire()
        return StepResult([(s.request_id, n) for s, n in batch], [s.request_id for s in finished])

    def schedule_decodes(self, budget: int) -> tuple[list[tuple[Seq, int]], int]:
        """Give every running request one token, oldest first, while ``budget`` lasts.

        Returns ``([(seq, 1), ...], budget_left)``. Requests beyond the budget are skipped for
        this step (they stay in ``self.running``). Do not change any ``Seq`` here.
        """
        # HINT: walk self.running in order; stop when the budget is 0; each decode costs 1.
        raise NotImplementedError('ex02 ContinuousScheduler.schedule_decodes: walk self.running in order; stop when the budget is 0; each decode costs 1. (see notebooks/02_continuous_batching.ipynb)')

    def admit(self, budget: int) -> list[tuple[Seq, int]]:
        """Move waiting requests into ``self.running`` while a seat is free and ``budget``
        covers the whole prompt; return ``[(seq, prompt_len), ...]`` in admission order.

        Stop at the first waiting request that does not fit (first come, first served).
        """
        # HINT: keep going while someone waits and a seat is free. Look at the oldest waiting
        #   request without removing it; if its prompt does not fit the budget, stop; else move
        #   it to the running list and pay for its prompt.
        raise NotImplementedError('ex02 ContinuousScheduler.admit: keep going while someone waits and a seat is free. Look at the oldest waiting request without removing it; if its prompt does not fit the budget, stop; else move it to the running list and pay for its prompt. (see notebooks/02_continuous_batching.ipynb)')

    def retire(self) -> list[Seq]:
        """Remove every running request whose ``num_output`` reached ``max_tokens``; return
        them in running order. The ones that stay keep their order."""
        # HINT: split self.running into done and not done, keeping the order of both.
        raise NotImplementedError('ex02 ContinuousScheduler.retire: split self.running into done and not done, keeping the order of both. (see notebooks/02_continuous_batching.ipynb)')
