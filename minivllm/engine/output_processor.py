"""From what a step did to what the user sees: text, stop strings, ``n > 1`` families, logprobs.

The engine core speaks in :class:`~minivllm.request.Request` objects and token ids. The user
asked for one request id with ``n`` completions and wants text. :class:`OutputProcessor` keeps,
for every request the user submitted, one *family* (its ``n`` child requests), and for every
child its incremental detokenizer and its log-probabilities. After each step it

1. appends the step's log-probabilities,
2. detokenizes the new tokens; a child whose text now contains a stop string is ended through
   the core (its blocks are freed at once),
3. builds one :class:`~minivllm.outputs.RequestOutput` per family that changed, and forgets
   families whose children have all finished.

vLLM v1 splits its engine the same way (``vllm/v1/engine/output_processor.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.core.engine_core import EngineCore, StepOutput
from minivllm.core.interfaces import Logprobs
from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.outputs import (
    CompletionOutput,
    Logprob,
    PositionLogprobs,
    RequestMetrics,
    RequestOutput,
)
from minivllm.request import Request, RequestStatus


@dataclass
class _ChildState:
    request: Request
    index: int
    family: _Family
    detokenizer: IncrementalDetokenizer | None
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    error: str | None = None


@dataclass
class _Family:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[_ChildState] = field(default_factory=list)
    prompt_logprobs: list[PositionLogprobs | None] | None = None

    @property
    def finished(self) -> bool:
        return all(c.request.is_finished for c in self.children)


class OutputProcessor:
    def __init__(self, core: EngineCore, tokenizer=None):
        self.core = core
        self.tokenizer = tokenizer  # None: no text, token ids only (skip_tokenizer_init)
        self.families: dict[str, _Family] = {}
        self.children: dict[str, _ChildState] = {}

    def __len__(self) -> int:
        """Families (user requests) not finished yet."""
        return len(self.families)

    def add_request(self, request_id: str, prompt: str | None, children: list[Request]) -> None:
        first = children[0]
        family = _Family(request_id, prompt, first.prompt_token_ids)
        for i, child in enumerate(children):
            params = child.sampling_params
            detok = (
                IncrementalDetokenizer(self.tokenizer, first.prompt_token_ids, params)
                if self.tokenizer is not None else None
            )
            state = _ChildState(child, i, family, detok)
            if params.logprobs is not None:
                state.logprobs, state.cumulative_logprob = [], 0.0
            family.children.append(state)
            self.children[child.request_id] = state
        self.families[request_id] = family

    # --- after a step ----------------------------------------------------------------------
    def process(self, step_out: StepOutput) -> list[RequestOutput]:
        touched: dict[str, _Family] = {}
        for rid, (first, entries) in step_out.prompt_logprobs.items():
            state = self.children.get(rid)
            if state is not None:  # placed by position: a preempted request recomputes its prompt
                family = state.family
                got = family.prompt_logprobs = family.prompt_logprobs or []
                got[first : first + len(entries)] = [None if e is None else self._position(e) for e in entries]
        for rid, entry in step_out.logprobs.items():
            state = self.children.get(rid)
            if state is not None and state.logprobs is not None and rid in step_out.sampled:
                state.logprobs.append(self._position(entry))
                state.cumulative_logprob += entry.logprob
        stopped = []
        for rid, token in step_out.sampled.items():
            state = self.children.get(rid)
            if state is None:
                continue
            touched[state.family.request_id] = state.family
            if state.detokenizer is None:
                continue
            stop = state.detokenizer.add_tokens([token])
            if stop is not None and not state.request.is_finished:
                state.request.stop_reason = stop
                stopped.append(rid)
        if stopped:
            self.core.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        for req in step_out.finished:
            state = self.children.get(req.request_id)
            if state is not None:
                state.error = step_out.failed.get(req.request_id)
                touched[state.family.request_id] = state.family
        return self._outputs(touched.values())

    def finished_outputs(self, requests: list[Request]) -> list[RequestOutput]:
        """Outputs for requests the core ended outside a step (an abort)."""
        touched = {}
        for req in requests:
            state = self.children.get(req.request_id)
            if state is not None:
                touched[state.family.request_id] = state.family
        return self._outputs(touched.values())

    def forget_finished(self) -> None:
        """Drop the families whose children have all ended without an output reaching the
        user (a step interrupted by ``KeyboardInterrupt`` ends its requests, then re-raises)."""
        for family in [f for f in self.families.values() if f.finished]:
            self._forget(family)

    def family_child_ids(self, request_id: str) -> list[str]:
        """The core-level request ids of a user request (itself when ``n == 1``)."""
        family = self.families.get(request_id)
        if family is None:
            return [request_id] if request_id in self.children else []
        return [c.request.request_id for c in family.children]

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

    def _completion(self, state: _ChildState) -> CompletionOutput:
        req = state.request
        finished = req.is_finished
        text = state.detokenizer.visible_text(finished) if state.detokenizer is not None else ""
        return CompletionOutput(
            index=state.index,
            text=text,
            token_ids=req.output_token_ids,
            finish_reason=req.status.finish_reason,
            stop_reason=req.stop_reason,
            cumulative_logprob=state.cumulative_logprob,
            logprobs=list(state.logprobs) if state.logprobs is not None else None,
            error=state.error,
        )

    def _outputs(self, families) -> list[RequestOutput]:
        outputs = []
        for family in families:
            first = family.children[0].request
            out = RequestOutput(
                request_id=family.request_id,
                prompt=family.prompt,
                prompt_token_ids=family.prompt_token_ids,
                outputs=[self._completion(c) for c in family.children],
                finished=family.finished,
                num_cached_tokens=first.num_cached_tokens,
                metrics=RequestMetrics.from_request(first),  # the first sample's times, as of now
                prompt_logprobs=family.prompt_logprobs,
            )
            outputs.append(out)
            if out.finished:
                self._forget(family)
        return outputs

    def _forget(self, family: _Family) -> None:
        self.families.pop(family.request_id, None)
        for c in family.children:
            self.children.pop(c.request.request_id, None)
