"""``InputProcessor``: the one place where a request's inputs are tokenized and checked.

Everything a caller hands the engine -- the prompt (text, token ids or a prompt dict), its
``SamplingParams``, a priority, an arrival time, a cache salt -- is turned into token ids and
checked here, against what this engine can serve (``max_model_len``, the vocabulary, whether it
has a tokenizer), with an error that names the value and the limit and stays short whatever the
client sent (``short_repr``). It is the one owner of every request rule: ``LLMEngine.add_request``,
``LLM.generate`` (every prompt of a batch before any is queued), ``LLM.beam_search``, ``AsyncLLM``
(on the caller's side, before a request crosses to the engine's thread), the HTTP server (which
maps its errors to 400s naming the field) and the simulator use it, so the rules cannot drift
apart. It also stamps a request's arrival, once, when its inputs are first checked.

Pure Python: the tokenizer is any Hugging Face-style callable (``tokenizer(text).input_ids``). A
Hugging Face tokenizer must not be used by two threads at once, so a front end that tokenizes
outside the engine's thread takes its own copy (:meth:`InputProcessor.with_tokenizer`). vLLM
v1 keeps the same step in ``vllm/v1/engine/processor.py``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

from minivllm.config import check_int
from minivllm.outputs import RequestOutputKind
from minivllm.sampling_params import SamplingParams, is_valid_unicode, short_repr


@dataclass(frozen=True)
class ProcessedInputs:
    """One request's inputs once every check passed: what the engine queues (as it is: a front
    end that checked a batch first hands these to ``LLMEngine.add_request``, checked once)."""

    prompt: str | None  # the prompt's text, if it came as text (or a dict carried it)
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None  # the argument's, else the prompt dict's ``"cache_salt"``
    priority: int = 0
    arrival_time: float = 0.0  # time.perf_counter() when the request arrived (its one stamp)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE


@dataclass(frozen=True)
class InputProcessor:
    """Tokenizes and checks requests for an engine of ``max_model_len`` tokens over a vocabulary
    of ``vocab_size`` ids whose end-of-sequence ids are ``eos_token_ids``; ``tokenizer=None``
    serves token-id prompts only."""

    max_model_len: int
    vocab_size: int
    tokenizer: Any = None
    eos_token_ids: tuple[int, ...] = ()

    def with_tokenizer(self, tokenizer: Any) -> InputProcessor:
        """The same checks with another tokenizer (a copy for another thread)."""
        return dataclasses.replace(self, tokenizer=tokenizer)

    # --- everything at once ----------------------------------------------------------------
    def process(
        self,
        prompt,
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE,
    ) -> ProcessedInputs:
        """Every input checked, the prompt tokenized; ``params=None`` means ``SamplingParams()``.
        ``cache_salt`` (or a prompt dict's ``"cache_salt"``, as in vLLM) keeps the request's
        prefix-cache blocks apart from those of requests with another salt or none;
        ``output_kind`` says what each of its outputs holds; ``arrival_time`` (``time.perf_counter()``
        seconds) is stamped now unless given. Raises ``TypeError`` / ``ValueError``."""
        now = time.perf_counter()
        params = SamplingParams() if params is None else params
        self.check_params(params)
        check_int("priority", priority)
        if not isinstance(output_kind, RequestOutputKind):
            raise TypeError(f"output_kind must be a RequestOutputKind, got {type(output_kind).__name__}")
        if arrival_time is not None and (
            not isinstance(arrival_time, (int, float)) or not math.isfinite(arrival_time)
        ):
            raise ValueError(f"arrival_time must be a finite number of seconds, got {short_repr(arrival_time)}")
        if isinstance(prompt, dict) and cache_salt is None:
            cache_salt = prompt.get("cache_salt")
        self.check_cache_salt(cache_salt)
        text, ids = self.tokenize(prompt)
        self.check_prompt(ids)
        return ProcessedInputs(text, ids, params, cache_salt, priority,
                               now if arrival_time is None else float(arrival_time), output_kind)

    @staticmethod
    def check_cache_salt(cache_salt) -> None:
        """A salt is a non-empty string of valid Unicode, or ``None`` (no salt)."""
        if cache_salt is None:
            return
        if not isinstance(cache_salt, str):
            raise TypeError(f"cache_salt must be a string, got {type(cache_salt).__name__}")
        if not cache_salt or not is_valid_unicode(cache_salt):
            raise ValueError("cache_salt must be a non-empty string of valid Unicode if given "
                             f"(got {short_repr(cache_salt)}); leave it out for no salt")

    # --- the prompt ------------------------------------------------------------------------
    def tokenize(self, prompt) -> tuple[str | None, list[int]]:
        """``(text or None, token ids)`` of a prompt: a string, a list of token ids, or a
        dict ``{"prompt_token_ids": [...]}`` / ``{"prompt": "..."}`` (vLLM's prompt dicts)."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), self._token_ids(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return self.tokenize(prompt["prompt"])
            keys = short_repr(sorted(map(str, prompt)))
            raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got keys {keys}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer (skip_tokenizer_init=True): pass token ids")
            if not is_valid_unicode(prompt):
                raise ValueError("the prompt is not valid Unicode (it has a lone surrogate)")
            return prompt, list(self.tokenizer(prompt).input_ids)
        if isinstance(prompt, (bytes, bytearray)):
            raise TypeError("a prompt must be a str or a list of token ids, not bytes: decode it first")
        if isinstance(prompt, (list, tuple)):
            return None, self._token_ids(prompt)
        raise TypeError(
            f"a prompt must be a str, a list of token ids or a prompt dict, got {type(prompt).__name__}"
        )

    @staticmethod
    def _token_ids(ids) -> list[int]:
        if not isinstance(ids, (list, tuple)):
            raise TypeError(f"prompt_token_ids must be a list of integers, got {type(ids).__name__}")
        bad = next((t for t in ids if not isinstance(t, int) or isinstance(t, bool)), None)
        if bad is not None:
            raise TypeError(f"prompt token ids must be integers, got {short_repr(bad)} ({type(bad).__name__})")
        return list(ids)

    def check_prompt(self, ids: list[int], max_tokens: int | None = None) -> None:
        """``ValueError`` naming the value and the limit for a prompt the engine cannot serve;
        with ``max_tokens`` (beam search, which must fit whole), the prompt and that many more."""
        if not ids:
            raise ValueError("the prompt is empty (0 tokens); a request needs at least 1 prompt token")
        check_prompt_length(len(ids), self.max_model_len)
        if max_tokens is not None and len(ids) + max_tokens > self.max_model_len:
            raise ValueError(
                f"the prompt of {len(ids)} tokens + max_tokens={max_tokens} exceeds "
                f"max_model_len={self.max_model_len}"
            )
        vocab = self.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")

    # --- the sampling parameters -------------------------------------------------------------
    def check_params(self, params: SamplingParams) -> None:
        """What ``SamplingParams`` cannot check alone: the limits of this model (its
        vocabulary) and of this engine (a tokenizer for stop strings)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer (this engine has skip_tokenizer_init=True)")
        vocab = self.vocab_size
        for name in ("top_k", "logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > vocab:
                raise ValueError(f"{name} must be at most {vocab} (the vocabulary size), got {name}={value}")
        stop_ids = params.stop_token_ids
        if len(stop_ids) > vocab:
            raise ValueError(
                f"stop_token_ids has {len(stop_ids)} entries but the vocabulary has {vocab} tokens"
            )
        bad = next((t for t in stop_ids if t >= vocab), None)
        if bad is not None:
            raise ValueError(f"stop_token_ids has {bad}, which is outside the vocabulary [0, {vocab})")
        eos = self.eos_token_ids
        if params.min_tokens and len(stop_ids) >= vocab - len(eos):
            stops = set(stop_ids) | (set() if params.ignore_eos else set(eos))
            if len(stops) >= vocab:
                with_eos = "" if params.ignore_eos else "with EOS, "
                raise ValueError(
                    f"min_tokens={params.min_tokens} cannot be met: {with_eos}stop_token_ids cover all "
                    f"{vocab} tokens, so no token may be generated before min_tokens"
                )


def check_prompt_length(num_tokens: int, max_model_len: int) -> None:
    """The length rule alone (a front end applies it to a list of ids before building anything
    for them): a prompt leaves room for at least one generated token."""
    if num_tokens >= max_model_len:
        raise ValueError(
            f"the prompt has {num_tokens} tokens but max_model_len={max_model_len} "
            f"(a prompt may have at most {max_model_len - 1} tokens, leaving room to generate)"
        )
