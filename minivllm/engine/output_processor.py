"""From what the engine core sends to what the user sees: text, stop strings, ``n > 1``, logprobs.

The core speaks in samples and token ids (:class:`~minivllm.core.messages.RequestDelta`: per
step, each sample's *new* tokens and how it ended). The user asked for one request id with
``n`` completions and wants text. :class:`OutputProcessor` keeps, for every request the user
submitted, one *family* (its ``n`` samples), and for every sample its incremental detokenizer
and its log-probabilities. For each batch of deltas it

1. appends the new log-probabilities and places prompt log-probabilities by position,
2. detokenizes the new tokens; a sample whose text now contains a stop string ends here, and
   its id is returned so that the caller ends it in the core too (its blocks are freed),
3. builds one :class:`~minivllm.outputs.RequestOutput` per family that changed, of the kind the
   request asked for (:class:`~minivllm.outputs.RequestOutputKind`: only the new text and
   tokens, everything so far, or only the final answer), and forgets families that ended.

With ``DELTA`` every step costs what is new, whatever the length of the answer: nothing is
re-sliced or re-joined. The processor never touches the core (it may run in another process),
so it works the same whichever way the core runs. vLLM v1 splits its engine the same way
(``vllm/v1/engine/output_processor.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from minivllm.core.interfaces import Logprobs
from minivllm.core.messages import EngineCoreRequest, RequestDelta, sample_ids
from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.engine.input_processor import ProcessedInputs
from minivllm.outputs import (
    CompletionOutput,
    Logprob,
    PositionLogprobs,
    RequestMetrics,
    RequestOutput,
    RequestOutputKind,
)
from minivllm.sampling_params import SamplingParams

DELTA, CUMULATIVE, FINAL_ONLY = RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY


@dataclass
class _ChildState:
    """One sample. With ``DELTA`` its lists hold only what was not sent yet; otherwise all."""

    request_id: str
    index: int
    family: _Family
    detokenizer: IncrementalDetokenizer | None
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # pieces of text, joined when sent
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    num_tokens: int = 0  # every token generated, sent or not
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    changed: bool = False  # since the family's last output

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class _Family:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    kind: RequestOutputKind
    metrics: RequestMetrics  # the core's times (see OutputProcessor.process)
    own_metrics: bool  # filled here from the core's step times until the core's record arrives
    children: list[_ChildState] = field(default_factory=list)
    delivered_at: float | None = None  # this process's clock when its tokens last reached it
    num_cached_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_unfinished: int = 0

    @property
    def finished(self) -> bool:
        return self.num_unfinished == 0


@dataclass
class ProcessedOutputs:
    """What one batch of deltas gave: ``outputs`` for the user; ``stopped``, sample ids that hit
    a stop string (end them in the core); per family, the tokens it got (``new_tokens``), the
    finish reasons of its samples that ended (``ended``) and, measured where the tokens reached
    this process (its clock, when the batch was processed), the time since its arrival for a
    family whose first tokens these are (``first_token_latency``) and since its previous tokens
    for the others (``inter_token_latency``) -- what the server's metrics count."""

    outputs: list[RequestOutput] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    new_tokens: dict[str, int] = field(default_factory=dict)
    ended: list[tuple[str, str]] = field(default_factory=list)  # (family id, finish reason)
    first_token_latency: dict[str, float] = field(default_factory=dict)
    inter_token_latency: dict[str, float] = field(default_factory=dict)


class OutputProcessor:
    def __init__(self, tokenizer=None, clock=time.perf_counter):
        self.tokenizer = tokenizer  # None: no text, token ids only (skip_tokenizer_init)
        self.clock = clock
        self.families: dict[str, _Family] = {}
        self.children: dict[str, _ChildState] = {}

    def __len__(self) -> int:
        """Families (user requests) not finished yet."""
        return len(self.families)

    def in_use(self, request_id: str) -> bool:
        """A user request's id, or the id of one of its samples, while it is unfinished."""
        return request_id in self.families or request_id in self.children

    def admit(self, request_id: str, inputs: ProcessedInputs) -> EngineCoreRequest:
        """The one way a request enters an engine, whichever front end took it (``LLM``,
        ``LLMEngine``, ``AsyncLLM``): its checked inputs (:class:`InputProcessor`, which stamped
        its arrival), its id and its samples' ids checked free, its state followed here; returns
        the message that queues it in the core, which the caller sends. Raises before anything
        is followed."""
        params = inputs.params
        self.check_ids_free(request_id, params.n)
        self.add_request(request_id, inputs.prompt, inputs.prompt_token_ids, params, inputs.output_kind,
                         inputs.arrival_time)
        return EngineCoreRequest(request_id, inputs.prompt_token_ids, params, inputs.arrival_time,
                                 inputs.priority, inputs.cache_salt)

    def withdraw(self, request_id: str) -> None:
        """Stop following a request just admitted that never reached the core (its message could
        not be delivered): no output is made for it."""
        family = self.families.get(request_id)
        if family is not None:
            self._forget(family)

    def add_request(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
        kind: RequestOutputKind = CUMULATIVE, arrival_time: float | None = None,
    ) -> None:
        """Follow a request the core was given (at ``arrival_time``). Its times are the core's:
        the first-token time is the end of the core's step that gave it its first token (the
        ``timestamp`` of that step's outputs: the very time the core stamps on its ``Request``),
        and the delta that ends its first sample brings the core's whole record (read off that
        ``Request``, the times' one owner), in either mode of the core."""
        metrics = RequestMetrics(arrival_time=self.clock() if arrival_time is None else arrival_time)
        family = _Family(request_id, prompt, list(prompt_token_ids), kind, metrics, True)
        for i, rid in enumerate(sample_ids(request_id, params.n)):
            detok = (IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params)
                     if self.tokenizer is not None else None)
            state = _ChildState(rid, i, family, detok)
            if params.logprobs is not None:
                state.logprobs, state.cumulative_logprob = [], 0.0
            family.children.append(state)
            self.children[rid] = state
        family.num_unfinished = len(family.children)
        self.families[request_id] = family

    def check_ids_free(self, request_id: str, n: int, also_in_use: Callable[[str], bool] | None = None) -> None:
        """The user's id and its samples' ids (``id#0``, ``id#1``, ... when ``n > 1``) must not
        name a request or a sample in flight: two states under one id would mix their outputs
        and leave one caller waiting forever. ``also_in_use``: ids the core holds besides."""

        def in_use(rid: str) -> bool:
            return self.in_use(rid) or (also_in_use is not None and also_in_use(rid))

        if in_use(request_id):
            raise ValueError(f"request_id {request_id!r} is already in use")
        child_ids = sample_ids(request_id, n)
        clash = next((cid for cid in child_ids if cid != request_id and in_use(cid)), None)
        if clash is not None:
            raise ValueError(
                f"request_id {request_id!r} names its {len(child_ids)} samples {child_ids[0]!r}..."
                f"{child_ids[-1]!r}, but {clash!r} is already in use"
            )

    def sample_ids(self, request_ids: Iterable[str]) -> list[str]:
        """The unfinished samples of these user requests (a sample's own id names itself)."""
        out = []
        for rid in request_ids:
            family = self.families.get(rid)
            if family is not None:
                out.extend(c.request_id for c in family.children if not c.finished)
            elif rid in self.children and not self.children[rid].finished:
                out.append(rid)
        return out

    # --- deltas from the core --------------------------------------------------------------
    def process(self, deltas: Iterable[RequestDelta], timestamp: float | None = None) -> ProcessedOutputs:
        """One message's deltas (``EngineCoreOutputs.deltas``); ``timestamp``: the core's clock
        when their step ended (``EngineCoreOutputs.timestamp``)."""
        result = ProcessedOutputs()
        touched: dict[str, _Family] = {}
        now = self.clock()  # when these tokens reached this process
        step_time = timestamp if timestamp is not None else now
        for d in deltas:
            state = self.children.get(d.request_id)
            if state is None or state.finished:  # aborted, or stopped here: the core had not heard yet
                continue
            family = state.family
            touched[family.request_id] = family
            if state.index == 0:
                family.num_cached_tokens = d.num_cached_tokens
            if d.prompt_logprobs is not None:
                first, entries = d.prompt_logprobs
                got = family.prompt_logprobs = family.prompt_logprobs or []
                got[first : first + len(entries)] = [None if e is None else self._position(e) for e in entries]
            if d.new_token_ids:
                family_id = family.request_id
                if family_id not in result.new_tokens:  # the family's tokens of this batch
                    self._delivered(family, now, step_time, result)
                stop = self._append(state, d)
                result.new_tokens[family_id] = result.new_tokens.get(family_id, 0) + len(d.new_token_ids)
                if stop is not None:
                    state.stop_reason = stop
                    self._end(state, "stop", result, step_time)
                    if d.finish_reason is None:  # the core goes on with it until told
                        result.stopped.append(state.request_id)
                    continue
            if d.finish_reason is not None:
                state.stop_reason, state.error = d.stop_reason, d.error
                if state.index == 0 and d.metrics is not None:
                    family.metrics, family.own_metrics = d.metrics, False
                self._end(state, d.finish_reason, result, step_time)
        result.outputs = self._outputs(touched.values())
        return result

    def _append(self, state: _ChildState, d: RequestDelta) -> str | None:
        """The delta's tokens (and their log-probabilities) join the sample; its text grows.
        Returns the stop string its text now contains, if any (later tokens are dropped)."""
        state.changed = True
        new = d.new_token_ids
        if d.new_logprobs is not None and state.logprobs is not None:
            for entry in d.new_logprobs:
                state.logprobs.append(self._position(entry))
                state.cumulative_logprob += entry.logprob
        detok = state.detokenizer
        if detok is None:
            state.token_ids.extend(new)
            state.num_tokens += len(new)
            return None
        for i, token in enumerate(new):
            state.token_ids.append(token)
            state.num_tokens += 1
            stop = detok.add_tokens([token])
            if stop is not None:
                if state.logprobs is not None and i + 1 < len(new):  # drop what followed the stop
                    del state.logprobs[len(state.logprobs) - (len(new) - i - 1) :]
                return stop
        return None

    @staticmethod
    def _delivered(family: _Family, now: float, step_time: float, result: ProcessedOutputs) -> None:
        """A family's tokens reached this process at ``now``, from a step that ended at
        ``step_time`` (the core's clock)."""
        if family.delivered_at is None:
            result.first_token_latency[family.request_id] = now - family.metrics.arrival_time
            if family.own_metrics and family.metrics.first_token_time is None:
                family.metrics.first_token_time = step_time
        else:
            result.inter_token_latency[family.request_id] = now - family.delivered_at
        family.delivered_at = now

    def _end(self, state: _ChildState, reason: str, result: ProcessedOutputs, when: float | None = None) -> None:
        """``state`` ends with ``reason``; ``when``: the core's time of the step whose tokens
        ended it (a stop string found here), else this process's clock (an abort from here)."""
        state.finish_reason = reason
        state.changed = True
        family = state.family
        family.num_unfinished -= 1
        result.ended.append((family.request_id, reason))
        if family.own_metrics and family.finished:
            m = family.metrics
            m.finished_time = when if when is not None else self.clock()
            m.num_output_tokens = family.children[0].num_tokens

    def abort(self, request_ids: Iterable[str]) -> tuple[list[RequestOutput], list[tuple[str, str]]]:
        """End these user requests (or single samples, by their ids) here (``finish_reason=
        "abort"`` on every unfinished sample);
        their final outputs, and ``(family id, "abort")`` per sample ended. The caller ends
        them in the core."""
        result = ProcessedOutputs()
        touched = {}
        for rid in request_ids:
            family = self.families.get(rid)
            if family is not None:
                samples = family.children
            elif rid in self.children:  # one sample of a request
                samples = [self.children[rid]]
                family = samples[0].family
            else:
                continue
            for c in samples:
                if not c.finished:
                    self._end(c, "abort", result)
            touched[family.request_id] = family
        return self._outputs(touched.values()), result.ended

    def clear(self) -> list[str]:
        """Forget every request (the core is gone); returns their ids."""
        ids = list(self.families)
        self.families.clear()
        self.children.clear()
        return ids

    # --- building outputs ------------------------------------------------------------------
    def _position(self, entry: Logprobs) -> PositionLogprobs:
        decode = self._decode_one
        pos = {tok: Logprob(lp, rank, decode(tok)) for rank, (tok, lp) in enumerate(entry.top, 1)}
        pos[entry.token_id] = Logprob(entry.logprob, entry.rank, decode(entry.token_id))
        return pos

    def _decode_one(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode([token_id])

    def _completion(self, state: _ChildState, kind: RequestOutputKind) -> CompletionOutput:
        if state.detokenizer is not None:
            piece = state.detokenizer.take(state.finished)
            if piece:
                state.text.append(piece)
        text = "".join(state.text)
        state.changed = False
        if kind is DELTA:  # hand over what is new and keep nothing
            out = CompletionOutput(state.index, text, state.token_ids, state.finish_reason, state.stop_reason,
                                   state.cumulative_logprob, state.logprobs, state.error)
            state.token_ids, state.text = [], []
            if state.logprobs is not None:
                state.logprobs = []
            return out
        if len(state.text) > 1:
            state.text = [text]
        logprobs = list(state.logprobs) if state.logprobs is not None else None
        return CompletionOutput(state.index, text, list(state.token_ids), state.finish_reason,
                                state.stop_reason, state.cumulative_logprob, logprobs, state.error)

    def _outputs(self, families: Iterable[_Family]) -> list[RequestOutput]:
        outputs = []
        for family in families:
            finished = family.finished
            kind = family.kind
            if kind is FINAL_ONLY and not finished:
                for c in family.children:  # keep the text decoded so far; nothing is sent
                    if c.changed and c.detokenizer is not None:
                        piece = c.detokenizer.take(False)
                        if piece:
                            c.text.append(piece)
                        c.changed = False
                continue
            children = family.children if kind is not DELTA else [c for c in family.children if c.changed]
            outputs.append(RequestOutput(
                request_id=family.request_id,
                prompt=family.prompt,
                prompt_token_ids=family.prompt_token_ids,
                outputs=[self._completion(c, kind) for c in children],
                finished=finished,
                num_cached_tokens=family.num_cached_tokens,
                metrics=family.metrics,
                prompt_logprobs=family.prompt_logprobs,
            ))
            if finished:
                self._forget(family)
        return outputs

    def _forget(self, family: _Family) -> None:
        self.families.pop(family.request_id, None)
        for c in family.children:
            self.children.pop(c.request_id, None)
