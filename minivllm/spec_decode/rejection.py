"""Verifying drafts: the rejection rule that keeps the target model's distribution.

A step gives a request with ``k`` drafts ``d_1 .. d_k`` ``k + 1`` rows of target logits: row ``i``
(0-based) is the target's distribution ``p_i`` for the token after ``d_1 .. d_i``. Walk the drafts
in order. Draft ``d_{i+1}``, proposed with probability ``q_i(d_{i+1})``, is accepted with
probability ``min(1, p_i(d) / q_i(d))``. At the first rejection the step emits one token drawn
from the *residual* ``max(p_i - q_i, 0)`` (renormalised) and stops; if all ``k`` are accepted it
emits a bonus token drawn from ``p_k``. Whatever ``q`` is, every emitted token is distributed as
the target alone would have sampled it (Leviathan et al. 2023, Chen et al. 2023): accepting
keeps ``min(p, q)`` of the mass, the residual supplies exactly the ``p - min(p, q)`` that is
missing.

Two kinds of draft fit the same rule:

* a **draft model** gives a distribution ``q_i`` per row (its own logits, with the request's
  temperature, top-k and top-p applied);
* an **n-gram** draft is deterministic: ``q_i`` is one-hot at ``d_{i+1}``, so the draft is
  accepted with probability ``p_i(d)`` and the residual is ``p_i`` with ``d`` removed.

A greedy request is the case where ``p_i`` is one-hot at the target's argmax: a draft is
accepted exactly when it equals the argmax, and the token emitted at the first mismatch is the
argmax itself, so greedy output is the same token for token as without speculation.

:func:`verify` does this for all requests of a step at once: the random numbers (one uniform per
draft, one ``Exp(1)`` per row and token for the draws, the exponential race of
``minivllm.sample.sampler``) are drawn by the caller, so a seeded request's result depends on its
seed alone.
"""

from __future__ import annotations

import torch

from minivllm.transfer import to_device


def verify(
    target_probs: torch.Tensor,  # [R, V]: every request's k_r + 1 rows, request after request
    draft_tokens: list[list[int]],  # per request, its k_r drafts
    draft_probs: torch.Tensor | None,  # [R, V] the draft's q (rows k_r of each request unused); None: one-hot drafts
    uniforms: torch.Tensor,  # [R] U(0, 1): row i's acceptance test (the last row of each request unused)
    noise: torch.Tensor,  # [R, V] Exp(1): the residual / bonus draw of row i
) -> list[list[int]]:
    """The tokens each request emits this step: its accepted drafts, then one more token (the
    residual draw at the first rejection, or the bonus token). ``1 <= len <= k_r + 1``."""
    device = target_probs.device
    num_rows = target_probs.shape[0]
    starts, flat = [], []
    for drafts in draft_tokens:
        starts.append(len(flat))
        flat.extend(drafts)
        flat.append(-1)  # the bonus row proposes nothing
    if len(flat) != num_rows:
        raise ValueError(f"{num_rows} target rows for {len(draft_tokens)} requests with {len(flat)} rows in all")
    (proposed,) = to_device([(flat, torch.long)], device)
    has_draft = proposed >= 0
    index = proposed.clamp(min=0)[:, None]
    p_draft = target_probs.gather(1, index).squeeze(1)
    if draft_probs is None:  # one-hot q: accepted with probability p(d)
        q_draft = torch.ones_like(p_draft)
        residual = target_probs.scatter(1, index, 0.0)
    else:
        q_draft = draft_probs.gather(1, index).squeeze(1)
        residual = (target_probs - draft_probs).clamp_(min=0)
    # u < p/q, written without a division (q > 0 for a token the draft proposed)
    accept = has_draft & (uniforms * q_draft < p_draft)
    # the bonus row draws from p itself; a residual with no mass left (p == q) falls back to p
    residual = torch.where(has_draft[:, None], residual, target_probs)
    empty = residual.sum(dim=1) <= 0
    residual = torch.where(empty[:, None], target_probs, residual)
    # a token of weight 0 never wins the race, even against an exact 0 of noise (0 / 0 is NaN)
    emitted_if_stop = torch.where(residual > 0, residual / noise, -1.0).argmax(dim=1)
    accept_l, stop_l = torch.stack([accept.long(), emitted_if_stop]).tolist()  # one read back
    out = []
    for start, drafts in zip(starts, draft_tokens, strict=True):
        a = 0
        while a < len(drafts) and accept_l[start + a]:
            a += 1
        out.append([*drafts[:a], stop_l[start + a]])
    return out



def verify_greedy(target_tokens: list[int], draft_tokens: list[list[int]]) -> list[list[int]]:
    """:func:`verify` where every request is greedy, from the target's argmax of each row
    (``target_tokens``: every request's ``k_r + 1`` rows, request after request) instead of its
    one-hot ``p``: a draft is kept while it equals the argmax of its row, and the token after
    the kept drafts is that row's argmax (the residual of a one-hot ``p`` at a rejection, the
    bonus token after all ``k``). The same tokens, without a tensor per row and token."""
    out, start = [], 0
    for drafts in draft_tokens:
        a = 0
        while a < len(drafts) and drafts[a] == target_tokens[start + a]:
            a += 1
        out.append([*drafts[:a], target_tokens[start + a]])
        start += len(drafts) + 1
    if start != len(target_tokens):
        raise ValueError(f"{len(target_tokens)} target rows for {len(draft_tokens)} requests with {start} rows in all")
    return out
