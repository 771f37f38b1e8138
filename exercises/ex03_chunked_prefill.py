# This file is generated from solutions/ex03_chunked_prefill.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex03` or `pytest -m ex03`. Stuck? `course.hint("ex03")` in the
# notebook (or `minivllm hint ex03`) gives a hint, one at a time.
"""Exercise 03: chunked prefill and preemption, added to your exercise-02 scheduler.

Notebook: notebooks/03_chunked_prefill.ipynb. Check your work with
``course.check(course.load("ex03_chunked_prefill"))`` there, or ``pytest -m ex03``.

``ChunkedScheduler`` *is* your ``ContinuousScheduler`` from exercise 02 -- or, until yours
passes its checks, the reference one (``course.working`` below says which) -- with your
``update_from_output`` kept and ``schedule()`` replaced. What changes:

* **chunks.** A prompt no longer has to fit the budget whole. Each step, a request gets as
  many of the tokens it still has to compute as the budget left allows. A request whose
  prompt is unfinished is admitted all the same, stays running, and samples nothing until the
  step that computes its last prompt token.
* **a full KV pool.** ``self.kv.allocate_slots`` returns ``None`` when the pool cannot hold a
  running request's next tokens. Then a running request must give its memory back
  (``self.preempt(victim, out)`` in ``SchedulerBase``): under first come, first served that is
  the newest one, which has done the least work -- possibly the very request that needs room.
  Preempt until the request fits or is itself the victim. A step that preempted admits nobody:
  memory is what is short.

Everything else -- the budget, the seats, first come first served -- is as in exercise 02.
The checks replay traces through your scheduler and through minivllm's
``Scheduler(enable_chunked_prefill=True)`` -- with pools small enough to force preemptions --
then serve the tiny model with both and compare tokens. Plug it in with
``LLM(scheduler=ex.ChunkedScheduler)`` (chunked prefill is the engine's default).
"""

from __future__ import annotations

from minivllm import course
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.request import RequestStatus

NOTEBOOK = "notebooks/03_chunked_prefill.ipynb"

ContinuousScheduler = course.working("ex02_continuous").ContinuousScheduler  # your exercise 02


class ChunkedScheduler(ContinuousScheduler):
    """Your exercise-02 scheduler, with chunked prefill and preemption by recomputation."""

    chunked_prefill = True

    def schedule(self) -> SchedulerOutput:
        """Plan one step, as in exercise 02, under the two new rules above."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        raise NotImplementedError("ex03 ChunkedScheduler.schedule: Plan one step, as in exercise 02, under the two new rules above. Yours to write; stuck? course.hint('ex03') (notebooks/03_chunked_prefill.ipynb)")
        return out


def steps_to_first_token(prompt_len: int, token_budget: int, num_decoding: int) -> int | None:
    """Steps a newly admitted prompt of ``prompt_len`` tokens needs until its first output token,
    when ``num_decoding`` older requests decode in every one of those steps (none finishes) and
    the pool never fills. ``None`` if the prompt would never get a token of the budget."""
    raise NotImplementedError("ex03 steps_to_first_token: What it must do is in its docstring. Yours to write; stuck? course.hint('ex03') (notebooks/03_chunked_prefill.ipynb)")
