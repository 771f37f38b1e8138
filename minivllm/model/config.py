"""What the engine needs to know about a checkpoint, read from its Hugging Face ``config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# bytes of the float32 scale after each row's codes in an 8-bit KV cache (kv_quant.SCALE_BYTES;
# this module stays free of torch, so the number is repeated, and a test checks they agree)
INT8_SCALE_BYTES = 4


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bits_per_value: float,
                       scale_bytes: int = 0) -> float:
    """Bytes of one token's K and V in every layer: a key and a value row per KV head, each of
    ``head_dim`` values of ``bits_per_value`` bits plus ``scale_bytes`` of scale stored beside it
    (an 8-bit cache with a scale per token and head: ``INT8_SCALE_BYTES``; a float cache, or a
    format whose scale is one per tensor: 0). The one rule the engine's pool sizing
    (:meth:`ModelConfig.kv_bytes_per_token`) and the simulator's (``ModelSpec``) both use."""
    return 2 * num_layers * num_kv_heads * (head_dim * bits_per_value / 8 + scale_bytes)

# the checkpoint shipped with the package (see docs/tiny_model.md)
TINY_MODEL_DIR = str(Path(__file__).resolve().parent.parent / "tiny_model")

# architecture name in config.json -> the features our decoder switches on for it
SUPPORTED_ARCHITECTURES: dict[str, dict[str, bool]] = {
    "LlamaForCausalLM": {"qkv_bias": False, "qk_norm": False},
    "MistralForCausalLM": {"qkv_bias": False, "qk_norm": False},
    "Qwen2ForCausalLM": {"qkv_bias": True, "qk_norm": False},
    "Qwen3ForCausalLM": {"qkv_bias": False, "qk_norm": True},
}
_MODEL_TYPE_TO_ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture is not one this decoder implements."""


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    rope_scaling: dict[str, Any] | None = None
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def gqa_group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token(self, dtype_bytes: int, kv_cache_dtype: str = "auto") -> int:
        """K and V, every layer, every KV head: ``2 * layers * kv_heads * head_dim * bytes`` for a
        cache in the model's float format (``dtype_bytes`` each); for ``kv_cache_dtype="int8"``
        ``2 * layers * kv_heads * (head_dim + 4)``: one byte per code and a float32 scale per
        row (the layout of ``minivllm/attention/kv_quant.py``)."""
        if kv_cache_dtype == "int8":
            bits, scale = 8, INT8_SCALE_BYTES
        elif kv_cache_dtype == "auto":
            bits, scale = 8 * dtype_bytes, 0
        else:
            raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not one of ('auto', 'int8')")
        return int(kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, bits, scale))

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or [_MODEL_TYPE_TO_ARCH.get(cfg.get("model_type", ""), "")]
        arch = archs[0] if archs else ""
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {arch or cfg.get('model_type')!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        features = SUPPORTED_ARCHITECTURES[arch]
        num_heads = cfg["num_attention_heads"]
        # transformers >= 5 writes rope settings under "rope_parameters"; older files use
        # "rope_theta" + "rope_scaling". Accept both.
        rope = dict(cfg.get("rope_parameters") or {})
        rope_theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        scaling = rope or cfg.get("rope_scaling") or None
        if scaling is not None:
            scaling = dict(scaling)
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind == "default":
                scaling = None
            elif kind != "llama3":
                raise UnsupportedModelError(
                    f"rope scaling type {kind!r} is not supported; supported: default, llama3"
                )
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        sliding = cfg.get("sliding_window")
        if cfg.get("use_sliding_window") is False:
            sliding = None
        attention_bias = bool(cfg.get("attention_bias", False))
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=features["qkv_bias"] or attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=features["qk_norm"],
            rope_scaling=scaling,
            sliding_window=sliding,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
            raw=cfg,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None
        try:
            return cls.from_dict(cfg)
        except KeyError as err:
            raise ValueError(f"{path} lacks the field {err.args[0]!r} that the decoder needs") from None
