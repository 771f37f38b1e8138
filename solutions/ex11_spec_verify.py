"""Exercise 11: the verifier of speculative decoding -- many tokens per step, the target's distribution kept.

Notebook: notebooks/11_the_2026_stack.ipynb. Check your work with
``course.check(course.load("ex11_spec_verify"))`` there, or ``pytest -m ex11``.

A cheap proposer (an n-gram lookup, a small draft model) guesses the next ``k`` tokens of a
request; the target model then scores all of them in one forward pass, which gives ``k + 1``
rows of next-token probabilities. Your function decides, from those rows and a handful of random
numbers, which tokens the request emits this step: some of the guesses, then one token more.
The notebook builds the idea (section 5); the contract below says what the result must satisfy,
and how to get there is yours.

Once it passes its checks, ``minivllm.course.verifier.use_verifier(llm, ex.verify_drafts)`` makes
an ``LLM(speculative_config=...)`` verify every request of every step with it.
"""

from __future__ import annotations

import torch

NOTEBOOK = "notebooks/11_the_2026_stack.ipynb"


def verify_drafts(
    target_probs: torch.Tensor,
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    noise: torch.Tensor,
) -> list[int]:
    """The tokens one request emits in a speculative step: a prefix of its drafts, then one more.

    Inputs, for one request with ``k = len(draft_tokens)`` drafts (``k >= 0``) and a vocabulary
    of ``V`` tokens:

    * ``target_probs`` ``[k + 1, V]``: row ``i`` is ``p_i``, the target model's distribution of
      the token that follows the request's tokens and the drafts ``d_1 .. d_i`` (row 0 follows
      the request alone; row ``k`` follows all the drafts). Rows are non-negative and sum to 1
      up to rounding; some entries may be exactly 0 (top-k, top-p, greedy).
    * ``draft_tokens``: ``d_1 .. d_k``, token ids in ``[0, V)``.
    * ``draft_probs`` ``[k, V]`` or ``None``: row ``i`` is ``q_i``, the distribution ``d_{i+1}``
      was drawn from (a draft model's; ``q_i(d_{i+1}) > 0``). ``None``: the drafts are
      deterministic guesses (an n-gram lookup), not drawn from any distribution you are given.

    The random numbers, which are all the randomness the function may use:

    * ``uniforms`` ``[k]``: independent numbers uniform on ``[0, 1)``; ``uniforms[i]`` is meant
      for the decision on draft ``d_{i+1}``.
    * ``noise`` ``[k + 1, V]``: independent ``Exp(1)`` numbers; ``noise[i]`` is meant for a token
      drawn at row ``i``. For any non-negative weights ``w`` over the vocabulary (not all 0),
      ``argmax(w / noise[i])`` is token ``x`` with probability ``w[x] / w.sum()`` (the
      exponential race of minivllm's sampler; the notebook measures it).

    What the result must satisfy (the checks test each):

    1. **Shape.** A list of Python ints ``draft_tokens[:a] + [t]`` for some ``0 <= a <= k``:
       ``a`` drafts kept, then one token more.
    2. **Exactness.** Whatever the drafts are (drawn from any ``q``, or fixed guesses), the
       emitted tokens are distributed as the target alone would sample them, one at a time: the
       first emitted token as ``p_0``; a second one (here, or as the first of the next step) as
       the target's row that follows the first, and so on. In particular no token is ever
       emitted from a row that gives it probability 0, whatever the random numbers and whatever
       rounding does to the arithmetic.
    3. **Optimality.** Drafts are kept as often as exactness allows: the law of ``a`` must be
       the best any exact verifier can reach for these distributions (the checks compare it with
       that best law). Finding how often that is, and a rule that reaches it, is the exercise.
    4. **Determinism.** The result is a function of the arguments alone (no random numbers of
       your own), and the arguments are left unchanged. ``ValueError`` unless ``target_probs``
       has ``k + 1`` rows, ``uniforms`` ``k`` entries, ``noise`` the shape of ``target_probs``
       and ``draft_probs`` (when given) ``k`` rows.

    Worked example (``V = 3``, ``k = 2``; the same result for any ``uniforms`` and ``noise``)::

        target_probs = [[0.5, 0.3, 0.2], [0.0, 0.4, 0.6], [0.2, 0.2, 0.6]]
        draft_tokens = [0, 0]
        draft_probs  = [[0.4, 0.4, 0.2], [0.4, 0.4, 0.2]]
        -> [0, 2]
    """
    # BEGIN SOLUTION
    k = len(draft_tokens)
    vocab = target_probs.shape[-1]
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(f"target_probs must be [k + 1, V] = [{k + 1}, V] for {k} drafts, got {list(target_probs.shape)}")
    if uniforms.shape != (k,):
        raise ValueError(f"uniforms must hold one number per draft ({k}), got shape {list(uniforms.shape)}")
    if noise.shape != target_probs.shape:
        raise ValueError(f"noise must be shaped like target_probs {list(target_probs.shape)}, got {list(noise.shape)}")
    if draft_probs is not None and draft_probs.shape != (k, vocab):
        raise ValueError(f"draft_probs must be [k, V] = [{k}, {vocab}], got {list(draft_probs.shape)}")

    kept: list[int] = []
    for i, token in enumerate(draft_tokens):
        p_row = target_probs[i]
        p_token = float(p_row[token])
        q_token = 1.0 if draft_probs is None else float(draft_probs[i, token])
        if float(uniforms[i]) * q_token < p_token:  # u < p / q: kept with probability min(1, p / q)
            kept.append(int(token))
            continue
        # rejected: the target's mass the draft did not already cover
        if draft_probs is None:
            leftover = p_row.clone()
            leftover[token] = 0.0
        else:
            leftover = (p_row - draft_probs[i]).clamp(min=0.0)
        if not float(leftover.sum()) > 0.0:
            leftover = p_row
        return kept + [int(torch.argmax(leftover / noise[i]))]
    return kept + [int(torch.argmax(target_probs[k] / noise[k]))]  # every draft kept: one from the last row
    # END SOLUTION
