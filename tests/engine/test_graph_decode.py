"""The graph-ready decode step (``minivllm/engine/graph_decode.py``), checked on the CPU with the
Triton kernels interpreted: per bucket the forward is the same operators on the same shapes
whatever the contents, reads nothing back, and run again on the same buffers with new contents it
equals a fresh run to the bit, with and without the 8-bit cache. The capture itself needs a GPU
(``scripts/gpu_check.sh``, step ``graphs``)."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minivllm import SamplingParams
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.engine.graph_decode import GraphDecode, batch_buckets
from minivllm.engine.host_syncs import HostSyncCounter
from minivllm.model.config import ModelConfig
from minivllm.model.layer_ops import TorchLayerOps
from minivllm.model.llama import LlamaFamilyModel
from minivllm.request import Request

BLOCK, MAX_LEN, NUM_BLOCKS = 16, 128, 64
CFG = dict(architectures=["Qwen3ForCausalLM"], vocab_size=97, hidden_size=32, intermediate_size=48,
           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
           max_position_embeddings=MAX_LEN, tie_word_embeddings=True)


def build_model(kv_dtype=None, seed=0):
    from minivllm.attention.triton_backend import TritonAttentionBackend

    torch.manual_seed(seed)
    model = LlamaFamilyModel(ModelConfig.from_dict(CFG), TritonAttentionBackend(), TorchLayerOps()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.3)
    model.allocate_kv_cache(NUM_BLOCKS, BLOCK, dtype=kv_dtype)
    with torch.no_grad():  # a cache full of earlier K/V (int8: random codes and positive scales)
        for k, v in model.kv_caches if hasattr(model, "kv_caches") else [(a.k_cache, a.v_cache)
                                                                        for a in model.attention_layers]:
            for c in (k, v):
                if c.dtype == torch.int8:
                    c.copy_(torch.randint(-100, 100, c.shape, dtype=torch.int8))
                    c[..., -4:].view(torch.float32).copy_(torch.rand(c.shape[:-1] + (1,)) * 0.02 + 0.01)
                else:
                    c.normal_()
    return model


def decode_step(n: int, rng: random.Random) -> SchedulerOutput:
    """``n`` decode entries with random contexts over disjoint random blocks."""
    out = SchedulerOutput()
    blocks = rng.sample(range(NUM_BLOCKS), NUM_BLOCKS)
    for i in range(n):
        context = rng.randrange(1, MAX_LEN - 1)
        req = Request(f"r{i}", [rng.randrange(97) for _ in range(context + 1)], SamplingParams(max_tokens=4))
        need = -(-(context + 1) // BLOCK)
        table, blocks = blocks[:need], blocks[need:]
        out.add(req, context, 1, table)
    return out


def caches(model):
    return [(a.k_cache, a.v_cache) for a in model.attention_layers]


def test_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(6) == [1, 2, 4, 6]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert batch_buckets(32) == [1, 2, 4, 8, 16, 24, 32]


@pytest.mark.parametrize("kv_dtype", [None, torch.int8], ids=["float32", "int8"])
def test_rerun_on_the_same_buffers_equals_a_fresh_run(kv_dtype):
    rng = random.Random(0)
    model = build_model(kv_dtype)
    graphs = GraphDecode(model, BLOCK, MAX_LEN, max_batch=4)
    assert graphs.buckets == [1, 2, 4]
    for bucket in graphs.buckets:
        for n in sorted({bucket, max(1, bucket - 1)}):  # a full bucket, and one with an idle seat
            first, second = decode_step(min(n, 4), rng), decode_step(min(n, 4), rng)
            assert graphs.bucket(len(second.requests)) == bucket or n < bucket
            graphs.run(first)  # the buffers now hold another step's contents
            before = [tuple(c.clone() for c in pair) for pair in caches(model)]
            again = graphs.run(second).clone()
            after = [tuple(c.clone() for c in pair) for pair in caches(model)]

            fresh_model = copy.deepcopy(model)
            for (k, v), (k0, v0) in zip(caches(fresh_model), before, strict=True):
                k.copy_(k0)
                v.copy_(v0)
            fresh = GraphDecode(fresh_model, BLOCK, MAX_LEN, max_batch=4).run(second)
            assert fresh.shape == (len(second.requests), CFG["hidden_size"])
            assert torch.equal(again, fresh), f"bucket {bucket}, {n} rows: not the same bits"
            for (k, v), (k1, v1) in zip(caches(fresh_model), after, strict=True):
                assert torch.equal(k, k1) and torch.equal(v, v1), "the K/V written differ"


class _Trace(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        self.ops.append((str(func), shapes))
        return func(*args, **(kwargs or {}))


def test_forward_is_static_and_reads_nothing_back():
    """Same operators on the same shapes for other contents (nothing sized from data), no read-back."""
    rng = random.Random(1)
    model = build_model()
    graphs = GraphDecode(model, BLOCK, MAX_LEN, max_batch=4)
    traces = []
    for _ in range(2):
        st = graphs.fill(decode_step(3, rng))
        with torch.inference_mode(), _Trace() as trace, HostSyncCounter() as syncs:
            graphs.forward(st)
        assert syncs.total == 0, syncs.calls
        traces.append(trace.ops)
    assert traces[0] == traces[1] and len(traces[0]) > 20


def test_steps_it_does_not_take():
    model = build_model()
    graphs = GraphDecode(model, BLOCK, MAX_LEN, max_batch=2)
    rng = random.Random(2)
    assert graphs.run(decode_step(3, rng)) is None  # more than the largest bucket
    prompt = SchedulerOutput()
    prompt.add(Request("p", [1, 2, 3], SamplingParams(max_tokens=2)), 0, 3, [0])
    assert graphs.run(prompt) is None
    with pytest.raises(ValueError, match="needs a CUDA device"):
        GraphDecode(model, BLOCK, MAX_LEN, max_batch=2, capture=True)
    from minivllm.attention import TorchAttentionBackend

    model.set_attention_backend(TorchAttentionBackend())
    with pytest.raises(ValueError, match="'triton' attention backend"):
        GraphDecode(model, BLOCK, MAX_LEN, max_batch=2)


def test_engine_option_gives_the_same_tokens(monkeypatch):
    """``LLM(cuda_graphs=True)`` on the CPU: the static buffers, eager; greedy tokens unchanged."""
    from minivllm import LLM

    taken = []
    forward = GraphDecode.forward
    monkeypatch.setattr(GraphDecode, "forward", lambda self, st: taken.append(st.size) or forward(self, st))
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    runs = {}
    for flag in (False, True):
        llm = LLM(attention_backend="triton", cuda_graphs=flag, max_num_seqs=4, max_model_len=64)
        runs[flag] = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
        assert bool(taken) == flag, "the decode steps went through the static buffers only when asked"
    assert runs[True] == runs[False]
