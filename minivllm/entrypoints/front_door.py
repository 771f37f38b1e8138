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
"""

from __future__ import annotations

import asyncio
import hmac
from dataclasses import dataclass

import h11
from fastapi import Request
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from minivllm.entrypoints.protocol import error_body

DEFAULT_MAX_REQUEST_BYTES = 4 << 20  # 4 MiB: a 128k-token prompt is ~0.5 MB of text
DEFAULT_READ_TIMEOUT = 30.0  # seconds to send the headers, and again the body
RETRY_AFTER_S = 1  # what a 503 tells the client to wait before retrying


@dataclass(frozen=True)
class DoorOptions:
    """The front door's settings (``minivllm serve --api-key / --max-request-bytes /
    --request-read-timeout``)."""

    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    read_timeout: float = DEFAULT_READ_TIMEOUT

    def __post_init__(self) -> None:
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ValueError("api_key must be a non-empty string (or None for no key)")
        if not isinstance(self.max_request_bytes, int) or self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be an integer >= 1, got {self.max_request_bytes!r}")
        if not isinstance(self.read_timeout, (int, float)) or not self.read_timeout > 0:
            raise ValueError(f"read_timeout must be a number of seconds > 0, got {self.read_timeout!r}")


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


def protocol_with_header_timeout(timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for each request's headers: a connection that
    has not sent a complete request head ``timeout`` seconds after it opened (or after its
    previous response) is closed."""

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

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol
