"""How one request wants its tokens chosen and when it should stop (vLLM's ``SamplingParams``).

Everything is validated when the object is built, with an error that names the field, the
value and the limit: a bad value must never reach the engine's step, where it would fail a
whole batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes 64-bit seeds


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_int(name: str, value, minimum: int, maximum: int | None = None) -> None:
    if not _is_int(value):
        raise TypeError(f"{name} must be an integer, got {name}={value!r} ({type(value).__name__})")
    if value < minimum or (maximum is not None and value > maximum):
        limit = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {limit}, got {name}={value}")


def _require_real(name: str, value) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {name}={value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {name}={value}")
    return float(value)


def _require_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {name}={value!r} ({type(value).__name__})")


@dataclass
class SamplingParams:
    """Per-request sampling settings. ``temperature=0`` means greedy (argmax).

    ``top_k <= 0`` and ``top_p == 1`` disable those filters. ``stop`` strings end the text
    *before* the stop string; ``stop_token_ids`` and the model's EOS end it after the token
    (EOS is ignored when ``ignore_eos``). ``min_tokens`` forbids EOS/stop tokens until that many
    tokens exist. ``seed`` gives the request its own random generator, so its samples do not
    depend on what else is in the batch. ``logprobs=k`` returns, for every generated token, its
    log-probability and the ``k`` most likely tokens'; ``prompt_logprobs=k`` the same for the
    prompt tokens (computed from the raw model distribution, before temperature and filters,
    as vLLM does).
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and not isinstance(self.stop, (list, tuple)):
            raise TypeError(f"stop must be a string or a list of strings, got stop={self.stop!r}")
        self.stop = list(self.stop or [])
        if self.stop_token_ids is not None and not isinstance(self.stop_token_ids, (list, tuple)):
            raise TypeError(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}")
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k is None or (_is_int(self.top_k) and self.top_k < 0):
            self.top_k = 0
        self._validate()

    def _validate(self) -> None:
        _require_int("n", self.n, 1)
        self.temperature = _require_real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got temperature={self.temperature}")
        self.top_p = _require_real("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got top_p={self.top_p}")
        _require_int("top_k", self.top_k, 0)
        if self.max_tokens is not None:
            _require_int("max_tokens", self.max_tokens, 1)
        _require_int("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens={self.min_tokens} must not exceed max_tokens={self.max_tokens}"
            )
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got stop={self.stop!r}")
        for t in self.stop_token_ids:
            _require_int("each of stop_token_ids", t, 0)
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            _require_bool(name, getattr(self, name))
        if self.seed is not None:
            _require_int("seed", self.seed, 0, MAX_SEED)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _require_int(name, getattr(self, name), 0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def for_sample(self, index: int) -> SamplingParams:
        """The settings of sample ``index`` of ``n``: one sample, seed ``seed + index``."""
        fields = {**self.__dict__, "n": 1}
        if self.seed is not None:
            fields["seed"] = (self.seed + index) % (MAX_SEED + 1)
        return SamplingParams(**fields)


@dataclass
class BeamSearchParams:
    """Beam search settings (``LLM.beam_search``): keep the ``beam_width`` best sequences by
    cumulative log-probability; finished beams are ranked by ``logprob / len ** length_penalty``."""

    beam_width: int
    max_tokens: int
    length_penalty: float = 1.0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _require_int("beam_width", self.beam_width, 1)
        _require_int("max_tokens", self.max_tokens, 1)
        self.length_penalty = _require_real("length_penalty", self.length_penalty)
        _require_bool("ignore_eos", self.ignore_eos)
