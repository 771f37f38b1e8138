"""Everything an engine core needs except its step, so that exercise 08 can be about the loop.

``minivllm.core.engine_core.EngineCore`` owns a scheduler (and through it the KV cache
manager), an executor, a clock and the statistics, and runs one step at a time. Exercise 08 has
the student write that step -- the order in which the parts are called, what is committed when,
what is recorded -- in a subclass of :class:`EngineCoreBase`, plugged in with
``LLM(engine_core=<the class>)``.

The parts of a step that are not the loop itself are given here as public helpers, each a thin
name for what ``EngineCore`` does internally (read them with ``inspect.getsource``):

* :meth:`EngineCoreBase.begin_step` -- what the executor must be told before it runs: requests
  that ended since the last step, siblings (``n > 1``) that draw their first token from a
  leader's row, and, with ``debug_checks=True``, the check that every K/V read was written;
* :meth:`EngineCoreBase.fail_step` -- the executor raised: end every request of the step with
  the error, register none of its blocks in the prefix cache;
* :meth:`EngineCoreBase.fail_rows` -- some rows could not be sampled: end those requests;
* :meth:`EngineCoreBase.fork_siblings` -- ``n > 1``: the siblings of a leader that sampled its
  first token fork off it, sharing its blocks;
* :meth:`EngineCoreBase.record_finish` and :meth:`EngineCoreBase.record_step` -- statistics;
* :meth:`EngineCoreBase.end_step` -- a step that planned nothing while requests wait raises
  ``EngineStalledError``; with ``debug_checks=True`` the KV manager's invariants are checked.
"""

from __future__ import annotations

from collections.abc import Callable

from minivllm.core.engine_core import EngineCore, StepOutput
from minivllm.core.interfaces import ModelRunnerOutput
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.request import Request

TokenChooser = Callable[[SchedulerOutput, ModelRunnerOutput], dict[str, int]]


class EngineCoreBase(EngineCore):
    """An ``EngineCore`` whose ``step()`` is left to the subclass (exercise 08)."""

    def step(self, choose_tokens: TokenChooser | None = None) -> StepOutput:
        raise NotImplementedError(
            f"{type(self).__name__} must define step(): EngineCoreBase leaves the loop to it"
        )

    # --- before the executor runs ---------------------------------------------------------------
    def begin_step(self, out: SchedulerOutput) -> None:
        """Complete the plan ``out`` for the executor: the ids of requests that ended since the
        last step (``out.finished_req_ids``), the siblings that fork off a leader sampling in
        this step (``out.forks``), and -- with ``debug_checks=True`` -- check that every K/V
        slot the step reads holds what was written for that token."""
        self._begin_step(out)

    # --- when something failed ------------------------------------------------------------------
    def fail_step(self, out: SchedulerOutput, err: BaseException, start: float) -> StepOutput:
        """The executor raised ``err``: the K/V the step may have half-written is discarded
        (never registered in the prefix cache), every request of the step ends with status
        ``FINISHED_ERROR``, the step is recorded, and its ``StepOutput`` is returned."""
        return self._fail_step(out, err, start)

    def fail_rows(self, failed: dict[str, str], core_out: StepOutput) -> None:
        """Rows the executor could not sample (``ModelRunnerOutput.failed``: request id ->
        message): those requests, and siblings still waiting to fork off them, end with an error;
        they are added to ``core_out.failed`` and ``core_out.finished``."""
        if failed:
            self._fail_requests(failed, core_out)

    # --- n > 1 ----------------------------------------------------------------------------------
    def fork_siblings(self, out: SchedulerOutput, result: ModelRunnerOutput) -> None:
        """Siblings of every leader that sampled this step become running requests that share
        its KV blocks (copy-on-write). Must happen before their tokens are appended."""
        self._fork_siblings(out, result)

    # --- statistics -----------------------------------------------------------------------------
    def record_finish(self, request: Request, now: float) -> None:
        """Stamp a finished request's end time and final counts in the statistics."""
        self._record_finish(request, now)

    def record_step(self, out: SchedulerOutput, start: float, now: float) -> None:
        """One ``StepStats`` for the step that began at ``start`` and ended at ``now``, read off
        the scheduler and the KV cache manager as they are *now* (batch, queue, blocks in use)."""
        self._record_step(out, start, now)

    # --- after the step -------------------------------------------------------------------------
    def end_step(self, out: SchedulerOutput, finished: list[Request]) -> None:
        """Raise ``EngineStalledError`` if the step planned nothing, preempted nobody and ended
        nobody while requests are unfinished (they could never be scheduled); with
        ``debug_checks=True``, check the KV cache manager's invariants."""
        self._end_step(out, finished)
