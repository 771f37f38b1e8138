# This file is generated from solutions/ex01_static_waste.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex01` or `pytest -m ex01`.
"""Exercise 01: what static batching throws away.

Notebook: notebooks/01_static_batching.ipynb. Check your work with
``course.check(course.load("ex01_static_waste"))`` there, or ``pytest -m ex01``.

A static batch pads every prompt to the longest one and then decodes in lock step until the
longest response is done. Both habits burn compute on tokens nobody asked for. These three
functions put numbers on that waste; they take plain lists of lengths (in tokens).
"""

from __future__ import annotations

NOTEBOOK = "notebooks/01_static_batching.ipynb"


def padded_prefill_fraction(prompt_lens: list[int]) -> float:
    """Fraction of a padded prefill's token positions that hold a real prompt token.

    The batch computes ``len(prompt_lens) * max(prompt_lens)`` positions; only
    ``sum(prompt_lens)`` of them are real. Raise ``ValueError`` for an empty batch or a prompt
    shorter than one token.
    """
    # HINT: real tokens / (batch size x longest prompt). Check the inputs first.
    raise NotImplementedError('ex01 padded_prefill_fraction: real tokens / (batch size x longest prompt). Check the inputs first. (see notebooks/01_static_batching.ipynb)')


def idle_slot_steps(output_lens: list[int]) -> int:
    """Slot-steps a lock-step decode spends on requests that have already finished.

    Every member of the batch keeps its seat until the longest response is done, and a
    finished member's seat is computed (and thrown away) at every step. ``output_lens[i]`` is
    how many tokens request ``i`` generates. An empty batch wastes nothing.
    """
    # HINT: request i sits idle for (longest response - its own response) steps; add them up.
    #   max() of an empty list fails: handle it.
    raise NotImplementedError('ex01 idle_slot_steps: request i sits idle for (longest response - its own response) steps; add them up. max() of an empty list fails: handle it. (see notebooks/01_static_batching.ipynb)')


def static_batch_efficiency(output_lens: list[int], batch_size: int) -> float:
    """Fraction of decode slot-steps that produce a wanted token when a whole trace is served
    by static batching: ``B_eff / B``.

    Requests are served in order, ``batch_size`` at a time (the last batch may be smaller).
    Each batch runs for as many steps as its longest response and occupies all
    ``batch_size`` seats of the server for that long, whether the seats are filled or not.
    Raise ``ValueError`` for an empty trace or ``batch_size < 1``.
    """
    # HINT: wanted tokens = sum(output_lens). Seat-steps paid = batch_size x the sum, over the
    #   consecutive batches, of each batch's longest response.
    raise NotImplementedError("ex01 static_batch_efficiency: wanted tokens = sum(output_lens). Seat-steps paid = batch_size x the sum, over the consecutive batches, of each batch's longest response. (see notebooks/01_static_batching.ipynb)")
