"""N-gram (prompt-lookup) drafts: guess that the text goes on as it did before.

For the last ``n`` tokens of a request (``n`` from ``prompt_lookup_max`` down to
``prompt_lookup_min``), find the most recent earlier place where the same ``n`` tokens occur, and
propose the ``k`` tokens that followed them there. Nothing is proposed when no n-gram recurs.
Costs no model at all: it pays off on text that repeats itself (code edits, quoting the prompt,
stories with refrains) and proposes nothing elsewhere.
"""

from __future__ import annotations

import torch

from minivllm.transfer import HOST


def propose_ngram(token_ids: list[int], k: int, max_n: int = 4, min_n: int = 1) -> list[int]:
    """Up to ``k`` draft tokens that continue ``token_ids``; ``[]`` when no n-gram recurs."""
    length = len(token_ids)
    if k <= 0 or length < min_n + 1:
        return []
    tokens = torch.tensor(token_ids, dtype=torch.long, device=HOST)  # searched on the host
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        pattern = tokens[length - n :]
        # windows starting at 0 .. length - n - 1: every occurrence that has a token after it
        windows = tokens[: length - 1].unfold(0, n, 1)
        hits = (windows == pattern).all(dim=1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n  # the most recent occurrence: what followed it
            return token_ids[start : start + k]
    return []
