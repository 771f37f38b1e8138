"""The tiny model serving short greedy traces through a chosen attention backend.

Notebooks 05 and 06 serve these traces with the backend written there, next to minivllm's own,
and exercises 05 and 06 grade with the same traces (``minivllm/course/checks``):

* :func:`serve_trace`: four requests on a pool of 8 blocks, with chunked prefill, a prefix-cache
  hit and a preemption, ``debug_checks`` on, optionally on a pool whose every slot holds NaN
  until written (a backend for every step: notebook 05);
* :func:`serve_tiny_model`: three requests whose steps after the second are decode-only (a
  decode kernel: notebook 06).

A backend is any object with ``name`` and ``forward(query, key, value, k_cache, v_cache, meta,
scale)``; ``backend=None`` is minivllm's own.
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.course.harness import TraceRequest, TraceResult, run_trace
from minivllm.course.runtime import one_cpu_thread

STORY = ("Once upon a time there was a little fox who lived in a quiet forest near a river. "
         "Every morning she walked to the water and looked at the fish. One day she saw a big bird "
         "on a rock by the water.")  # 48 tokens
MAX_TOKENS = 16

# --- a backend for every step: chunks, a prefix hit, a preemption --------------------------------
ENGINE_ARGS = dict(dtype="float32", max_model_len=128, max_num_seqs=4, num_kv_blocks=8,
                   max_num_batched_tokens=32)


class NaNUntilWritten:
    """An attention backend around ``inner`` whose caches hold NaN in every slot until written:
    the first time it is handed a layer's cache (that layer's first step, before anything is
    written there) it fills the cache with NaN, then lets ``inner`` write and attend. A backend
    that lets a slot it does not own into a real row's output then yields NaN. It goes through
    the attention protocol alone: the caches are the backend's arguments."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self._seen: set[int] = set()

    def forward(self, query, key, value, k_cache, v_cache, meta, scale):
        if k_cache.data_ptr() not in self._seen:
            self._seen.add(k_cache.data_ptr())
            k_cache.fill_(float("nan"))
            v_cache.fill_(float("nan"))
        return self.inner.forward(query, key, value, k_cache, v_cache, meta, scale)

    def __getattr__(self, name: str):  # the protocol's optional members (check_kv_cache)
        return getattr(self.inner, name)


def make_llm(backend=None, poisoned: bool = False, **engine_args):
    """The tiny model with ``backend`` (``None``: minivllm's own ``"torch"``), ``debug_checks``
    on; ``poisoned``: every slot of every layer's cache NaN until written (:class:`NaNUntilWritten`)."""
    from minivllm import LLM
    from minivllm.attention import get_attention_backend

    if poisoned:
        backend = NaNUntilWritten(get_attention_backend("torch") if backend is None else backend)
    return LLM(attention_backend="torch" if backend is None else backend, debug_checks=True, **engine_args)


def serve_trace(backend=None, poisoned: bool = False) -> TraceResult:
    """Four greedy requests on a pool of 8 blocks of 16 tokens, 32 tokens per step at most.

    ``long`` (44 tokens) is prefilled in two chunks, 32 then 12, the second next to ``short``.
    Before step 3 ``shared`` arrives with the same first 32 tokens plus its own: a prefix-cache
    hit of two blocks, so its first step is a chunk after 32 cached tokens, in a step with
    decodes; ``tom`` arrives with it. The four cannot all fit in 8 blocks: one is preempted and
    recomputed, in blocks another request left behind. ``backend=None``: minivllm's own.
    """
    with one_cpu_thread():
        llm = make_llm(backend, poisoned, **ENGINE_ARGS)
        tokenize = llm.engine.tokenizer.encode
        story = tokenize(STORY)
        trace = [
            TraceRequest("long", story[:44], MAX_TOKENS),
            TraceRequest("short", tokenize("The little fox"), MAX_TOKENS),
            TraceRequest("shared", story[:32] + tokenize(" and then she saw a big bird"), MAX_TOKENS, 3),
            TraceRequest("tom", tokenize("Tom went to the market with his mother and"), MAX_TOKENS, 3),
        ]
        return run_trace(llm, trace)


# --- a decode kernel: decode-only steps ------------------------------------------------------
DECODE_ENGINE_ARGS = dict(dtype="float32", num_kv_blocks=64, max_model_len=256, max_num_seqs=8)


@dataclass
class Served:
    """One request served by the engine."""

    prompt_len: int
    num_cached_tokens: int
    token_ids: list[int]
    text: str


def serve_tiny_model(backend=None, max_tokens: int = MAX_TOKENS) -> dict[str, Served]:
    """Serve three greedy requests and return what each produced, by request id.

    ``boundary`` has a 16-token prompt (exactly one block, so its first decode token opens a
    new block) and ``short`` a 4-token one; both are prefilled in the first step. ``shared``
    then arrives with ``boundary``'s 16 tokens plus more: its first block is a prefix-cache hit.
    The second step mixes the rest of that prompt with two decodes; every later step is
    decode-only, so a backend's decode kernel serves all but the first two steps.
    ``backend=None``: the engine's default backend.
    """
    from minivllm import LLM

    with one_cpu_thread():
        llm = LLM(**DECODE_ENGINE_ARGS) if backend is None else LLM(attention_backend=backend,
                                                                   **DECODE_ENGINE_ARGS)
        tokenize = llm.engine.tokenizer.encode
        story = tokenize(STORY)
        trace = [
            TraceRequest("boundary", story[:16], max_tokens),
            TraceRequest("short", tokenize("The little fox"), max_tokens),
            TraceRequest("shared", story[:16] + tokenize(" and then she saw a bird"), max_tokens, arrival_step=1),
        ]
        run = run_trace(llm, trace)
    return {r.request_id: Served(r.prompt_len, run.cached[r.request_id], run.tokens[r.request_id],
                                 run.texts[r.request_id]) for r in sorted(trace, key=lambda r: r.request_id)}
