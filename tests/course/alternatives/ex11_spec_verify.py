"""Exercise 11: the verifier of speculative decoding -- a whole step's drafts at once, the target's distribution kept.

(An alternative correct answer, for tests/course/test_alternatives.py: a draft is kept when
``(1 - u) * q(d) <= p(d)``, a guess being a draw from the point mass on ``d``; the rows are laid
out as a ``[requests, k_max + 1]`` grid and a cumulative product finds each request's end;
the token is drawn only at the rows where steps end, as ``argmin(noise / w)``.)

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


def _check_shapes(target_probs, uniforms, noise, draft_probs, num_rows: int, draft_tokens) -> None:
    if target_probs.dim() != 2 or target_probs.shape[0] != num_rows:
        raise ValueError(f"target_probs must be [R, V] with R = {num_rows} rows for drafts of lengths "
                         f"{[len(d) for d in draft_tokens]}; got shape {tuple(target_probs.shape)}")
    if tuple(uniforms.shape) != (num_rows,):
        raise ValueError(f"uniforms must have shape ({num_rows},), got {tuple(uniforms.shape)}")
    for name, other in (("noise", noise), ("draft_probs", draft_probs)):
        if other is not None and other.shape != target_probs.shape:
            raise ValueError(f"{name} must have the shape of target_probs, "
                             f"{tuple(target_probs.shape)}; got {tuple(other.shape)}")


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
    sizes = [len(drafts) for drafts in draft_tokens]
    num_rows = sum(sizes) + len(sizes)
    _check_shapes(target_probs, uniforms, noise, draft_probs, num_rows, draft_tokens)
    if not sizes:
        return []
    device = target_probs.device
    # Host bookkeeping. Rows are laid out as a grid [requests, k_max + 1]: cell (r, i) is request
    # r's row i, and cells beyond a request's last row repeat that last row (masked out below).
    width = max(sizes) + 1
    offsets, proposal, grid, is_draft_cell = [], [], [], []
    for drafts, k in zip(draft_tokens, sizes, strict=True):
        base = len(proposal)
        offsets.append(base)
        proposal += [int(t) for t in drafts]
        proposal.append(0)  # the last row proposes nothing; any valid id will do as a placeholder
        grid.append([base + min(i, k) for i in range(width)])
        is_draft_cell.append([i < k for i in range(width)])
    tokens = torch.tensor(proposal, dtype=torch.long, device=device)
    cells = torch.tensor(grid, dtype=torch.long, device=device)
    draft_cell = torch.tensor(is_draft_cell, dtype=torch.bool, device=device)
    first_row = torch.tensor(offsets, dtype=torch.long, device=device)
    num_drafts = torch.tensor(sizes, dtype=torch.long, device=device)

    # One test for every row: keep draft d when (1 - u) * q(d) <= p(d), which happens with
    # probability min(1, p(d) / q(d)). A guess is a draw from the point mass on d: q(d) = 1.
    p_of_draft = target_probs.gather(1, tokens[:, None]).squeeze(1)
    complement = 1.0 - uniforms
    if draft_probs is None:
        passes = complement <= p_of_draft
    else:
        passes = complement * draft_probs.gather(1, tokens[:, None]).squeeze(1) <= p_of_draft
    # A request keeps its drafts up to its first failed test: the run of ones in its grid row.
    survive = (passes[cells] & draft_cell).to(torch.long).cumprod(dim=1)
    num_kept = survive.sum(dim=1)
    final = first_row + num_kept  # the row each request's step ends at

    # Draw one token per request, at that row only. After a rejection the draw is from what the
    # target wants beyond what the draft already offered, p - min(p, q); with no rejection (all
    # drafts kept) from p itself. If rounding leaves nothing beyond, p stands in.
    p_end = target_probs[final]
    if draft_probs is None:
        q_end = torch.nn.functional.one_hot(tokens[final], p_end.shape[1]).to(p_end.dtype)
    else:
        q_end = draft_probs[final]
    beyond = p_end - torch.minimum(p_end, q_end)
    rejected = (num_kept < num_drafts)[:, None] & (beyond.sum(dim=1, keepdim=True) > 0)
    weights = torch.where(rejected, beyond, p_end)
    # the race, run as argmin(noise / w): a token of weight 0 gets +inf and never wins
    arrival = torch.where(weights > 0, noise[final] / weights, torch.inf)
    winner = arrival.argmin(dim=1)
    kept_counts, picked = torch.stack((num_kept, winner)).tolist()
    out: list[list[int]] = []
    for drafts, a, token in zip(draft_tokens, kept_counts, picked, strict=True):
        out.append([int(t) for t in drafts[:a]] + [token])
    return out
