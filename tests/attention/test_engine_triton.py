"""The Triton backend inside the engine gives the same greedy tokens as the PyTorch reference,
with chunked prefill, preemption and prefix caching all exercised (kernels run in the Triton
interpreter on a CPU, so the workload is small)."""

from __future__ import annotations

from minivllm import LLM, SamplingParams


def test_triton_backend_matches_reference_in_the_engine():
    shared = [1] + list(range(300, 333))  # 34 tokens: two full blocks shared by every prompt
    prompts = [shared + [400 + i] * (1 + 3 * i) for i in range(5)] + [[1, 5, 6]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    setup = dict(max_num_batched_tokens=24, num_kv_blocks=8, max_model_len=128, block_size=16,
                 enable_prefix_caching=True, debug_checks=True)
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(attention_backend=backend, **setup)
        outs = llm.generate(prompts, params, use_tqdm=False)
        results[backend] = [o.outputs[0].token_ids for o in outs]
        stats = llm.stats()
        assert stats.summary()["preemptions"] > 0, "the pool should be small enough to preempt"
        assert stats.prefix_hit_rate > 0, "shared prompt blocks should be reused"
        assert max(s.batch_tokens for s in stats.steps) <= 24
    assert results["triton"] == results["torch"]
