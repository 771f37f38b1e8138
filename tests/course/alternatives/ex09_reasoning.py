"""Exercise 09: reasoning models -- how many long sequences fit, and a policy that keeps chat fast.

(An alternative correct answer, for tests/course/test_alternatives.py: the bytes per token are
counted in bits first; the pool's whole blocks come from ``divmod``. The policy tells chat from
reasoning by the KV footprint a request may grow to -- its prompt plus its budget -- and its
victim is, among the least important running class, the one with the least work to redo.)

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
    vector_bits = model.head_dim * DTYPE_BITS[model.kv_dtype]  # one head's K (or V) vector
    layer_bits = vector_bits * model.num_kv_heads * 2  # K and V of every KV head
    return layer_bits * model.num_layers / 8


def max_concurrent_sequences(model, kv_memory_bytes: float, seq_len: int, block_size: int = 16) -> int:
    """How many sequences of ``seq_len`` tokens each (prompt and generated tokens together) can
    hold their K/V at the same time in a paged KV cache of ``kv_memory_bytes`` bytes.

    The pool is cut into whole blocks of ``block_size`` tokens (bytes left over after the last
    whole block are unusable), and every sequence holds whole blocks of its own (no prefix
    sharing). Raise ``ValueError`` for ``seq_len < 1``, ``block_size < 1`` or negative memory.
    """
    problems = [what for what, bad in (("seq_len < 1", seq_len < 1), ("block_size < 1", block_size < 1),
                                       ("negative kv_memory_bytes", kv_memory_bytes < 0)) if bad]
    if problems:
        raise ValueError(f"max_concurrent_sequences: {', '.join(problems)} (seq_len={seq_len}, "
                         f"block_size={block_size}, kv_memory_bytes={kv_memory_bytes})")
    whole_blocks, _unusable = divmod(kv_memory_bytes, block_size * kv_bytes_per_token(model))
    per_sequence, partial = divmod(seq_len, block_size)
    if partial:
        per_sequence += 1  # a partly filled last block is a whole block of its own
    return int(whole_blocks) // per_sequence


# --- (b) a scheduling policy that keeps chat fast while reasoning runs -------------------------
# A request that may grow past this many tokens of KV (its prompt plus its budget) is treated as
# a long one. Chat clients send prompts of at most a couple of thousand tokens and budgets of at
# most 2,048; reasoning clients budget tens of thousands of tokens.
_LONG_FOOTPRINT = 8192


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

    @staticmethod
    def _class_of(request: Request) -> tuple[int, int]:
        """(the client's priority, 0 for a short request or 1 for a long one): what decides who
        goes first and who may push out whom."""
        budget = request.sampling_params.max_tokens
        if budget is None:
            return request.priority, 1
        return request.priority, 0 if request.num_prompt_tokens + budget <= _LONG_FOOTPRINT else 1

    def waiting_key(self, request: Request) -> tuple:
        """Sort key of the waiting queue: the smallest key is admitted first."""
        priority, long = self._class_of(request)
        return priority, long, request.arrival_time

    def choose_victim(self, running: list[Request]) -> Request:
        """The running request that gives its KV blocks back (``running`` is non-empty, in
        admission order; do not reorder it: it is the scheduler's own list)."""
        worst = None
        worst_rank = None
        for request in running:  # a scan: the scheduler's list stays as it is
            # the least important class first; in it, the least work thrown away, then the latest
            rank = (*self._class_of(request), -request.num_computed_tokens, request.arrival_time)
            if worst_rank is None or rank > worst_rank:
                worst, worst_rank = request, rank
        return worst

    def may_preempt(self, incoming: Request, victim: Request) -> bool:
        """May the waiting ``incoming`` request, which does not fit, take ``victim``'s place?"""
        # a strict order between classes only, so that two requests never evict each other in turn
        return self._class_of(incoming) < self._class_of(victim)
