"""What an engine core gives a step loop that is not the loop's to decide: exercise 08's base class.

It is ``minivllm.core.engine_core.EngineCoreBase`` -- the class minivllm's own ``EngineCore``
stands on too, so a student's loop and minivllm's share the infrastructure and nothing else:
neither inherits the other's step. Exercise 08 has the student write that step -- planning,
running, what happens when the executor raises or a row cannot be sampled, what joins the prefix
cache when, ``n > 1`` forks, the timestamps and the statistics -- as ``run_step`` in a subclass,
plugged in with ``LLM(engine_core=<the class>)``.

What the base class gives is infrastructure, none of the step's decisions:

* the parts: ``self.scheduler``, ``self.kv``, ``self.executor``, ``self.clock()``,
  ``self.stats``, ``self.debug_checks``;
* requests: ``add_request`` (the siblings of an ``n > 1`` request wait in
  ``self.pending_siblings`` until their leader samples), ``finish_requests(ids, status)`` (ends
  requests -- and siblings still waiting on them -- frees their blocks and records them
  finished), ``abort_requests``;
* ``begin_step(plan)`` -- what every plan must tell the executor and the debug checks before it
  runs;
* ``record_finish(request, now)`` -- a request ended: its finished time, the statistics, the
  executor told at the next step;
* reporting: ``step()`` runs the subclass's ``run_step()`` and hands the ``StepOutput`` it returns
  to the step listeners (with ``debug_checks=True``, the KV cache manager's invariants are
  checked after it).

Here too is what a step hands back and may raise -- ``StepOutput``, ``EngineStalledError``, and
``TokenChooser`` (the type of beam search's ``choose_tokens``) -- so that exercise 08 imports its
parts from this module alone.
"""

from __future__ import annotations

from minivllm.core.engine_core import EngineCoreBase, EngineStalledError, StepOutput, TokenChooser

__all__ = ["EngineCoreBase", "EngineStalledError", "StepOutput", "TokenChooser"]
