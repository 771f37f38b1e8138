"""Copy-on-write on real cache tensors: after a fork and divergent writes, each request's K/V
(read through its own block table) equals that of a run that never shared anything."""

from __future__ import annotations

import torch

from minivllm import LLM
from minivllm.engine.core_client import local_core
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams


def _kv_of(engine, rid: str, n: int) -> list[torch.Tensor]:
    """K and V of positions [0, n) of request ``rid``, every layer, through its block table."""
    ids = torch.tensor(local_core(engine).kv.get_block_ids(rid))
    out = []
    for k_cache, v_cache in local_core(engine).executor.kv_caches:
        for cache in (k_cache, v_cache):
            out.append(cache[ids].flatten(0, 1)[:n].clone())
    return out


def _run_steps(engine, steps: int) -> None:
    """Schedule and run forward passes (no sampling: the test appends the tokens itself)."""
    for _ in range(steps):
        local_core(engine).executor.forward(local_core(engine).scheduler.schedule())
        local_core(engine).kv.commit_written_blocks()


def test_forked_children_match_unshared_runs(random_checkpoints):
    path, _ = random_checkpoints["llama"]
    prompt = list(range(50, 71))  # 21 tokens: one full block + a shared partial block
    branches = {"p": [7, 9, 11], "c1": [8, 8, 8], "c2": [7, 10, 12]}
    params = SamplingParams(max_tokens=50, ignore_eos=True)

    shared = LLM(str(path), max_model_len=256, debug_checks=True).engine
    s = local_core(shared).scheduler
    parent = Request("p", prompt, params)
    s.add_request(parent)
    _run_steps(shared, 1)  # prefill once
    kids = {rid: Request(rid, prompt, params) for rid in ("c1", "c2")}
    for kid in kids.values():
        s.fork_request(parent, kid)
    reqs = {"p": parent, **kids}
    used_after_fork = local_core(shared).kv.num_used_blocks
    for step in range(3):
        for rid, r in reqs.items():
            r.all_token_ids.append(branches[rid][step])
        _run_steps(shared, 1)
        shared.check_invariants()
    assert local_core(shared).kv.num_used_blocks == used_after_fork + 2  # two copies; the third writes in place
    assert local_core(shared).kv.num_cow_copies == 2

    for rid in reqs:
        alone = LLM(str(path), max_model_len=256).engine
        solo = Request("solo", prompt + branches[rid], params)
        local_core(alone).scheduler.add_request(solo)
        _run_steps(alone, 1)
        n = len(prompt) + 3
        for got, want in zip(_kv_of(shared, rid, n), _kv_of(alone, "solo", n)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
