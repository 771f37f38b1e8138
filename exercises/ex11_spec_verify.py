# This file is generated from solutions/ex11_spec_verify.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex11` or `pytest -m ex11`. Stuck? `course.hint("ex11")` in the
# notebook (or `minivllm hint ex11`) gives a hint, one at a time.
"""Exercise 11: the verifier of speculative decoding -- a whole step's drafts at once, the target's distribution kept.

Notebook: notebooks/11_the_2026_stack.ipynb. Check your work with
``course.check(course.load("ex11_spec_verify"))`` there, or ``pytest -m ex11``.

A cheap proposer (an n-gram lookup, a small draft model) guesses the next ``k`` tokens of each
running request; the target model then scores every guess of every request in one forward pass,
which gives each request ``k + 1`` rows of next-token probabilities. Your function decides, from
those rows and a handful of random numbers, which tokens each request emits this step: some of its
guesses, then one token more. The notebook builds the idea (section 5); the contract below says
what the result must satisfy, and how to get there is yours.

It has the signature of the engine's own verifier, so that
``minivllm.course.verifier.with_verifier(config, ex.verify_step)`` makes an
``LLM(speculative_config=...)`` call it for every step.
"""

from __future__ import annotations

import torch

NOTEBOOK = "notebooks/11_the_2026_stack.ipynb"


def verify_step(
    target_probs: torch.Tensor,
    draft_tokens: list[list[int]],
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    noise: torch.Tensor,
) -> list[list[int]]:
    """The tokens every request of a speculative step emits: a prefix of its drafts, then one more.

    A step verifies ``n = len(draft_tokens)`` requests at once. Request ``r`` has
    ``k_r = len(draft_tokens[r])`` drafts (``k_r >= 0``, different from request to request) and
    owns ``k_r + 1`` consecutive rows of the step's tensors, request after request:
    ``R = sum_r (k_r + 1)`` rows in all, over a vocabulary of ``V`` tokens. Within request ``r``'s
    rows, its row ``i`` (``0 <= i <= k_r``) is:

    * ``target_probs[row]`` ``[R, V]``: ``p_i``, the target model's distribution of the token that
      follows the request's tokens and its drafts ``d_1 .. d_i`` (row 0 follows the request
      alone; row ``k_r``, its last, follows all its drafts). Rows are non-negative and sum to 1
      up to rounding; some entries may be exactly 0 (top-k, top-p, greedy).
    * ``draft_tokens[r]``: ``d_1 .. d_{k_r}``, token ids in ``[0, V)``.
    * ``draft_probs[row]`` ``[R, V]`` or ``None``: for ``i < k_r``, ``q_i``, the distribution
      ``d_{i+1}`` was drawn from (a draft model's; ``q_i(d_{i+1}) > 0``); a request's last row
      holds no distribution (its values are arbitrary). ``None``: the drafts of every request are
      deterministic guesses (an n-gram lookup), not drawn from any distribution you are given.

    The random numbers, which are all the randomness the function may use:

    * ``uniforms[row]`` ``[R]``: independent numbers uniform on ``[0, 1)``; for ``i < k_r`` it is
      meant for the decision on draft ``d_{i+1}`` (a request's last entry is spare).
    * ``noise[row]`` ``[R, V]``: independent ``Exp(1)`` numbers, meant for a token drawn at that
      row. For weights ``w >= 0`` over the vocabulary with a positive sum,
      ``argmax(w / noise[row])`` is token ``x`` with probability ``w[x] / w.sum()`` (the
      exponential race of minivllm's sampler; the notebook measures it). A value may be an
      exact 0 (some devices' generators emit one now and then).

    What the result must satisfy (the checks test each):

    1. **Shape.** A list of ``n`` lists of Python ints, request by request; request ``r``'s is
       ``draft_tokens[r][:a] + [t]`` for some ``0 <= a <= k_r``: ``a`` drafts kept, then one
       token more.
    2. **Exactness.** For every request, whatever its drafts are (drawn from any ``q``, or fixed
       guesses), the emitted tokens are distributed as the target alone would sample them, one at
       a time: the first emitted token as ``p_0``; a second one (here, or as the first of the next
       step) as the target's row that follows the first, and so on. In particular no token is ever
       emitted from a row that gives it probability 0, whatever the random numbers and whatever
       rounding does to the arithmetic. A request's result depends on its own rows alone.
    3. **Optimality.** Drafts are kept as often as exactness allows: for every request the law of
       ``a`` must be the best any exact verifier can reach for its distributions (the checks
       compare it with that best law). Finding how often that is, and a rule that reaches it, is
       part of the exercise.
    4. **Determinism.** The result is a function of the arguments alone (no random numbers of
       your own), and the arguments are left unchanged. ``ValueError`` unless ``target_probs`` is
       ``[R, V]`` for the ``R`` that ``draft_tokens`` needs, ``uniforms`` ``[R]``, and ``noise``
       and ``draft_probs`` (when given) the shape of ``target_probs``.
    5. **Work.** The number of tensor operations does not grow with the step: at most **60
       tensor operations** and at most **3 transfers** of values to the host per call, for a step
       of 2 requests as for one of 300 requests with 0 to 4 drafts each (the checks count both).
       An operation is one PyTorch operation that computes or copies values (views, and tensors
       built from Python lists, are free), as ``minivllm.course.work.count_work`` counts them; a
       transfer is a call of ``.tolist()``, ``.item()``, ``.numpy()``, or ``int()``, ``float()``,
       ``bool()`` of a tensor. A Python loop over the requests that assembles the lists from
       values already on the host is fine; a loop that runs a tensor operation, or reads a
       tensor, per request or per row is not.

    Worked example (``V = 4``; three requests with 2, 0 and 1 drafts, ``R = 6``; the same result
    for any ``uniforms`` and ``noise``)::

        target_probs = [[0.1, 0.6, 0.3, 0.0],     # request 0
                        [0.2, 0.2, 0.1, 0.5],
                        [0.0, 0.0, 1.0, 0.0],
                        [0.0, 0.0, 0.0, 1.0],     # request 1
                        [0.0, 0.0, 1.0, 0.0],     # request 2
                        [0.3, 0.3, 0.2, 0.2]]
        draft_tokens = [[1, 3], [], [0]]
        draft_probs  = [[0.2, 0.5, 0.2, 0.1],
                        [0.25, 0.25, 0.25, 0.25],
                        [0.0, 0.0, 0.0, 0.0],
                        [0.0, 0.0, 0.0, 0.0],
                        [0.7, 0.1, 0.1, 0.1],
                        [0.0, 0.0, 0.0, 0.0]]
        -> [[1, 3, 2], [3], [2]]
    """
    raise NotImplementedError("ex11 verify_step: The tokens every request of a speculative step emits: a prefix of its drafts, then one more. Yours to write; stuck? course.hint('ex11') (notebooks/11_the_2026_stack.ipynb)")
