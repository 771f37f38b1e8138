"""What an engine core gives a step loop that is not the loop's to decide: exercise 08's base class.

``minivllm.core.engine_core.EngineCore`` owns a scheduler (and through it the KV cache
manager), an executor, a clock and the statistics, takes requests in and ends them from outside
(aborts, stop strings), and runs one step at a time. Exercise 08 has the student write that
step -- planning, running, what happens when the executor raises or a row cannot be sampled,
what joins the prefix cache when, ``n > 1`` forks, the timestamps and the statistics -- in a
subclass of :class:`EngineCoreBase`, plugged in with ``LLM(engine_core=<the class>)``.

What the base class gives is infrastructure, none of the step's decisions:

* the parts: ``self.scheduler``, ``self.kv``, ``self.executor``, ``self.clock()``,
  ``self.stats``, ``self.debug_checks``;
* requests: ``add_request`` (the siblings of an ``n > 1`` request wait in
  :attr:`EngineCoreBase.pending_siblings` until their leader samples), ``finish_requests(ids,
  status)`` (ends requests -- and siblings still waiting on them -- frees their blocks and
  records them finished), ``abort_requests``;
* :meth:`EngineCoreBase.begin_step` -- what every plan must tell the executor and the debug
  checks before it runs;
* ``record_finish(request, now)`` -- a request ended: its finished time, the statistics, the
  executor told at the next step;
* reporting: every step a subclass's ``step()`` returns reaches the step listeners and, with
  ``debug_checks=True``, the KV cache manager's invariants are checked after it. ``EngineCore``
  wraps the ``step`` of every subclass when the class is created, so this happens without the
  loop calling anything for it.
"""

from __future__ import annotations

from minivllm.core.engine_core import EngineCore, StepOutput, TokenChooser
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.request import Request


class EngineCoreBase(EngineCore):
    """An ``EngineCore`` whose ``step()`` is left to the subclass (exercise 08)."""

    def step(self, choose_tokens: TokenChooser | None = None) -> StepOutput:
        raise NotImplementedError(
            f"{type(self).__name__} must define step(): EngineCoreBase leaves the loop to it"
        )

    @property
    def pending_siblings(self) -> dict[str, list[Request]]:
        """``n > 1``: leader request id -> its siblings that have not forked off it yet (they
        are in no queue of the scheduler). ``add_request`` fills it; ``finish_requests`` removes
        the siblings it ends; forking them off their leader is the step's."""
        return self._pending_forks

    def begin_step(self, out: SchedulerOutput) -> None:
        """Tell the executor, in the plan ``out``, which requests ended since the last step
        (``out.finished_req_ids``) and, with ``debug_checks=True``, check that every K/V slot
        the step will read holds what was written for that token. Call it once per plan,
        before the executor runs it."""
        self._prepare_plan(out)
