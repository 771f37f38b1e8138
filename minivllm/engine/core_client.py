"""The seam between a front end and its engine core, and the core in the caller's process.

A front end (``LLMEngine``, ``AsyncLLM``) reaches its core only through an
:class:`EngineCoreClient`, which comes in two kinds with the same semantics:

* :class:`InprocCore` -- the core in this process (``engine_core_process=False``, ``LLM()``'s
  default: notebooks, debugging, plug-ins defined in a notebook). ``step()`` runs one step
  right here; ``AsyncLLM`` runs an :class:`~minivllm.core.core_loop.EngineCoreLoop` over it
  in a thread of its own.
* ``ProcessCore`` (``minivllm/engine/core_process.py``) -- the core in a process of its own
  (``engine_core_process=True``, ``minivllm serve``'s default): the model computes on one
  core while the front end tokenizes, detokenizes and writes HTTP on another, and neither
  waits for the other's GIL.

Synchronous use (``LLMEngine``): ``add_request`` / ``finish_requests`` / ``step()`` /
``call()``. Asynchronous use (``AsyncLLM``): ``await connect(loop, on_message, on_dead)``
returns a :class:`CoreConnection` whose ``send`` never blocks the event loop; every
:class:`~minivllm.core.messages.EngineCoreOutputs` is handed to ``on_message`` on the event
loop, in order, and ``on_dead(error)`` is called once if the core stops unexpectedly.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from minivllm.core.core_loop import EngineCoreLoop
from minivllm.core.engine_core import EngineCore
from minivllm.core.messages import (
    SHUTDOWN,
    CoreReady,
    EngineCoreOutputs,
    EngineCoreRequest,
    UtilityCall,
    UtilityResult,
)
from minivllm.request import RequestStatus

if TYPE_CHECKING:  # pragma: no cover - building a core needs torch; this module does not
    from minivllm.engine.core_builder import BuiltCore

OnMessage = Callable[[EngineCoreOutputs], None]
OnDead = Callable[[BaseException], None]


class EngineDeadError(RuntimeError):
    """The engine core has stopped (shut down, crashed, its process died): nothing is served."""


@runtime_checkable
class EngineCoreClient(Protocol):
    ready: CoreReady

    def add_request(self, request: EngineCoreRequest) -> None: ...

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None: ...

    def step(self) -> EngineCoreOutputs: ...

    def call(self, method: str, *args): ...

    async def connect(self, loop: asyncio.AbstractEventLoop, on_message: OnMessage,
                      on_dead: OnDead) -> CoreConnection: ...

    def shutdown(self) -> None: ...


class CoreConnection:
    """The asynchronous side of a client: ``send`` commands, ``await call(...)`` utilities.
    Subclasses deliver messages by calling :meth:`_dispatch` on the event loop."""

    def __init__(self, on_message: OnMessage, on_dead: OnDead):
        self.on_message, self.on_dead = on_message, on_dead
        self.alive = True
        self._ids = itertools.count()
        self._calls: dict[int, asyncio.Future] = {}
        self._closing: asyncio.Future | None = None

    def send(self, command) -> None:
        raise NotImplementedError

    async def call(self, method: str, *args):
        """Ask the core (see ``minivllm.core.messages.UTILITIES``) and wait for the answer."""
        if not self.alive:
            raise EngineDeadError("the engine core has stopped")
        call_id = next(self._ids)
        future = self._calls[call_id] = asyncio.get_running_loop().create_future()
        self.send(UtilityCall(call_id, method, args))
        return await future

    def begin_close(self) -> asyncio.Future:
        """Start stopping the core (on the event loop) and return what to await. Whoever asks
        again gets the same future: one stop, however many found that the core must stop, and
        nothing left running that nobody waits for."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        return self._closing

    async def close(self) -> None:
        """Stop the core and wait until it has stopped."""
        await asyncio.shield(self.begin_close())

    async def _close(self) -> None:
        raise NotImplementedError

    def _dispatch(self, message) -> None:
        if isinstance(message, UtilityResult):
            future = self._calls.pop(message.call_id, None)
            if future is not None and not future.done():
                try:
                    future.set_result(message.unwrap())
                except Exception as error:  # noqa: BLE001 - the call's own error, for its caller
                    future.set_exception(error)
            return
        self.on_message(message)

    def _died(self, error: BaseException) -> None:
        if not self.alive:
            return
        self.alive = False
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()
        self.on_dead(error)


class InprocCore:
    """The engine core in this process (``engine_core_process=False``). Its objects are there to
    look at: ``core`` (the ``EngineCore``: ``core.scheduler``, ``core.kv``, ``core.executor``, the
    model runner) and ``model``; :func:`local_core` finds them from an ``LLM``."""

    def __init__(self, built: BuiltCore, eos_token_ids: tuple[int, ...]):
        self.built = built
        self.core = built.core
        self.model = built.model
        self.eos_token_ids = tuple(eos_token_ids)
        self.ready = built.ready()
        self._loop = EngineCoreLoop(self.core, self.eos_token_ids, self._keep)
        self._kept: list = []
        self._thread: _ThreadConnection | None = None

    def _keep(self, message) -> None:
        self._kept.append(message)

    # --- synchronous: LLMEngine ------------------------------------------------------------
    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request's samples; raises ``ValueError`` for an id already in use."""
        samples = request.samples(self.eos_token_ids)
        self.core.add_request(samples[0], samples[1:])

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        self.core.finish_requests(request_ids, status)

    def step(self) -> EngineCoreOutputs:
        """One step, now. An exception from the step propagates (as it did before there was a
        seam): in the caller's process nothing is lost by letting it."""
        return self.core.step()

    def call(self, method: str, *args):
        self._loop.handle(UtilityCall(0, method, args))
        (result,) = self._kept
        self._kept.clear()
        return result.unwrap()

    def shutdown(self) -> None:
        """Nothing to stop in this process; ``AsyncLLM`` stops its loop thread itself."""

    # --- asynchronous: AsyncLLM ------------------------------------------------------------
    async def connect(self, loop: asyncio.AbstractEventLoop, on_message: OnMessage,
                      on_dead: OnDead) -> CoreConnection:
        """Start a thread that runs the core's loop and posts its messages to ``loop``."""
        if self._thread is not None and self._thread.alive:
            raise RuntimeError("this engine core is already serving a front end")
        self._thread = _ThreadConnection(self, loop, on_message, on_dead)
        return self._thread


def local_core(engine) -> EngineCore:
    """The ``EngineCore`` of an ``LLM``, ``LLMEngine`` or ``AsyncLLM`` whose core runs in this
    process -- to look at its scheduler, KV cache and model runner, or to add a step listener.
    ``ValueError`` when the core runs in a process of its own (there is nothing here to look at)."""
    front = getattr(engine, "engine", engine)  # LLM.engine, AsyncLLM.engine: the LLMEngine
    client = getattr(front, "core_client", None)
    if not isinstance(client, InprocCore):
        raise ValueError(
            f"the engine core of this {type(engine).__name__} runs in a process of its own "
            "(engine_core_process=True): build it with engine_core_process=False to look at its parts"
        )
    return client.core


class _ThreadConnection(CoreConnection):
    """An :class:`EngineCoreLoop` in a thread of this process, talking through a queue."""

    def __init__(self, inproc: InprocCore, loop: asyncio.AbstractEventLoop, on_message: OnMessage,
                 on_dead: OnDead):
        super().__init__(on_message, on_dead)
        self._event_loop = loop
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._core_loop = EngineCoreLoop(inproc.core, inproc.eos_token_ids, self._emit)
        self._thread = threading.Thread(target=self._run, name="minivllm-engine-loop", daemon=True)
        self._thread.start()

    def send(self, command) -> None:
        self._commands.put(command)

    def _take(self, block: bool) -> list:
        commands = [self._commands.get()] if block else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _run(self) -> None:
        try:
            self._core_loop.run(self._take)
        except BaseException as error:  # a bug in the loop: never leave callers hanging
            self._post(self._died, EngineDeadError(f"the engine loop crashed: {error!r}"))

    def _emit(self, message) -> None:
        self._post(self._dispatch, message)

    def _post(self, callback: Callable, *args) -> None:
        try:
            self._event_loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    async def _close(self) -> None:
        if self._thread.is_alive():
            self._commands.put(SHUTDOWN)
            await asyncio.to_thread(self._thread.join)
        self.alive = False

