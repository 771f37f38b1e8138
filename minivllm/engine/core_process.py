"""The engine core in a process of its own (``engine_core_process=True``).

    front end (the caller's process)            core process (minivllm.engine.core_process.main)
    ──────────────────────────────────          ──────────────────────────────────────────────────
    ProcessCore ── one Unix socket pair ──────> reader thread ─> queue ─> EngineCoreLoop (main
      sync: LLMEngine                                                      thread: schedule, run
      async: asyncio transport (AsyncLLM)   <── writer thread <─ queue <── the model, sample)

Messages (``minivllm.core.messages``) are pickled, each behind a 4-byte length. Pickle because
both ends are the same program: no schema to keep in step, and on the step messages it costs
about as much as msgpack (``benchmarks/core_transport.py``; docs/architecture.md has the
figures); the socket pair is private to the two processes, so nobody else can send it a frame.
The core reads and writes in threads of its own, so the loop never blocks on the socket, and
the front end never waits for the core except where it asks to (``LLMEngine.step``).

Lifetime: the core is started by its front end and dies with it. It ignores SIGINT and SIGTERM
(a Ctrl-C in the terminal or a supervisor's SIGTERM reaches the server, which drains its
requests and then stops the core) and runs in a session of its own; it exits at once when its
socket reaches end-of-file -- its parent is gone, however it died -- and a watchdog thread
exits too should the parent change (``os.getppid()``). A core that dies is noticed by the front
end at the same end-of-file, which fails every request in flight with :class:`EngineDeadError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from pathlib import Path

from minivllm.core.messages import (
    SHUTDOWN,
    CoreFailed,
    CoreReady,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishRequests,
    UtilityCall,
    UtilityResult,
)
from minivllm.engine.core_client import CoreConnection, EngineDeadError, OnDead, OnMessage
from minivllm.request import RequestStatus

_HEADER = struct.Struct("!I")  # the length of the pickled message that follows
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_WATCH_PARENT_S = 1.0
_SHUTDOWN_WAIT_S = 30.0
# The child imports this very copy of minivllm, whatever its working directory holds.
_CHILD = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
          "from minivllm.engine.core_process import main; sys.exit(main(sys.argv[1:]))")


@dataclass(frozen=True)
class StartCore:
    """The second frame the core receives: what to build (the first one is its ``sys.path``,
    so that plug-ins named in ``args`` can be unpickled)."""

    args: object  # EngineArgs
    model_path: str
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None


def encode(message) -> bytes:
    payload = pickle.dumps(message, protocol=_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


class _Channel:
    """Blocking framed messages over a socket (the core's threads, the synchronous front end)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, message) -> None:
        self.sock.sendall(encode(message))

    def recv(self):
        """The next message; ``EOFError`` when the other end has closed."""
        (size,) = _HEADER.unpack(self._exactly(_HEADER.size))
        return pickle.loads(self._exactly(size))

    def _exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise EOFError("the other end closed the connection")
            got += k
        return bytes(buf)


# --- the core process ----------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when the core stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    channel = _Channel(socket.socket(fileno=int(argv[0])))
    try:
        sys_path, parent = channel.recv()
        sys.path[:] = [*sys_path, *(p for p in sys.path if p not in sys_path)]
        _watch_parent(parent)
        start: StartCore = channel.recv()
    except EOFError:
        return 1
    try:
        from minivllm.engine.core_builder import build_core

        built = build_core(start.args, Path(start.model_path), start.pad_token_id)
    except BaseException as error:  # noqa: BLE001 - the front end raises it with this message
        channel.send(CoreFailed(type(error).__name__, str(error), traceback.format_exc()))
        return 1
    channel.send(built.ready())
    return _serve(channel, built.core, start.eos_token_ids)


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_WATCH_PARENT_S)
        os._exit(1)

    threading.Thread(target=watch, name="minivllm-core-watchdog", daemon=True).start()


def _serve(channel: _Channel, core, eos_token_ids) -> int:
    from minivllm.core.core_loop import EngineCoreLoop

    inbox: queue.SimpleQueue = queue.SimpleQueue()
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    done = object()

    def read() -> None:
        while True:
            try:
                message = channel.recv()
            except (EOFError, OSError):
                os._exit(0)  # the front end is gone: so is the reason to run
            inbox.put(message)

    def write() -> None:
        while (message := outbox.get()) is not done:
            try:
                channel.send(message)
            except OSError:
                os._exit(0)

    def take(block: bool) -> list:
        commands = [inbox.get()] if block else []
        while True:
            try:
                commands.append(inbox.get_nowait())
            except queue.Empty:
                return commands

    threading.Thread(target=read, name="minivllm-core-reader", daemon=True).start()
    writer = threading.Thread(target=write, name="minivllm-core-writer")
    writer.start()
    try:
        EngineCoreLoop(core, eos_token_ids, outbox.put).run(take)
    finally:
        outbox.put(done)
        writer.join()
    return 0


# --- the front end's side ------------------------------------------------------------------------
class ProcessCore:
    """Starts the engine core in a process of its own and talks to it (see the module's doc).

    Raises what building the core raised (a bad checkpoint, a pool that does not fit), with
    its message, or :class:`EngineDeadError` if the process died before it was ready."""

    def __init__(self, args, model_path: Path, eos_token_ids: tuple[int, ...], pad_token_id: int | None):
        start = StartCore(args, str(Path(model_path).resolve()), tuple(eos_token_ids), pad_token_id)
        try:
            start_frame = encode(start)
        except Exception as error:  # a plug-in defined where the core process cannot see it
            raise TypeError(
                "engine_core_process=True sends the engine arguments to the engine core's process, "
                f"but they cannot be pickled ({type(error).__name__}: {error}); use "
                "engine_core_process=False for plug-ins that live in a notebook or a closure"
            ) from error
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), start_new_session=True,
        )
        theirs.close()
        self._sock = ours
        self._channel = _Channel(ours)
        self._finalizer = weakref.finalize(self, _stop_process, self.proc, ours)
        self._messages: list[EngineCoreOutputs] = []
        self._results: dict[int, UtilityResult] = {}
        self._call_ids = 0
        self._connection: _SocketConnection | None = None
        try:
            self._channel.send((list(sys.path), os.getpid()))
            ours.sendall(start_frame)
            reply = self._channel.recv()
        except (EOFError, OSError) as error:
            self._finalizer()
            raise EngineDeadError(f"the engine core process died while starting ({self._exit_status()})") from error
        if isinstance(reply, CoreFailed):
            self._finalizer()
            raise _rebuilt(reply)
        self.ready: CoreReady = reply

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _exit_status(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        code = self.proc.returncode
        if code is None:
            return "still running"
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exit status {code}"

    # --- synchronous: LLMEngine ------------------------------------------------------------
    def _send(self, message) -> None:
        if self._connection is not None:
            raise RuntimeError("this engine core is serving an AsyncLLM; use it through that")
        try:
            self._channel.send(message)
        except OSError as error:
            raise EngineDeadError(f"the engine core process has stopped ({self._exit_status()})") from error

    def _recv(self):
        try:
            return self._channel.recv()
        except (EOFError, OSError) as error:
            raise EngineDeadError(f"the engine core process has stopped ({self._exit_status()})") from error

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(request)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        if request_ids:
            self._send(FinishRequests(tuple(request_ids), status))

    def step(self) -> EngineCoreOutputs:
        """The core's next message: it steps on its own, this waits for what it did."""
        while not self._messages:
            self._take_one()
        return self._messages.pop(0)

    def call(self, method: str, *args):
        self._call_ids += 1
        call_id = self._call_ids
        self._send(UtilityCall(call_id, method, args))
        while call_id not in self._results:
            self._take_one()
        return self._results.pop(call_id).unwrap()

    def _take_one(self) -> None:
        message = self._recv()
        if isinstance(message, UtilityResult):
            self._results[message.call_id] = message
        else:
            self._messages.append(message)

    def shutdown(self) -> None:
        """Stop the core (its requests are aborted) and wait for its process to end."""
        if self.proc.poll() is None and self._connection is None:
            with contextlib.suppress(OSError):
                self._channel.send(SHUTDOWN)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(_SHUTDOWN_WAIT_S)
        self._finalizer()

    # --- asynchronous: AsyncLLM ------------------------------------------------------------
    async def connect(self, loop: asyncio.AbstractEventLoop, on_message: OnMessage,
                      on_dead: OnDead) -> CoreConnection:
        if self._connection is not None:
            raise RuntimeError("this engine core is already serving a front end")
        connection = _SocketConnection(self, on_message, on_dead)
        for message in self._messages:  # anything a synchronous user left unread
            connection._dispatch(message)
        self._messages.clear()
        self._sock.setblocking(False)
        await loop.create_unix_connection(lambda: _CoreProtocol(connection), sock=self._sock)
        self._connection = connection
        return connection


class _SocketConnection(CoreConnection):
    def __init__(self, client: ProcessCore, on_message: OnMessage, on_dead: OnDead):
        super().__init__(on_message, on_dead)
        self.client = client
        self.transport: asyncio.Transport | None = None

    def send(self, command) -> None:
        if self.transport is None or self.transport.is_closing():
            raise EngineDeadError(f"the engine core process has stopped ({self.client._exit_status()})")
        self.transport.write(encode(command))

    def lost(self) -> None:
        """End-of-file: the core process stopped. Find out how, off the event loop."""
        if not self.alive:
            return

        async def report() -> None:
            status = await asyncio.to_thread(self.client._exit_status)
            self._died(EngineDeadError(f"the engine core process (pid {self.client.pid}) stopped: {status}"))

        asyncio.ensure_future(report())

    async def _close(self) -> None:
        self.alive = False
        proc = self.client.proc
        if proc.poll() is None and self.transport is not None and not self.transport.is_closing():
            self.transport.write(encode(SHUTDOWN))
            try:
                await asyncio.to_thread(proc.wait, _SHUTDOWN_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.transport is not None:
            self.transport.close()
        self.client._finalizer()


class _CoreProtocol(asyncio.Protocol):
    """Frames from the core's socket, unpickled on the event loop as they complete."""

    def __init__(self, connection: _SocketConnection):
        self.connection = connection
        self.buffer = bytearray()

    def connection_made(self, transport) -> None:
        self.connection.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        start, end, header = 0, len(buf), _HEADER.size
        while end - start >= header:
            (size,) = _HEADER.unpack_from(buf, start)
            if end - start - header < size:
                break
            message = pickle.loads(memoryview(buf)[start + header : start + header + size])
            start += header + size
            self.connection._dispatch(message)
        del buf[:start]

    def connection_lost(self, exc) -> None:
        self.connection.lost()


def _stop_process(proc: subprocess.Popen, sock: socket.socket) -> None:
    """Close the socket (the core exits at its end-of-file), then make sure it has."""
    sock.close()
    try:
        proc.wait(5.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _rebuilt(failed: CoreFailed) -> Exception:
    """The exception the core's build raised, as the front end's own: its type where it is one
    of the engine's usual ones, its message, and the core's traceback as its cause."""
    kinds = {"ValueError": ValueError, "TypeError": TypeError, "FileNotFoundError": FileNotFoundError,
             "MemoryError": MemoryError, "KeyError": KeyError}
    kind = kinds.get(failed.error_type)
    error = kind(failed.message) if kind is not None else RuntimeError(f"{failed.error_type}: {failed.message}")
    error.__cause__ = RuntimeError(f"in the engine core process:\n{failed.traceback}")
    return error


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
