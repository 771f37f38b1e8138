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

Part (b), scheduling. You design a scheduling policy, :class:`ChatFirstPolicy`, for a server
where chat users and reasoning requests share one GPU and nobody marks which is which. It plugs
into minivllm's scheduler (``LLM(scheduling_policy=ChatFirstPolicy())``,
``Simulator(..., scheduling_policy=...)``) through the three questions of
:class:`minivllm.core.policies.SchedulingPolicy`. It is graded by what it achieves: the chat
latency percentiles it reaches on a simulated H100 against the targets stated in the notebook
(section 7), the reasoning throughput it keeps, and the tokens it serves on the tiny model. Any
design that meets them passes.
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
    """A scheduling policy that keeps chat fast while reasoning requests share the GPU.

    **The contract** (minivllm's :class:`~minivllm.core.policies.SchedulingPolicy`; the
    scheduler calls these, nothing else):

    * ``name``: a non-empty string; ``ChatFirstPolicy()`` needs no arguments.
    * ``waiting_key(request) -> tuple``: the waiting queue is a heap of these keys, smallest
      admitted first, ties in the order requests joined it. A key is computed when the request
      joins the queue (on arrival, and again each time it is preempted) and never updated.
    * ``choose_victim(running) -> Request``: when a running request cannot grow, one of
      ``running`` (non-empty, in admission order; do not change the list) gives all its KV
      blocks back and goes back to the waiting queue, to be recomputed from its prompt.
    * ``may_preempt(incoming, victim) -> bool``: a waiting request that does not fit asks
      whether it may take the place of the victim your ``choose_victim`` named.

    **What a policy may read** (the checks pass views that have nothing else):
    ``request.priority`` (set by the client, 0 unless it says; lower is more important),
    ``request.arrival_time``, ``request.sampling_params`` (``max_tokens`` is the client's
    budget, the most the request may generate, not its length: the answer may end well before
    it; ``None`` means no limit), ``request.num_prompt_tokens``,
    ``request.num_computed_tokens``. Requests are compared by identity (``is``).

    **Rules:**

    1. A client's priority comes first: a request with a smaller ``priority`` is admitted before
       any with a larger one; a running request is not the victim while one with a larger
       ``priority`` runs; and a request never pushes out one with a smaller ``priority``.
    2. The targets of the notebook's section 7, on its simulated trace where every priority is 0.
    3. Deterministic; no two requests may each push the other out (they would take turns
       evicting each other, and the scheduler would loop); every request of the traces finishes.

    **One worked example.** FCFS, the built-in default, meets rules 1 (trivially, priorities
    equal) and 3 but not 2: ``waiting_key`` is ``(arrival_time,)``, the victim is
    ``running[-1]``, and ``may_preempt`` is always ``False``; on the section 7 trace its chat
    p99 time to first token is over a minute.
    """

    name = "chat-first"

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
