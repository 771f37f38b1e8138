"""``EngineCoreLoop``: an :class:`EngineCore` serving a front end through messages.

The loop is the same whether it runs in a thread of the front end's process (``AsyncLLM``'s
in-process mode) or as the main loop of the engine core's own process
(``minivllm/engine/core_process.py``)::

    while True:
        commands = take(block=<the core has nothing to do>)   requests, finishes, questions
        handle them                                           add_request / finish_requests
        if work is left: one step -> emit(EngineCoreOutputs)  the step's deltas, the state
        elif a command changed the state: emit the state      (the gauges go back to 0)

It blocks while idle, steps back to back while it has work, and takes new commands between
steps, so a request that arrives mid-step joins the very next batch. What a step produced goes
out as the step's own :class:`EngineCoreOutputs`: each sample's new token ids, not its whole text.

Failure semantics: a request the core refuses (an id already in use) ends at once with an
error delta; if ``step()`` itself raises, every request the core holds ends with the error (its
caller is told) and the loop goes on serving newcomers. ``SHUTDOWN`` aborts what is left.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from minivllm.core.engine_core import EngineCore
from minivllm.core.messages import (
    SHUTDOWN,
    UTILITIES,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishRequests,
    RequestDelta,
    UtilityCall,
    UtilityResult,
    sample_ids,
)
from minivllm.request import RequestStatus

logger = logging.getLogger("minivllm")


class EngineCoreLoop:
    """Runs ``core`` for one front end. ``emit`` sends a message back (an
    :class:`EngineCoreOutputs` or a :class:`UtilityResult`); it must not block for long."""

    def __init__(self, core: EngineCore, eos_token_ids: tuple[int, ...], emit: Callable[[object], None]):
        self.core = core
        self.eos_token_ids = tuple(eos_token_ids)
        self.emit = emit
        self._deltas: list[RequestDelta] = []  # ended by a command, sent with the next message

    def run(self, take: Callable[[bool], list]) -> None:
        """Until ``SHUTDOWN``: ``take(block)`` returns the commands that arrived (waiting for
        one when ``block``)."""
        core = self.core
        while True:
            changed = False
            for command in take(not core.has_unfinished_requests()):
                if isinstance(command, str) and command == SHUTDOWN:
                    self._shutdown()
                    return
                changed = self.handle(command) or changed
            if core.has_unfinished_requests():
                self.step()
            elif changed or self._deltas:
                self._send()

    # --- commands ----------------------------------------------------------------------------
    def handle(self, command) -> bool:
        """Carry out one command; whether the core's state changed."""
        if isinstance(command, EngineCoreRequest):
            self._add(command)
            return True
        if isinstance(command, FinishRequests):
            self.core.finish_requests(list(command.request_ids), command.status)
            return True
        if isinstance(command, UtilityCall):
            self.emit(self._utility(command))
            return command.method in ("reset_stats", "set_stats_window")
        raise TypeError(f"the engine core got an unknown command of type {type(command).__name__}")

    def _add(self, request: EngineCoreRequest) -> None:
        samples = request.samples(self.eos_token_ids)
        try:
            self.core.add_request(samples[0], samples[1:])
        except (ValueError, TypeError) as error:  # the front end checks ids; this is a backstop
            message = f"{type(error).__name__}: {error}"
            self._deltas.extend(RequestDelta(rid, [], "error", error=message)
                                for rid in sample_ids(request.request_id, request.params.n))

    def _utility(self, call: UtilityCall) -> UtilityResult:
        core = self.core
        try:
            if call.method not in UTILITIES:
                raise ValueError(f"unknown utility {call.method!r}; known: {UTILITIES}")
            if call.method == "get_stats":
                value = core.stats
            elif call.method == "reset_stats":
                value = core.reset_stats()
            elif call.method == "check_invariants":
                value = core.check_invariants()
            elif call.method == "set_stats_window":
                (window,) = call.args
                core.stats.window = window
                value = None
            elif call.method == "request_ids":
                value = core.request_ids()
            elif call.method == "beam_search":
                from minivllm.core.beam_search import run_beam_search

                value = run_beam_search(core, *call.args, eos_token_ids=self.eos_token_ids)
            else:  # "state"
                value = core.core_state()
        except Exception as error:  # noqa: BLE001 - the answer carries the error back
            return UtilityResult(call.call_id, error=f"{type(error).__name__}: {error}")
        return UtilityResult(call.call_id, value)

    # --- steps ---------------------------------------------------------------------------------
    def step(self) -> None:
        core = self.core
        before = core.stats.num_steps
        try:
            outputs = core.step()
        except Exception as error:  # noqa: BLE001 - fail the requests in flight, keep serving
            self._fail_everything(error)
            self._send(EngineCoreOutputs([], step=core.step_summary(before)))
            return
        self._send(outputs)

    def _fail_everything(self, error: Exception) -> None:
        """``step()`` raised: nobody can tell which requests were in the failed batch or how
        far their state got, so every request the core holds ends with the error."""
        message = f"{type(error).__name__}: {error}"
        logger.error("an engine step raised; failing every request in flight: %s", message, exc_info=error)
        ended = self.core.finish_requests(list(self.core.scheduler.requests), RequestStatus.FINISHED_ERROR)
        self._deltas.extend(RequestDelta(r.request_id, [], "error", error=message) for r in ended)

    def _send(self, outputs: EngineCoreOutputs | None = None) -> None:
        """Emit ``outputs`` (or a message with no step), with the deltas of samples that
        commands ended since the last message first, and the core's state now."""
        outputs = outputs or EngineCoreOutputs([])
        if self._deltas:
            outputs.deltas[:0], self._deltas = self._deltas, []
        if outputs.state is None:  # a step's outputs hold the state the step left already
            outputs.state = self.core.core_state()
        self.emit(outputs)

    def _shutdown(self) -> None:
        core = self.core
        core.abort_requests(core.request_ids())
        self._send()
