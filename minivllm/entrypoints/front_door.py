"""The server's front door: what is refused before any work is done for a request.

Parsing, tokenizing and templating cost time in proportion to what a client sends, and the
server's threads are shared by every client; so a request is bounded before any of that work:

* ``api_key``: every ``/v1`` route needs ``Authorization: Bearer <key>`` (vLLM's ``--api-key``),
  else 401 in OpenAI's shape, checked before the body is read. ``/health`` and ``/metrics``
  stay open, for load balancers and scrapers.
* ``max_request_bytes``: a larger body gets 413 (at once when its ``Content-Length`` says so,
  otherwise as soon as that many bytes have arrived), never parsed.
* ``read_timeout``: a client that takes longer to send its headers is disconnected, and one
  that takes longer to send its body gets 408; otherwise a client that sends half a request
  and waits would hold a connection (and its buffers) forever.

uvicorn does not time out incomplete headers (its keep-alive timer only runs between
requests), so :func:`protocol_with_header_timeout` adds that deadline to its h11 protocol.

Connections themselves are bounded too (:class:`ConnectionGuard`), so that a flood of idle or
half-open connections cannot use up the process's file descriptors (at which point ``accept``
fails and a good client waits in the kernel's queue):

* at start the soft open-file limit is raised toward the hard one (:func:`raise_open_file_limit`,
  as ``vllm serve`` does);
* at most ``max_connections`` are open (by default a little under the open-file limit, at most
  4096); a connection past the cap sheds the oldest one that has no request in progress --
  first those that never completed a request head, then idle keep-alive ones -- and when
  every open connection is busy with a request the newcomer gets a bare 503 and is closed;
* a failed ``accept`` (``EMFILE`` and the like) is counted and logged at most once every
  ``ACCEPT_LOG_EVERY_S`` seconds, not once per attempt with a traceback (asyncio's own loop
  retries ``accept`` up to ``backlog`` times per tick and logs each failure).

The counts are on ``/metrics``: ``minivllm_http_connections_shed_total{reason}`` and
``minivllm_http_accept_errors_total``, with the ``minivllm_http_connections_open`` gauge.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import logging
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass

import h11
from fastapi import Request
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from minivllm.entrypoints.protocol import error_body

DEFAULT_MAX_REQUEST_BYTES = 4 << 20  # 4 MiB: a 128k-token prompt is ~0.5 MB of text
DEFAULT_READ_TIMEOUT = 30.0  # seconds to send the headers, and again the body
RETRY_AFTER_S = 1  # what a 503 tells the client to wait before retrying
DEFAULT_MAX_CONNECTIONS = 4096  # open HTTP connections, when the open-file limit allows as many
OPEN_FILE_TARGET = 65535  # the soft open-file limit the server asks for at start (as vLLM's)
ACCEPT_LOG_EVERY_S = 10.0  # a failing accept() is logged at most this often

logger = logging.getLogger("minivllm.serve")


@dataclass(frozen=True)
class DoorOptions:
    """The front door's settings (``minivllm serve --api-key / --max-request-bytes /
    --request-read-timeout / --max-connections``)."""

    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    read_timeout: float = DEFAULT_READ_TIMEOUT
    max_connections: int | None = None  # None: derived from the open-file limit at start

    def __post_init__(self) -> None:
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ValueError("api_key must be a non-empty string (or None for no key)")
        if not isinstance(self.max_request_bytes, int) or self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be an integer >= 1, got {self.max_request_bytes!r}")
        if not isinstance(self.read_timeout, (int, float)) or not self.read_timeout > 0:
            raise ValueError(f"read_timeout must be a number of seconds > 0, got {self.read_timeout!r}")
        if self.max_connections is not None and (
                not isinstance(self.max_connections, int) or self.max_connections < 1):
            raise ValueError(f"max_connections must be an integer >= 1 (or None), got {self.max_connections!r}")


class RefusedAtTheDoor(Exception):
    """A request refused before its body was parsed: an HTTP status, OpenAI's error fields."""

    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.code = status, code


def error_response(status: int, message: str, type_: str, param: str | None = None, code=None,
                   headers: dict | None = None) -> JSONResponse:
    """An error in OpenAI's shape; a 503 tells the client when to retry."""
    headers = dict(headers or {})
    if status == 503:
        headers["Retry-After"] = str(RETRY_AFTER_S)
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


async def read_body(http: Request, options: DoorOptions) -> bytes:
    """The request body, at most ``max_request_bytes`` of it, within ``read_timeout`` seconds;
    else :class:`RefusedAtTheDoor` (413 or 408)."""
    limit = options.max_request_bytes
    declared = http.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)

    async def receive() -> bytes:
        parts, size = [], 0
        async for chunk in http.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit, at_least=True)
            parts.append(chunk)
        return b"".join(parts)

    try:
        return await asyncio.wait_for(receive(), options.read_timeout)
    except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
        raise RefusedAtTheDoor(
            408, f"the request body did not arrive within {options.read_timeout:g} s", "request_timeout"
        ) from None


def _too_large(size: int, limit: int, at_least: bool = False) -> RefusedAtTheDoor:
    more = "more than " if at_least else ""
    return RefusedAtTheDoor(
        413, f"the request body has {more}{size} bytes but this server accepts at most {limit} "
        f"(--max-request-bytes)", "request_too_large",
    )


class ApiKeyMiddleware:
    """ASGI middleware: ``/v1`` routes need ``Authorization: Bearer <api_key>``. The key is
    compared in constant time and never echoed."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = error_response(
                    401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                    "invalid_request_error", None, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def protocol_with_header_timeout(timeout: float, guard: ConnectionGuard | None = None) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for each request's headers: a connection that
    has not sent a complete request head ``timeout`` seconds after it opened (or after its
    previous response) is closed. With ``guard``, each connection tells it when it waits for
    a request head (it may then be shed) and when it is gone."""

    class HeaderTimeoutProtocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(timeout, self._expire)

        def _expire(self) -> None:
            # IDLE: h11 has not seen a complete request head since the deadline was armed
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()
            if guard is not None:
                guard.waiting(self, served=False)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()
                if guard is not None:
                    guard.waiting(self, served=True)

        def connection_lost(self, exc) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            if guard is not None:
                guard.gone(self)
            super().connection_lost(exc)

    return HeaderTimeoutProtocol


# --- connections: the open-file limit, a cap, shedding, accept errors -----------------------------
def raise_open_file_limit(target: int = OPEN_FILE_TARGET) -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` toward ``target`` (no further than the hard limit), as
    ``vllm serve`` does at start: every open connection is a file descriptor. Returns the
    (soft, hard) limits in force afterwards."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return (target, target)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError) as error:
            logger.warning("could not raise the open-file limit from %d to %d: %s", soft, want, error)
    return soft, hard


def open_file_limit() -> int:
    try:
        import resource
    except ImportError:  # pragma: no cover
        return OPEN_FILE_TARGET
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return OPEN_FILE_TARGET if soft == resource.RLIM_INFINITY else soft


def connection_budget(requested: int | None, fd_limit: int) -> tuple[int, int]:
    """(cap, hard cap): shed past ``cap``; refuse outright past ``hard cap`` connections not
    being shed (sockets being shed close on the loop's next turn, so a burst accepted in one turn
    may hold more descriptors for that turn; one past the limit fails ``accept``, which is
    counted and retried, see :meth:`ConnectionGuard.accept_failed`). Both stay under the open-file limit with room for the process's own
    files (the model, the core's socket, the tokenizer, logs): a quarter of the limit, at
    least 32 and at most 256 descriptors."""
    headroom = max(32, min(256, fd_limit // 4))
    fit = max(8, fd_limit - headroom)
    cap = min(requested if requested is not None else DEFAULT_MAX_CONNECTIONS, fit)
    if requested is not None and requested > fit:
        logger.warning("--max-connections %d does not fit the open-file limit %d: using %d",
                       requested, fd_limit, cap)
    return cap, cap + max(4, min(headroom // 2, fd_limit - cap - 16))


_BUSY_BODY = (b'{"error":{"message":"the server has no free connection slot; retry later",'
              b'"type":"server_overloaded","param":null,"code":"busy"}}')
_BUSY_REPLY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
               b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(_BUSY_BODY)) + _BUSY_BODY
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class ConnectionGuard:
    """Counts the server's open connections and sheds the oldest idle ones past the cap.

    The listening socket (:class:`GuardedListener`) calls :meth:`accepted` for each socket it
    accepts and the socket calls :meth:`closed` when it closes, so the count covers sockets
    the protocol has not seen yet; the protocol reports when a connection waits for a request
    head (:meth:`waiting`: it is then sheddable) and when it is gone. Event loop thread only."""

    def __init__(self, max_connections: int | None = None, metrics=None, fd_limit: int | None = None):
        self.fd_limit = fd_limit if fd_limit is not None else open_file_limit()
        self.cap, self.hard_cap = connection_budget(max_connections, self.fd_limit)
        self.metrics = metrics
        self.open = 0
        self._fresh: OrderedDict = OrderedDict()  # never completed a request head, oldest first
        self._kept: OrderedDict = OrderedDict()  # idle between requests (keep-alive), oldest first
        self._shedding: set = set()  # shed, their sockets not closed yet (on the loop's next turn)
        self.shed = {"incomplete": 0, "idle": 0, "refused": 0}
        self.accept_errors = 0
        self._unlogged, self._last_log = 0, -float("inf")

    # --- from the listening socket -----------------------------------------------------------
    def accepted(self) -> bool:
        """A socket was accepted: whether to keep it (else the caller answers 503 and closes)."""
        self.open += 1
        if self.over_cap():
            self.shed_one()
        # a connection being shed is gone on the loop's next turn: a burst accepted in one turn
        # is refused only when there is nothing left to shed for it
        if self.open - len(self._shedding) > self.hard_cap:
            self._count("refused")
            return False
        self._gauge()
        return True

    def over_cap(self) -> bool:
        return self.open - len(self._shedding) > self.cap

    def closed(self) -> None:
        self.open -= 1
        self._gauge()

    def accept_failed(self, error: OSError) -> None:
        """``accept`` failed for want of descriptors or memory: count it, log it now and then."""
        self.accept_errors += 1
        self._unlogged += 1
        if self.metrics is not None:
            with self.metrics.lock:
                self.metrics.accept_errors.inc()
        now = time.monotonic()
        if now - self._last_log >= ACCEPT_LOG_EVERY_S:
            logger.warning(
                "accept() failed %d time(s) since the last report (%s); %d connections open, open-file "
                "limit %d; shedding idle connections", self._unlogged, error, self.open, self.fd_limit)
            self._unlogged, self._last_log = 0, now

    # --- from the protocol -------------------------------------------------------------------
    def waiting(self, protocol, served: bool) -> None:
        """``protocol`` waits for a request head: newest at the end of its queue."""
        self._fresh.pop(protocol, None)
        self._kept.pop(protocol, None)
        (self._kept if served else self._fresh)[protocol] = None
        if self.over_cap():  # a burst was accepted before any of it could be shed
            self.shed_one()

    def gone(self, protocol) -> None:
        self._fresh.pop(protocol, None)
        self._kept.pop(protocol, None)
        self._shedding.discard(protocol)

    def shed_one(self) -> bool:
        """Close the oldest connection that has no request in progress (never-completed ones
        first); whether there was one. A connection found busy leaves the queue until it
        waits again."""
        for queue, reason in ((self._fresh, "incomplete"), (self._kept, "idle")):
            while queue:
                protocol, _ = queue.popitem(last=False)
                if _is_idle(protocol):
                    protocol.transport.close()
                    self._shedding.add(protocol)
                    self._count(reason)
                    return True
        return False

    def exception_handler(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """The event loop's exception handler: asyncio's own report of a failed ``accept``
        (one per attempt, with a traceback) becomes a count; everything else as before."""
        error = context.get("exception")
        if context.get("message") == "socket.accept() out of system resource" and isinstance(error, OSError):
            if not getattr(error, "_minivllm_counted", False):
                self.accept_failed(error)
            return
        loop.default_exception_handler(context)

    def _count(self, reason: str) -> None:
        self.shed[reason] += 1
        if self.metrics is not None:
            with self.metrics.lock:
                self.metrics.connections_shed.inc(label_value=reason)

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.http_connections.set(self.open)  # one float store: no lock needed


def _is_idle(protocol) -> bool:
    transport = protocol.transport
    if transport is None or transport.is_closing():
        return False
    cycle = protocol.cycle
    return protocol.conn.their_state is h11.IDLE and (cycle is None or cycle.response_complete)


class _TrackedSocket(socket.socket):
    """An accepted connection's socket: tells the guard when it closes."""

    _guard: ConnectionGuard | None = None

    def close(self) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.closed()
        super().close()


class GuardedListener(socket.socket):
    """The listening socket, counting what it accepts (asyncio calls its ``accept``).

    Past the hard cap a connection gets a bare 503 and is closed at once, so its descriptor
    is free again before the next ``accept``. When ``accept`` itself fails for want of
    descriptors, the failure is counted (and logged now and then), the oldest idle connection
    is shed, and the loop tries again on its next turn; if there was nothing to shed, the
    error goes on to asyncio, which pauses accepting for a second (one report, not one per
    attempt: the rest of that turn's attempts end at once)."""

    guard: ConnectionGuard | None = None
    _backing_off = False

    def accept(self):
        if self._backing_off:
            raise BlockingIOError(errno.EAGAIN, "backing off after a failed accept")
        guard = self.guard
        while True:
            try:
                fd, addr = self._accept()
            except OSError as error:
                if guard is None or error.errno not in _OUT_OF_RESOURCES:
                    raise
                guard.accept_failed(error)
                self._back_off()
                if guard.shed_one():
                    raise BlockingIOError(errno.EAGAIN, "retrying after shedding a connection") from error
                error._minivllm_counted = True
                raise
            sock = _TrackedSocket(self.family, self.type, self.proto, fileno=fd)
            if guard is None:
                return sock, addr
            sock._guard = guard
            if guard.accepted():
                return sock, addr
            try:
                sock.setblocking(False)
                sock.send(_BUSY_REPLY)
            except OSError:
                pass
            sock.close()

    def _back_off(self) -> None:
        self._backing_off = True
        try:
            asyncio.get_running_loop().call_soon(self._stop_backing_off)
        except RuntimeError:  # not on a loop (a blocking caller): no turn to wait for
            self._backing_off = False

    def _stop_backing_off(self) -> None:
        self._backing_off = False


def listening_socket(host: str, port: int, guard: ConnectionGuard | None) -> GuardedListener:
    """A bound TCP socket for ``host:port`` (IPv6 when the host has a colon), as uvicorn binds one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = GuardedListener(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.guard = guard
    return sock
