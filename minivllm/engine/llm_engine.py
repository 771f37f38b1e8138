"""``LLMEngine``: the front end (tokenizer, input and output processing) over an engine core.

    add_request  -> InputProcessor: validate everything, tokenize; then the core queues it
                    (nothing is queued if anything is wrong)
    step()       -> the core's next step: EngineCoreOutputs (per sample, its new token ids)
                    OutputProcessor.process()     text, stop strings, n > 1, logprobs
                 -> a RequestOutput for every request that made progress or ended
    abort_request-> the requests end now, their blocks are freed, final outputs returned

The engine core -- scheduler, KV cache, model runner -- runs in this process (the default; its
objects are there to look at: ``local_core(engine)``) or, with ``engine_core_process=True``, in
a process of its own (``minivllm/engine/core_process.py``), where it steps on its own while this
process detokenizes. The front end knows only its :class:`EngineCoreClient`: the two talk
through the messages of ``minivllm/core/messages.py`` either way
(:mod:`minivllm.engine.core_client`), and nothing here depends on where the core runs.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path

from minivllm.config import EngineArgs
from minivllm.core.beam_search import BeamSearchOutput, BeamSequence
from minivllm.core.messages import sample_ids
from minivllm.engine.core_client import EngineCoreClient, InprocCore
from minivllm.engine.input_processor import InputProcessor, ProcessedInputs
from minivllm.engine.output_processor import OutputProcessor
from minivllm.metrics import EngineStats
from minivllm.model.config import ModelConfig
from minivllm.model.loader import load_tokenizer, resolve_model_path
from minivllm.outputs import RequestOutput, RequestOutputKind
from minivllm.request import RequestStatus
from minivllm.sampling_params import BeamSearchParams, SamplingParams


class LLMEngine:
    def __init__(self, model: str | None = None, **engine_args):
        self.args = args = EngineArgs.from_kwargs(**engine_args)
        self.model_path = resolve_model_path(model)
        config = ModelConfig.from_file(self.model_path)  # its errors name the file
        self.tokenizer = self._load_tokenizer()
        self.eos_token_ids = self._eos_ids(config)
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else None
        self.core_client: EngineCoreClient
        if args.engine_core_process:
            from minivllm.engine.core_process import ProcessCore

            self.core_client = ProcessCore(args, self.model_path, self.eos_token_ids, pad)
        else:
            from minivllm.engine.core_builder import build_core

            self.core_client = InprocCore(build_core(args, self.model_path, pad), self.eos_token_ids)
        ready = self.core_client.ready
        self.model_config: ModelConfig = ready.model_config
        self.max_model_len: int = ready.max_model_len
        self.input_processor = InputProcessor(
            self.max_model_len, self.model_config.vocab_size, self.tokenizer, self.eos_token_ids
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    @property
    def device(self) -> str:
        """The device the model computes on (``"cpu"``, ``"cuda:0"``)."""
        return self.core_client.ready.device

    @property
    def stats(self) -> EngineStats:
        """The core's statistics: the live object in this process, a copy from a core process."""
        return self.get_stats()

    @property
    def can_fork(self) -> bool:
        """Whether ``n > 1`` and beam search can share KV blocks (continuous + paged)."""
        return self.core_client.ready.can_fork

    # --- set-up helpers --------------------------------------------------------------------
    def _load_tokenizer(self):
        if self.args.skip_tokenizer_init:
            return None
        path = Path(self.args.tokenizer) if self.args.tokenizer is not None else self.model_path
        try:
            return load_tokenizer(path)
        except Exception as err:  # noqa: BLE001 - say which directory and how to go on
            raise ValueError(
                f"could not load a tokenizer from {path} ({type(err).__name__}: {err}); give "
                "tokenizer=<directory> or skip_tokenizer_init=True to serve token-id prompts"
            ) from err

    def _eos_ids(self, cfg: ModelConfig) -> tuple[int, ...]:
        ids = set(cfg.eos_token_ids)
        gen_cfg = self.model_path / "generation_config.json"
        if gen_cfg.is_file():
            try:
                eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
            except json.JSONDecodeError as err:
                raise ValueError(f"{gen_cfg} is not valid JSON: {err}") from err
            ids.update(eos if isinstance(eos, list) else ([] if eos is None else [eos]))
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return tuple(sorted(ids))

    # --- requests --------------------------------------------------------------------------
    def tokenize(self, prompt) -> tuple[str | None, list[int]]:
        """``(text or None, token ids)``: the engine's :class:`InputProcessor` at work."""
        return self.input_processor.tokenize(prompt)

    def caller_input_processor(self) -> InputProcessor:
        """The same checks with a tokenizer of its own, for a front end that tokenizes on
        another thread than the one that detokenizes (``AsyncLLM``)."""
        tokenizer = None if self.tokenizer is None else self._load_tokenizer()
        return self.input_processor.with_tokenizer(tokenizer)

    def add_request(
        self,
        request_id: str | None,
        prompt,
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE,
    ) -> str:
        """Validate and queue a request; returns its id. Raises before anything is queued.
        ``cache_salt`` (or a prompt dict's ``"cache_salt"``, as in vLLM) keeps this request's
        prefix-cache blocks apart from those of requests with another salt or none.
        ``output_kind``: what each of its outputs holds (see :class:`RequestOutputKind`).
        ``prompt`` may also be what :meth:`InputProcessor.process` returned for it (a batch
        checked before any of it is queued): it is queued as it is, with its own settings."""
        if isinstance(prompt, ProcessedInputs):
            inputs = prompt
        else:
            inputs = self.input_processor.process(prompt, params, priority=priority, arrival_time=arrival_time,
                                                  cache_salt=cache_salt, output_kind=output_kind)
        request_id = self._new_request_id(inputs.params.n) if request_id is None else str(request_id)
        message = self.output_processor.admit(request_id, inputs)
        try:
            self.core_client.add_request(message)
        except BaseException:
            self.output_processor.withdraw(request_id)
            raise
        return request_id

    def beam_search(self, prompts: Sequence, params: BeamSearchParams) -> list[BeamSearchOutput]:
        """Beam search for each prompt, run where the engine core runs (this process or the
        core's own; ``minivllm/core/beam_search.py``). Every prompt is checked first, whole
        search included (:meth:`InputProcessor.check_prompt` with ``max_tokens``); the engine
        must be idle."""
        if not isinstance(params, BeamSearchParams):
            raise TypeError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        checked = []
        for prompt in prompts:
            text, ids = self.input_processor.tokenize(prompt)
            self.input_processor.check_prompt(ids, max_tokens=params.max_tokens)
            checked.append((text, ids))
        if self.has_unfinished_requests():
            raise RuntimeError("beam search needs an idle engine; finish or abort running requests first")
        results = self.core_client.call("beam_search", [ids for _, ids in checked], params,
                                        self.model_config.vocab_size, self.args.max_num_seqs)
        decode = self.tokenizer.decode if self.tokenizer is not None else (lambda ids, **_: "")
        return [
            BeamSearchOutput(text, ids, [
                BeamSequence(s.token_ids, s.cum_logprob, s.score, decode(s.token_ids, skip_special_tokens=True),
                             s.finished_by_eos)
                for s in result.sequences
            ], result.error)
            for (text, ids), result in zip(checked, results, strict=True)
        ]

    def _new_request_id(self, n: int) -> str:
        op = self.output_processor
        while True:  # skip the ids callers chose themselves
            request_id = str(next(self._ids))
            if not any(op.in_use(r) for r in {request_id, *sample_ids(request_id, n)}):
                return request_id

    def abort_request(self, request_ids: str | Sequence[str]) -> list[RequestOutput]:
        """End requests now (``finish_reason="abort"``), free their blocks, and return their
        final outputs. Unknown or already finished ids are ignored."""
        ids = [request_ids] if isinstance(request_ids, str) else [str(r) for r in request_ids]
        samples = self.output_processor.sample_ids(ids)
        outputs, _ = self.output_processor.abort(ids)
        self.core_client.finish_requests(samples, RequestStatus.FINISHED_ABORTED)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return len(self.output_processor) > 0

    def get_num_unfinished_requests(self) -> int:
        """User requests (an ``n > 1`` request counts once) not finished yet."""
        return len(self.output_processor)

    # --- the loop --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine step; a :class:`RequestOutput` for every request that got a token or
        ended (a request that failed ends with ``finish_reason="error"``). With the core in
        its own process: the outputs of the core's next step (it steps on its own)."""
        try:
            core_out = self.core_client.step()
        except BaseException:  # Ctrl-C: the core ended the step's requests; forget them here too
            self._forget_ended_in_core()
            raise
        done = self.output_processor.process(core_out.deltas, core_out.timestamp)
        if done.stopped:
            self.core_client.finish_requests(done.stopped, RequestStatus.FINISHED_STOPPED)
        return done.outputs

    def _forget_ended_in_core(self) -> None:
        """A step interrupted by ``KeyboardInterrupt`` ended its requests in the core, then
        re-raised: end them here as well, without an output reaching the user (the core says
        which samples it still holds)."""
        try:
            live = set(self.core_client.call("request_ids"))
        except Exception:  # noqa: BLE001 - the core cannot answer: nothing is left to follow
            live = set()
        gone = [rid for rid, fam in self.output_processor.families.items()
                if not any(c.request_id in live for c in fam.children)]
        self.output_processor.abort(gone)

    def check_invariants(self) -> None:
        self.core_client.call("check_invariants")

    def get_stats(self) -> EngineStats:
        return self.core_client.call("get_stats")

    def reset_stats(self) -> None:
        """Start the statistics afresh (e.g. after a warm-up run)."""
        self.core_client.call("reset_stats")

    def set_stats_window(self, window: int | None) -> None:
        """Keep at most about ``window`` steps (and finished requests) in detail (a server)."""
        self.core_client.call("set_stats_window", window)

    def shutdown(self) -> None:
        """Stop the engine core (with its own process: end that process)."""
        self.core_client.shutdown()
