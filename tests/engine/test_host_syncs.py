"""What a step would make the host wait for on a GPU, counted on the CPU, and a run that finds
any tensor made without the device of the data it meets.

``HostSyncCounter`` (``minivllm/engine/host_syncs.py``) counts reads back to the host, ops whose
shape depends on the data and blocking copies from the host; ``scripts/gpu_check.sh`` checks
the same steps with ``torch.cuda.set_sync_debug_mode`` on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, TINY_DRAFT_MODEL_DIR, SamplingParams
from minivllm.engine.host_syncs import DECODE_SYNC_BUDGET, HostSyncCounter, count_step_syncs
from minivllm.transfer import HOST, select_rows, to_device

PROMPTS = ["Once upon a time", "The little fox went to the forest and", "Mia had a red ball. " * 6,
           "One sunny day, Leo"]
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, top_k=20, seed=3, ignore_eos=True)

CONFIGS = {
    "plain": {},
    "int8": {"kv_cache_dtype": "int8"},
    "chunked": {"max_num_batched_tokens": 24},
    "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": None}},
    "draft_model": {"speculative_config": {"model": TINY_DRAFT_MODEL_DIR, "num_speculative_tokens": 3, "disable_by_batch_size": None}},
}


# --- the counter itself ----------------------------------------------------------------------------
def test_the_counter_sees_reads_data_shaped_ops_and_blocking_copies_of_device_tensors():
    weights = torch.ones(4)  # made before the counter: on the device, like a model's weights
    with HostSyncCounter() as syncs:
        x = weights * 2
        x.tolist()
        x[0].item()
        int(x[1])
        x.nonzero()
        x[x > 1]
        torch.tensor([1, 2], device=weights.device)
        torch.arange(3).to(weights.device)
    assert syncs.calls == {"tolist": 1, "item": 1, "__int__": 1, "nonzero": 1, "mask index": 1,
                           "tensor(device)": 1, "to(device)": 1}, syncs.calls
    assert all(" at test_host_syncs.py:" in site for site in syncs.sites), syncs.sites


def test_the_counter_lets_host_tensors_and_copies_that_do_not_block_pass():
    weights = torch.ones(6)
    with HostSyncCounter() as syncs:
        host = torch.tensor([3, 1, 2], device=HOST)
        host.sort().values.tolist()  # computed on the host from host data: free
        int(host[0])
        ids, scales = to_device([([0, 2, 4], torch.long), ([0.5, 1.0, 2.0], torch.float32)], weights.device)
        picked = select_rows(weights[:, None] * 1.0, [1, 2, 3])  # consecutive rows: a view
        gathered = select_rows(weights[:, None] * 1.0, [4, 0])
        (weights[ids] * scales).sum()
    assert syncs.total == 0, syncs.sites
    assert ids.tolist() == [0, 2, 4] and ids.dtype == torch.long
    assert scales.tolist() == [0.5, 1.0, 2.0] and scales.dtype == torch.float32
    assert picked.shape == (3, 1) and gathered.shape == (2, 1)


def test_to_device_keeps_every_bit_and_the_order_of_mixed_entries():
    big = 2**62 + 1
    a, b, c, d = to_device([([big, -1], torch.long), ([0.1], torch.float32), ([], torch.int32),
                            ([7, 8], torch.int32)], "cpu")
    assert a.tolist() == [big, -1] and b.item() == pytest.approx(0.1) and c.numel() == 0
    assert d.tolist() == [7, 8] and d.dtype == torch.int32


# --- the engine's budget ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def counts():
    """config -> params -> step kind -> the syncs of each step of that kind."""
    out = {}
    for name, args in CONFIGS.items():
        llm = LLM(engine_core_process=False, seed=0, **args)
        out[name] = {p: count_step_syncs(llm, PROMPTS, params) for p, params in (("greedy", GREEDY),
                                                                                 ("sampled", SAMPLED))}
    return out


@pytest.mark.parametrize("config", ["plain", "int8", "chunked"])
@pytest.mark.parametrize("params", ["greedy", "sampled"])
def test_a_step_without_speculation_reads_back_within_its_budget(counts, config, params):
    by_kind = counts[config][params]
    assert by_kind.get("decode"), by_kind
    for kind, steps in by_kind.items():
        assert max(steps) <= DECODE_SYNC_BUDGET, f"{config}, {params}: a {kind} step made {max(steps)} host syncs"


@pytest.mark.parametrize("config", ["ngram", "draft_model"])
def test_a_speculative_step_reads_back_once_per_draft_position_at_most(counts, config):
    """Verifying reads the verdicts back once; a draft model reads back each of its k draft
    tokens (the next draft position is fed from it); a decode step keeps its budget."""
    k = CONFIGS[config]["speculative_config"]["num_speculative_tokens"]
    drafting = k if config == "draft_model" else 0
    for params in ("greedy", "sampled"):
        by_kind = counts[config][params]
        assert by_kind.get("speculative"), by_kind
        assert max(by_kind["speculative"]) <= DECODE_SYNC_BUDGET + 1 + drafting, by_kind
        assert max(by_kind.get("decode", [0])) <= DECODE_SYNC_BUDGET + drafting, by_kind


# --- no tensor made without a device ---------------------------------------------------------------
@pytest.mark.parametrize("config", ["plain", "int8", "ngram", "draft_model"])
def test_every_step_runs_with_the_default_device_set_to_meta(config):
    """With ``torch.set_default_device("meta")`` a tensor made without a device has no data, and
    the first op that meets a real one fails: the engine makes every tensor on the device of
    the data it meets (or says ``device=HOST``). The tokens equal a normal run's."""
    llm = LLM(engine_core_process=False, seed=0, **CONFIGS[config])
    params = SamplingParams(max_tokens=6, temperature=0.8, seed=2, top_k=10, top_p=0.9, ignore_eos=True,
                            logprobs=2, prompt_logprobs=1)
    reference = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:3], params, use_tqdm=False)]
    engine = llm.engine
    for i, prompt in enumerate(PROMPTS[:3]):
        engine.add_request(str(i), prompt, params)
    got: dict[str, list[int]] = {}
    torch.set_default_device("meta")
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                got[out.request_id] = list(out.outputs[0].token_ids)
    finally:
        torch.set_default_device(None)
    assert [got[str(i)] for i in range(3)] == [list(r) for r in reference]
