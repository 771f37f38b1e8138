# This file is generated from solutions/ex02_continuous.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex02` or `pytest -m ex02`. Stuck? `course.hint("ex02")` in the
# notebook (or `minivllm hint ex02`) gives a hint, one at a time.
"""Exercise 02: a continuous-batching scheduler that serves the model.

Notebook: notebooks/02_continuous_batching.ipynb. Check your work with
``course.check(course.load("ex02_continuous"))`` there, or ``pytest -m ex02``.

``ContinuousScheduler`` meets minivllm's ``Scheduler`` protocol, so once it passes the checks it
plugs straight into the engine: ``LLM(scheduler=ex.ContinuousScheduler,
enable_chunked_prefill=False)``. The queues, lookups and aborts are done for you by
``minivllm.course.scheduling.SchedulerBase`` (read it: ``self.waiting``, ``self.running``,
``self.requests``, ``self.kv``, ``self.config`` and the helper ``self.add_to_batch``). You write
the two methods that make it a scheduler:

* ``schedule()``: plan one step -- who computes how many tokens;
* ``update_from_output(sampled)``: after the model ran, take each sampled token and retire the
  requests that are done.

What a step must respect:

* at most ``config.max_num_batched_tokens`` tokens computed in the step (the token budget);
* at most ``config.max_num_seqs`` requests admitted and not yet finished (the seats);
* a prompt is computed whole, in the step that admits it (no chunks: that is exercise 03);
* KV room for every token computed, taken from ``self.kv.allocate_slots`` -- its only
  interface is minivllm's ``KVCacheManager`` protocol;
* first come, first served.

In this exercise's checks the KV pool is always large enough for every request at once, so
``allocate_slots`` only fails if something else is wrong; exercise 03 deals with a full pool.
The checks replay request traces through your scheduler and minivllm's own ``Scheduler``,
step by step, then serve the tiny model with both and compare the tokens.
"""

from __future__ import annotations

from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.course.scheduling import SchedulerBase
from minivllm.request import Request, RequestStatus

NOTEBOOK = "notebooks/02_continuous_batching.ipynb"


class ContinuousScheduler(SchedulerBase):
    """Iteration-level scheduling, whole prompts, first come first served."""

    chunked_prefill = False

    def schedule(self) -> SchedulerOutput:
        """Plan one step and return it (every request's share recorded with
        ``self.add_to_batch``). Requests admitted this step move from ``self.waiting`` to the
        end of ``self.running`` with status ``RUNNING``."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        raise NotImplementedError("ex02 ContinuousScheduler.schedule: Plan one step and return it (every request's share recorded with ``self.add_to_batch``). Yours to write; stuck? course.hint('ex02') (notebooks/02_continuous_batching.ipynb)")
        return out

    def update_from_output(self, sampled_token_ids: dict[str, int]) -> list[Request]:
        """The step ran: ``sampled_token_ids`` maps request id -> the token it sampled. Append
        each token to its request, end the requests that must stop (``req.check_stop(token,
        self.config.max_model_len)`` returns the status to finish with, or ``None``), free their
        KV blocks, and return them. The others keep their order in ``self.running``."""
        raise NotImplementedError("ex02 ContinuousScheduler.update_from_output: The step ran: ``sampled_token_ids`` maps request id -> the token it sampled. Yours to write; stuck? course.hint('ex02') (notebooks/02_continuous_batching.ipynb)")
