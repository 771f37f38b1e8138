"""``speculative_config``: which drafts to propose, and how many per step. Pure Python, no torch.

The engine argument takes a dict (or its JSON text, as ``minivllm serve --speculative-config``
passes it), with vLLM's keys::

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    {"method": "draft_model", "model": "<checkpoint dir>", "num_speculative_tokens": 4}

``method`` may be left out when ``model`` is given (a draft model is then meant). Every value is
checked here, when the engine is built, with an error that names it and its limit.

``verifier`` (in Python only, not vLLM's) replaces minivllm's rejection rule: a function with
the signature of :func:`minivllm.spec_decode.rejection.verify`, called on every step's tensors
-- the plug-in point exercise 11 fills (``minivllm.course.verifier.with_verifier``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 32  # more drafts than this are almost never all accepted
_KEYS = ("method", "num_speculative_tokens", "model", "prompt_lookup_max", "prompt_lookup_min",
         "disable_by_batch_size", "verifier")
# "auto" on a CPU, per method: above this many requests in a step, drafting costs more than it
# saves (benchmarks/spec_decode.py --requests N on the tiny model, greedy, k = 4, 64 tokens;
# docs/benchmarks.md). The draft model: 1.24x at 4 requests, 1.09x at 8, 0.93x at 16, 0.85x at 32.
# N-gram lookup on new stories: drafts rarely kept, 0.88x with a limit of 32 where 8 gave 1.13x.
CPU_DISABLE_BY_BATCH_SIZE = {"draft_model": 8, "ngram": 8}


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"speculative_config[{name!r}] must be an integer, got {value!r} ({type(value).__name__})")
    if not low <= value <= high:
        raise ValueError(f"speculative_config[{name!r}] must be in [{low}, {high}], got {value}")


@dataclass(frozen=True)
class SpeculativeConfig:
    """``method``: ``"ngram"`` (prompt lookup: copy what followed the last n tokens the previous
    time they occurred) or ``"draft_model"`` (a smaller model with the same tokenizer);
    ``num_speculative_tokens``: drafts proposed per request per step (k); ``model``: the draft
    model's checkpoint directory; ``prompt_lookup_max`` / ``prompt_lookup_min``: the longest and
    shortest n-gram the lookup tries, longest first; ``disable_by_batch_size``: a step with more
    requests than this proposes no drafts (the next step decodes plainly), as vLLM's option of
    that name; ``None`` never stops; ``"auto"`` (the default) is
    :data:`CPU_DISABLE_BY_BATCH_SIZE` for the method on a CPU and no limit on a GPU, where a verification step
    stays cheap up to a far larger batch (not measured here); ``verifier``: the rejection rule
    (``None``: minivllm's, :func:`~minivllm.spec_decode.rejection.verify`, with its greedy
    shortcut)."""

    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    disable_by_batch_size: int | str | None = "auto"
    verifier: Callable | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative_config['method'] must be one of {METHODS}, got {self.method!r}")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        if self.method == "draft_model":
            if not isinstance(self.model, str) or not self.model:
                raise ValueError("speculative_config with method 'draft_model' needs 'model': a checkpoint directory")
        elif self.model is not None:
            raise ValueError(f"speculative_config['model'] is only for method 'draft_model', not {self.method!r}")
        _check_int("prompt_lookup_max", self.prompt_lookup_max, 1, 64)
        _check_int("prompt_lookup_min", self.prompt_lookup_min, 1, self.prompt_lookup_max)
        if self.disable_by_batch_size not in ("auto", None):
            _check_int("disable_by_batch_size", self.disable_by_batch_size, 1, 1 << 20)
        if self.verifier is not None and not callable(self.verifier):
            raise TypeError(f"speculative_config['verifier'] must be callable (the signature of "
                            f"minivllm.spec_decode.rejection.verify), got {type(self.verifier).__name__}")

    def batch_limit(self, device_type: str) -> int | None:
        """The most requests a step may have and still propose drafts; ``None``: no limit."""
        if self.disable_by_batch_size == "auto":
            return CPU_DISABLE_BY_BATCH_SIZE[self.method] if device_type == "cpu" else None
        return self.disable_by_batch_size

    @property
    def num_lookahead_tokens(self) -> int:
        """Slots past the verified tokens that a step must also reserve: a draft model writes
        its own K/V for the drafts it proposes for the *next* step (positions up to k - 1 past
        the last token), in the same blocks; n-gram lookup writes nothing."""
        return self.num_speculative_tokens if self.method == "draft_model" else 0

    def num_drafts(self, length_limit: int, max_model_len: int, num_tokens: int) -> int:
        """Drafts worth proposing for a request that will have ``num_tokens`` tokens: ``k``, cut
        so that the next step (the drafts and the token after them) stays within the request's
        ``length_limit`` and ``max_model_len``."""
        room = min(length_limit, max_model_len) - num_tokens - 1
        return max(0, min(self.num_speculative_tokens, room))

    @classmethod
    def parse(cls, value: Any) -> SpeculativeConfig | None:
        """``None``, a :class:`SpeculativeConfig`, a dict or its JSON text -> a checked config."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(f"speculative_config is not valid JSON: {err}; got {value!r}") from None
        if not isinstance(value, dict):
            raise TypeError(
                f"speculative_config must be a dict such as {{'method': 'ngram', 'num_speculative_tokens': 4}}, "
                f"got {value!r} ({type(value).__name__})"
            )
        unknown = sorted(set(value) - set(_KEYS))
        if unknown:
            raise ValueError(f"unknown speculative_config key(s) {unknown}; valid: {list(_KEYS)}")
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative_config needs 'num_speculative_tokens' (drafts per step, e.g. 4)")
        kwargs = dict(value)
        if "method" not in kwargs:
            kwargs["method"] = "draft_model" if kwargs.get("model") is not None else "ngram"
        return cls(**kwargs)
