"""Per-step and per-request measurements, shared by the engine and the simulator."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from minivllm.outputs import RequestMetrics


@dataclass
class StepStats:
    step: int
    start_time: float
    duration: float
    num_running: int  # requests holding a seat after scheduling
    num_waiting: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_padding_tokens: int
    kv_blocks_used: int
    kv_blocks_total: int
    tokens_stored: int  # token K/V entries held for live requests
    slots_reserved: int  # token slots set aside for them
    num_preemptions: int  # this step
    num_batched_seqs: int = 0  # sequences in this step's forward pass
    kv_blocks_referenced: int = 0  # sum of block-table lengths (> used when blocks are shared)
    num_cow_copies: int = 0  # blocks copied before this step (copy-on-write)
    # the prefix cache, over the requests scheduled for the first time in this step: their
    # tokens (what the cache was asked for) and those already in the cache (not computed)
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_forked_tokens: int = 0  # tokens siblings forked in this step share instead of computing
    # speculative decoding: draft tokens this step verified, and those the target accepted
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_spec_seqs: int = 0  # sequences that verified at least one draft

    @property
    def kv_blocks_saved_by_sharing(self) -> int:
        return max(self.kv_blocks_referenced - self.kv_blocks_used, 0)

    @property
    def kv_utilization(self) -> float:
        """Tokens stored / token slots reserved (1.0 = no slot wasted)."""
        return self.tokens_stored / self.slots_reserved if self.slots_reserved else 0.0

    @property
    def batch_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_padding_tokens


class EngineStats:
    """Statistics of an engine (or a simulator) run: per-step and per-request.

    ``steps`` keeps (at least) the most recent ``window`` steps and ``requests`` the
    :class:`~minivllm.outputs.RequestMetrics` of the most recent ``window`` finished requests,
    so a long-running server uses bounded memory (``window=None`` keeps everything). A
    request's times live on the request itself until it finishes (the engine core stamps them
    there); :meth:`record_finish` then reads them off it. :meth:`summary` reads running totals,
    so it covers the whole run whatever the window.
    """

    def __init__(self, window: int | None = 100_000, steps: list[StepStats] | None = None):
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 or None, got {window}")
        self.window = window
        self.reset()
        for step in steps or ():  # statistics assembled by hand (tests, notebooks)
            self.add_step(step)

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self.steps: list[StepStats] = []
        self.requests: dict[str, RequestMetrics] = {}
        self._finished_order: deque[str] = deque()
        self.num_steps = 0
        self._totals = dict.fromkeys(_STEP_TOTALS, 0)
        self._peaks = dict.fromkeys(("kv_blocks_used", "kv_blocks_saved_by_sharing"), 0)
        self._req_totals = dict.fromkeys(("output_tokens", "ttft", "n_ttft", "tpot", "n_tpot", "e2e", "n_e2e"), 0.0)

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens found in the prefix cache / prompt tokens looked up, over the run."""
        queries = self._totals["prefix_cache_queries"]
        return self._totals["prefix_cache_hits"] / queries if queries else 0.0

    @property
    def prefill_tokens_skipped(self) -> int:
        """Prompt tokens never computed: prefix-cache hits plus prompts shared by forking."""
        return self._totals["prefix_cache_hits"] + self._totals["num_forked_tokens"]

    # --- requests --------------------------------------------------------------------------
    def record_finish(self, request) -> RequestMetrics:
        """Keep a finished request's times and counts (read off ``request``, whose
        ``finished_time`` is stamped: ``EngineCore.record_finish`` does both) and add them to
        the totals. The engine core records each request once, when it ends."""
        if request.finished_time is None:
            raise ValueError(f"request {request.request_id!r} has no finished_time: stamp it before recording it")
        rid = request.request_id
        m = self.requests[rid] = RequestMetrics.from_request(request)
        t = self._req_totals
        t["output_tokens"] += m.num_output_tokens
        for key, value in (("ttft", m.ttft), ("tpot", m.tpot), ("e2e", m.e2e_latency)):
            if value is not None:
                t[key] += value
                t["n_" + key] += 1
        self._finished_order.append(rid)
        if self.window is not None:
            while len(self._finished_order) > self.window:
                self.requests.pop(self._finished_order.popleft(), None)
        return m

    # --- steps -----------------------------------------------------------------------------
    def record_step(
        self, scheduler, out, start: float, duration: float, *, prefix_cache_queries: int = 0,
        prefix_cache_hits: int = 0, num_forked_tokens: int = 0, num_draft_tokens: int = 0,
        num_accepted_tokens: int = 0,
    ) -> StepStats:
        """Record what one step did (``out``: its ``SchedulerOutput``), read off the scheduler
        and its KV manager right after the step; the prefix-cache figures come from the engine
        core, which reads them off the step's plan."""
        kv = scheduler.kv
        stats = StepStats(
            step=self.num_steps,
            start_time=start,
            duration=duration,
            num_running=len(scheduler.running),
            num_waiting=scheduler.num_waiting,
            num_prefill_tokens=out.num_prefill_tokens,
            num_decode_tokens=out.num_decode_tokens,
            num_padding_tokens=out.num_padding_tokens,
            kv_blocks_used=kv.num_used_blocks,
            kv_blocks_total=kv.num_blocks,
            tokens_stored=sum(r.num_computed_tokens for r in scheduler.live_requests()),
            slots_reserved=kv.num_reserved_slots,
            num_preemptions=len(out.preempted),
            num_batched_seqs=len(out.requests),
            kv_blocks_referenced=kv.num_referenced_blocks,
            num_cow_copies=len(out.blocks_to_copy),
            prefix_cache_queries=prefix_cache_queries,
            prefix_cache_hits=prefix_cache_hits,
            num_forked_tokens=num_forked_tokens,
            num_draft_tokens=num_draft_tokens,
            num_accepted_tokens=num_accepted_tokens,
            num_spec_seqs=len(out.spec_token_ids),
        )
        self.add_step(stats)
        return stats

    def add_step(self, stats: StepStats) -> None:
        """Keep one step's figures and add them to the running totals."""
        steps = self.steps
        steps.append(stats)
        if self.window is not None and len(steps) >= 2 * self.window:
            del steps[: len(steps) - self.window]  # trim in batches: amortised O(1) per step
        self.num_steps += 1
        totals = self._totals
        for name in _STEP_TOTALS:
            totals[name] += getattr(stats, name)
        peaks = self._peaks
        peaks["kv_blocks_used"] = max(peaks["kv_blocks_used"], stats.kv_blocks_used)
        saved = stats.kv_blocks_saved_by_sharing
        peaks["kv_blocks_saved_by_sharing"] = max(peaks["kv_blocks_saved_by_sharing"], saved)

    def column(self, name: str) -> list:
        """One field of every kept step, for plotting: ``stats.column("num_running")``."""
        return [getattr(s, name) for s in self.steps]

    def summary(self) -> dict[str, float]:
        """Totals and means over the whole run (the requests' latencies and tokens over the
        requests that finished)."""
        t, r = self._totals, self._req_totals
        total_time = t["duration"]
        out_tokens = int(r["output_tokens"])
        nan = float("nan")
        return {
            "num_steps": self.num_steps,
            "total_time_s": total_time,
            "output_tokens": out_tokens,
            "output_tokens_per_s": out_tokens / total_time if total_time else nan,
            "prefill_tokens": t["num_prefill_tokens"],
            "decode_tokens": t["num_decode_tokens"],
            "padding_tokens": t["num_padding_tokens"],
            "mean_batch_seqs": t["num_batched_seqs"] / self.num_steps if self.num_steps else nan,
            "mean_kv_utilization": (
                t["tokens_stored"] / t["slots_reserved"] if t["slots_reserved"] else nan
            ),
            "preemptions": t["num_preemptions"],
            "mean_ttft_s": r["ttft"] / r["n_ttft"] if r["n_ttft"] else nan,
            "mean_tpot_s": r["tpot"] / r["n_tpot"] if r["n_tpot"] else nan,
            "mean_e2e_s": r["e2e"] / r["n_e2e"] if r["n_e2e"] else nan,
            "prefix_hit_rate": self.prefix_hit_rate,
            "prefix_cache_hits": t["prefix_cache_hits"],
            "prefill_tokens_skipped": self.prefill_tokens_skipped,
            "peak_kv_blocks_used": self._peaks["kv_blocks_used"],
            "peak_kv_blocks_saved_by_sharing": self._peaks["kv_blocks_saved_by_sharing"],
            "output_tokens_per_step": out_tokens / self.num_steps if self.num_steps else nan,
            **self.spec_decoding(),
        }

    def spec_decoding(self) -> dict[str, float]:
        """Speculative decoding over the run: drafts verified and accepted, the acceptance rate
        (accepted / verified), and the mean accepted length (tokens a sequence gains from one
        verification: its accepted drafts plus the token sampled after them)."""
        t = self._totals
        drafts, accepted, seqs = t["num_draft_tokens"], t["num_accepted_tokens"], t["num_spec_seqs"]
        nan = float("nan")
        return {
            "spec_draft_tokens": drafts,
            "spec_accepted_tokens": accepted,
            "spec_acceptance_rate": accepted / drafts if drafts else nan,
            "spec_mean_accepted_length": 1 + accepted / seqs if seqs else nan,
        }


# StepStats fields summed over the run for EngineStats.summary()
_STEP_TOTALS = (
    "duration", "num_prefill_tokens", "num_decode_tokens", "num_padding_tokens", "tokens_stored",
    "slots_reserved", "num_preemptions", "num_batched_seqs", "prefix_cache_queries", "prefix_cache_hits",
    "num_forked_tokens", "num_draft_tokens", "num_accepted_tokens", "num_spec_seqs",
)
