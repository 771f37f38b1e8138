"""How one request wants its tokens chosen and when it should stop (vLLM's ``SamplingParams``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """Per-request sampling settings. ``temperature=0`` means greedy (argmax).

    ``top_k <= 0`` and ``top_p == 1`` disable those filters. ``stop`` strings end the text
    *before* the stop string; ``stop_token_ids`` and the model's EOS end it after the token
    (EOS is ignored when ``ignore_eos``). ``min_tokens`` forbids EOS/stop tokens until that many
    tokens exist. ``seed`` gives the request its own random generator, so its samples do not
    depend on what else is in the batch.
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
    logprobs: None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k is None or self.top_k < 0:
            self.top_k = 0
        self._validate()

    def _validate(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got n={self.n!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got temperature={self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got top_p={self.top_p}")
        if not isinstance(self.top_k, int):
            raise ValueError(f"top_k must be an integer (0 disables it), got top_k={self.top_k!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got max_tokens={self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got min_tokens={self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens={self.min_tokens} must not exceed max_tokens={self.max_tokens}"
            )
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got stop={self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class BeamSearchParams:
    """Beam search settings (``LLM.beam_search``): keep the ``beam_width`` best sequences by
    cumulative log-probability; finished beams are ranked by ``logprob / len ** length_penalty``."""

    beam_width: int
    max_tokens: int
    length_penalty: float = 1.0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be >= 1, got beam_width={self.beam_width}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got max_tokens={self.max_tokens}")
