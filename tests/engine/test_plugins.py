"""Third-party plug-ins, written here from the protocols alone, serve the tiny model.

Each class below is the smallest thing that meets one protocol of ``minivllm.core.interfaces``
(or the attention backend's contract). Plugged into ``LLM(...)`` -- and the first two into the
``Simulator`` -- they must give the same greedy tokens (and scheduling decisions) as
minivllm's own parts.
"""

from __future__ import annotations

from collections import deque

import pytest
import torch
import torch.nn.functional as F
from support import FreeListKV

from minivllm import LLM, SamplingParams
from minivllm.core.interfaces import KVCacheManagerInterface, SchedulerInterface, check_implements
from minivllm.core.messages import RequestDelta
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.engine.core_client import local_core
from minivllm.request import RequestStatus


class FifoScheduler:
    """Continuous batching without chunking or preemption: running requests decode, then
    waiting ones are admitted whole (less their prefix-cache hits) while the budget, the seats
    and the blocks last. It keeps no statistics: the engine reads them off its plans."""

    def __init__(self, config, kv):
        self.config, self.kv = config, kv
        self.running, self.waiting, self.requests = [], deque(), {}

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def add_request(self, request):
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def _plan(self, out, req, num_new) -> bool:
        table = self.kv.allocate_slots(req, num_new)
        if table is None:
            return False
        out.add(req, req.num_computed_tokens, num_new, table)
        req.num_computed_tokens += num_new
        return True

    def schedule(self):
        out, budget = SchedulerOutput(), self.config.max_num_batched_tokens
        for req in self.running:
            n = req.num_tokens - req.num_computed_tokens
            if 0 < n <= budget and self._plan(out, req, n):
                budget -= n
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            hits, num_hit = self.kv.get_computed_blocks(req)  # ([], 0) without a prefix cache
            num_new = req.num_tokens - num_hit
            table = self.kv.allocate_slots(req, num_new, hits) if num_new <= budget else None
            if table is None:
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.add(req, num_hit, num_new, table)
            req.num_computed_tokens = num_hit + num_new
            budget -= num_new
        return out

    def update_from_output(self, plan, new_token_ids):
        finished, deltas = [], []
        for rid, (token,) in new_token_ids.items():
            req = self.requests[rid]
            req.all_token_ids.append(token)
            status = req.check_stop(token, self.config.max_model_len)
            if status is not None:
                req.status = status
                finished.append(req)
            deltas.append(RequestDelta(rid, [token], status.finish_reason if status else None, req.stop_reason))
        self._end(finished)
        return deltas

    def finish_requests(self, request_ids, status):
        ended = [self.requests[r] for r in request_ids if r in self.requests]
        for req in ended:
            req.status = status
        self._end(ended)
        return ended

    def _end(self, reqs):
        gone = {r.request_id for r in reqs}
        self.running = [r for r in self.running if r.request_id not in gone]
        self.waiting = deque(r for r in self.waiting if r.request_id not in gone)
        for r in reqs:
            self.kv.free(r)
            self.requests.pop(r.request_id, None)

    def has_unfinished_requests(self):
        return bool(self.running or self.waiting)

    def live_requests(self):
        return self.running


class LoopAttention:
    """Attention one sequence at a time with ``scaled_dot_product_attention``: write the new
    K/V through the slot mapping, gather the sequence's context through its block table."""

    name = "loop"

    def forward(self, query, key, value, k_cache, v_cache, meta, scale):
        flat_k = k_cache.view(-1, *k_cache.shape[2:])
        flat_v = v_cache.view(-1, *v_cache.shape[2:])
        keep = meta.slot_mapping >= 0
        flat_k[meta.slot_mapping[keep]] = key[keep].to(k_cache.dtype)
        flat_v[meta.slot_mapping[keep]] = value[keep].to(v_cache.dtype)
        out = torch.empty_like(query)
        bs, group = meta.block_size, query.shape[1] // key.shape[1]
        starts, seq_lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
        for i, seq_len in enumerate(seq_lens):
            lo, hi = starts[i], starts[i + 1]
            pos = torch.arange(seq_len, device=query.device)
            slots = meta.block_tables[i, pos // bs].long() * bs + pos % bs
            k = flat_k[slots].to(query.dtype).repeat_interleave(group, dim=1)  # [S, H, D]
            v = flat_v[slots].to(query.dtype).repeat_interleave(group, dim=1)
            q_pos = torch.arange(seq_len - (hi - lo), seq_len, device=query.device)
            mask = pos[None, :] <= q_pos[:, None]  # [new, S]: causal over the whole context
            o = F.scaled_dot_product_attention(
                query[lo:hi].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                attn_mask=mask, scale=scale,
            )
            out[lo:hi] = o.transpose(0, 1)
        return out


PROMPTS = [
    "Once upon a time", "The little fox", "Tom went to the market and", "A bird sat on a branch",
    "In the morning the sun", "Mia had a red ball", "The old man smiled", "Sam and Lily were friends",
]
GREEDY = SamplingParams(temperature=0, max_tokens=24)


def tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference_tokens() -> list[list[int]]:
    return tokens(LLM(max_model_len=128, num_kv_blocks=64, enable_prefix_caching=False))


def test_the_plugins_meet_their_protocols():
    kv = FreeListKV(8, 16)
    check_implements(kv, KVCacheManagerInterface, "kv_cache")
    check_implements(FifoScheduler(None, kv), SchedulerInterface, "scheduler")


def test_a_third_party_kv_cache_manager_serves_the_model(reference_tokens):
    kv = FreeListKV(num_blocks=64, block_size=16)
    llm = LLM(max_model_len=128, kv_cache=kv, debug_checks=True)
    assert tokens(llm) == reference_tokens
    assert kv.num_used_blocks == 0 and llm.stats().summary()["peak_kv_blocks_used"] > 0


def test_a_third_party_kv_cache_manager_under_preemption(reference_tokens):
    """A pool of 12 blocks cannot hold 8 sequences of up to 36 tokens: minivllm's scheduler
    preempts and recomputes, on top of the plug-in's bookkeeping."""
    llm = LLM(max_model_len=128, kv_cache=FreeListKV(num_blocks=12, block_size=16), debug_checks=True)
    assert tokens(llm) == reference_tokens
    assert llm.stats().summary()["preemptions"] > 0


def test_a_third_party_scheduler_serves_the_model(reference_tokens):
    llm = LLM(max_model_len=128, num_kv_blocks=64, scheduler=FifoScheduler, debug_checks=True)
    assert isinstance(local_core(llm).scheduler, FifoScheduler)
    assert tokens(llm) == reference_tokens
    assert local_core(llm).kv.num_used_blocks == 0


def test_a_third_party_attention_backend_serves_the_model(reference_tokens):
    llm = LLM(max_model_len=128, num_kv_blocks=64, enable_prefix_caching=False,
              attention_backend=LoopAttention())
    assert local_core(llm).executor.model.attention_layers[0].backend.name == "loop"
    assert tokens(llm) == reference_tokens


def test_plugins_drive_the_simulator_like_the_builtin_parts():
    """Same trace, same decisions: the plug-ins vs minivllm's scheduler without chunking over
    a pool large enough that nothing is preempted."""
    from minivllm import workloads
    from minivllm.sim import Simulator

    trace = workloads.chat(40, seed=3, rate=20.0)
    common = dict(max_model_len=4096, max_num_seqs=16, enable_chunked_prefill=False,
                  max_num_batched_tokens=4096, record_decisions=True)
    ours = Simulator("llama-3-8b", "H100-SXM", enable_prefix_caching=False, **common)
    ours.run(trace)
    theirs = Simulator("llama-3-8b", "H100-SXM", scheduler=FifoScheduler,
                       kv_cache=FreeListKV(ours.kv.num_blocks, 16), **common)
    theirs.run(trace)
    assert theirs.decisions == ours.decisions
    assert theirs.summary()["output_tokens"] == trace.num_output_tokens


def test_plugins_that_miss_members_are_refused_by_name():
    class Half:
        block_size, num_blocks = 16, 8

        def allocate_slots(self, *a):
            return []

    with pytest.raises(TypeError, match="missing .*free.*get_computed_blocks"):
        LLM(kv_cache=Half())
    with pytest.raises(TypeError, match="takes an instance"):
        LLM(kv_cache=FreeListKV)
    with pytest.raises(TypeError, match="forward"):
        LLM(attention_backend=object())
    with pytest.raises(ValueError, match="block_size=8 but block_size=16"):
        LLM(kv_cache=FreeListKV(64, 8))


class ShortestPromptFirst:
    """A scheduling policy: waiting requests with the shortest prompt go first."""

    name = "shortest-prompt-first"

    def waiting_key(self, request):
        return (request.num_prompt_tokens, request.arrival_time)

    def choose_victim(self, running):
        return running[-1]

    def may_preempt(self, incoming, victim):
        return False


def test_a_scheduling_policy_plugs_into_engine_and_simulator(reference_tokens):
    from minivllm import workloads
    from minivllm.sim import Simulator

    sim = Simulator("llama-3-8b", "H100-SXM", max_num_seqs=1, scheduling_policy=ShortestPromptFirst(),
                    record_decisions=True)
    trace = workloads.fixed([300, 20, 100, 5], [3, 3, 3, 3])
    sim.run(trace)
    order = [step[0][0] for step in sim.decisions if step and step[0][1] > 1]  # prefills
    lens = {it.request_id: it.prompt_len for it in trace}
    assert [lens[r] for r in order] == [5, 20, 100, 300]  # all arrive at once: shortest first
    llm = LLM(max_model_len=128, num_kv_blocks=64, enable_prefix_caching=False,
              scheduling_policy=ShortestPromptFirst())
    assert tokens(llm) == reference_tokens
    with pytest.raises(TypeError, match="missing .*choose_victim"):
        LLM(scheduling_policy=object())


def test_a_hand_written_step_loop_serves_the_model(reference_tokens):
    """The smallest engine step: plan, run, let the blocks join the cache, append the tokens."""
    from minivllm.core.engine_core import EngineCoreBase

    class PlainCore(EngineCoreBase):
        def run_step(self, choose_tokens=None):
            start = self.clock()
            plan = self.scheduler.schedule()
            self.begin_step(plan)
            result = self.executor.execute(plan)
            self.kv.commit_written_blocks()
            stepped = {rid: self.scheduler.requests[rid] for rid in result.new_token_ids}
            deltas = self.scheduler.update_from_output(plan, result.new_token_ids)
            now = self.clock()
            for d in deltas:
                if d.finish_reason is not None:
                    self.record_finish(stepped[d.request_id], now)
            self.stats.record_step(self.scheduler, plan, start, now - start)
            return self.step_outputs(plan, start, now, deltas, result)

    llm = LLM(max_model_len=128, num_kv_blocks=64, enable_prefix_caching=False, engine_core=PlainCore)
    assert type(local_core(llm)) is PlainCore
    assert tokens(llm) == reference_tokens


def test_a_policy_that_always_preempts_cannot_make_a_step_loop_forever():
    """Two waiting requests that may each preempt the other must not take turns inside one
    step: a request admitted in this step is never preempted by an admission in the same step."""
    from minivllm import workloads
    from minivllm.sim import Simulator

    class Restless(ShortestPromptFirst):
        name = "restless"

        def may_preempt(self, incoming, victim):
            return True

    import signal

    def too_slow(*_):
        raise TimeoutError("a scheduling step did not finish in 30 s")

    sim = Simulator("llama-3-8b", "H100-SXM", num_kv_blocks=8, max_model_len=128,
                    scheduling_policy=Restless())
    trace = workloads.fixed([40, 40, 40], [8, 8, 8])
    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(30)
    try:
        assert sim.run(trace, check_invariants=True).summary()["output_tokens"] == 24
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_plug_in_schedulers_prefix_hits_are_counted():
    """The prefix hit rate and each output's num_cached_tokens come from the plans, so a
    plug-in scheduler that reuses cached blocks reports them like minivllm's own."""
    shared = "Once upon a time there was a little fox who lived in the woods near a river. "
    prompts = [shared + p for p in PROMPTS]
    llm = LLM(max_model_len=128, num_kv_blocks=64, scheduler=FifoScheduler, max_num_seqs=1, debug_checks=True)
    plain = LLM(max_model_len=128, num_kv_blocks=64, enable_prefix_caching=False)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [
        o.outputs[0].token_ids for o in plain.generate(prompts, GREEDY, use_tqdm=False)
    ]
    cached = [o.num_cached_tokens for o in outs]
    assert cached[0] == 0 and min(cached[1:]) >= 16
    summary = llm.stats().summary()
    assert summary["prefix_cache_hits"] == sum(cached)
    assert summary["prefix_hit_rate"] == pytest.approx(sum(cached) / sum(len(o.prompt_token_ids) for o in outs))


def test_the_static_baseline_is_no_forking_scheduler():
    from minivllm.core.interfaces import ForkingScheduler

    llm = LLM(scheduler="static", num_kv_blocks=64, max_model_len=128)
    assert not isinstance(local_core(llm).scheduler, ForkingScheduler) and not llm.engine.can_fork
    out = llm.generate("Once upon a time", SamplingParams(n=3, temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 1  # three independent greedy requests
