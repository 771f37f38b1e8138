"""``LLM``: the offline front end, shaped like ``vllm.LLM``.

One engine, any number of callers: every ``generate`` / ``stream`` call gets exactly its own
outputs. Whoever needs progress runs an engine step (under a lock, so two threads never step at
once) and the step's outputs are routed to the call that owns each request; the other calls'
requests advance in the same batch and their outputs wait in their own inboxes. A call that
ends early (a closed stream, an exception, Ctrl-C) aborts what it still had running, so its
blocks are freed and nothing is left for the next call to finish.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence

from tqdm.auto import tqdm

from minivllm.core.beam_search import BeamSearchOutput
from minivllm.engine.llm_engine import LLMEngine
from minivllm.metrics import EngineStats
from minivllm.outputs import RequestOutput, RequestOutputKind
from minivllm.sampling_params import BeamSearchParams, SamplingParams

Prompt = str | Sequence[int] | dict


class LLM:
    """``LLM()`` loads the shipped tiny model; ``LLM("path/or/hub-name", **engine_args)`` any
    supported checkpoint. See :class:`minivllm.config.EngineArgs` for the engine arguments.
    Safe to share between threads: concurrent calls are batched together."""

    def __init__(self, model: str | None = None, **engine_args):
        self.engine = LLMEngine(model, **engine_args)
        self._lock = threading.RLock()
        self._inboxes: dict[str, deque[RequestOutput]] = {}  # request id -> undelivered outputs

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    # --- submitting -------------------------------------------------------------------------
    @staticmethod
    def _as_list(prompts) -> list:
        single = isinstance(prompts, (str, dict)) or (
            isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)
        )
        if single:
            return [prompts]
        if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, Sequence):
            raise TypeError(
                f"prompts must be a str, a list of token ids, or a list of those, got {type(prompts).__name__}"
            )
        return list(prompts)

    def _add_all(self, prompts, sampling_params, priority, kind: RequestOutputKind) -> list[str]:
        """Validate every prompt and its settings, then queue them all (or none)."""
        prompts = self._as_list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        prios = priority if isinstance(priority, list) else [priority or 0] * len(prompts)
        if len(params) != len(prompts) or len(prios) != len(prompts):
            raise ValueError(
                f"got {len(prompts)} prompts but {len(params)} sampling params and {len(prios)} priorities"
            )
        engine = self.engine
        processor = engine.input_processor
        checked = [processor.process(p, sp, priority=pr, output_kind=kind)
                   for p, sp, pr in zip(prompts, params, prios, strict=True)]
        with self._lock:
            ids = []
            try:
                for inputs in checked:  # queued as checked: nothing is checked twice
                    rid = engine.add_request(None, inputs)
                    self._inboxes[rid] = deque()
                    ids.append(rid)
            except BaseException:
                self._abandon(ids)
                raise
        return ids

    # --- running ------------------------------------------------------------------------------
    def _step(self) -> None:
        """One engine step; route its outputs to the calls that own them. Hold the lock."""
        for out in self.engine.step():
            box = self._inboxes.get(out.request_id)
            if box is not None:
                box.append(out)

    def _take(self, ids) -> list[RequestOutput]:
        """Step until one of ``ids`` has an output waiting, then return all of theirs."""
        with self._lock:
            while True:
                got = [out for rid in ids for out in _drain(self._inboxes.get(rid))]
                if got:
                    return got
                if not self.engine.has_unfinished_requests():
                    raise RuntimeError(f"requests {sorted(ids)[:5]} vanished from the engine")
                self._step()

    def _abandon(self, ids) -> None:
        """Abort what is still running of ``ids`` and drop their inboxes."""
        with self._lock:
            self.engine.abort_request(list(ids))
            for rid in ids:
                self._inboxes.pop(rid, None)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: int | list[int] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order. A request that
        failed ends with ``finish_reason="error"`` and the message in ``outputs[i].error``."""
        ids = self._add_all(prompts, sampling_params, priority, RequestOutputKind.FINAL_ONLY)
        done: dict[str, RequestOutput] = {}
        waiting = set(ids)
        bar = tqdm(total=len(ids), desc="generate", disable=not use_tqdm, dynamic_ncols=True)
        try:
            while waiting:
                for out in self._take(waiting):
                    if out.finished:
                        done[out.request_id] = out
                        waiting.discard(out.request_id)
                        bar.update(1)
        finally:
            bar.close()
            self._abandon(waiting)
            for rid in ids:
                self._inboxes.pop(rid, None)
        return [done[i] for i in ids]

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        delta: bool = True,
        priority: int | list[int] | None = None,
    ) -> Iterator[RequestOutput]:
        """Yield outputs as tokens arrive. With ``delta=True`` each yielded completion holds only
        the new text and token ids since the previous yield for that request. The requests are
        queued when iteration starts; closing the iterator early (``break``) aborts the ones it
        was still streaming. ``delta=False``: each output holds everything so far."""
        kind = RequestOutputKind.DELTA if delta else RequestOutputKind.CUMULATIVE
        ids = self._add_all(prompts, sampling_params, priority, kind)
        waiting = set(ids)
        try:
            while waiting:
                for out in self._take(waiting):
                    if out.finished:
                        waiting.discard(out.request_id)
                    yield out
        finally:
            self._abandon(waiting)
            for rid in ids:
                self._inboxes.pop(rid, None)

    def abort(self, request_ids: str | Sequence[str]) -> list[RequestOutput]:
        """End requests now; their calls receive a final output with ``finish_reason="abort"``
        (which is also returned)."""
        with self._lock:
            outs = self.engine.abort_request(request_ids)
            for out in outs:
                box = self._inboxes.get(out.request_id)
                if box is not None:
                    box.append(out)
            return outs

    def beam_search(
        self, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams
    ) -> list[BeamSearchOutput]:
        """Beam search for each prompt; ``outputs[i].sequences[0]`` is the best sequence.
        Beams share KV blocks and fork copy-on-write (see ``minivllm/core/beam_search.py``). It
        runs where the engine core runs (this process or the core's own), and needs an idle
        engine (no other call running)."""
        prompts = self._as_list(prompts)
        with self._lock:
            return self.engine.beam_search(prompts, params)

    def stats(self) -> EngineStats:
        """Per-step and per-request metrics collected so far (for plots and tables)."""
        return self.engine.get_stats()

    def reset_stats(self) -> None:
        """Start the statistics afresh (e.g. after a warm-up run)."""
        self.engine.reset_stats()

    def shutdown(self) -> None:
        """Stop the engine core (``engine_core_process=True``: its process ends). Also done
        when the ``LLM`` is garbage-collected or the interpreter exits."""
        with self._lock:
            self.engine.shutdown()


def _drain(box: deque | None) -> list[RequestOutput]:
    if not box:
        return []
    items = list(box)
    box.clear()
    return items
