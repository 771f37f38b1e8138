"""Exercise 03: plan one step's tokens under a budget, cutting long prompts into chunks.

Notebook: notebooks/03_chunked_prefill.ipynb. Check your work with
``course.check(course.load("ex03_chunked_prefill"))`` there, or ``pytest -m ex03``.

With chunked prefill a request does not need its whole prompt computed in one step. Every
step has a token budget; decodes take one token each, and whatever budget is left goes to
prompts, a slice at a time. The check compares your plans with the decisions of minivllm's
real ``Scheduler`` (chunked prefill on) on random traces, and with hand-made edge cases.
"""

from __future__ import annotations

NOTEBOOK = "notebooks/03_chunked_prefill.ipynb"


def split_into_chunks(num_tokens: int, chunk_size: int) -> list[int]:
    """Cut a prompt of ``num_tokens`` tokens into chunks of at most ``chunk_size``, front to
    back: ``split_into_chunks(10, 4) == [4, 4, 2]``. Zero tokens give ``[]``. Raise
    ``ValueError`` if ``chunk_size < 1``."""
    # HINT: full chunks first, then the remainder if there is one.
    # BEGIN SOLUTION
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    full, rest = divmod(num_tokens, chunk_size)
    return [chunk_size] * full + ([rest] if rest else [])
    # END SOLUTION


def plan_step(
    running: list[tuple[str, int]],
    waiting: list[tuple[str, int]],
    token_budget: int,
    max_num_seqs: int,
    chunk_size: int | None = None,
) -> list[tuple[str, int]]:
    """Decide how many tokens each request computes in this step.

    ``running``: ``(request_id, tokens_left)`` for requests already in the batch, oldest
    first. ``tokens_left`` is 1 for a request that is decoding and the uncomputed rest of the
    prompt for one whose prefill is still in progress.
    ``waiting``: ``(request_id, prompt_len)`` in arrival order.

    Rules (vLLM's): running requests first, in order, each getting
    ``min(tokens_left, budget_left, chunk_size)`` tokens; then waiting requests in order,
    each admitted while budget is left and the batch has fewer than ``max_num_seqs``
    requests (running ones count), getting ``min(prompt_len, budget_left, chunk_size)``.
    ``chunk_size=None`` means no cap beyond the budget. Stop as soon as the budget is spent.

    Returns ``[(request_id, num_tokens), ...]`` in that order, only for requests that got at
    least one token.
    """
    # HINT: keep budget_left; one loop over running, then one over waiting that also checks
    #   the seat count (len(running) + number admitted so far < max_num_seqs).
    # BEGIN SOLUTION
    cap = chunk_size if chunk_size is not None else token_budget
    budget = token_budget
    plan = []
    for rid, left in running:
        if budget <= 0:
            break
        n = min(left, budget, cap)
        plan.append((rid, n))
        budget -= n
    seats = len(running)
    for rid, prompt_len in waiting:
        if budget <= 0 or seats >= max_num_seqs:
            break
        n = min(prompt_len, budget, cap)
        plan.append((rid, n))
        budget -= n
        seats += 1
    return plan
    # END SOLUTION


def steps_to_first_token(prompt_len: int, token_budget: int, num_decoding: int) -> int | None:
    """How many steps a newly admitted prompt of ``prompt_len`` tokens needs before its first
    output token, when ``num_decoding`` other requests decode every step (each taking one
    token of the budget first) and the prompt gets the rest of the budget.

    The first token is sampled in the step that computes the prompt's last chunk. Return
    ``None`` if the decodes leave no budget for the prompt at all.
    """
    # HINT: per step the prompt gets token_budget - num_decoding tokens; ceil-divide.
    # BEGIN SOLUTION
    per_step = token_budget - num_decoding
    if per_step <= 0:
        return None
    return -(-prompt_len // per_step)
    # END SOLUTION
