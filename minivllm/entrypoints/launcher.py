"""Running the server: ``minivllm serve`` in the foreground, or a server thread in this process.

uvicorn serves the FastAPI app; :class:`GracefulServer` adds the shutdown a model server needs
(drain, then abort, then exit 0; a second signal aborts at once and exits non-zero), the front
door's header deadline and connection guard (``minivllm/entrypoints/front_door.py``: a cap on
open connections that sheds the oldest idle ones, a counted and rate-limited report of a failed
``accept``; ``minivllm serve`` also raises the open-file limit first), and :func:`start_in_thread`
runs the same server from a background thread on a free port for tests, benchmarks and
notebooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass

import uvicorn

from minivllm.entrypoints.async_llm import AsyncLLM
from minivllm.entrypoints.front_door import (
    ConnectionGuard,
    DoorOptions,
    listening_socket,
    protocol_with_header_timeout,
    raise_open_file_limit,
)
from minivllm.entrypoints.openai_server import build_app

DEFAULT_MODEL_NAME = "minivllm-tiny"
API_KEY_ENV = "MINIVLLM_API_KEY"  # the key from the environment keeps it out of `ps`


class GracefulServer(uvicorn.Server):
    """uvicorn's server with the shutdown a model server needs on SIGINT/SIGTERM: stop
    accepting (new connections are refused, new requests on open connections get 503), let
    running requests finish for ``grace`` seconds, then abort the rest so that their streams
    end cleanly with ``finish_reason="abort"`` and ``[DONE]``, stop the engine loop, and exit
    with status 0 (uvicorn would re-raise the signal, which makes the exit status look like a
    crash).

    A second signal during the drain means "now": the running requests are aborted at once
    (their streams still end with an abort chunk and ``[DONE]``, not a cut connection), and
    the exit status is ``128 + signal`` (130 for SIGINT, 143 for SIGTERM), the shell's
    convention for a process ended by a signal, so a supervisor can tell a forced stop from a
    clean one. (uvicorn's own second Ctrl-C drops open connections mid-stream.)"""

    def __init__(self, config: uvicorn.Config, llm: AsyncLLM, grace: float, guard: ConnectionGuard | None = None):
        super().__init__(config)
        self.llm, self.grace, self.guard = llm, grace, guard
        self.forced_by: int | None = None  # the signal that cut the drain short
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hurry: asyncio.Event | None = None

    @property
    def exit_status(self) -> int:
        return 0 if self.forced_by is None else 128 + self.forced_by

    async def serve(self, sockets=None) -> None:
        self._loop, self._hurry = asyncio.get_running_loop(), asyncio.Event()
        if self.guard is not None:
            self._loop.set_exception_handler(self.guard.exception_handler)
        await super().serve(sockets)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame) -> None:
        if not self.should_exit:
            self.should_exit = True
            return
        self.forced_by = sig  # a second signal: abort now
        if self._loop is not None and self._hurry is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                self._loop.call_soon_threadsafe(self._hurry.set)

    async def shutdown(self, sockets=None) -> None:
        self.llm.stop_accepting()
        abort_later = asyncio.ensure_future(self._abort_after_grace())
        try:
            await super().shutdown(sockets)
        finally:
            abort_later.cancel()

    async def _abort_after_grace(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), self.grace)
        await self.llm.abort_all()


def uvicorn_config(app, door: DoorOptions, grace: float, guard: ConnectionGuard | None = None,
                   **kwargs) -> uvicorn.Config:
    """uvicorn's settings for this server: the front door's header deadline and connection
    guard, and a backstop for the graceful shutdown behind the aborts."""
    return uvicorn.Config(
        app, lifespan="on", http=protocol_with_header_timeout(door.read_timeout, guard),
        timeout_graceful_shutdown=grace + 5.0, **kwargs,
    )


def door_options_from(args) -> DoorOptions:
    return DoorOptions(
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        max_request_bytes=args.max_request_bytes, read_timeout=args.request_read_timeout,
        max_connections=args.max_connections,
    )


def make_server(args) -> tuple[GracefulServer, socket.socket]:
    """Load the model and build the server from parsed ``minivllm serve`` arguments: the
    server and its bound listening socket. Raises the open-file limit first."""
    from minivllm.entrypoints.cli_args import engine_args_from

    raise_open_file_limit()
    door = door_options_from(args)
    llm = AsyncLLM.from_engine_args(args.model, max_waiting=args.max_waiting,
                                    stall_timeout=args.core_stall_timeout, **engine_args_from(args))
    name = args.served_model_name or args.model or DEFAULT_MODEL_NAME
    guard = ConnectionGuard(door.max_connections, llm.metrics)
    sock = listening_socket(args.host, args.port, guard)
    config = uvicorn_config(build_app(llm, name, door), door, args.shutdown_timeout, guard,
                            log_level=args.log_level)
    return GracefulServer(config, llm, grace=args.shutdown_timeout, guard=guard), sock


def run_server(args) -> int:
    server, sock = make_server(args)
    server.run(sockets=[sock])
    return server.exit_status


@dataclass
class BackgroundServer:
    """A server running in a thread of this process (tests, benchmarks, notebooks):
    ``with start_in_thread(llm) as srv: openai.OpenAI(base_url=srv.url + "/v1", ...)``."""

    url: str
    llm: AsyncLLM
    server: GracefulServer
    thread: threading.Thread

    def run(self, coro, timeout: float = 60.0):
        """Run a coroutine on the server's event loop (where ``llm`` lives) and return its
        result: ``srv.run(srv.llm.core_state())``."""
        return asyncio.run_coroutine_threadsafe(coro, self.server._loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"the server thread did not stop within {timeout} s")

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_in_thread(
    llm: AsyncLLM, model_name: str = DEFAULT_MODEL_NAME, host: str = "127.0.0.1", port: int = 0,
    grace: float = 5.0, log_level: str = "warning", startup_timeout: float = 60.0,
    door: DoorOptions | None = None,
) -> BackgroundServer:
    """Serve ``llm`` from a background thread; ``port=0`` picks a free port."""
    door = door or DoorOptions()
    guard = ConnectionGuard(door.max_connections, llm.metrics)
    sock = listening_socket(host, port, guard)
    config = uvicorn_config(build_app(llm, model_name, door), door, grace, guard, log_level=log_level)
    server = GracefulServer(config, llm, grace, guard)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="minivllm-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError("the background server failed to start (see the log above)")
        time.sleep(0.01)
    bound_host, bound_port = sock.getsockname()[:2]
    return BackgroundServer(f"http://{bound_host}:{bound_port}", llm, server, thread)
