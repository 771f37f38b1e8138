"""How one request wants its tokens chosen and when it should stop (vLLM's ``SamplingParams``).

Everything is validated when the object is built, over the whole range of each field's type,
with an error that names the field, the value and the limit: a bad value must never reach the
engine's step, where it would fail a whole batch. Integers that reach a tensor must fit in
int64, floats must survive float32 (the sampler's dtype), lists are bounded. What depends on
the model (the vocabulary) is checked by ``InputProcessor.check_params``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes 64-bit seeds
INT64_MAX = 2**63 - 1  # integers that become tensors (top_k, logprobs, token ids) must fit
FLOAT32_MAX = 3.4028234663852886e38  # a temperature above it is inf in the sampler's float32
# Below this a temperature is greedy, as in vLLM (its _SAMPLING_EPS): the logits divided by it
# would overflow float32 (1e-40 even rounds to 0, and the division gave inf everywhere).
GREEDY_TEMPERATURE = 1e-5
# One request's samples are that many requests in the engine (and detokenizers, and outputs).
MAX_N = 4096
# Every stop string is searched for in the new text of every step.
MAX_STOP_STRINGS = 64
_REPR_CHARS = 60  # how much of a bad value an error message quotes


def short_repr(value, limit: int = _REPR_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error message must stay short whatever
    the client sent (the repr of a 1 MB prompt is a 1 MB message). Long containers are not
    even fully repr'd."""
    if isinstance(value, (list, tuple, dict, set)) and len(value) > limit:
        return f"<{type(value).__name__} of {len(value)} items>"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} characters)"


def is_valid_unicode(text: str) -> bool:
    """False for text with lone surrogates (JSON's ``"\\ud800"``), which UTF-8 cannot encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_int(name: str, value, minimum: int, maximum: int | None = None) -> None:
    """An int in ``[minimum, maximum]``; without ``maximum``, at most ``INT64_MAX``."""
    if not _is_int(value):
        raise TypeError(f"{name} must be an integer, got {name}={short_repr(value)} ({type(value).__name__})")
    if minimum <= value <= (INT64_MAX if maximum is None else maximum):
        return
    if maximum is not None:
        raise ValueError(f"{name} must be in [{minimum}, {maximum}], got {name}={short_repr(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={short_repr(value)}")
    raise ValueError(f"{name} must be at most {INT64_MAX} (int64's largest), got {name}={short_repr(value)}")


def _require_real(name: str, value) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {name}={short_repr(value)} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {name}={value}")
    return float(value)


def _require_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {name}={short_repr(value)} ({type(value).__name__})")


@dataclass
class SamplingParams:
    """Per-request sampling settings. ``temperature=0`` (or below ``GREEDY_TEMPERATURE``)
    means greedy (argmax).

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
            raise TypeError(f"stop must be a string or a list of strings, got stop={short_repr(self.stop)}")
        self.stop = list(self.stop or [])
        if self.stop_token_ids is not None and not isinstance(self.stop_token_ids, (list, tuple)):
            raise TypeError(
                f"stop_token_ids must be a list of token ids, got stop_token_ids={short_repr(self.stop_token_ids)}"
            )
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k is None or (_is_int(self.top_k) and self.top_k < 0):
            self.top_k = 0
        self._validate()

    def _validate(self) -> None:
        _require_int("n", self.n, 1, MAX_N)
        self.temperature = _require_real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got temperature={self.temperature}")
        if self.temperature > FLOAT32_MAX:
            raise ValueError(
                f"temperature must be at most {FLOAT32_MAX:.8g} (float32's largest), got "
                f"temperature={self.temperature}"
            )
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
        self._validate_stops()
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            _require_bool(name, getattr(self, name))
        if self.seed is not None:
            _require_int("seed", self.seed, 0, MAX_SEED)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _require_int(name, getattr(self, name), 0)

    def _validate_stops(self) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop may have at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}")
        for i, s in enumerate(self.stop):
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got stop[{i}]={short_repr(s)}")
            if not is_valid_unicode(s):
                raise ValueError(f"stop string {i} is not valid Unicode (it has a lone surrogate): {short_repr(s)}")
        for i, t in enumerate(self.stop_token_ids):
            _require_int(f"stop_token_ids[{i}]", t, 0)

    @property
    def greedy(self) -> bool:
        """Argmax sampling: temperature 0, or so small that dividing by it would overflow."""
        return self.temperature < GREEDY_TEMPERATURE

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
