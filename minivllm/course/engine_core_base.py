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
* requests: ``add_request`` (the siblings of an ``n > 1`` request wait with the scheduler until
  their leader samples), ``finish_requests(ids, status)`` (ends requests -- and siblings still
  waiting on them -- frees their blocks and records them finished), ``fail_requests(failed)``
  (the same with ``FINISHED_ERROR`` and a message each, returning their deltas),
  ``abort_requests``;
* ``begin_step(plan)`` -- the debug checks every plan goes through before it runs;
* ``record_finish(request, now)`` -- a request ended: its finished time, the statistics;
* ``step_outputs(plan, start, end, deltas, result)`` -- the step's ``EngineCoreOutputs`` from its
  deltas;
* reporting: ``step()`` runs the subclass's ``run_step()``, adds the state the step left to the
  ``EngineCoreOutputs`` it returns and hands it to the step listeners (with
  ``debug_checks=True``, the KV cache manager's invariants are checked after it).

Here too is what a step hands back and may raise -- ``EngineCoreOutputs``, ``EngineStalledError``,
and ``TokenChooser`` (the type of beam search's ``choose_tokens``) -- so that exercise 08 imports
its parts from this module alone.
"""

from __future__ import annotations

from minivllm.core.engine_core import EngineCoreBase, EngineStalledError, TokenChooser
from minivllm.core.messages import EngineCoreOutputs

__all__ = ["EngineCoreBase", "EngineCoreOutputs", "EngineStalledError", "TokenChooser"]
