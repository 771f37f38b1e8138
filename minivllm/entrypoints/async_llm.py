"""``AsyncLLM``: many concurrent callers, one engine, one loop thread that steps it.

A server's requests arrive whenever clients send them, and each client waits on its own
tokens. The engine, though, is a single-threaded object that makes progress only when someone
calls ``step()``. ``AsyncLLM`` puts the two together the way vLLM's ``AsyncLLM`` does:

    callers (asyncio tasks)                    loop thread (owns the LLMEngine)
    ───────────────────────                    ────────────────────────────────
    add_request() ── _Add ──> command queue ──> engine.add_request()  (ValueError goes back)
      (inputs tokenized and checked here first, by the engine's InputProcessor rules)
    stream closed ── _Abort ─> command queue ──> engine.abort_request()
    async for out in stream <── call_soon_threadsafe(_deliver) <── engine.step() outputs

* Only the loop thread touches the engine; callers talk to it through a queue, so there are no
  locks around engine state. The loop blocks on the queue when the engine is idle and steps
  without pause while it has work, draining new commands between steps: a request that
  arrives mid-step joins the very next batch (continuous batching at the front door).
* Stepping runs in a thread, not in the event loop, so the HTTP server keeps accepting
  connections and writing tokens while the model computes.
* Outputs are cumulative (the whole text so far), so a stream keeps only the newest one: a
  slow reader skips intermediate outputs instead of queueing them without bound.
* A caller that goes away (its stream or generator is closed or cancelled) aborts its request
  at once, which frees its KV blocks; an explicit :meth:`AsyncLLM.abort` ends the caller's
  stream with ``finish_reason="abort"``.
* A request the engine ends with an error (``finish_reason="error"``: its row could not be
  sampled, or its step failed) fails its caller with that message; the others go on. Should
  ``step()`` itself raise, every request the engine holds fails with the error and the loop
  carries on serving newcomers; it never dies silently.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from minivllm.engine.llm_engine import LLMEngine
from minivllm.entrypoints.metrics import ServerMetrics
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import SamplingParams

STATS_WINDOW = 10_000  # steps (and finished requests) the engine keeps in detail when serving


class EngineDeadError(RuntimeError):
    """The loop thread has stopped (shut down, or crashed): no request can be served."""


class QueueFullError(RuntimeError):
    """More requests are waiting for a seat than ``max_waiting`` allows."""


class RequestFailedError(RuntimeError):
    """The engine raised while this request was in flight; the request was aborted."""


# --- commands from callers to the loop thread ----------------------------------------------
@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: dict  # {"prompt": text or None, "prompt_token_ids": [...]}
    params: SamplingParams
    priority: int
    arrival_time: float  # time.perf_counter() when the caller asked
    future: asyncio.Future  # resolved with None, or failed with the engine's ValueError
    cache_salt: str | None = None  # a tenant's prefix-cache partition


@dataclass(frozen=True)
class _Abort:
    request_ids: tuple[str, ...]
    notify: bool  # deliver a final "abort" output to the callers (False: they already left)


_STOP = object()
_ABORTED = object()  # delivery marker: this request was aborted, end its stream


@dataclass
class _Timing:
    """Per-request clock readings the loop thread keeps for the latency histograms."""

    arrival_time: float
    num_prompt_tokens: int
    num_samples: int  # n: every sample is one sequence in the finish counts
    first_token_time: float | None = None
    last_token_time: float = 0.0
    tokens_seen: int = 0


@dataclass
class RequestStream:
    """One request's outputs, as its caller sees them: ``async for out in stream``.

    Every ``RequestOutput`` holds the whole completion so far, so only the newest matters;
    iteration ends after the output with ``finished=True``. ``aclose()`` before that aborts
    the request. Lives on the event loop thread; the loop thread never touches it directly.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    n: int
    _on_close: Callable[[str], None] = field(repr=False)
    finished: bool = False  # the engine side is over (finished, aborted or failed)
    _latest: RequestOutput | None = field(default=None, repr=False)
    _last_read: RequestOutput | None = field(default=None, repr=False)
    _error: BaseException | None = field(default=None, repr=False)
    _consumed: bool = field(default=False, repr=False)  # the caller saw the end
    _ready: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    # --- fed by AsyncLLM._deliver (event loop thread) ------------------------------------
    def _put(self, out: RequestOutput) -> None:
        if self.finished:
            return
        self._latest, self.finished = out, out.finished
        self._ready.set()

    def _fail(self, error: BaseException) -> None:
        if self.finished:
            return
        self._error, self.finished = error, True
        self._ready.set()

    def _abort(self) -> None:
        """End the stream with ``finish_reason="abort"`` on every unfinished completion,
        keeping the text and tokens produced so far."""
        last = self._latest or self._last_read
        if last is None:
            outputs = [CompletionOutput(i, "", [], "abort") for i in range(self.n)]
        else:
            outputs = [
                CompletionOutput(c.index, c.text, list(c.token_ids), c.finish_reason or "abort", c.stop_reason)
                for c in last.outputs
            ]
        self._put(
            RequestOutput(
                self.request_id, self.prompt, self.prompt_token_ids, outputs, finished=True,
                num_cached_tokens=last.num_cached_tokens if last else 0,
            )
        )

    # --- read by the caller ----------------------------------------------------------------
    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        while self._latest is None and self._error is None:
            if self._consumed:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        if self._error is not None:
            error, self._error, self._consumed = self._error, None, True
            raise error
        out, self._latest = self._latest, None
        self._last_read = out
        self._consumed = out.finished
        return out

    async def aclose(self) -> None:
        """Stop listening. A request that is still running is aborted (its blocks freed)."""
        self._consumed = True
        if not self.finished:
            self.finished = True
            self._on_close(self.request_id)


class AsyncLLM:
    """Serve an :class:`LLMEngine` to concurrent asyncio callers.

    ``max_waiting`` caps how many sequences may wait for a seat in the running batch (counted
    from the engine's last step plus arrivals since); beyond it ``add_request`` raises
    :class:`QueueFullError` so that a server can shed load instead of queueing without bound.
    """

    def __init__(self, engine: LLMEngine, max_waiting: int | None = None, metrics: ServerMetrics | None = None):
        if max_waiting is not None and (not isinstance(max_waiting, int) or max_waiting < 1):
            raise ValueError(f"max_waiting must be an integer >= 1 (or None for no limit), got {max_waiting!r}")
        self.engine = engine
        self.max_waiting = max_waiting
        self.metrics = metrics or ServerMetrics()
        # The engine's tokenizer belongs to the loop thread; callers tokenize and check their
        # requests with the same rules and a tokenizer of their own.
        self.input_processor = engine.caller_input_processor()
        self.tokenizer = self.input_processor.tokenizer
        # A server runs for days: keep a short window of per-step figures (totals are kept
        # anyway); the gauges read the steps recorded since the last look.
        engine.stats.window = min(engine.stats.window or STATS_WINDOW, STATS_WINDOW)
        self._steps_seen = engine.stats.num_steps
        self.max_model_len: int = engine.max_model_len
        self.vocab_size: int = engine.model_config.vocab_size
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # event loop thread only
        self._timing: dict[str, _Timing] = {}  # loop thread only
        self._last_running = 0  # sequences running after the last step (loop thread only)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None
        self._stopping = False
        self._accepting = True

    @classmethod
    def from_engine_args(cls, model: str | None = None, max_waiting: int | None = None, **engine_args) -> AsyncLLM:
        return cls(LLMEngine(model, **engine_args), max_waiting=max_waiting)

    # --- lifecycle (event loop thread) -----------------------------------------------------
    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    def start(self) -> None:
        """Start the loop thread; call from the event loop that will read the outputs."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="minivllm-engine-loop", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Abort whatever is still running, stop the loop thread and wait for it."""
        if self._thread is None or self._stopping:
            return
        self._stopping = True
        self._commands.put(_STOP)
        await asyncio.to_thread(self._thread.join)

    # --- requests (event loop thread) ------------------------------------------------------
    def stop_accepting(self) -> None:
        """Refuse new requests from now on (graceful shutdown); running ones go on."""
        self._accepting = False

    async def abort_all(self) -> None:
        """Abort every running request; each caller's stream ends with ``"abort"``."""
        if self._streams:
            self._commands.put(_Abort(tuple(self._streams), notify=True))

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"the engine loop has stopped: {self._dead}")
        if self._stopping or not self._accepting:
            raise EngineDeadError("the server is shutting down and accepts no new requests")

    def tokenize(self, prompt: str | Sequence[int]) -> tuple[str | None, list[int]]:
        """The engine's tokenization (BOS included), done on the caller's side."""
        return self.input_processor.tokenize(prompt)

    async def add_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> RequestStream:
        """Queue a request and return its stream. Raises before anything is queued:
        ``ValueError`` / ``TypeError`` (the engine's validation, naming the value and the
        limit), :class:`QueueFullError`, :class:`EngineDeadError`."""
        arrival = time.perf_counter()
        self._check_alive()
        self.start()
        inputs = self.input_processor.process(prompt, params, priority=priority, cache_salt=cache_salt)
        text, ids, params = inputs.prompt, inputs.prompt_token_ids, inputs.params
        request_id = f"req-{uuid.uuid4().hex}" if request_id is None else str(request_id)
        if request_id in self._streams:
            raise ValueError(f"request_id {request_id!r} is already in use")
        stream = RequestStream(request_id, text, ids, params.n, self._abort_from_caller)
        self._streams[request_id] = stream
        future = self._loop.create_future()
        self._commands.put(
            _Add(request_id, {"prompt": text, "prompt_token_ids": ids}, params, priority, arrival, future,
                 inputs.cache_salt)
        )
        try:
            await future
        except asyncio.CancelledError:
            # The caller left while the add was in flight: it may still be added, so abort it
            # after (commands run in order).
            self._streams.pop(request_id, None)
            self._commands.put(_Abort((request_id,), notify=False))
            raise
        except BaseException:
            self._streams.pop(request_id, None)
            raise
        return stream

    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """``async for out in llm.generate(...)``: cumulative outputs until ``out.finished``.
        Closing or cancelling the iteration aborts the request."""
        stream = await self.add_request(prompt, params, request_id, priority)
        try:
            async for out in stream:
                yield out
        finally:
            await stream.aclose()

    async def abort(self, request_id: str) -> None:
        """Abort a request; its caller's stream ends with ``finish_reason="abort"``."""
        if request_id in self._streams:
            self._commands.put(_Abort((request_id,), notify=True))

    def _abort_from_caller(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        if self._thread is not None and self._dead is None:
            self._commands.put(_Abort((request_id,), notify=False))

    def _deliver(self, items: list[tuple[str, object]]) -> None:
        """Event loop side of a delivery: hand each item to its stream."""
        for request_id, item in items:
            stream = self._streams.get(request_id)
            if stream is None:
                continue
            if item is _ABORTED:
                stream._abort()
            elif isinstance(item, BaseException):
                stream._fail(item)
            else:
                stream._put(item)
            if stream.finished:
                del self._streams[request_id]

    def _fail_all_streams(self, error: BaseException) -> None:
        for stream in list(self._streams.values()):
            stream._fail(error)
        self._streams.clear()

    # --- the loop thread -------------------------------------------------------------------
    def _post(self, callback: Callable, *args) -> None:
        """Run ``callback(*args)`` on the event loop (a no-op once that loop is closed)."""
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass

    def _run(self) -> None:
        try:
            while True:
                commands = self._take_commands(block=not self.engine.has_unfinished_requests())
                if any(c is _STOP for c in commands):
                    self._stop(commands)
                    return
                for command in commands:
                    if isinstance(command, _Add):
                        self._handle_add(command)
                    else:
                        self._handle_abort(command)
                if self.engine.has_unfinished_requests():
                    self._step()
        except BaseException as error:  # a bug in this loop: never leave callers hanging
            self._dead = error
            dead = EngineDeadError(f"the engine loop crashed: {error!r}")
            self._post(self._fail_all_streams, dead)
            self._reject_pending(dead)

    def _take_commands(self, block: bool) -> list:
        commands = [self._commands.get()] if block else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _reject_pending(self, error: BaseException, commands: Sequence = ()) -> None:
        for command in [*commands, *self._take_commands(block=False)]:
            if isinstance(command, _Add):
                self._post(_resolve, command.future, error)

    def _waiting_count(self) -> int:
        """Sequences without a seat: everything unfinished minus what ran at the last step."""
        return max(0, self.engine.get_num_unfinished_requests() - self._last_running)

    def _handle_add(self, command: _Add) -> None:
        if command.future.cancelled():
            return
        if self.max_waiting is not None and self._waiting_count() >= self.max_waiting:
            with self.metrics.lock:
                self.metrics.rejected.inc(label_value="queue_full")
            error = QueueFullError(
                f"the server is at capacity: {self._waiting_count()} requests are waiting for a "
                f"seat and max_waiting={self.max_waiting}; retry later"
            )
            self._post(_resolve, command.future, error)
            return
        try:
            self.engine.add_request(
                command.request_id, command.prompt, command.params,
                priority=command.priority, arrival_time=command.arrival_time, cache_salt=command.cache_salt,
            )
        except (ValueError, TypeError) as error:
            self._post(_resolve, command.future, error)
            return
        num_prompt = len(command.prompt["prompt_token_ids"])
        self._timing[command.request_id] = _Timing(command.arrival_time, num_prompt, command.params.n)
        self._post(_resolve, command.future, None)

    def _handle_abort(self, command: _Abort) -> None:
        ids = [rid for rid in command.request_ids if rid in self._timing]
        if not ids:
            return
        result = self.engine.abort_request(ids)
        final = {out.request_id: out for out in (result or []) if out.finished}
        with self.metrics.lock:
            for rid in ids:
                self._count_ended(self._timing.pop(rid), "abort")
        if command.notify:
            self._post(self._deliver, [(rid, final.get(rid, _ABORTED)) for rid in ids])
        self._refresh_gauges()

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as error:  # noqa: BLE001 - fail the requests in flight, keep serving
            self._fail_in_flight(error)
            return
        now = time.perf_counter()
        self._record_outputs(outputs, now)
        self._refresh_gauges()
        items = []
        for out in outputs:
            if out.finished:
                self._timing.pop(out.request_id, None)
            errors = [c.error for c in out.outputs if c.finish_reason == "error"]
            if out.finished and errors:
                with self.metrics.lock:
                    self.metrics.failed.inc()
                items.append((out.request_id, RequestFailedError(f"the engine failed this request: {errors[0]}")))
            else:
                items.append((out.request_id, out))
        if items:  # outputs of requests whose caller left are dropped by _deliver
            self._post(self._deliver, items)

    def _fail_in_flight(self, error: Exception) -> None:
        """``step()`` raised. The engine cannot tell us which requests were in the failed
        batch, and their state may be half-updated, so every request it holds is aborted and
        its caller gets the error; the loop then serves new requests as before."""
        ids = list(self._timing)
        self.engine.abort_request(ids)
        message = f"the engine failed while running this request: {type(error).__name__}: {error}"
        with self.metrics.lock:
            self.metrics.failed.inc(len(ids))
            for timing in self._timing.values():
                self._count_ended(timing, "error")
        self._timing.clear()
        self._post(self._deliver, [(rid, RequestFailedError(message)) for rid in ids])
        self._refresh_gauges()

    def _count_ended(self, timing: _Timing, reason: str) -> None:
        """A request that ended outside a step's outputs (aborted, or failed with its step):
        each of its ``n`` sequences counts once, as finished ones do. Hold the metrics lock."""
        self.metrics.finished.inc(timing.num_samples, label_value=reason)
        self.metrics.prompt_tokens.inc(timing.num_prompt_tokens)

    def _record_outputs(self, outputs: list[RequestOutput], now: float) -> None:
        """Latency histograms, measured where the caller will see the tokens: right after the
        step that produced them. TTFT counts from the caller's arrival, queueing included."""
        m = self.metrics
        with m.lock:
            for out in outputs:
                timing = self._timing.get(out.request_id)
                if timing is None:
                    continue
                tokens = sum(len(c.token_ids) for c in out.outputs)
                if tokens > timing.tokens_seen:
                    if timing.first_token_time is None:
                        timing.first_token_time = now
                        m.ttft.observe(now - timing.arrival_time)
                    else:
                        m.itl.observe(now - timing.last_token_time)
                    m.generation_tokens.inc(tokens - timing.tokens_seen)
                    timing.last_token_time, timing.tokens_seen = now, tokens
                if out.finished:
                    m.e2e.observe(now - timing.arrival_time)
                    m.prompt_tokens.inc(timing.num_prompt_tokens)
                    for c in out.outputs:
                        m.finished.inc(label_value=c.finish_reason or "unknown")

    def _refresh_gauges(self) -> None:
        """Read the steps the engine recorded since last time."""
        stats = self.engine.get_stats()
        new = stats.num_steps - self._steps_seen
        self._steps_seen = stats.num_steps
        steps, m = (stats.steps[-new:] if new > 0 else []), self.metrics
        with m.lock:
            for s in steps:
                m.steps.inc()
                m.batch_size.observe(s.num_batched_seqs)
                m.preemptions.inc(s.num_preemptions)
            m.prefix_hit_rate.set(stats.prefix_hit_rate)
            if not self.engine.has_unfinished_requests():
                # Idle: nothing runs, waits or holds a block (checked by the tests).
                self._last_running = 0
                m.running.set(0)
                m.waiting.set(0)
                m.kv_usage.set(0.0)
            elif steps:
                last = steps[-1]
                self._last_running = last.num_running
                m.running.set(last.num_running)
                m.waiting.set(last.num_waiting)
                m.kv_usage.set(last.kv_blocks_used / last.kv_blocks_total if last.kv_blocks_total else 0.0)

    def _stop(self, commands: list) -> None:
        """Shut down: refuse queued adds, abort every live request (ending its stream)."""
        self._dead = EngineDeadError("the server shut down")
        self._reject_pending(EngineDeadError("the server is shutting down"), [c for c in commands if c is not _STOP])
        ids = list(self._timing)
        if ids:
            self.engine.abort_request(ids)
            with self.metrics.lock:
                for timing in self._timing.values():
                    self._count_ended(timing, "abort")
            self._timing.clear()
            self._post(self._deliver, [(rid, _ABORTED) for rid in ids])
        self._refresh_gauges()


def _resolve(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
