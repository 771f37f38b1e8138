"""Hardware and model numbers, recomputed from first principles."""

from __future__ import annotations

import json

import pytest

from minivllm.sim import HARDWARE, ModelSpec, get_hardware, preset
from minivllm.sim.model_spec import DTYPE_BITS


def llama_params(vocab, h, inter, layers, heads, kv_heads, head_dim, tied=False) -> int:
    """Independent count, written out the long way."""
    attn = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h
    mlp = 3 * h * inter
    norms = 2 * h
    emb = vocab * h
    return layers * (attn + mlp + norms) + h + emb + (0 if tied else emb)


def test_llama3_8b_parameter_count():
    spec = preset("llama-3-8b")
    assert spec.num_params == llama_params(128256, 4096, 14336, 32, 32, 8, 128)
    assert spec.num_params == pytest.approx(8.03e9, rel=0.01)  # the model card's 8.03B


def test_llama3_70b_parameter_count():
    spec = preset("llama-3-70b")
    assert spec.num_params == llama_params(128256, 8192, 28672, 80, 64, 8, 128)
    assert spec.num_params == pytest.approx(70.6e9, rel=0.01)


def test_qwen3_0_6b_counts_tied_embeddings_and_qk_norm():
    spec = preset("qwen3-0.6b")
    expected = llama_params(151936, 1024, 3072, 28, 16, 8, 128, tied=True) + 28 * 2 * 128
    assert spec.num_params == expected
    assert spec.num_params == pytest.approx(0.6e9, rel=0.02)
    assert spec.lm_head_params == 0


def test_kv_bytes_per_token_llama3_70b():
    spec = preset("llama-3-70b")
    # 2 (K, V) x 80 layers x 8 KV heads x 128 dims x 2 bytes
    assert spec.kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2 == 327_680
    assert spec.kv_bytes_per_token("int8") == 163_840
    assert spec.kv_bytes_per_token("int4") == 81_920
    mha = ModelSpec(**{**spec.__dict__, "num_kv_heads": 64})
    assert mha.kv_bytes_per_token() == 8 * spec.kv_bytes_per_token()  # GQA-8 saves 8x


@pytest.mark.parametrize("dtype", ["bf16", "int8", "int4"])
def test_weight_bytes_by_dtype(dtype):
    spec = preset("llama-3-70b", weight_dtype=dtype)
    linear = spec.linear_params
    other = spec.num_params - linear
    bits = {"bf16": 16, "int8": 8 + 16 / 8192, "int4": 4 + (16 + 4) / 128}[dtype]  # AWQ
    assert spec.weight_bytes == pytest.approx(linear * bits / 8 + other * 2)
    assert spec.naive_weight_bytes == spec.num_params * DTYPE_BITS[dtype] / 8


def test_int4_70b_fits_one_h100_with_room_for_kv():
    spec = preset("llama-3-70b", weight_dtype="int4", kv_dtype="int8")
    assert 35e9 < spec.weight_bytes < 42e9  # 68.5B x 4.16 bits + 16-bit embeddings and head
    # at vLLM's default 90 % memory utilisation, ~30 GB remain for the KV cache
    assert get_hardware("H100").memory_bytes * 0.9 - spec.weight_bytes > 30e9


def test_flops_per_token_is_twice_the_matmul_params_plus_attention():
    spec = preset("llama-3-8b")
    assert spec.flops_per_token(0, sample=False) == 2 * spec.linear_params + 4 * 32 * 32 * 128
    grow = spec.flops_per_token(1000) - spec.flops_per_token(0)
    assert grow == 1000 * 4 * spec.num_layers * spec.num_heads * spec.head_dim
    # roughly "2 x params" per token at short context
    assert spec.flops_per_token(0) == pytest.approx(2 * spec.num_params, rel=0.15)


def test_from_config_json(tmp_path):
    cfg = dict(
        architectures=["LlamaForCausalLM"], vocab_size=1000, hidden_size=64, intermediate_size=160,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=True,
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = ModelSpec.from_pretrained(tmp_path, kv_dtype="fp32")
    assert spec.num_params == llama_params(1000, 64, 160, 3, 4, 2, 16, tied=True)
    assert spec.kv_bytes_per_token() == 2 * 3 * 2 * 16 * 4
    assert spec.max_position_embeddings == 512


def test_tiny_preset_reads_config_at_run_time():
    from pathlib import Path

    import minivllm
    from minivllm.model.config import ModelConfig

    path = Path(minivllm.TINY_MODEL_DIR) / "config.json"
    if not path.is_file():
        with pytest.raises(FileNotFoundError):
            preset("tiny")
        return
    cfg = ModelConfig.from_file(path)
    spec = preset("tiny", kv_dtype="fp32")
    assert spec.kv_bytes_per_token() == cfg.kv_bytes_per_token(4)
    assert spec.num_layers == cfg.num_layers


def test_unknown_dtype_and_preset_are_rejected():
    with pytest.raises(ValueError):
        preset("llama-3-8b", weight_dtype="int3")
    with pytest.raises(KeyError):
        preset("gpt-5")


def test_hardware_table_numbers():
    h100, h200, a100 = get_hardware("H100"), get_hardware("H200"), get_hardware("A100")
    assert h100.peak_flops == pytest.approx(1979e12 / 2)  # datasheet sparse figure halved
    assert h200.peak_flops == h100.peak_flops and h200.memory_bandwidth > h100.memory_bandwidth
    assert h100.ridge_point == pytest.approx(989.5 / 3.35, rel=1e-6)  # ~295 FLOP/byte
    assert a100.ridge_point == pytest.approx(312 / 2.039, rel=1e-6)
    for hw in HARDWARE.values():
        assert hw.usd_per_hour > 0 and hw.source
        assert 10e9 <= hw.memory_bytes <= 200e9
    assert get_hardware("t4").with_price(1.0).usd_per_hour == 1.0
    with pytest.raises(KeyError):
        get_hardware("B300")
