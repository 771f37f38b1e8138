"""Seeded request traces: who arrives when, with how long a prompt, wanting how many tokens.

A :class:`Trace` is a list of :class:`TraceItem`. An item stores lengths and seeds, not token
ids; ``item.prompt_token_ids(vocab_size)`` materialises the ids deterministically (the same
seed gives the same ids on every machine), and items that share a system prompt share exactly
the same first ``shared_prefix_len`` ids, so the prefix cache sees real hits. The same trace
runs on the real engine (:func:`run_on_engine`) and on the simulator
(:meth:`minivllm.sim.Simulator.run`); every request is generated with ``ignore_eos=True`` and
``max_tokens = output_len`` at temperature 0, so it produces exactly ``output_len`` tokens.

Workloads (numbers and where they come from):

* **chat** -- ShareGPT-like. Kwon et al., "Efficient Memory Management for Large Language Model
  Serving with PagedAttention" (SOSP 2023, arXiv:2309.06180), Fig. 11 and Sec. 6.1, report for
  their ShareGPT trace a mean of 161.31 input tokens and 337.99 output tokens (Alpaca: 19.31 and
  58.45). We draw both lengths from lognormals whose mean after clipping to [4, 2048] equals
  those means. The published figures give no spread parameter; ``sigma = 1.0`` is our
  assumption (median about 0.6 x mean, a long right tail, ~1 % of outputs at the 2k clip).
* **reasoning** -- chat-like prompts, outputs lognormal with mean 8,000 tokens, sigma 0.8,
  clipped to [256, 30,000]: an assumption shaped after the chapter (sec. 6: thinking chains "up
  to 30k+ tokens"); there is no public length distribution to fit.
* **shared system prompt** -- every request starts with the same ``prefix_len`` tokens (chapter
  sec. 4.4 uses a 2k-token system prompt) followed by a chat-like user turn.
* **long context** -- prompts log-uniform in [8k, 100k] tokens (chapter sec. 1: prompts "up
  to 10^5 tokens"), short chat-like answers.

Arrivals: all at time 0 (``rate=None``: an offline batch) or a Poisson process with ``rate``
requests per second (exponential gaps), as vLLM's serving benchmarks do.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from minivllm.sampling_params import SamplingParams

# Placeholder ids start here: small vocabularies put pad/bos/eos/unk at the lowest ids.
FIRST_TOKEN_ID = 8


# --- length distributions -----------------------------------------------------------------
def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _clipped_lognormal_mean(mu: float, sigma: float, low: float, high: float) -> float:
    """E[min(max(X, low), high)] for X ~ LogNormal(mu, sigma)."""
    a, b = math.log(low), math.log(high)
    inside = math.exp(mu + sigma**2 / 2) * (_phi((b - mu - sigma**2) / sigma) - _phi((a - mu - sigma**2) / sigma))
    return inside + low * _phi((a - mu) / sigma) + high * (1.0 - _phi((b - mu) / sigma))


@dataclass(frozen=True)
class LogNormalLengths:
    """Integer lengths ``round(X)`` with X lognormal, clipped to ``[low, high]``, whose clipped
    mean is ``mean`` (``mu`` is solved for by bisection; ``sigma`` is the log-space spread)."""

    mean: float
    sigma: float
    low: int
    high: int

    def __post_init__(self) -> None:
        if not self.low <= self.mean <= self.high:
            raise ValueError(f"mean {self.mean} outside [{self.low}, {self.high}]")
        if self.sigma <= 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")

    @property
    def mu(self) -> float:
        lo, hi = math.log(self.low) - 10 * self.sigma, math.log(self.high) + 10 * self.sigma
        for _ in range(100):
            mid = (lo + hi) / 2
            if _clipped_lognormal_mean(mid, self.sigma, self.low, self.high) < self.mean:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    @property
    def median(self) -> float:
        return min(max(math.exp(self.mu), self.low), self.high)

    def sample(self, rng: random.Random, n: int) -> list[int]:
        mu = self.mu
        return [min(max(round(rng.lognormvariate(mu, self.sigma)), self.low), self.high) for _ in range(n)]


@dataclass(frozen=True)
class LogUniformLengths:
    low: int
    high: int

    def sample(self, rng: random.Random, n: int) -> list[int]:
        a, b = math.log(self.low), math.log(self.high)
        return [min(max(round(math.exp(rng.uniform(a, b))), self.low), self.high) for _ in range(n)]


# Kwon et al. 2023, Fig. 11: ShareGPT means 161.31 (input) and 337.99 (output) tokens.
SHAREGPT_PROMPT = LogNormalLengths(mean=161.31, sigma=1.0, low=4, high=2048)
SHAREGPT_OUTPUT = LogNormalLengths(mean=337.99, sigma=1.0, low=4, high=2048)
# Assumptions (see the module docstring).
REASONING_OUTPUT = LogNormalLengths(mean=8000.0, sigma=0.8, low=256, high=30000)
LONG_CONTEXT_PROMPT = LogUniformLengths(low=8192, high=100_000)


# --- traces -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TraceItem:
    """One request of a trace. Token ids are produced on demand by :meth:`prompt_token_ids`."""

    request_id: str
    arrival_time: float  # seconds from the start of the trace
    prompt_len: int
    output_len: int
    seed: int  # seeds this request's own prompt tokens
    shared_prefix_len: int = 0  # the first tokens come from prefix_seed instead
    prefix_seed: int = 0
    priority: int = 0  # lower = more important (vLLM's convention)
    kind: str = "chat"

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError(f"{self.request_id}: prompt_len and output_len must be >= 1")
        if not 0 <= self.shared_prefix_len <= self.prompt_len:
            raise ValueError(f"{self.request_id}: shared_prefix_len must be in [0, prompt_len]")

    def prompt_token_ids(self, vocab_size: int, first_id: int = FIRST_TOKEN_ID) -> list[int]:
        """Deterministic placeholder prompt: ``shared_prefix_len`` ids drawn from
        ``prefix_seed`` (identical for every item with that seed), then private ids."""
        first_id = min(first_id, vocab_size - 1)
        pool = range(first_id, vocab_size)
        prefix = random.Random(self.prefix_seed).choices(pool, k=self.shared_prefix_len)
        own = random.Random(self.seed).choices(pool, k=self.prompt_len - self.shared_prefix_len)
        return prefix + own

    def sampling_params(self) -> SamplingParams:
        """Greedy, exactly ``output_len`` tokens: what both engine and simulator run."""
        return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=self.output_len)


@dataclass
class Trace:
    name: str
    items: list[TraceItem]
    description: str = ""
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = [it.request_id for it in self.items]
        if len(set(ids)) != len(ids):
            raise ValueError(f"trace {self.name!r} has duplicate request ids")
        self.items.sort(key=lambda it: it.arrival_time)  # stable

    def __iter__(self) -> Iterator[TraceItem]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    @property
    def prompt_lens(self) -> list[int]:
        return [it.prompt_len for it in self.items]

    @property
    def output_lens(self) -> list[int]:
        return [it.output_len for it in self.items]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(self.prompt_lens)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    def describe(self) -> str:
        n = len(self)
        span = self.items[-1].arrival_time if self.items else 0.0
        return (
            f"{self.name}: {n} requests, prompt mean {self.num_prompt_tokens / max(n, 1):.0f} "
            f"(max {max(self.prompt_lens, default=0)}), output mean {self.num_output_tokens / max(n, 1):.0f} "
            f"(max {max(self.output_lens, default=0)}), arrivals over {span:.1f} s"
        )


def arrival_times(n: int, rate: float | None, rng: random.Random) -> list[float]:
    """All zeros for ``rate=None`` (everything queued at once), else a Poisson process."""
    if rate is None or math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate}")
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def _build(
    name: str,
    n: int,
    seed: int,
    rate: float | None,
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    rng: random.Random,
    *,
    shared_prefix_len: int = 0,
    prefix_seed: int = 0,
    priority: int = 0,
    description: str = "",
    params: dict | None = None,
) -> Trace:
    times = arrival_times(n, rate, rng)
    items = [
        TraceItem(
            request_id=f"{name}-{i}",
            arrival_time=times[i],
            prompt_len=prompt_lens[i],
            output_len=output_lens[i],
            seed=rng.getrandbits(63),
            shared_prefix_len=shared_prefix_len,
            prefix_seed=prefix_seed,
            priority=priority,
            kind=name,
        )
        for i in range(n)
    ]
    return Trace(name, items, description, {"n": n, "seed": seed, "rate": rate, **(params or {})})


def chat(
    n: int,
    seed: int = 0,
    rate: float | None = None,
    prompt: LogNormalLengths | LogUniformLengths = SHAREGPT_PROMPT,
    output: LogNormalLengths | LogUniformLengths = SHAREGPT_OUTPUT,
    name: str = "chat",
    priority: int = 0,
) -> Trace:
    """ShareGPT-like chat requests (see the module docstring for the numbers)."""
    rng = random.Random(f"{name}:{seed}")
    return _build(
        name, n, seed, rate, prompt.sample(rng, n), output.sample(rng, n), rng,
        priority=priority, description="ShareGPT-like chat",
    )


def reasoning(
    n: int,
    seed: int = 0,
    rate: float | None = None,
    output: LogNormalLengths = REASONING_OUTPUT,
    name: str = "reasoning",
    priority: int = 1,
) -> Trace:
    """Chat-sized prompts with long thinking chains (up to 30k tokens)."""
    rng = random.Random(f"{name}:{seed}")
    return _build(
        name, n, seed, rate, SHAREGPT_PROMPT.sample(rng, n), output.sample(rng, n), rng,
        priority=priority, description="reasoning model: long outputs",
    )


def shared_prefix(
    n: int,
    prefix_len: int = 2048,
    seed: int = 0,
    rate: float | None = None,
    user: LogNormalLengths = SHAREGPT_PROMPT,
    output: LogNormalLengths = SHAREGPT_OUTPUT,
    name: str = "sysprompt",
) -> Trace:
    """Every prompt = the same ``prefix_len``-token system prompt + its own user turn."""
    rng = random.Random(f"{name}:{seed}")
    prompts = [prefix_len + u for u in user.sample(rng, n)]
    return _build(
        name, n, seed, rate, prompts, output.sample(rng, n), rng,
        shared_prefix_len=prefix_len, prefix_seed=rng.getrandbits(63),
        description=f"chat behind a shared {prefix_len}-token system prompt",
        params={"prefix_len": prefix_len},
    )


def long_context(
    n: int,
    seed: int = 0,
    rate: float | None = None,
    prompt: LogUniformLengths = LONG_CONTEXT_PROMPT,
    output: LogNormalLengths = SHAREGPT_OUTPUT,
    name: str = "longctx",
) -> Trace:
    """Document analysis: prompts of 8k-100k tokens, chat-length answers."""
    rng = random.Random(f"{name}:{seed}")
    return _build(
        name, n, seed, rate, prompt.sample(rng, n), output.sample(rng, n), rng,
        description="long-context analysis",
    )


def fixed(
    prompt_lens: Sequence[int],
    output_lens: Sequence[int] | int,
    seed: int = 0,
    arrival: Sequence[float] | None = None,
    name: str = "fixed",
) -> Trace:
    """Hand-picked lengths (examples and tests); all at time 0 unless ``arrival`` is given."""
    n = len(prompt_lens)
    outs = [output_lens] * n if isinstance(output_lens, int) else list(output_lens)
    if len(outs) != n or (arrival is not None and len(arrival) != n):
        raise ValueError("prompt_lens, output_lens and arrival must have the same length")
    rng = random.Random(f"{name}:{seed}")
    items = [
        TraceItem(f"{name}-{i}", 0.0 if arrival is None else float(arrival[i]), p, o, rng.getrandbits(63), kind=name)
        for i, (p, o) in enumerate(zip(prompt_lens, outs, strict=True))
    ]
    return Trace(name, items, "hand-picked lengths")


def merge(*traces: Trace, name: str = "mix") -> Trace:
    """One trace with every item of ``traces`` in arrival order (ties: argument order)."""
    items = [it for t in traces for it in t.items]
    return Trace(name, items, " + ".join(t.name for t in traces))


# --- the real engine ----------------------------------------------------------------------
def _engine_of(llm_or_engine):
    return getattr(llm_or_engine, "engine", llm_or_engine)


def submit_to_engine(llm_or_engine, trace: Trace | Sequence[TraceItem]) -> list[str]:
    """Queue every item now, as one offline batch: the trace's arrival times are ignored and
    every request is stamped with the same arrival time (as in the simulator, where an
    all-at-once trace arrives at t = 0; the priority policy breaks ties on arrival time).
    Request ids are the trace's; each request is greedy, ignores EOS and stops after exactly
    ``output_len`` tokens."""
    engine = _engine_of(llm_or_engine)
    vocab = engine.model_config.vocab_size
    now = time.perf_counter()
    return [
        engine.add_request(
            it.request_id, it.prompt_token_ids(vocab), it.sampling_params(),
            priority=it.priority, arrival_time=now,
        )
        for it in trace
    ]


def run_on_engine(llm_or_engine, trace: Trace | Sequence[TraceItem], realtime: bool = False):
    """Serve a trace on the real engine and return its :class:`~minivllm.metrics.EngineStats`.

    ``realtime=False`` submits everything at once. ``realtime=True`` submits each item when
    the wall clock reaches its arrival time (the engine idles in between), so arrival-driven
    metrics such as TTFT mean what they mean on a server.
    """
    engine = _engine_of(llm_or_engine)
    if not realtime:
        submit_to_engine(engine, trace)
        while engine.has_unfinished_requests():
            engine.step()
        return engine.get_stats()
    items = sorted(trace, key=lambda it: it.arrival_time)
    vocab = engine.model_config.vocab_size
    t0 = time.perf_counter()
    i = 0
    while i < len(items) or engine.has_unfinished_requests():
        now = time.perf_counter()
        while i < len(items) and t0 + items[i].arrival_time <= now:
            it = items[i]
            engine.add_request(
                it.request_id, it.prompt_token_ids(vocab), it.sampling_params(),
                priority=it.priority, arrival_time=t0 + it.arrival_time,
            )
            i += 1
        if engine.has_unfinished_requests():
            engine.step()
        elif i < len(items):
            time.sleep(max(0.0, t0 + items[i].arrival_time - time.perf_counter()))
    return engine.get_stats()
