"""A verifier of a step's drafts, plugged into the engine's speculative decoding (exercise 11).

minivllm verifies the drafts of every request of a step in one call,
``SpeculativeDecoder.verify_fn(target_probs, draft_tokens, draft_probs, uniforms, noise)``, on
flat tensors whose rows are each request's ``k + 1`` rows, request after request (the signature
of :func:`minivllm.spec_decode.rejection.verify`). Exercise 11's ``verify_step`` has that
signature, so it plugs in as it is, as ``speculative_config``'s ``verifier`` (:func:`with_verifier`
builds that config); :func:`checked` only checks what comes back (one list per request, each a
prefix of its drafts then one token) before the engine uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

StepVerifier = Callable[
    [torch.Tensor, list[list[int]], "torch.Tensor | None", torch.Tensor, torch.Tensor], list[list[int]]
]


class VerifierOutputError(ValueError):
    """A verifier returned something that is not, per request, ``drafts[:a] + [token]``."""


def check_emitted(emitted: object, drafts: Sequence[int], vocab_size: int) -> list[int]:
    """One request's ``emitted`` tokens as a list of ints, or :class:`VerifierOutputError` saying
    what is wrong."""
    if not isinstance(emitted, (list, tuple)):
        raise VerifierOutputError(f"a request's tokens are a list of token ids, got {type(emitted).__name__}: "
                                  f"{emitted!r}")
    tokens = list(emitted)
    if not 1 <= len(tokens) <= len(drafts) + 1:
        raise VerifierOutputError(
            f"with {len(drafts)} drafts a request emits between 1 and {len(drafts) + 1} tokens, got "
            f"{len(tokens)}: {tokens!r}"
        )
    for t in tokens:
        if not isinstance(t, int) or isinstance(t, bool):
            raise VerifierOutputError(f"token ids are Python ints, got {type(t).__name__} {t!r} in {tokens!r}")
        if not 0 <= t < vocab_size:
            raise VerifierOutputError(f"token id {t} is outside the vocabulary [0, {vocab_size}) in {tokens!r}")
    kept = tokens[:-1]
    if kept != list(drafts[: len(kept)]):
        raise VerifierOutputError(
            f"all tokens but the last must be the drafts in order: drafts {list(drafts)!r}, emitted {tokens!r}"
        )
    return tokens


def check_step(emitted: object, draft_tokens: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
    """A step's result (one list per request, in order) checked request by request with
    :func:`check_emitted`; :class:`VerifierOutputError` names the request that is wrong."""
    if not isinstance(emitted, (list, tuple)):
        raise VerifierOutputError(f"a verifier returns one list of token ids per request, got "
                                  f"{type(emitted).__name__}: {emitted!r}"[:300])
    if len(emitted) != len(draft_tokens):
        raise VerifierOutputError(f"a step of {len(draft_tokens)} requests needs {len(draft_tokens)} lists of "
                                  f"tokens, got {len(emitted)}")
    out = []
    for r, (got, drafts) in enumerate(zip(emitted, draft_tokens, strict=True)):
        try:
            out.append(check_emitted(got, drafts, vocab_size))
        except VerifierOutputError as err:
            raise VerifierOutputError(f"request {r}: {err}") from None
    return out


def checked(fn: StepVerifier) -> StepVerifier:
    """``fn`` with its result checked by :func:`check_step` on every call."""

    def verify_step(
        target_probs: torch.Tensor,
        draft_tokens: list[list[int]],
        draft_probs: torch.Tensor | None,
        uniforms: torch.Tensor,
        noise: torch.Tensor,
    ) -> list[list[int]]:
        got = fn(target_probs, draft_tokens, draft_probs, uniforms, noise)
        return check_step(got, draft_tokens, target_probs.shape[-1])

    verify_step.unchecked = fn  # type: ignore[attr-defined]
    return verify_step


def with_verifier(speculative_config: dict, fn: StepVerifier) -> dict:
    """``speculative_config`` (a dict such as ``{"method": "ngram", "num_speculative_tokens": 4}``)
    with ``fn`` as its ``verifier``, checked (:func:`checked`): ``LLM(speculative_config=
    with_verifier(config, fn))`` verifies every step's drafts with ``fn``."""
    if not callable(fn):
        raise TypeError(f"a verifier must be callable, got {type(fn).__name__}")
    if not isinstance(speculative_config, dict):
        raise TypeError(f"speculative_config must be a dict such as {{'method': 'ngram', "
                        f"'num_speculative_tokens': 4}}, got {type(speculative_config).__name__}")
    return {**speculative_config, "verifier": checked(fn)}
