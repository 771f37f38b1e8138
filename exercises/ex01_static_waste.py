# This file is generated from solutions/ex01_static_waste.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex01` or `pytest -m ex01`. Stuck? `course.hint("ex01")` in the
# notebook (or `minivllm hint ex01`) gives a hint, one at a time.
"""Exercise 01: the books of a static batcher, over a whole trace.

Notebook: notebooks/01_static_batching.ipynb. Check your work with
``course.check(course.load("ex01_static_waste"))`` there, or ``pytest -m ex01``.

minivllm's ``StaticBatchScheduler`` (``LLM(scheduler="static")``) serves requests the way a
training loop would: it takes the next ``batch_size`` requests, computes all their prompts in
one forward pass -- each prompt padded with filler tokens to the longest prompt of *its*
batch -- and that pass gives every member its first output token; then it decodes the batch in
lock step, one row per member per step, until the member with the longest response has all its
tokens. A member that is done keeps its seat: its row is still computed, and thrown away. Only
then does the next batch start. The KV cache is assumed large enough for every batch.

You predict, from the lengths alone, what that costs: how many forward passes, and how many
rows of them do what. A *row* is one token position of one sequence in one forward pass; the
checks compare your books with what minivllm's static scheduler really computes.
"""

from __future__ import annotations

from dataclasses import dataclass

NOTEBOOK = "notebooks/01_static_batching.ipynb"


@dataclass
class StaticAccount:
    """Rows computed by a static batcher, by what they were for."""

    num_steps: int = 0  # forward passes, prefill and decode
    prompt_rows: int = 0  # rows of real prompt tokens (in prefill passes)
    padding_rows: int = 0  # rows of filler tokens that pad prompts (in prefill passes)
    decode_rows: int = 0  # rows that produce a wanted token in decode passes
    idle_rows: int = 0  # rows of members that are already done (in decode passes)

    @property
    def total_rows(self) -> int:
        return self.prompt_rows + self.padding_rows + self.decode_rows + self.idle_rows


def account_static(prompt_lens: list[int], output_lens: list[int], batch_size: int) -> StaticAccount:
    """The :class:`StaticAccount` of serving requests ``0, 1, 2, ...`` (prompt ``prompt_lens[i]``
    tokens, response ``output_lens[i]`` tokens) with static batches of up to ``batch_size``.

    An empty trace costs nothing. Raise ``ValueError`` (naming the value) for ``batch_size < 1``,
    lists of different lengths, a prompt shorter than one token, or a response shorter than one.
    """
    raise NotImplementedError("ex01 account_static: What it must do is in its docstring. Yours to write; stuck? course.hint('ex01') (notebooks/01_static_batching.ipynb)")
