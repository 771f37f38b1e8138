"""Per-step and per-request measurements, shared by the engine and the simulator."""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass
class EngineStats:
    steps: list[StepStats] = field(default_factory=list)
    requests: dict[str, RequestMetrics] = field(default_factory=dict)
    prefix_hit_rate: float = 0.0
    prefill_tokens_skipped: int = 0  # prefix-cache hits + prompts shared by forking

    def record_step(self, scheduler, out, start: float, duration: float) -> StepStats:
        """Append what one step did (``out``: its ``SchedulerOutput``), read off the scheduler
        and its KV manager right after the step. The engine and the simulator both call this."""
        kv = scheduler.kv
        stats = StepStats(
            step=len(self.steps),
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
        )
        self.steps.append(stats)
        return stats

    def record_finish(self, request, now: float) -> None:
        """Stamp a finished request's end time and final counts."""
        request.finished_time = now
        m = self.requests[request.request_id]
        m.finished_time = now
        m.num_output_tokens = request.num_output_tokens
        m.num_preemptions = request.num_preemptions

    def column(self, name: str) -> list:
        """One field of every step, for plotting: ``stats.column("num_running")``."""
        return [getattr(s, name) for s in self.steps]

    def summary(self) -> dict[str, float]:
        steps = self.steps
        total_time = sum(s.duration for s in steps)
        decode = sum(s.num_decode_tokens for s in steps)
        prefill = sum(s.num_prefill_tokens for s in steps)
        padding = sum(s.num_padding_tokens for s in steps)
        reserved = sum(s.slots_reserved for s in steps)
        stored = sum(s.tokens_stored for s in steps)
        out_tokens = sum(m.num_output_tokens for m in self.requests.values())
        ttfts = [m.ttft for m in self.requests.values() if m.ttft is not None]
        tpots = [m.tpot for m in self.requests.values() if m.tpot is not None]
        e2e = [m.e2e_latency for m in self.requests.values() if m.e2e_latency is not None]
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        return {
            "num_steps": len(steps),
            "total_time_s": total_time,
            "output_tokens": out_tokens,
            "output_tokens_per_s": out_tokens / total_time if total_time else float("nan"),
            "prefill_tokens": prefill,
            "decode_tokens": decode,
            "padding_tokens": padding,
            "mean_batch_seqs": mean([s.num_batched_seqs for s in steps]),
            "mean_kv_utilization": stored / reserved if reserved else float("nan"),
            "preemptions": sum(s.num_preemptions for s in steps),
            "mean_ttft_s": mean(ttfts),
            "mean_tpot_s": mean(tpots),
            "mean_e2e_s": mean(e2e),
            "prefix_hit_rate": self.prefix_hit_rate,
            "prefill_tokens_skipped": self.prefill_tokens_skipped,
            "peak_kv_blocks_used": max((s.kv_blocks_used for s in steps), default=0),
            "peak_kv_blocks_saved_by_sharing": max((s.kv_blocks_saved_by_sharing for s in steps), default=0),
        }
