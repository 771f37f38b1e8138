"""``LLM``: the offline front end, shaped like ``vllm.LLM``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tqdm.auto import tqdm

from minivllm.engine.beam_search import BeamSearchOutput, run_beam_search
from minivllm.engine.llm_engine import LLMEngine
from minivllm.metrics import EngineStats
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import BeamSearchParams, SamplingParams

Prompt = str | Sequence[int]


class LLM:
    """``LLM()`` loads the shipped tiny model; ``LLM("path/or/hub-name", **engine_args)`` any
    supported checkpoint. See :class:`minivllm.config.EngineArgs` for the engine arguments."""

    def __init__(self, model: str | None = None, **engine_args):
        self.engine = LLMEngine(model, **engine_args)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def _add_all(self, prompts, sampling_params, priority) -> list[str]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        prios = priority if isinstance(priority, list) else [priority or 0] * len(prompts)
        if len(params) != len(prompts) or len(prios) != len(prompts):
            raise ValueError(
                f"got {len(prompts)} prompts but {len(params)} sampling params and {len(prios)} priorities"
            )
        # Tokenize and validate everything first, so a bad prompt queues nothing.
        tokenized = []
        for p, sp in zip(prompts, params, strict=True):
            if sp is not None and not isinstance(sp, SamplingParams):
                raise TypeError(f"sampling_params must be SamplingParams, got {type(sp).__name__}")
            text, ids = self.engine.tokenize(p)
            self.engine.check_prompt(ids)
            tokenized.append({"prompt": text, "prompt_token_ids": ids})
        return [
            self.engine.add_request(None, p, sp, priority=pr)
            for p, sp, pr in zip(tokenized, params, prios, strict=True)
        ]

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: int | list[int] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order."""
        ids = self._add_all(prompts, sampling_params, priority)
        wanted = set(ids)
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="generate", disable=not use_tqdm, dynamic_ncols=True)
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished and out.request_id in wanted:
                        done[out.request_id] = out
                        bar.update(1)
        finally:
            bar.close()
        return [done[i] for i in ids]

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        delta: bool = True,
        priority: int | list[int] | None = None,
    ) -> Iterator[RequestOutput]:
        """Yield outputs as tokens arrive. With ``delta=True`` each yielded completion holds only
        the new text and token ids since the previous yield for that request."""
        self._add_all(prompts, sampling_params, priority)
        sent_text: dict[tuple[str, int], int] = {}
        sent_ids: dict[tuple[str, int], int] = {}
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if not delta:
                    yield out
                    continue
                pieces = []
                for c in out.outputs:
                    key = (out.request_id, c.index)
                    t0, i0 = sent_text.get(key, 0), sent_ids.get(key, 0)
                    sent_text[key], sent_ids[key] = len(c.text), len(c.token_ids)
                    pieces.append(
                        CompletionOutput(c.index, c.text[t0:], c.token_ids[i0:], c.finish_reason, c.stop_reason)
                    )
                yield RequestOutput(
                    out.request_id, out.prompt, out.prompt_token_ids, pieces, out.finished,
                    out.num_cached_tokens, out.metrics,
                )

    def beam_search(
        self, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams
    ) -> list[BeamSearchOutput]:
        """Beam search for each prompt; ``outputs[i].sequences[0]`` is the best sequence.
        Beams share KV blocks and fork copy-on-write (see ``minivllm/engine/beam_search.py``)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return run_beam_search(self.engine, list(prompts), params)

    def stats(self) -> EngineStats:
        """Per-step and per-request metrics collected so far (for plots and tables)."""
        return self.engine.get_stats()
