"""Cases for ex00_kv_memory: KV bytes per token and sequence, decode intensity, crossover."""

from __future__ import annotations

import json
from pathlib import Path

from minivllm.course.grading import Case, case, expect, expect_raises

CASES: list[Case] = []

# Hugging Face config.json fields of public models (only the ones that matter here).
LLAMA3_8B = dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096)
LLAMA3_70B = dict(num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, hidden_size=8192)
# Qwen3-0.6B sets head_dim=128 although hidden_size / heads = 64: trust head_dim when present.
QWEN3_06B = dict(num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, hidden_size=1024, head_dim=128)
# GPT-2 small style: no num_key_value_heads at all (every head has its own K and V).
MHA_SMALL = dict(num_hidden_layers=12, num_attention_heads=12, hidden_size=768)
# Some configs write num_key_value_heads: null for multi-head attention.
MHA_NULL = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=None, hidden_size=64)


def _tiny_config() -> dict:
    from minivllm.model.loader import TINY_MODEL_DIR

    path = Path(TINY_MODEL_DIR) / "config.json"
    if not path.is_file():  # the model is not trained yet: a config of the same shape
        return dict(architectures=["LlamaForCausalLM"], vocab_size=2048, hidden_size=192,
                    intermediate_size=512, num_hidden_layers=4, num_attention_heads=6,
                    num_key_value_heads=2, head_dim=32)
    return json.loads(path.read_text())


@case(CASES, "Llama-3-8B, bfloat16", "kv_bytes_per_token", "per layer a key and a value vector for every KV head, in 2-byte numbers")
def _(ex):
    expect(ex.kv_bytes_per_token(LLAMA3_8B, "bfloat16"), 2 * 32 * 8 * 128 * 2)


@case(CASES, "Llama-3-70B, float16 and int8", "kv_bytes_per_token", "80 layers, 8 KV heads of 128 dims")
def _(ex):
    expect(ex.kv_bytes_per_token(LLAMA3_70B, "float16"), 2 * 80 * 8 * 128 * 2, "float16")
    expect(ex.kv_bytes_per_token(LLAMA3_70B, "int8"), 2 * 80 * 8 * 128 * 1, "int8")


@case(CASES, "Qwen3-0.6B (explicit head_dim)", "kv_bytes_per_token",
      "use config['head_dim'] when it is there; hidden_size // heads is only the fallback")
def _(ex):
    expect(ex.kv_bytes_per_token(QWEN3_06B, "bfloat16"), 2 * 28 * 8 * 128 * 2)


@case(CASES, "multi-head attention, no num_key_value_heads", "kv_bytes_per_token",
      "a missing (or null) num_key_value_heads means one KV head per query head")
def _(ex):
    expect(ex.kv_bytes_per_token(MHA_SMALL, "float32"), 2 * 12 * 12 * 64 * 4, "key missing")
    expect(ex.kv_bytes_per_token(MHA_NULL, "float16"), 2 * 2 * 4 * 16 * 2, "key is null")


@case(CASES, "the shipped tiny model vs the engine", "kv_bytes_per_token",
      "the engine's ModelConfig.kv_bytes_per_token computes the same thing for its own model")
def _(ex):
    from minivllm.model.config import ModelConfig

    cfg = _tiny_config()
    for dtype, nbytes in (("float32", 4), ("bfloat16", 2)):
        expect(ex.kv_bytes_per_token(cfg, dtype), ModelConfig.from_dict(cfg).kv_bytes_per_token(nbytes), dtype)


@case(CASES, "unknown dtype", "kv_bytes_per_token", "raise ValueError when dtype is not in DTYPE_BYTES")
def _(ex):
    expect_raises(ValueError, lambda: ex.kv_bytes_per_token(LLAMA3_8B, "float64"))


@case(CASES, "32k-token Llama-3-70B sequence", "kv_bytes_per_sequence", "tokens x bytes per token")
def _(ex):
    expect(ex.kv_bytes_per_sequence(LLAMA3_70B, "bfloat16", 32768), 32768 * 2 * 80 * 8 * 128 * 2)


@case(CASES, "zero tokens, with and without blocks", "kv_bytes_per_sequence", "an empty sequence holds nothing")
def _(ex):
    expect(ex.kv_bytes_per_sequence(LLAMA3_8B, "bfloat16", 0), 0, "no block_size")
    expect(ex.kv_bytes_per_sequence(LLAMA3_8B, "bfloat16", 0, block_size=16), 0, "block_size=16")


@case(CASES, "block boundaries (15, 16, 17 tokens in 16-token blocks)", "kv_bytes_per_sequence",
      "17 tokens in 16-token blocks occupy 2 blocks")
def _(ex):
    per_token = 2 * 32 * 8 * 128 * 2
    for n, slots in ((1, 16), (15, 16), (16, 16), (17, 32), (200, 208)):
        expect(ex.kv_bytes_per_sequence(LLAMA3_8B, "bfloat16", n, block_size=16), slots * per_token, f"{n} tokens")
    expect(ex.kv_bytes_per_sequence(LLAMA3_8B, "bfloat16", 17, block_size=1), 17 * per_token, "block_size=1")


@case(CASES, "batch 1 and batch 64, weights only", "decode_intensity",
      "FLOPs = 2 * params * batch; bytes = params * weight_bytes (+ batch * kv bytes)")
def _(ex):
    expect(ex.decode_intensity(1, 8e9, 2), 1.0, "batch 1, bf16 weights")
    expect(ex.decode_intensity(64, 8e9, 2), 64.0, "batch 64, bf16 weights")
    expect(ex.decode_intensity(64, 8e9, 0.5), 256.0, "batch 64, 4-bit weights")


@case(CASES, "KV reads included", "decode_intensity", "each sequence adds kv_bytes_per_seq to the bytes moved")
def _(ex):
    p, kv = 8e9, 1.0e9
    for b in (1, 16, 256):
        expect(ex.decode_intensity(b, p, 2, kv), 2 * p * b / (p * 2 + b * kv), f"batch {b}")


@case(CASES, "ridge hit exactly (256 FLOP/byte)", "crossover_batch",
      "intensity equal to the ridge already counts as compute-bound: use >=, not >")
def _(ex):
    # peak 2^40 FLOP/s over 2^32 B/s: ridge 256; bf16 weights: intensity = batch.
    expect(ex.crossover_batch(2**33, 2, 2.0**40, 2.0**32), 256)


@case(CASES, "4-bit weights and a tiny ridge", "crossover_batch",
      "smaller weights mean fewer bytes per FLOP; the answer is never below batch 1")
def _(ex):
    expect(ex.crossover_batch(2**33, 0.5, 2.0**40, 2.0**32), 64, "4-bit weights")
    expect(ex.crossover_batch(1e9, 2, 1e9, 1e12), 1, "ridge 0.001")


@case(CASES, "KV bytes move the crossover", "crossover_batch",
      "each sequence now brings bytes as well as FLOPs; the answer is the first batch whose intensity reaches the ridge")
def _(ex):
    # P = 2^30, w = 2, kv = 2^20, ridge 256: B >= 2^39 / (2^31 - 2^28) = 292.57...
    expect(ex.crossover_batch(2**30, 2, 2.0**40, 2.0**32, kv_bytes_per_seq=2**20), 293)


@case(CASES, "KV reads so large decode never turns compute-bound", "crossover_batch",
      "however large the batch, the intensity stays below what one sequence alone brings (FLOPs over its KV bytes)")
def _(ex):
    expect(ex.crossover_batch(2**30, 2, 2.0**40, 2.0**32, kv_bytes_per_seq=2**24), None, "far beyond")
    expect(ex.crossover_batch(2**30, 2, 2.0**40, 2.0**32, kv_bytes_per_seq=2**23), None, "exactly at the limit")
