"""Turn the logits of the rows that sample into token ids, each row with its own settings.

Order of operations (the same as Hugging Face ``generate`` and vLLM): temperature, then
top-k, then top-p, then a draw. Greedy rows (temperature 0) take the argmax of the raw logits.
A request with a ``seed`` draws from its own ``torch.Generator``, so its samples do not depend
on which other requests share the batch.
"""

from __future__ import annotations

import torch

from minivllm.request import Request


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep each row's ``top_k`` largest logits (``0`` keeps all). ``logits [N, V]``."""
    vocab = logits.shape[-1]
    k = torch.where(top_k <= 0, vocab, top_k.clamp(max=vocab)).long()
    sorted_desc = logits.sort(dim=-1, descending=True).values
    kth = sorted_desc.gather(1, (k - 1)[:, None])
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


class Sampler:
    def __init__(self, seed: int | None = None):
        self._generators: dict[str, torch.Generator] = {}
        self._default = torch.Generator()
        if seed is not None:
            self._default.manual_seed(seed)

    def _generator(self, req: Request) -> torch.Generator:
        seed = req.sampling_params.seed
        if seed is None:
            return self._default
        gen = self._generators.get(req.request_id)
        if gen is None:
            gen = self._generators[req.request_id] = torch.Generator()
            gen.manual_seed(seed)
        return gen

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def filter_logits(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """Apply temperature, top-k and top-p to ``logits [N, V]`` (float32)."""
        params = [r.sampling_params for r in requests]
        temps = torch.tensor([p.temperature or 1.0 for p in params], dtype=logits.dtype)
        logits = logits / temps[:, None]
        if any(p.top_k > 0 for p in params):
            logits = apply_top_k(logits, torch.tensor([p.top_k for p in params]))
        if any(p.top_p < 1.0 for p in params):
            logits = apply_top_p(logits, torch.tensor([p.top_p for p in params], dtype=logits.dtype))
        return logits

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """``logits [N, V]`` (one row per sampling request) -> N token ids."""
        logits = logits.float()
        self._suppress_early_stops(logits, requests)
        greedy = [r.sampling_params.temperature == 0.0 for r in requests]
        tokens = logits.argmax(dim=-1).tolist()
        if all(greedy):
            return tokens
        rows = [i for i, g in enumerate(greedy) if not g]
        sub = [requests[i] for i in rows]
        probs = self.filter_logits(logits[rows], sub).softmax(dim=-1).cpu()
        for j, (i, req) in enumerate(zip(rows, sub, strict=True)):
            tokens[i] = int(torch.multinomial(probs[j], 1, generator=self._generator(req)))
        return tokens

    @staticmethod
    def _suppress_early_stops(logits: torch.Tensor, requests: list[Request]) -> None:
        """``min_tokens``: stop tokens (EOS, stop_token_ids) are impossible until then."""
        for i, r in enumerate(requests):
            if r.sampling_params.min_tokens and r.num_output_tokens < r.sampling_params.min_tokens:
                stop_ids = list(r.stop_token_set)
                if stop_ids:
                    logits[i, stop_ids] = float("-inf")
