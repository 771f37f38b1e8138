"""``AsyncLLM``: many concurrent callers, one engine core, outputs streamed as deltas.

A server's requests arrive whenever clients send them, and each client waits on its own
tokens. ``AsyncLLM`` is the front end that joins the two, as vLLM's ``AsyncLLM`` does::

    callers (asyncio tasks, event loop)               engine core (a thread, or its own process)
    ───────────────────────────────────               ──────────────────────────────────────────
    add_request(): InputProcessor (checks, ids) ─ EngineCoreRequest ─> EngineCoreLoop: queue it
    stream closed / abort(): OutputProcessor ends it ─ FinishRequests ─> blocks freed
    stream <─ OutputProcessor (detokenize, stop strings) <─ EngineCoreOutputs ─ one per step

* The core runs in a process of its own when the engine was built with
  ``engine_core_process=True`` (``minivllm serve``'s default): the model computes there while
  this process parses, detokenizes and writes HTTP, on another CPU core and under another GIL.
  Otherwise in a thread of this process (notebooks, debugging), with the same semantics.
* Outputs are deltas (``RequestOutputKind.DELTA``): each holds only the new text and tokens,
  so a step costs the front end what is new, however long the answers have grown. A slow
  reader gets the deltas it missed merged into one; ``FINAL_ONLY`` (a non-streaming reply)
  gets one output with everything.
* A caller that goes away (its stream or generator is closed or cancelled) aborts its request
  at once, which frees its KV blocks; an explicit :meth:`AsyncLLM.abort` ends the caller's
  stream with ``finish_reason="abort"``.
* A request the core ends with an error (``finish_reason="error"``: its row could not be
  sampled, or its step failed) fails its caller with that message; the others go on. Should
  ``step()`` itself raise, every request the core holds fails with the error and the core
  carries on serving newcomers. Should the core die (its process killed), every caller fails
  with :class:`EngineDeadError` and :attr:`is_running` turns false (``/health`` answers 503).
* A core that stops answering (its process stopped, a step that never ends) is not dead to
  the socket; :meth:`AsyncLLM.health` calls it stalled once it has sent nothing for
  ``stall_timeout`` seconds while requests are pending (a core with work sends a message every
  step), and healthy again at its next message.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from minivllm.core.messages import EngineCoreOutputs, FinishRequests
from minivllm.engine.core_client import CoreConnection, EngineDeadError
from minivllm.engine.llm_engine import LLMEngine
from minivllm.engine.output_processor import ProcessedOutputs
from minivllm.entrypoints.metrics import ServerMetrics
from minivllm.outputs import CompletionOutput, RequestOutput, RequestOutputKind
from minivllm.request import RequestStatus
from minivllm.sampling_params import SamplingParams

STATS_WINDOW = 10_000  # steps (and finished requests) the engine keeps in detail when serving
DEFAULT_STALL_TIMEOUT = 5.0  # seconds of silence from a core with pending work before /health says so
DELTA = RequestOutputKind.DELTA


class QueueFullError(RuntimeError):
    """More requests are waiting for a seat than ``max_waiting`` allows."""


class RequestFailedError(RuntimeError):
    """The engine failed this request (its row, or its whole step); it was ended."""


@dataclass
class _InFlight:
    """What the server counts of a request in flight (event loop thread); its times are the
    output processor's."""

    num_prompt_tokens: int
    num_samples: int  # n: every sample is one sequence in the finish counts
    error: str | None = None  # the first error one of its samples ended with


def merge_delta(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """Two consecutive delta outputs of one request as one: texts, token ids and
    log-probabilities joined per completion; how it ended from the later one."""
    merged = {c.index: c for c in earlier.outputs}
    for c in later.outputs:
        old = merged.get(c.index)
        if old is None:
            merged[c.index] = c
            continue
        logprobs = None if old.logprobs is None else old.logprobs + (c.logprobs or [])
        merged[c.index] = CompletionOutput(c.index, old.text + c.text, old.token_ids + c.token_ids,
                                           c.finish_reason, c.stop_reason, c.cumulative_logprob, logprobs, c.error)
    return RequestOutput(later.request_id, later.prompt, later.prompt_token_ids,
                         [merged[i] for i in sorted(merged)], later.finished, later.num_cached_tokens,
                         later.metrics, later.prompt_logprobs)


@dataclass
class RequestStream:
    """One request's outputs, as its caller sees them: ``async for out in stream``.

    With ``DELTA`` outputs, deltas that arrive before the caller reads are merged into one;
    otherwise the newest replaces the last. Iteration ends after the output with
    ``finished=True``; ``aclose()`` before that aborts the request. Lives on the event loop."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    n: int
    kind: RequestOutputKind
    _on_close: Callable[[str], None] = field(repr=False)
    finished: bool = False  # the engine side is over (finished, aborted or failed)
    _latest: RequestOutput | None = field(default=None, repr=False)
    _error: BaseException | None = field(default=None, repr=False)
    _consumed: bool = field(default=False, repr=False)  # the caller saw the end
    _ready: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    # --- fed by AsyncLLM (event loop thread) -------------------------------------------------
    def _put(self, out: RequestOutput) -> None:
        if self.finished:
            return
        if self._latest is not None and self.kind is DELTA:
            out = merge_delta(self._latest, out)
        self._latest, self.finished = out, out.finished
        self._ready.set()

    def _fail(self, error: BaseException) -> None:
        if self.finished:
            return
        self._error, self.finished = error, True
        self._ready.set()

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
        self._consumed = out.finished
        return out

    async def aclose(self) -> None:
        """Stop listening. A request that is still running is aborted (its blocks freed)."""
        self._consumed = True
        if not self.finished:
            self.finished = True
            self._on_close(self.request_id)


class AsyncLLM:
    """Serve an :class:`LLMEngine` to concurrent asyncio callers. It takes the engine over:
    from :meth:`start` on nobody else may call its ``add_request`` or ``step``.

    ``max_waiting`` caps how many sequences may wait for a seat (those in flight minus those
    running at the core's last step); beyond it ``add_request`` raises :class:`QueueFullError`
    so that a server can shed load instead of queueing without bound.

    ``stall_timeout``: seconds the core may stay silent while requests are pending before
    :meth:`health` reports it stalled (see the module's doc).
    """

    def __init__(self, engine: LLMEngine, max_waiting: int | None = None, metrics: ServerMetrics | None = None,
                 stall_timeout: float = DEFAULT_STALL_TIMEOUT):
        if max_waiting is not None and (not isinstance(max_waiting, int) or max_waiting < 1):
            raise ValueError(f"max_waiting must be an integer >= 1 (or None for no limit), got {max_waiting!r}")
        if not isinstance(stall_timeout, (int, float)) or not stall_timeout > 0:
            raise ValueError(f"stall_timeout must be a number of seconds > 0, got {stall_timeout!r}")
        self.engine = engine
        self.max_waiting = max_waiting
        self.stall_timeout = float(stall_timeout)
        self._last_heard = time.monotonic()  # the core's last message, or when work began pending
        self.metrics = metrics or ServerMetrics()
        # Tokenizing (a worker thread of the server) and detokenizing (the event loop) each
        # have a tokenizer of their own: a Hugging Face tokenizer must not serve two threads.
        self.input_processor = engine.caller_input_processor()
        self.tokenizer = self.input_processor.tokenizer
        self.output_processor = engine.output_processor
        self.max_model_len: int = engine.max_model_len
        self.vocab_size: int = engine.model_config.vocab_size
        # A server runs for days: keep a short window of per-step figures in the core.
        window = engine.get_stats().window
        engine.set_stats_window(STATS_WINDOW if window is None else min(window, STATS_WINDOW))
        self._streams: dict[str, RequestStream] = {}
        self._in_flight: dict[str, _InFlight] = {}
        self._sequences = 0  # samples in flight, for max_waiting
        self._running = 0  # sequences holding a seat at the core's last message
        self._prefix = [0, 0]  # prompt tokens looked up in / served from the prefix cache
        self._connection: CoreConnection | None = None
        self._connecting: asyncio.Future | None = None
        self._dead: BaseException | None = None
        self._stopping = False
        self._accepting = True

    @classmethod
    def from_engine_args(cls, model: str | None = None, max_waiting: int | None = None,
                         stall_timeout: float = DEFAULT_STALL_TIMEOUT, **engine_args) -> AsyncLLM:
        return cls(LLMEngine(model, **engine_args), max_waiting=max_waiting, stall_timeout=stall_timeout)

    # --- lifecycle (event loop thread) -----------------------------------------------------
    @property
    def is_running(self) -> bool:
        return self._connection is not None and self._connection.alive and self._dead is None

    def health(self) -> str | None:
        """``None`` while the core runs and answers; else why not (``/health`` answers 503 with
        it): the core has stopped, or it has sent nothing for more than ``stall_timeout``
        seconds while requests are pending. Also refreshes the liveness gauges."""
        m = self.metrics
        silent = time.monotonic() - self._last_heard if self._in_flight else 0.0
        if not self.is_running:
            reason = f"the engine core is not running: {self._dead}" if self._dead else "the engine core is not running"
        elif silent > self.stall_timeout:
            reason = (f"the engine core has not answered for {silent:.1f} s with {self._sequences} sequences "
                      f"pending (stall threshold {self.stall_timeout:g} s)")
        else:
            reason = None
        with m.lock:
            m.core_up.set(reason is None)
            m.core_silent.set(silent)
            m.in_flight.set(self._sequences)
        return reason

    async def start(self) -> None:
        """Connect to the engine core (its loop thread starts, or its process's socket joins
        the event loop); call from the event loop that will read the outputs."""
        if self._connection is not None:
            return
        if self._connecting is None:
            loop = asyncio.get_running_loop()
            self._connecting = asyncio.ensure_future(
                self.engine.core_client.connect(loop, self._on_message, self._on_dead))
        self._connection = await asyncio.shield(self._connecting)

    async def shutdown(self) -> None:
        """Abort whatever is still running (each stream ends with ``"abort"``), stop the
        engine core and wait for it."""
        if self._stopping:
            return
        self._stopping = True
        await self.abort_all()
        if self._connecting is not None:
            connection = await self._connecting
            await connection.close()
        else:  # never started: a core process still has to go
            await asyncio.to_thread(self.engine.shutdown)
        self._dead = self._dead or EngineDeadError("the server shut down")

    # --- requests (event loop thread) ------------------------------------------------------
    def stop_accepting(self) -> None:
        """Refuse new requests from now on (graceful shutdown); running ones go on."""
        self._accepting = False

    async def abort_all(self) -> None:
        """Abort every running request; each caller's stream ends with ``"abort"``."""
        for request_id in list(self._streams):
            await self.abort(request_id)

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"the engine has stopped: {self._dead}")
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
        output_kind: RequestOutputKind = DELTA,
    ) -> RequestStream:
        """Queue a request and return its stream. Raises before anything is queued:
        ``ValueError`` / ``TypeError`` (the engine's validation, naming the value and the
        limit), :class:`QueueFullError`, :class:`EngineDeadError`."""
        self._check_alive()
        await self.start()
        self._check_alive()
        inputs = self.input_processor.process(prompt, params, priority=priority, cache_salt=cache_salt,
                                              output_kind=output_kind)
        text, ids, params = inputs.prompt, inputs.prompt_token_ids, inputs.params
        request_id = f"req-{uuid.uuid4().hex}" if request_id is None else str(request_id)
        if self.max_waiting is not None and self._waiting() >= self.max_waiting:
            with self.metrics.lock:
                self.metrics.rejected.inc(label_value="queue_full")
            raise QueueFullError(
                f"the server is at capacity: {self._waiting()} requests are waiting for a "
                f"seat and max_waiting={self.max_waiting}; retry later"
            )
        message = self.output_processor.admit(request_id, inputs)
        if not self._in_flight:  # the core had nothing to do: its silence counts from now
            self._last_heard = time.monotonic()
        try:
            self._connection.send(message)
        except BaseException:
            self.output_processor.withdraw(request_id)
            raise
        stream = RequestStream(request_id, text, ids, params.n, output_kind, self._abort_from_caller)
        self._streams[request_id] = stream
        self._in_flight[request_id] = _InFlight(len(ids), params.n)
        self._sequences += params.n
        return stream

    def _waiting(self) -> int:
        """Sequences without a seat: every one in flight minus those running at the last step."""
        return max(0, self._sequences - self._running)

    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        output_kind: RequestOutputKind = DELTA,
    ) -> AsyncIterator[RequestOutput]:
        """``async for out in llm.generate(...)``: outputs (by default the new text and tokens
        of each step) until ``out.finished``. Closing or cancelling the iteration aborts it."""
        stream = await self.add_request(prompt, params, request_id, priority, output_kind=output_kind)
        try:
            async for out in stream:
                yield out
        finally:
            await stream.aclose()

    async def abort(self, request_id: str) -> None:
        """Abort a request; its caller's stream ends with ``finish_reason="abort"``."""
        stream = self._streams.get(request_id)
        if stream is None:
            return
        for out in self._end(request_id):
            stream._put(out)
        self._forget(request_id)

    def _abort_from_caller(self, request_id: str) -> None:
        if request_id in self._streams:
            self._end(request_id)
            self._forget(request_id)

    def _end(self, request_id: str) -> list[RequestOutput]:
        """End a request here and in the core; its final outputs."""
        op = self.output_processor
        samples = op.sample_ids([request_id])
        outputs, ended = op.abort([request_id])
        if samples and self._connection is not None and self._connection.alive:
            self._connection.send(FinishRequests(tuple(samples), RequestStatus.FINISHED_ABORTED))
        self._count_ended(ended)
        return outputs

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        tracked = self._in_flight.pop(request_id, None)
        if tracked is not None:
            self._sequences -= tracked.num_samples
            with self.metrics.lock:
                self.metrics.prompt_tokens.inc(tracked.num_prompt_tokens)

    # --- messages from the core (event loop thread) ------------------------------------------
    def _on_message(self, message: EngineCoreOutputs) -> None:
        self._last_heard = time.monotonic()
        try:
            self._handle(message)
        except Exception as error:  # a bug here: never leave callers hanging
            self._on_dead(EngineDeadError(f"handling the engine's outputs failed: {error!r}"))
            if self._connection is not None:
                self._connection.begin_close()  # shutdown() waits for the same stop

    def _handle(self, message: EngineCoreOutputs) -> None:
        done = self.output_processor.process(message.deltas, message.timestamp)
        if done.stopped:
            self._connection.send(FinishRequests(tuple(done.stopped), RequestStatus.FINISHED_STOPPED))
        self._record(done)
        self._count_ended(done.ended)
        self._refresh_gauges(message)
        for out in done.outputs:
            self._deliver(out)

    def _deliver(self, out: RequestOutput) -> None:
        rid = out.request_id
        tracked = self._in_flight.get(rid)
        if tracked is not None and tracked.error is None:
            tracked.error = next((c.error or "unknown error" for c in out.outputs if c.finish_reason == "error"), None)
        stream = self._streams.get(rid)
        if not out.finished:
            if stream is not None:
                stream._put(out)
            return
        if tracked is not None:
            with self.metrics.lock:
                self.metrics.e2e.observe(time.perf_counter() - out.metrics.arrival_time)
                if tracked.error is not None:
                    self.metrics.failed.inc()
        if stream is not None:
            if tracked is not None and tracked.error is not None:
                stream._fail(RequestFailedError(f"the engine failed this request: {tracked.error}"))
            else:
                stream._put(out)
        self._forget(rid)

    def _record(self, done: ProcessedOutputs) -> None:
        """Latency histograms, measured where the caller gets the tokens (the output
        processor's readings, right after the step's outputs were processed). TTFT counts from
        the arrival, queueing included."""
        m = self.metrics
        with m.lock:
            for rid, new in done.new_tokens.items():
                if rid not in self._in_flight:
                    continue
                if rid in done.first_token_latency:
                    m.ttft.observe(done.first_token_latency[rid])
                else:
                    m.itl.observe(done.inter_token_latency[rid])
                m.generation_tokens.inc(new)

    def _count_ended(self, ended: list[tuple[str, str]]) -> None:
        """Each sample that ended counts once, by its finish reason."""
        if ended:
            with self.metrics.lock:
                for _, reason in ended:
                    self.metrics.finished.inc(label_value=reason)

    def _refresh_gauges(self, message: EngineCoreOutputs) -> None:
        m, state, step = self.metrics, message.state, message.step
        self._running = state.num_running
        with m.lock:
            if step is not None:
                m.steps.inc()
                m.batch_size.observe(step.num_batched_seqs)
                m.preemptions.inc(step.num_preemptions)
                if step.num_draft_tokens:
                    m.spec_drafts.inc(step.num_draft_tokens)
                    m.spec_accepted.inc(step.num_accepted_tokens)
                self._prefix[0] += step.prefix_cache_queries
                self._prefix[1] += step.prefix_cache_hits
                if self._prefix[0]:
                    m.prefix_hit_rate.set(self._prefix[1] / self._prefix[0])
            m.running.set(state.num_running)
            m.waiting.set(state.num_waiting)
            m.kv_usage.set(state.kv_blocks_used / state.kv_blocks_total if state.kv_blocks_total else 0.0)

    def _on_dead(self, error: BaseException) -> None:
        """The core stopped: every caller in flight fails with ``error``; nothing more is served."""
        if self._dead is None:
            self._dead = error
        streams = list(self._streams.values())
        self._streams.clear()
        self._in_flight.clear()
        self._sequences = 0
        self.output_processor.clear()
        with self.metrics.lock:  # nothing runs or waits any more: no frozen gauges
            for gauge in (self.metrics.running, self.metrics.waiting, self.metrics.kv_usage,
                          self.metrics.in_flight, self.metrics.core_up, self.metrics.core_silent):
                gauge.set(0)
        for stream in streams:
            stream._fail(error if isinstance(error, EngineDeadError) else EngineDeadError(str(error)))

    # --- asking the core (tests, tools) ------------------------------------------------------
    async def core_state(self):
        """The core's state now (``minivllm.core.messages.CoreState``): running, waiting, KV
        blocks in use, samples held -- read by the core itself, wherever it runs."""
        await self.start()
        return await self._connection.call("state")

    async def check_invariants(self) -> None:
        """The KV manager's invariants, checked in the core."""
        await self.start()
        await self._connection.call("check_invariants")
