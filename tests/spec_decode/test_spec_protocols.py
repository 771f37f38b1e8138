"""Speculative decoding through the protocols alone: a scheduler and a KV cache manager written
here, from ``SpeculativeScheduler`` and ``SpeculativeKVCacheManager`` and nothing of minivllm's
own parts, serve the tiny model with drafts, token for token as minivllm does without them; a
part that lacks what speculation needs is refused when the engine is built, by name."""

from __future__ import annotations

from collections import deque

import pytest
from support import FreeListKV

import minivllm
from minivllm import LLM, SamplingParams
from minivllm.core.interfaces import SpeculativeKVCacheManager, SpeculativeScheduler
from minivllm.core.messages import RequestDelta
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.request import RequestStatus

PROMPTS = ["Once upon a time", "The little fox", "Mia had a red ball. She played with it every day"]
ARGS = dict(max_model_len=256, max_num_seqs=8, seed=0)
NUM_BLOCKS = 64


class DraftingScheduler:
    """Whole prompts, first come first served, no preemption (the pool is large enough); a
    decoding request verifies the drafts proposed for it, and what the target rejects is rolled
    back through the KV manager's ``trim``."""

    def __init__(self, config, kv):
        self.config, self.kv = config, kv
        self.waiting: deque = deque()
        self.running: list = []
        self.requests: dict = {}

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def add_request(self, request):
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self):
        return bool(self.waiting or self.running)

    def live_requests(self):
        return self.running

    def schedule(self):
        out, cfg = SchedulerOutput(), self.config
        budget, lookahead = cfg.max_num_batched_tokens, cfg.num_lookahead_tokens
        for req in self.running:
            num_new = req.num_tokens - req.num_computed_tokens
            drafts, req.spec_token_ids = req.spec_token_ids[: budget - num_new], []
            table = self.kv.allocate_slots(req, num_new + len(drafts), (), lookahead)
            assert table is not None, "the test's pool is large enough"
            out.add(req, req.num_computed_tokens, num_new, table, draft_token_ids=drafts)
            req.num_computed_tokens += num_new + len(drafts)
            budget -= num_new + len(drafts)
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            if req.num_tokens > budget:
                break
            table = self.kv.allocate_slots(req, req.num_tokens, (), lookahead)
            if table is None:
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.add(req, 0, req.num_tokens, table)
            req.num_computed_tokens = req.num_tokens
            budget -= req.num_tokens
        return out

    def update_from_output(self, plan, new_token_ids):
        finished, deltas = [], []
        for rid, tokens in new_token_ids.items():
            req = self.requests[rid]
            delta = RequestDelta(rid, [])
            for t in tokens:
                req.all_token_ids.append(t)
                delta.new_token_ids.append(t)
                status = req.check_stop(t, self.config.max_model_len)
                if status is not None:
                    req.status = status
                    finished.append(req)
                    delta.finish_reason, delta.stop_reason = status.finish_reason, req.stop_reason
                    break
            deltas.append(delta)
        for rid in plan.spec_token_ids:  # the rejected drafts' K/V is not the request's
            req = self.requests[rid]
            if not req.is_finished:
                req.num_computed_tokens = req.num_tokens - 1
                self.kv.trim(req, req.num_computed_tokens + max(1, self.config.num_lookahead_tokens))
        for req in finished:
            self._drop(req)
        return deltas

    def update_draft_token_ids(self, draft_token_ids):
        for rid, drafts in draft_token_ids.items():
            req = self.requests.get(rid)
            if req is not None and req.status is RequestStatus.RUNNING:
                req.spec_token_ids = list(drafts)

    def finish_requests(self, request_ids, status):
        ended = [self.requests[rid] for rid in dict.fromkeys(request_ids) if rid in self.requests]
        for req in ended:
            req.status = status
            if req in self.waiting:
                self.waiting.remove(req)
            self._drop(req)
        return ended

    def _drop(self, req):
        if req in self.running:
            self.running.remove(req)
        self.kv.free(req)
        self.requests.pop(req.request_id, None)


class NoDrafts:
    """A scheduler that never learns of drafts: every member of ``DraftingScheduler`` but
    ``update_draft_token_ids``."""

    def __init__(self, config, kv):
        self._inner = DraftingScheduler(config, kv)

    def __getattr__(self, name):
        if name == "update_draft_token_ids":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_the_parts_written_here_implement_the_protocols():
    kv = FreeListKV(8, 16)
    assert isinstance(kv, SpeculativeKVCacheManager)
    assert isinstance(DraftingScheduler(None, kv), SpeculativeScheduler)


@pytest.fixture(scope="module")
def reference():
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outs = LLM(**ARGS).generate(PROMPTS, params, use_tqdm=False)
    return params, [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("spec", [
    {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": None},
    {"model": minivllm.TINY_DRAFT_MODEL_DIR, "num_speculative_tokens": 4, "disable_by_batch_size": None},
], ids=["ngram", "draft_model"])
def test_a_protocol_only_scheduler_and_kv_manager_serve_with_speculation(reference, spec):
    """Greedy tokens identical to minivllm's own engine without drafts; drafts were verified and
    some accepted; every block back in the pool at the end."""
    params, want = reference
    kv = FreeListKV(NUM_BLOCKS, 16)
    llm = LLM(**ARGS, kv_cache=kv, scheduler=DraftingScheduler, speculative_config=spec, debug_checks=True)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert got == want
    spec_stats = llm.stats().spec_decoding()
    assert spec_stats["spec_draft_tokens"] > 0 and spec_stats["spec_accepted_tokens"] > 0
    assert kv.num_used_blocks == 0 and not kv.tables


def test_a_scheduler_without_the_speculative_member_is_refused_by_name():
    with pytest.raises(TypeError, match="scheduler=NoDrafts does not implement .*SpeculativeScheduler.*"
                                        "missing update_draft_token_ids"):
        LLM(**ARGS, kv_cache=FreeListKV(NUM_BLOCKS, 16), scheduler=NoDrafts,
            speculative_config={"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": None})
