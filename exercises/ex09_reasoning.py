# This file is generated from solutions/ex09_reasoning.py by `minivllm course make-exercises`.
# It is yours: replace each `raise NotImplementedError(...)` with your code, then run
# `minivllm grade ex09` or `pytest -m ex09`. Stuck? `course.hint("ex09")` in the
# notebook (or `minivllm hint ex09`) gives a hint, one at a time.
"""Exercise 09: reasoning models -- how many long sequences fit, and a policy that keeps chat fast.

Notebook: notebooks/09_reasoning_models.ipynb. Check your work with
``course.check(course.load("ex09_reasoning"))`` there, or ``pytest -m ex09``.

Part (a), memory. Every token a sequence holds keeps its keys and values in the KV cache, in
every layer. A 30,000-token reasoning chain holds sixty times what a 500-token chat answer
holds, so far fewer of them run at once. You compute the bytes per token from the model's shape
and the KV cache's number format, and how many sequences of a given length fit in a pool of
blocks. The functions take a :class:`minivllm.sim.ModelSpec` but may read only the attributes in
``MODEL_ATTRIBUTES`` (the checks pass objects that have nothing else).

Part (b), scheduling. A :class:`ChatFirstPolicy` plugs into minivllm's scheduler
(``LLM(scheduling_policy=ChatFirstPolicy())``, ``Simulator(..., scheduling_policy=...)``): it
orders the waiting queue, picks who gives memory back when the KV cache is full, and decides
whether a waiting request may push a running one out. The checks run it on a simulated H100
against first-come-first-served and on the tiny model against minivllm's own tokens.
"""

from __future__ import annotations

from minivllm.request import Request
from minivllm.sim.model_spec import DTYPE_BITS

NOTEBOOK = "notebooks/09_reasoning_models.ipynb"

# What a model description offers (a ModelSpec has more; the checks pass only these):
MODEL_ATTRIBUTES = (
    "name",
    "num_layers",  # decoder layers, each with its own K and V
    "num_kv_heads",  # K/V heads per layer (GQA: fewer than the query heads)
    "head_dim",  # elements per head vector
    "kv_dtype",  # the KV cache's number format: a key of DTYPE_BITS ("bf16", "int8", "int4", ...)
)

# A request that may generate more tokens than this is treated as a reasoning request. ShareGPT
# chat answers are clipped at 2,048 tokens in minivllm.workloads; reasoning chains run to 30k.
LONG_OUTPUT_TOKENS = 2048


# --- (a) concurrency limits from memory --------------------------------------------------------
def kv_bytes_per_token(model) -> float:
    """Bytes of KV cache one token occupies: a key vector and a value vector of ``head_dim``
    elements for every KV head of every layer, each element stored in ``model.kv_dtype``
    (``DTYPE_BITS[model.kv_dtype]`` bits; int4 is half a byte). Quantisation scales are
    ignored (a few bytes per head)."""
    raise NotImplementedError("ex09 kv_bytes_per_token: What it must do is in its docstring. Yours to write; stuck? course.hint('ex09') (notebooks/09_reasoning_models.ipynb)")


def max_concurrent_sequences(model, kv_memory_bytes: float, seq_len: int, block_size: int = 16) -> int:
    """How many sequences of ``seq_len`` tokens each (prompt and generated tokens together) can
    hold their K/V at the same time in a paged KV cache of ``kv_memory_bytes`` bytes.

    The pool is cut into whole blocks of ``block_size`` tokens (bytes left over after the last
    whole block are unusable), and every sequence holds whole blocks of its own (no prefix
    sharing). Raise ``ValueError`` for ``seq_len < 1``, ``block_size < 1`` or negative memory.
    """
    raise NotImplementedError("ex09 max_concurrent_sequences: What it must do is in its docstring. Yours to write; stuck? course.hint('ex09') (notebooks/09_reasoning_models.ipynb)")


# --- (b) a scheduling policy that keeps chat fast while reasoning runs -------------------------
class ChatFirstPolicy:
    """Chat before reasoning, recognised by the length a request may run to.

    **How a request is recognised.** A request's *rank* is ``(priority, long)``, smaller is
    more important: first the priority the client set (lower first, as in vLLM), then
    ``long = 1`` if it may generate more than ``long_output_tokens`` tokens
    (``request.sampling_params.max_tokens``; ``None``, no limit, counts as long), else 0.
    Why ``max_tokens``: it is known the moment the request arrives, it bounds the KV memory
    the request can grow to and how long it holds a seat, which is exactly what hurts the
    others; a client need not say anything. A prompt's length tells nothing here (reasoning
    prompts are chat-sized; a long document with a short answer leaves quickly). The explicit
    priority still comes first, so an operator can override the split.

    * ``waiting_key``: most important rank first; within a rank, first come first served.
    * ``choose_victim``: when memory runs out, the running request that would be admitted
      last: the least important rank, and within it the latest arrival (it has waited least
      and usually computed least, so recomputing it later wastes least).
    * ``may_preempt``: a waiting request may push out a running one only if its rank is
      strictly more important. Never within a rank: that would only swap who waits, pay for a
      recompute, and let two requests take turns evicting each other.
    """

    name = "chat-first"

    def __init__(self, long_output_tokens: int = LONG_OUTPUT_TOKENS):
        if not isinstance(long_output_tokens, int) or long_output_tokens < 1:
            raise ValueError(f"long_output_tokens must be an integer >= 1, got {long_output_tokens!r}")
        self.long_output_tokens = long_output_tokens

    def rank(self, request: Request) -> tuple[int, int]:
        """``(request.priority, 1 if the request may run long else 0)``."""
        raise NotImplementedError("ex09 ChatFirstPolicy.rank: ``(request.priority, 1 if the request may run long else 0)``. Yours to write; stuck? course.hint('ex09') (notebooks/09_reasoning_models.ipynb)")

    def waiting_key(self, request: Request) -> tuple:
        """Sort key of the waiting queue: the smallest key is admitted first."""
        raise NotImplementedError("ex09 ChatFirstPolicy.waiting_key: Sort key of the waiting queue: the smallest key is admitted first. Yours to write; stuck? course.hint('ex09') (notebooks/09_reasoning_models.ipynb)")

    def choose_victim(self, running: list[Request]) -> Request:
        """The running request that gives its KV blocks back (``running`` is non-empty, in
        admission order; do not reorder it: it is the scheduler's own list)."""
        raise NotImplementedError("ex09 ChatFirstPolicy.choose_victim: What it must do is in its docstring. Yours to write; stuck? course.hint('ex09') (notebooks/09_reasoning_models.ipynb)")

    def may_preempt(self, incoming: Request, victim: Request) -> bool:
        """May the waiting ``incoming`` request, which does not fit, take ``victim``'s place?"""
        raise NotImplementedError("ex09 ChatFirstPolicy.may_preempt: May the waiting ``incoming`` request, which does not fit, take ``victim``'s place? Yours to write; stuck? course.hint('ex09') (notebooks/09_reasoning_models.ipynb)")
