"""Turn the logits of the rows that sample into token ids, each row with its own settings.

Order of operations (the same as Hugging Face ``generate`` and vLLM): stop tokens are impossible
before ``min_tokens``, then temperature, then top-k, then top-p, then a draw. Greedy rows
(``SamplingParams.greedy``: temperature 0, or below ``GREEDY_TEMPERATURE``) take the argmax.

Everything runs on the logits' device, for all rows at once. The draw is the *exponential
race*: for probabilities ``p`` and independent ``E_i ~ Exp(1)``, ``argmax_i p_i / E_i`` is
distributed exactly as a draw from ``p`` (it is the Gumbel-max trick in another form), and it
needs one random number per (row, token) instead of a sequential search. A request with a
``seed`` draws its noise from a generator seeded by ``(seed, stream, how many tokens it has
generated, draw)``, so its samples depend on neither the other requests in the batch nor their
order, and the sampler keeps no state per request.

This module is the one owner of a request's distribution and of its random numbers: the model
runner calls the sampler; speculative decoding builds the target's distributions
(:meth:`Sampler.probs` with each row's output position), the draft model's, and the numbers its
rejection rule needs (:meth:`Sampler.generator`, :meth:`Sampler.exponential`) through the same
methods. A draft model draws from its own ``stream``, so its noise is independent of the
target's.

A row whose logits are not usable (NaN, +inf, or every token impossible) cannot be sampled:
it is reported in ``failed`` and gets no token, and the other rows are unaffected.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minivllm.core.interfaces import Logprobs
from minivllm.request import Request
from minivllm.transfer import to_device

TARGET_STREAM = 0  # the target model's draws: its samples, a verification's numbers
DRAFT_STREAM = 0x5DEECE66D  # a draft model's draws, independent of the target's


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_k: int | None = None) -> torch.Tensor:
    """Keep each row's ``top_k`` largest logits (``0`` keeps all). ``logits [N, V]``,
    ``top_k [N]`` on the same device. Only the ``max_k`` largest logits of each row are sorted
    (``topk``; ``max_k``: the rows' largest ``k``, a row that keeps all counting as the
    vocabulary, read from ``top_k`` when not given), not the whole vocabulary: the k-th largest
    value is the same."""
    vocab = logits.shape[-1]
    k = torch.where(top_k <= 0, vocab, top_k.clamp(max=vocab)).long()
    width = int(k.max()) if max_k is None else max_k
    kth = logits.topk(width, dim=-1).values.gather(1, (k - 1)[:, None])
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches ``top_p``
    (at least one token always survives)."""
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cum <= (1 - top_p[:, None])
    remove[:, -1] = False
    mask = torch.zeros_like(remove).scatter(1, order, remove)
    return logits.masked_fill(mask, float("-inf"))


def unusable_rows(logits: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: rows with a NaN or +inf, or with no finite logit at all."""
    return torch.isnan(logits).any(-1) | torch.isposinf(logits).any(-1) | torch.isneginf(logits).all(-1)


def greedy_probs(logits: torch.Tensor) -> torch.Tensor:
    """A greedy row's "distribution": 1 at the argmax (the first, on a tie, as ``argmax``)."""
    return torch.zeros_like(logits).scatter_(1, logits.argmax(dim=1, keepdim=True), 1.0)


def _mix64(seed: int, index: int) -> int:
    """A well-spread 64-bit seed for draw ``index`` of a request seeded with ``seed``
    (splitmix64's finaliser), so consecutive draws use unrelated random streams."""
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


MAX_DRAWS_PER_TOKEN = 64  # draws of one stream at one output length (a draft model's positions)


class Sampler:
    """``sampler(logits [N, V], requests) -> (token ids, failed rows)``, and the parts of it that
    speculative decoding shares: :meth:`probs`, :meth:`generator`, :meth:`exponential`."""

    def __init__(self, seed: int | None = None):
        self.seed = seed
        self._default: dict[torch.device, torch.Generator] = {}  # unseeded rows, per device

    # --- the distribution ----------------------------------------------------------------------
    @staticmethod
    def mask_early_stops(logits: torch.Tensor, requests: Sequence[Request],
                         offsets: Sequence[int] | None = None) -> None:
        """``min_tokens``, in place: row ``i`` gives its request's output token number
        ``num_output_tokens + offsets[i]`` (``offsets`` default to 0: the next token), and a stop
        token (EOS, ``stop_token_ids``) is impossible there until ``min_tokens`` exist."""
        for i, r in enumerate(requests):
            min_tokens = r.sampling_params.min_tokens
            position = r.num_output_tokens + (offsets[i] if offsets is not None else 0)
            if min_tokens and position < min_tokens and r.stop_token_set:
                logits[i, list(r.stop_token_set)] = float("-inf")

    @staticmethod
    def filter_logits(logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
        """Apply temperature, top-k and top-p to ``logits [N, V]`` (float32)."""
        params = [r.sampling_params for r in requests]
        # the rows' settings reach the device in one copy that does not block
        temps, top_k, top_p = to_device([([1.0 if p.greedy else p.temperature for p in params], logits.dtype),
                                         ([p.top_k for p in params], torch.long),
                                         ([p.top_p for p in params], logits.dtype)], logits.device)
        logits = logits / temps[:, None]
        if any(p.top_k > 0 for p in params):
            vocab = logits.shape[-1]
            widest = max(min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params)
            logits = apply_top_k(logits, top_k, widest)
        if any(p.top_p < 1.0 for p in params):
            logits = apply_top_p(logits, top_p)
        return logits

    def greedy_tokens(self, logits: torch.Tensor, requests: Sequence[Request],
                      offsets: Sequence[int] | None = None) -> torch.Tensor:
        """``[N]`` int64: the token a greedy row takes at its request's output position
        ``num_output_tokens + offsets[i]``, the argmax after :meth:`mask_early_stops` (where
        :meth:`probs` puts its one-hot)."""
        if any(r.sampling_params.min_tokens for r in requests):
            logits = logits.float().clone()
            self.mask_early_stops(logits, requests, offsets)
        return logits.argmax(dim=-1)

    def probs(self, logits: torch.Tensor, requests: Sequence[Request],
              offsets: Sequence[int] | None = None) -> torch.Tensor:
        """``[N, V]`` float32: the distribution row ``i``'s token is drawn from, for its request's
        output position ``num_output_tokens + offsets[i]`` (see :meth:`mask_early_stops`): one-hot
        at the argmax for a greedy request, else the softmax of :meth:`filter_logits`. What the
        sampler draws from, and what speculative decoding verifies against."""
        logits = logits.float().clone()
        self.mask_early_stops(logits, requests, offsets)
        greedy = [r.sampling_params.greedy for r in requests]
        probs = greedy_probs(logits)
        if not all(greedy):
            rows = [i for i, g in enumerate(greedy) if not g]
            (index,) = to_device([(rows, torch.long)], logits.device)
            probs[index] = self.filter_logits(logits[index], [requests[i] for i in rows]).softmax(dim=-1)
        return probs

    # --- the random numbers ----------------------------------------------------------------------
    def generator(self, request: Request, device: torch.device, stream: int = TARGET_STREAM,
                  draw: int = 0) -> torch.Generator:
        """Where ``request``'s random numbers for its next token come from: with a ``seed``, a
        generator seeded by ``(seed, stream, num_output_tokens, draw)`` -- the target draws once
        per output length; a draft stream numbers its draws there (the draft positions, below
        :data:`MAX_DRAWS_PER_TOKEN`); without a seed, the sampler's generator for ``device``."""
        seed = request.sampling_params.seed
        if seed is None:
            return self._shared_generator(torch.device(device))
        n_out = request.num_output_tokens
        if stream == TARGET_STREAM:  # the target draws once per token (its sample, or a verification)
            if draw:
                raise ValueError(f"the target stream has one draw per token, got draw={draw}")
            index = n_out
        elif 0 <= draw < MAX_DRAWS_PER_TOKEN:
            index = n_out * MAX_DRAWS_PER_TOKEN + draw
        else:
            raise ValueError(f"draw must be in [0, {MAX_DRAWS_PER_TOKEN}), got {draw}")
        gen = torch.Generator(device=device)
        gen.manual_seed(_mix64(seed ^ stream, index))
        return gen

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        gen = self._default.get(device)
        if gen is None:
            gen = self._default[device] = torch.Generator(device=device)
            if self.seed is not None:
                gen.manual_seed(self.seed)
            else:
                gen.seed()
        return gen

    def exponential(self, like: torch.Tensor, requests: Sequence[Request], stream: int = TARGET_STREAM,
                    draw: int = 0) -> torch.Tensor:
        """``Exp(1)`` noise shaped like ``like [N, V]``, row ``i`` from request ``i``'s
        :meth:`generator`; never exactly 0 (some devices' ``exponential_`` emits one now and then,
        and ``p / 0`` would win the race for a token of probability 0)."""
        noise = torch.empty_like(like, dtype=torch.float32)
        seeded = [i for i, r in enumerate(requests) if r.sampling_params.seed is not None]
        if len(seeded) < len(requests):
            noise.exponential_(generator=self._shared_generator(like.device))
        for i in seeded:
            noise[i].exponential_(generator=self.generator(requests[i], like.device, stream, draw))
        return noise.clamp_(min=torch.finfo(noise.dtype).tiny)

    # --- sampling --------------------------------------------------------------------------------
    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> tuple[list[int], dict[int, str]]:
        """``logits [N, V]`` (one row per sampling request) -> ``(N token ids, failed)`` where
        ``failed`` maps a row index to why it could not be sampled (its token is then -1)."""
        logits = logits.float()
        self.mask_early_stops(logits, requests)
        # a row with NaN or +inf, or nothing finite, cannot be sampled: it comes back as -1
        # (rows are independent, so the others are drawn as if it were not there)
        bad = ~torch.isfinite(logits.amax(dim=-1))  # a NaN or +inf is the max; so is -inf when nothing is finite
        tokens = logits.argmax(dim=-1)
        sampled_rows = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
        if sampled_rows:
            (rows,) = to_device([(sampled_rows, torch.long)], logits.device)
            sub = [requests[i] for i in sampled_rows]
            probs = self.filter_logits(logits.index_select(0, rows), sub).softmax(dim=-1)
            tokens.index_copy_(0, rows, (probs / self.exponential(probs, sub)).argmax(dim=-1))
        out = tokens.masked_fill(bad, -1).tolist()  # the step's one read back to the host
        failed = {i: "the model produced non-finite logits (NaN or inf) for this request"
                  for i, token in enumerate(out) if token == -1}
        return out, failed


def compute_logprobs(
    logits: torch.Tensor, token_ids: list[int], num_top: list[int]
) -> list[Logprobs]:
    """Log-probabilities of ``token_ids[i]`` under row ``i`` of ``logits [N, V]`` (the raw model
    distribution, before temperature or filters, as vLLM reports them), its rank, and the
    ``num_top[i]`` most likely tokens of the row."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    idx = torch.tensor(token_ids, device=logits.device)
    chosen = logprobs.gather(1, idx[:, None]).squeeze(1)
    ranks = (logprobs > chosen[:, None]).sum(-1) + 1
    k = max(num_top, default=0)
    top_vals, top_ids = logprobs.topk(k, dim=-1) if k else (None, None)
    chosen_l, ranks_l = chosen.tolist(), ranks.tolist()
    top_v = top_vals.tolist() if k else None
    top_i = top_ids.tolist() if k else None
    out = []
    for i, tok in enumerate(token_ids):
        top = list(zip(top_i[i][: num_top[i]], top_v[i][: num_top[i]], strict=True)) if k else []
        out.append(Logprobs(tok, chosen_l[i], ranks_l[i], top))
    return out
