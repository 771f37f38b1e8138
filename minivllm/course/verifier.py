"""A per-request verifier of drafts, plugged into the engine's speculative decoding (exercise 11).

minivllm verifies the drafts of every request of a step in one call,
``SpeculativeDecoder.verify_fn(target_probs, draft_tokens, draft_probs, uniforms, noise)``, on
flat tensors whose rows are each request's ``k + 1`` rows, request after request (the signature
of :func:`minivllm.spec_decode.rejection.verify`). Exercise 11 writes the rule for *one* request.
:func:`batched` turns such a function into the batched form: it cuts each request's rows out,
hands the function copies (so that it cannot change the engine's tensors), and checks that what
comes back has the contract's shape (a prefix of the drafts, then one token). :func:`use_verifier`
installs it in an ``LLM`` built with ``speculative_config``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

PerRequestVerifier = Callable[
    [torch.Tensor, list[int], "torch.Tensor | None", torch.Tensor, torch.Tensor], list[int]
]


class VerifierOutputError(ValueError):
    """A verifier returned something that is not ``drafts[:a] + [token]``."""


def check_emitted(emitted: object, drafts: Sequence[int], vocab_size: int) -> list[int]:
    """``emitted`` as a list of ints, or :class:`VerifierOutputError` saying what is wrong."""
    if not isinstance(emitted, (list, tuple)):
        raise VerifierOutputError(f"a verifier returns a list of token ids, got {type(emitted).__name__}: {emitted!r}")
    tokens = list(emitted)
    if not 1 <= len(tokens) <= len(drafts) + 1:
        raise VerifierOutputError(
            f"with {len(drafts)} drafts a verifier emits between 1 and {len(drafts) + 1} tokens, got "
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


def batched(fn: PerRequestVerifier) -> Callable[..., list[list[int]]]:
    """The batched verifier (``rejection.verify``'s signature) that runs ``fn`` request by request."""

    def verify_step(
        target_probs: torch.Tensor,
        draft_tokens: list[list[int]],
        draft_probs: torch.Tensor | None,
        uniforms: torch.Tensor,
        noise: torch.Tensor,
    ) -> list[list[int]]:
        num_rows, vocab = target_probs.shape
        needed = sum(len(d) + 1 for d in draft_tokens)
        if needed != num_rows:
            raise ValueError(f"{num_rows} target rows for {len(draft_tokens)} requests needing {needed}")
        out, row = [], 0
        for drafts in draft_tokens:
            k = len(drafts)
            q = None if draft_probs is None else draft_probs[row : row + k].clone()
            got = fn(target_probs[row : row + k + 1].clone(), list(drafts), q,
                     uniforms[row : row + k].clone(), noise[row : row + k + 1].clone())
            out.append(check_emitted(got, drafts, vocab))
            row += k + 1
        return out

    verify_step.per_request = fn  # type: ignore[attr-defined]
    return verify_step


def use_verifier(llm, fn: PerRequestVerifier) -> Callable:
    """Make ``llm`` (an ``LLM`` built with ``speculative_config``, in this process) verify every
    step's drafts with ``fn``; returns the verifier it replaces (to put back by hand)."""
    engine = getattr(llm, "engine", llm)
    if not getattr(engine, "in_process", False):
        raise ValueError("use_verifier needs an LLM whose engine core runs in this process "
                         "(engine_core_process=False)")
    speculative = engine.runner.speculative
    if speculative is None:
        raise ValueError("this LLM does not speculate: build it with speculative_config="
                         "{'method': 'ngram', 'num_speculative_tokens': 4} (or a draft model)")
    previous = speculative.verify_fn
    speculative.verify_fn = batched(fn)
    return previous
