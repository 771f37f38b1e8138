"""The 8-bit KV cache (``kv_cache_dtype="int8"``): the format, the ragged backend, the engine.

* ``kv_quant``: each element within half a scale step of its input (float64 reference), zero
  rows exact, codes in [-127, 127];
* the ``"torch"`` backend over an int8 cache against float64 SDPA on the dequantised K/V
  (tight), and against the float K/V (within a bound derived from the scale steps); slots no
  sequence owns hold random codes with a NaN or inf scale and must not reach the output;
* the engine: the same kv_cache_memory holds the byte ratio's worth more blocks; int8 with
  prefix caching and copy-on-write gives the same tokens with and without hits; torch and
  triton agree; a poisoned int8 pool changes no token; bad arguments fail when the engine is
  built.
"""

from __future__ import annotations

import argparse
import math
import random

import pytest
import torch
from support import save_random_checkpoint

import minivllm
from minivllm import LLM, SamplingParams
from minivllm.attention import get_attention_backend
from minivllm.attention.kv_quant import (
    CACHE_STORAGE,
    SCALE_BYTES,
    dequantize_rows,
    quantize_rows,
    split_rows,
)
from minivllm.attention.testing import (
    Seq,
    assert_cache_matches,
    assert_matches_reference,
    int8_problem,
    make_paged_problem,
)
from minivllm.config import KV_CACHE_DTYPES, EngineArgs
from minivllm.engine.core_client import local_core
from minivllm.model.config import INT8_SCALE_BYTES, ModelConfig


# --- the format ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_round_trip_within_half_a_step(dtype):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 3, 48, generator=gen) * torch.rand(64, 3, 1, generator=gen).pow(4) * 30).to(dtype)
    x[5, 1] = 0.0
    rows = quantize_rows(x)
    assert rows.dtype == torch.int8 and rows.shape == (64, 3, 48 + SCALE_BYTES)
    codes, scales = split_rows(rows)
    assert int(codes.min()) >= -127 and int(codes.max()) <= 127
    x64 = x.double()
    deq64 = codes.double() * scales.double()  # exact in float64
    err = (x64 - deq64).abs()
    assert bool((err <= scales.double() * (0.5 + 1e-5)).all()), float((err / scales.double()).nan_to_num().max())
    # the largest magnitude of a row maps to +-127; a zero row to scale 0 and exact zeros
    assert bool((codes.abs().amax(-1)[scales[..., 0] > 0] == 127).all())
    assert scales[5, 1].item() == 0.0 and bool((dequantize_rows(rows)[5, 1] == 0).all())
    # float32 dequantisation: code * scale rounded once to float32
    assert bool(((dequantize_rows(rows).double() - deq64).abs() <= deq64.abs() * 2.0**-24).all())


def test_head_dim_must_be_a_multiple_of_four():
    with pytest.raises(ValueError, match="head_dim to be a multiple of 4.*head_dim=18"):
        quantize_rows(torch.randn(2, 18))


def test_the_constants_agree():
    assert KV_CACHE_DTYPES == ("auto", *CACHE_STORAGE) == ("auto", "int8")
    assert CACHE_STORAGE["int8"] is torch.int8
    assert INT8_SCALE_BYTES == SCALE_BYTES == torch.finfo(torch.float32).bits // 8


# --- the ragged backend ----------------------------------------------------------------------
def mixed_step(dtype, seed=0):
    """Decodes, a whole prompt, a chunk after cached context, a padded prompt, a shared prefix."""
    seqs = [Seq(new=1, context=0), Seq(new=1, context=40), Seq(new=17), Seq(new=9, context=32),
            Seq(new=4, pad=3), Seq(new=3, context=32)]
    return make_paged_problem(seqs, num_heads=6, num_kv_heads=2, head_dim=32, block_size=16, dtype=dtype,
                              share={5: (3, 2)}, guard_blocks=1, seed=seed)


@pytest.mark.parametrize("unowned_scale", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ragged_backend_matches_float64_on_the_dequantised_cache(dtype, unowned_scale):
    problem = int8_problem(mixed_step(dtype), unowned_scale=unowned_scale)
    k_cache, v_cache = problem.caches()
    out = get_attention_backend("torch").forward(problem.query, problem.key, problem.value, k_cache, v_cache,
                                                 problem.meta, problem.scale)
    assert out.dtype == dtype
    assert_matches_reference(out, problem)
    assert_cache_matches(k_cache, problem.k_cache_after, "K cache")
    assert_cache_matches(v_cache, problem.v_cache_after, "V cache")


def test_ragged_backend_stays_within_the_quantisation_bound_of_the_float_cache():
    """Against attention on the float K/V themselves: each value moves by at most its row's
    step / 2 (``dv``), each score by at most ``eps = scale * sum_d |q_d| * dk`` (``dk``: the key
    rows' largest step / 2), so the softmax weights move by at most ``exp(2 eps) - 1`` in L1,
    and an output by at most ``dv + (exp(2 eps) - 1) * max |v'|``."""
    float_problem = mixed_step(torch.float32, seed=3)
    problem = int8_problem(float_problem)
    k_cache, v_cache = problem.caches()
    out = get_attention_backend("torch").forward(problem.query, problem.key, problem.value, k_cache, v_cache,
                                                 problem.meta, problem.scale).double()
    real = problem.real_rows
    err = (out[real] - float_problem.expected[real]).abs().amax(-1)  # [rows, heads]
    step = [split_rows(quantize_rows(k))[1].double().max() / 2 for k in float_problem.keys]
    vstep = [split_rows(quantize_rows(v))[1].double().max() / 2 for v in float_problem.values]
    vmax = [v.abs().max() for v in problem.values]
    q = problem.query.double()[real]
    owners = [i for i, s in enumerate(problem.seqs) for j in range(s.query_len) if j < s.new]
    for row, seq in enumerate(owners):
        eps = problem.scale * q[row].abs().sum(-1) * step[seq]  # [heads]
        bound = vstep[seq] + (torch.exp(2 * eps) - 1) * vmax[seq]
        assert bool((err[row] <= bound).all()), (row, err[row], bound)
    assert float(err.max()) > 0, "the int8 cache should not be exact"


# --- the engine ------------------------------------------------------------------------------
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def prompts_with_a_shared_prefix() -> list[list[int]]:
    rng = random.Random(5)
    shared = [1] + [rng.randrange(3, 1900) for _ in range(40)]  # two full blocks and a bit
    return [shared + [rng.randrange(3, 1900) for _ in range(n)] for n in (3, 20, 7)] + [[1, 44, 45, 46]]


def greedy(llm, prompts, params=GREEDY):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_pool_sizing_follows_the_layout():
    """The same kv_cache_memory: num_blocks in the exact ratio of bytes per block; the bytes the
    pool counts are the bytes the cache tensors take."""
    memory = 3 << 20
    engines = {d: LLM(kv_cache_dtype=d, dtype="float32", kv_cache_memory=memory, max_model_len=256).engine
               for d in ("auto", "int8")}
    cfg = engines["auto"].model_config
    per_token = {"auto": cfg.kv_bytes_per_token(4), "int8": cfg.kv_bytes_per_token(1, "int8")}
    assert per_token["int8"] == 2 * cfg.num_layers * cfg.num_kv_heads * (cfg.head_dim + 4)
    for d, engine in engines.items():
        assert local_core(engine).kv.num_blocks == memory // (per_token[d] * local_core(engine).kv.block_size)
        caches = local_core(engine).executor.kv_caches
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in caches)
        assert nbytes == local_core(engine).kv.num_blocks * local_core(engine).kv.block_size * per_token[d]
    assert local_core(engines["int8"]).executor.kv_caches[0][0].dtype == torch.int8
    ratio = local_core(engines["int8"]).kv.num_blocks / local_core(engines["auto"]).kv.num_blocks
    assert ratio == pytest.approx(per_token["auto"] / per_token["int8"], rel=0.02)  # 128 / 36 for head_dim 32
    assert ratio > 3.4


def test_prefix_hits_and_copy_on_write_give_the_same_tokens():
    """With prefix caching the later prompts read the shared prefix from the int8 cache; without
    it they compute it again and round their own K/V the way the cache would: the same tokens.
    n=2 samples fork a request whose last block is shared and partly filled (copy-on-write)."""
    prompts = prompts_with_a_shared_prefix()
    args = dict(kv_cache_dtype="int8", dtype="float32", num_kv_blocks=64, max_model_len=256,
                max_num_batched_tokens=32)
    hits = LLM(enable_prefix_caching=True, **args)
    cold = LLM(enable_prefix_caching=False, **args)
    assert greedy(hits, prompts) == greedy(cold, prompts)
    assert hits.stats().prefix_hit_rate > 0 and cold.stats().prefix_hit_rate == 0
    forked = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, n=2)
    outs = hits.generate(prompts[:2], forked, use_tqdm=False)
    assert local_core(hits).kv.num_cow_copies > 0, "the fork should copy a shared partial block"
    for o, want in zip(outs, greedy(cold, prompts[:2], SamplingParams(temperature=0, max_tokens=6,
                                                                        ignore_eos=True)), strict=True):
        assert [c.token_ids for c in o.outputs] == [want, want]


def test_int8_is_close_to_the_float_cache_and_backends_agree():
    """Prompt log-probabilities through chunks that read the cache: int8 within 0.05 nats of the
    float32 cache on average (0.013 mean, 0.046 max when written; benchmarks/kv_int8.py measures
    more); the Triton kernels give the ragged backend's greedy tokens."""
    prompts = prompts_with_a_shared_prefix()
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=0)
    args = dict(dtype="float32", num_kv_blocks=64, max_model_len=256, max_num_batched_tokens=16)
    lp = {}
    for d in ("auto", "int8"):
        outs = LLM(kv_cache_dtype=d, **args).generate(prompts, params, use_tqdm=False)
        lp[d] = [next(iter(e.values())).logprob for o in outs for e in o.prompt_logprobs[1:]]
    diffs = [abs(a - b) for a, b in zip(lp["auto"], lp["int8"], strict=True)]
    assert 0 < sum(diffs) / len(diffs) < 0.05 and max(diffs) < 0.5
    small = prompts[:1] + prompts[-1:]
    triton = LLM(kv_cache_dtype="int8", attention_backend="triton", **args)
    torch_ = LLM(kv_cache_dtype="int8", attention_backend="torch", **args)
    assert greedy(triton, small, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)) == \
        greedy(torch_, small, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
def test_a_poisoned_int8_pool_changes_no_token(backend):
    """Random codes and a NaN scale in every slot before the run: the very tokens of a zeroed pool."""
    prompts = prompts_with_a_shared_prefix()[:2] + [[1, 7, 8]]
    params = SamplingParams(temperature=0, max_tokens=3 if backend == "triton" else 6, ignore_eos=True)
    args = dict(kv_cache_dtype="int8", dtype="float32", num_kv_blocks=40, max_model_len=192,
                max_num_batched_tokens=32, enable_prefix_caching=True, max_num_seqs=4)
    # the zeroed pool's tokens from the ragged backend (the two backends agree: the test above),
    # so that the slow Triton interpreter runs only the poisoned pool
    clean = greedy(LLM(**args, attention_backend="torch"), prompts, params)
    llm = LLM(**args, attention_backend=backend)
    gen = torch.Generator().manual_seed(1)
    nan = torch.tensor([math.nan], dtype=torch.float32).view(torch.int8)
    for k_cache, v_cache in local_core(llm).executor.kv_caches:
        for cache in (k_cache, v_cache):
            cache.copy_(torch.randint(-128, 128, cache.shape, generator=gen, dtype=torch.int8))
            cache[..., -SCALE_BYTES:] = nan
    assert greedy(llm, prompts, params) == clean


# --- arguments, refused when the engine is built ------------------------------------------------
def test_bad_kv_cache_dtype_is_refused():
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp8' is not one of \('auto', 'int8'\)"):
        EngineArgs(kv_cache_dtype="fp8")
    with pytest.raises(TypeError, match="kv_cache_dtype must be a name, got kv_cache_dtype=torch.int8"):
        EngineArgs(kv_cache_dtype=torch.int8)


def test_torch_padded_refuses_int8():
    with pytest.raises(ValueError, match=r"'torch_padded' cannot read an 8-bit KV cache.*\('cpp', 'torch', 'triton'\)"):
        LLM(kv_cache_dtype="int8", attention_backend="torch_padded", num_kv_blocks=16, max_model_len=64)


class NoRequirements:
    """A plug-in backend that says nothing about its cache."""

    name = "plain"

    def forward(self, query, key, value, k_cache, v_cache, meta, scale):  # pragma: no cover - never run
        raise AssertionError


def test_a_plugin_without_check_kv_cache_refuses_int8():
    with pytest.raises(ValueError, match="'plain' has no check_kv_cache"):
        LLM(kv_cache_dtype="int8", attention_backend=NoRequirements(), num_kv_blocks=16, max_model_len=64)


def test_head_dim_not_a_multiple_of_four_is_refused(tmp_path):
    save_random_checkpoint(tmp_path, "llama", hidden_size=72, num_attention_heads=4, num_key_value_heads=2)
    assert ModelConfig.from_file(tmp_path).head_dim == 18
    with pytest.raises(ValueError, match="multiple of 4.*head_dim=18"):
        LLM(str(tmp_path), kv_cache_dtype="int8", num_kv_blocks=16, max_model_len=64)
    LLM(str(tmp_path), num_kv_blocks=16, max_model_len=64)  # the float cache is fine


def test_serve_flag():
    from minivllm.entrypoints.cli_args import add_engine_arguments, engine_args_from

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_args_from(parser.parse_args(["--kv-cache-dtype", "int8"]))["kv_cache_dtype"] == "int8"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp8"])


def test_the_simulator_honours_kv_cache_dtype():
    from minivllm.sim.simulator import Simulator

    auto = Simulator("llama-3-8b", "H100-SXM", kv_cache_memory=1 << 30, max_model_len=4096)
    int8 = Simulator("llama-3-8b", "H100-SXM", kv_cache_memory=1 << 30, max_model_len=4096,
                     kv_cache_dtype="int8")
    assert auto.model.kv_dtype == "bf16" and int8.model.kv_dtype == "int8"
    assert auto.num_kv_blocks == (1 << 30) // (2 * 32 * 8 * 128 * 2 * 16)
    # the engine's layout: one byte per value and a float32 scale per row (token and KV head)
    assert int8.num_kv_blocks == (1 << 30) // (2 * 32 * 8 * (128 + 4) * 16)


def test_the_engine_and_the_simulator_count_kv_bytes_by_one_rule():
    """The tiny model's bytes per token in each format: the engine's pool sizing and the
    simulator's spec of the same checkpoint agree (int8 with its scales)."""
    from minivllm.model.config import ModelConfig
    from minivllm.sim.model_spec import ModelSpec
    from minivllm.sim.simulator import Simulator

    cfg = ModelConfig.from_file(minivllm.TINY_MODEL_DIR)
    spec = ModelSpec.from_config(cfg, "tiny", kv_dtype="fp32")
    assert cfg.kv_bytes_per_token(4) == spec.kv_bytes_per_token()
    sim = Simulator(spec, "H100-SXM", kv_cache_memory=1 << 24, max_model_len=256, kv_cache_dtype="int8")
    assert cfg.kv_bytes_per_token(1, "int8") == sim.model.kv_bytes_per_token()
