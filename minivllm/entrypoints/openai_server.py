"""``minivllm serve``: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over ``AsyncLLM``.

    POST /v1/completions        text in, text out (one prompt or a batch; n choices each)
    POST /v1/chat/completions   messages -> the tokenizer's chat template -> text out
    GET  /v1/models             the served model
    GET  /health                200 while the engine core runs and answers; 503 with the reason
                                once it has stopped, or when it has been silent for longer than
                                ``--core-stall-timeout`` while requests are pending
    GET  /metrics               Prometheus text (see minivllm/entrypoints/metrics.py)

Each HTTP request becomes one engine request per prompt. With ``"stream": true`` the reply is
a stream of server-sent events (``data: {chunk}``, then ``data: [DONE]``) carrying the new text
of every step; otherwise one JSON body when all choices are done. Errors use OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``: 400 for anything the client got wrong
(malformed JSON, bad or unsupported parameters, prompts too long), 401 without the API key,
404 for an unknown model, 408 / 413 for a body too slow / too large (``front_door.py``), 503
when the waiting queue is full or the server is shutting down, 500 if the engine fails.
A client that disconnects aborts its requests, so their KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from minivllm.entrypoints import protocol as api
from minivllm.entrypoints.async_llm import (
    AsyncLLM,
    EngineDeadError,
    QueueFullError,
    RequestFailedError,
    RequestStream,
)
from minivllm.entrypoints.front_door import (
    ApiKeyMiddleware,
    DoorOptions,
    RefusedAtTheDoor,
    error_response,
    read_body,
)
from minivllm.outputs import RequestOutput, RequestOutputKind
from minivllm.sampling_params import short_repr

Kind = Literal["completion", "chat"]
BODIES: dict[Kind, type[api._SamplingFields]] = {"completion": api.CompletionRequest, "chat": api.ChatCompletionRequest}


class _ClientGone(Exception):
    """The client closed the connection before its (non-streaming) response was ready."""


class OpenAIServer:
    """The routes and their plumbing; one per running server.

    Parsing, tokenizing and chat templating (work in proportion to what the client sent) run
    on one worker thread, never on the event loop, so a big request delays only requests that
    are being parsed too, not the streams being written. One thread, because the tokenizer is
    not safe to call from two threads at once."""

    def __init__(self, llm: AsyncLLM, model_name: str, door: DoorOptions | None = None):
        self.llm = llm
        self.model_name = model_name
        self.door = door or DoorOptions()
        self.started = int(time.time())
        self.prompt_char_limit = (
            api.max_prompt_chars(llm.tokenizer, llm.max_model_len) if llm.tokenizer is not None else 0
        )
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minivllm-prepare")

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    # --- helpers ---------------------------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise LookupError(
                f"the model {short_repr(name)} does not exist; this server serves {self.model_name!r}"
            )

    async def start_requests(
        self, prompts: list[list[int]], params, request_id: str, req: api._SamplingFields
    ) -> list[RequestStream]:
        """Add one engine request per prompt. If one is refused, the ones already added are
        aborted, so a refused HTTP request leaves nothing behind."""
        kind = RequestOutputKind.DELTA if req.stream else RequestOutputKind.FINAL_ONLY
        streams: list[RequestStream] = []
        try:
            for i, ids in enumerate(prompts):
                rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
                streams.append(await self.llm.add_request(ids, params, rid, req.priority, cache_salt=req.cache_salt,
                                                          output_kind=kind))
        except BaseException:
            for s in streams:
                await s.aclose()
            raise
        return streams

    def prepare(self, raw: bytes, kind: Kind):
        """Parse, validate and tokenize a body (on the worker thread): (request, prompt texts,
        prompt ids, SamplingParams). Raises InvalidRequestError / LookupError before anything
        reaches the engine."""
        llm = self.llm
        req = api.parse_body(raw, BODIES[kind], llm.max_model_len)
        self.check_model(req.model)
        api.check_cache_salt(req)
        if kind == "chat":
            texts, prompts = [None], [api.render_chat(llm.tokenizer, req, self.prompt_char_limit)]
            param = "messages"
        else:
            texts, prompts = [], []
            raw_prompts = req.prompts()
            for i, p in enumerate(raw_prompts):
                if isinstance(p, str) and not p:  # as vllm serve: no text, nothing to continue
                    raise api.InvalidRequestError(
                        f"{'the prompt' if len(raw_prompts) == 1 else f'prompt {i}'} is empty: "
                        "give at least one character or token id", "prompt")
                if isinstance(p, str) and llm.tokenizer is not None:
                    api.check_text(p, "prompt", "the prompt" if len(raw_prompts) == 1 else f"prompt {i}",
                                   self.prompt_char_limit)
                text, ids = llm.tokenize(p)
                if text is None and llm.tokenizer is not None:
                    text = llm.tokenizer.decode(ids)
                texts.append(text or "")
                prompts.append(ids)
            param = "prompt"
        for ids in prompts:  # the engine's prompt rules: not empty, short enough, in the vocabulary
            with api.refused_as(param):
                llm.input_processor.check_prompt(ids)
        longest = max(len(ids) for ids in prompts)
        params = api.to_sampling_params(req, longest, llm.max_model_len)
        return req, texts, prompts, params

    # --- non-streaming ---------------------------------------------------------------------
    @staticmethod
    async def _final(stream: RequestStream) -> RequestOutput:
        final = None
        async for out in stream:
            final = out
        return final

    async def collect(self, http: Request, streams: list[RequestStream]) -> list[RequestOutput]:
        """Wait for every stream's final output, or abort them all if the client leaves. One
        task per stream (not a ``gather``, whose cancelled future would hold an exception that
        nobody reads, logged with a traceback when it is collected); whatever happens, every
        task is cancelled and awaited, so a hang-up costs one 499 and no log at all."""
        tasks = [asyncio.ensure_future(self._final(s)) for s in streams]
        watch = asyncio.ensure_future(_wait_for_disconnect(http))
        try:
            pending = set(tasks)
            while pending:
                done, _ = await asyncio.wait(pending | {watch}, return_when=asyncio.FIRST_COMPLETED)
                for task in done & pending:
                    pending.discard(task)
                    task.result()  # a request the engine failed raises here
                if watch in done and pending:
                    raise _ClientGone()
            return [task.result() for task in tasks]
        finally:
            for task in (watch, *tasks):
                task.cancel()
            await asyncio.gather(watch, *tasks, return_exceptions=True)
            for s in streams:
                await s.aclose()

    def logprobs(self, kind: Kind, token_ids, logprobs, num: int | None, text_offset: int = 0):
        """Tokens' log-probabilities in the API's shape (None unless the request asked)."""
        if num is None or logprobs is None:
            return None
        if kind == "chat":
            return api.chat_logprobs(self.llm.tokenizer, token_ids, logprobs, num)
        return api.completion_logprobs(self.llm.tokenizer, token_ids, logprobs, num, text_offset)

    def full_response(self, kind: Kind, head: api.ResponseHeader, texts, outputs, echo: bool,
                      num_logprobs: int | None) -> dict:
        n = len(outputs[0].outputs)
        choices = []
        for i, out in enumerate(outputs):
            for c in out.outputs:
                if kind == "chat":
                    choices.append(api.chat_choice(c.index, c, self.logprobs(kind, c.token_ids, c.logprobs,
                                                                              num_logprobs)))
                else:
                    prefix = texts[i] if echo else ""
                    lps = self.logprobs(kind, c.token_ids, c.logprobs, num_logprobs, len(prefix))
                    choices.append(api.completion_choice(i * n + c.index, prefix + c.text, c, lps))
        body = api.chat_response if kind == "chat" else api.completion_response
        return body(head, choices, api.usage_of(outputs))

    # --- streaming -------------------------------------------------------------------------
    async def stream_events(
        self, kind: Kind, head: api.ResponseHeader, texts, streams: list[RequestStream], n: int,
        echo: bool, include_usage: bool, num_logprobs: int | None,
    ) -> AsyncIterator[str]:
        """Server-sent events: the new text of each choice as it arrives, ``finish_reason`` on
        its last chunk, an optional usage chunk, then ``[DONE]``. The streams' outputs are
        deltas, so each event costs what is new. Closing this generator (the client left, or
        the server is shutting down) aborts every request still running."""
        sent_text: dict[int, int] = {}  # characters sent per choice (logprobs' text_offset)
        held: dict[int, tuple[list[int], list]] = {}  # tokens (and logprobs) not sent with text yet
        completion_tokens, cached = 0, [0] * len(streams)
        try:
            if kind == "chat":  # the role comes first, as OpenAI's streams do
                first = [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None} for i in range(n)]
                yield _sse(api.chunk(head, kind, first))
            elif echo:
                yield _sse(api.chunk(head, kind, [
                    {"index": p * n + i, "text": texts[p], "logprobs": None, "finish_reason": None}
                    for p in range(len(streams)) for i in range(n)
                ]))
            async for p, out in _merge(streams):
                choices = []
                for c in out.outputs:
                    index = p * n + c.index
                    completion_tokens += len(c.token_ids)
                    tokens, lps = held.pop(index, ([], []))
                    tokens = tokens + c.token_ids
                    lps = lps + (c.logprobs or [])
                    if not c.text and c.finish_reason is None:  # no text yet: send the tokens later
                        held[index] = (tokens, lps)
                        continue
                    start = sent_text.get(index, 0)
                    offset = start + (len(texts[p]) if echo else 0)
                    logprobs = self.logprobs(kind, tokens, lps if c.logprobs is not None else None,
                                             num_logprobs, offset)
                    sent_text[index] = start + len(c.text)
                    if kind == "chat":
                        choices.append({"index": index, "delta": {"content": c.text}, "logprobs": logprobs,
                                        "finish_reason": c.finish_reason})
                    else:
                        choices.append({"index": index, "text": c.text, "logprobs": logprobs,
                                        "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
                if out.finished:
                    cached[p] = out.num_cached_tokens
                if choices:
                    yield _sse(api.chunk(head, kind, choices))
            if include_usage:
                prompt_tokens = sum(len(s.prompt_token_ids) for s in streams)
                yield _sse(api.chunk(head, kind, [], api.usage(prompt_tokens, completion_tokens, sum(cached))))
        except RequestFailedError as error:
            yield _sse(api.error_body(str(error), "server_error", None, 500))
        except EngineDeadError as error:
            yield _sse(api.error_body(str(error), "server_error", None, 503))
        finally:
            for s in streams:
                await s.aclose()
        yield "data: [DONE]\n\n"

    # --- the two endpoints -----------------------------------------------------------------
    async def handle(self, http: Request, kind: Kind) -> Response:
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        head = api.ResponseHeader(f"{prefix}-{uuid.uuid4().hex}", self.model_name)
        try:
            raw = await read_body(http, self.door)
            work = asyncio.get_running_loop().run_in_executor(self._worker, self.prepare, raw, kind)
            req, texts, prompts, params = await work
            streams = await self.start_requests(prompts, params, head.id, req)
        except RefusedAtTheDoor as error:  # the rest of the body is unread: the connection is done
            return error_response(error.status, str(error), "invalid_request_error", None, error.code,
                          headers={"Connection": "close"})
        except ClientDisconnect:
            return Response(status_code=499)
        except LookupError as error:
            return error_response(404, str(error), "invalid_request_error", "model", "model_not_found")
        except api.InvalidRequestError as error:
            return error_response(400, str(error), "invalid_request_error", error.param)
        except (ValueError, TypeError) as error:  # the engine's own validation names the field first
            return error_response(400, str(error), "invalid_request_error", api.param_named_in(str(error), BODIES[kind]))
        except QueueFullError as error:
            return error_response(503, str(error), "server_overloaded", None, "queue_full")
        except EngineDeadError as error:
            return error_response(503, str(error), "server_error", None, "engine_unavailable")
        echo = bool(getattr(req, "echo", False))
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            events = self.stream_events(kind, head, texts, streams, params.n, echo, include_usage,
                                        req.num_logprobs())
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            outputs = await self.collect(http, streams)
        except _ClientGone:
            return Response(status_code=499)  # nobody is listening; nginx's "client closed request"
        except RequestFailedError as error:
            return error_response(500, str(error), "server_error", None)
        except EngineDeadError as error:
            return error_response(503, str(error), "server_error", None, "engine_unavailable")
        return JSONResponse(self.full_response(kind, head, texts, outputs, echo, req.num_logprobs()))

    def models(self) -> dict:
        card = {"id": self.model_name, "object": "model", "created": self.started, "owned_by": "minivllm",
                "root": self.model_name, "max_model_len": self.llm.max_model_len}
        return {"object": "list", "data": [card]}


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def _wait_for_disconnect(http: Request) -> None:
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return


async def _merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """``(prompt index, output)`` from several streams as each arrives."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    pending: dict[asyncio.Future, int] = {asyncio.ensure_future(_next(s)): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                out = task.result()
                if out is None:
                    continue
                yield i, out
                if not out.finished:
                    pending[asyncio.ensure_future(_next(streams[i]))] = i
    finally:
        for task in pending:
            task.cancel()


async def _next(stream: RequestStream) -> RequestOutput | None:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None


def build_app(llm: AsyncLLM, model_name: str, door: DoorOptions | None = None) -> FastAPI:
    """The FastAPI application. ``llm``'s loop starts with the app and stops with it. No
    ``/docs`` or ``/openapi.json``: the API is OpenAI's (see docs/serving.md), and a served
    model needs no schema browser open to every client."""
    server = OpenAIServer(llm, model_name, door)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await llm.start()
        yield
        await llm.shutdown()
        server.close()

    app = FastAPI(title="minivllm", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    if server.door.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=server.door.api_key)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal server error: {type(exc).__name__}: {short_repr(str(exc), 200)}", "server_error")

    @app.post("/v1/completions")
    async def completions(http: Request) -> Response:
        return await server.handle(http, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(http: Request) -> Response:
        return await server.handle(http, "chat")

    @app.get("/v1/models")
    async def models() -> dict:
        return server.models()

    @app.get("/health")
    async def health() -> Response:
        reason = llm.health()
        if reason is None:
            return Response(status_code=200)
        return error_response(503, reason, "server_error", None, "engine_unavailable")

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        llm.health()  # the liveness gauges as of now
        return PlainTextResponse(llm.metrics.render(), media_type="text/plain; version=0.0.4")

    return app
