"""What the cost model needs to know about a model: its shape, and the bytes it occupies.

A :class:`ModelSpec` is built from the same ``config.json`` the engine loads (through
:class:`minivllm.model.config.ModelConfig`), or from a preset that is a copy of a public
``config.json``. Every derived number (parameter count, weight bytes, KV bytes per token,
FLOPs per token) is computed here from the shape, never typed in, so a student can check each
one by hand:

* parameters of one decoder layer = attention ``h*(nh*d) + 2*h*(nkv*d) + (nh*d)*h``
  + gated MLP ``3*h*I`` + two RMSNorm vectors ``2*h`` (Qwen3 adds two ``d``-sized q/k norms);
* KV bytes per token = ``2 (K and V) * layers * kv_heads * head_dim * bytes per element``;
* FLOPs per token = ``2 * (matmul parameters)`` for the linear layers plus
  ``4 * layers * heads * head_dim`` per (query, key) pair for attention (QK^T and PV).

Quantisation is modelled the way weight-only schemes ship checkpoints: the linear layers of the
decoder blocks are stored at ``weight_dtype``, and int4 (AWQ's layout) adds, per group of
``quant_group_size`` weights, one 16-bit scale and one zero point stored in 4 bits like the
weights (4 + 20/128 = 4.16 bits per weight); int8 adds one 16-bit scale per output channel. The
token embedding, the LM head and the norms stay 16-bit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from minivllm.model.config import ModelConfig, kv_bytes_per_token

# bits per element before quantisation overheads
DTYPE_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}
_FLOAT_DTYPES = {"fp32", "fp16", "bf16"}


def _check_dtype(dtype: str) -> str:
    if dtype not in DTYPE_BITS:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_BITS)}")
    return dtype


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 8192
    qkv_bias: bool = False
    qk_norm: bool = False
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    quant_group_size: int = 128
    kv_scale_bytes: int = 0  # bytes of scale stored beside each K or V row (per token and KV head)

    def __post_init__(self) -> None:
        _check_dtype(self.weight_dtype)
        _check_dtype(self.kv_dtype)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")

    # --- construction --------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: ModelConfig, name: str = "model", **overrides) -> ModelSpec:
        """Shape from a parsed ``config.json``; ``overrides`` set dtypes or any other field."""
        spec = cls(
            name=name,
            num_layers=cfg.num_layers,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            vocab_size=cfg.vocab_size,
            tie_word_embeddings=cfg.tie_word_embeddings,
            max_position_embeddings=cfg.max_position_embeddings,
            qkv_bias=cfg.qkv_bias,
            qk_norm=cfg.qk_norm,
        )
        return dataclasses.replace(spec, **overrides)

    @classmethod
    def from_pretrained(cls, path: str | Path, name: str | None = None, **overrides) -> ModelSpec:
        """Read ``path/config.json`` (a checkpoint directory or the file itself)."""
        path = Path(path)
        return cls.from_config(ModelConfig.from_file(path), name or path.name, **overrides)

    def with_dtypes(self, weight_dtype: str | None = None, kv_dtype: str | None = None) -> ModelSpec:
        return dataclasses.replace(
            self, weight_dtype=weight_dtype or self.weight_dtype, kv_dtype=kv_dtype or self.kv_dtype
        )

    # --- parameter counts ----------------------------------------------------------------
    @property
    def attention_params_per_layer(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q_out, kv_out = self.num_heads * d, self.num_kv_heads * d
        params = h * q_out + 2 * h * kv_out + q_out * h
        if self.qkv_bias:
            params += q_out + 2 * kv_out
        return params

    @property
    def mlp_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # gate, up, down

    @property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def linear_params(self) -> int:
        """Weights of the decoder blocks' matmuls: what every token multiplies through."""
        return self.num_layers * (self.attention_params_per_layer + self.mlp_params_per_layer)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Separate LM-head weights (0 when tied to the embedding)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def norm_params(self) -> int:
        return self.num_layers * self.norm_params_per_layer + self.hidden_size  # + final norm

    @property
    def num_params(self) -> int:
        return self.linear_params + self.embedding_params + self.lm_head_params + self.norm_params

    # --- bytes ---------------------------------------------------------------------------
    @property
    def bits_per_linear_weight(self) -> float:
        """Storage bits per decoder-block weight, quantisation scales and zeros included."""
        bits = DTYPE_BITS[self.weight_dtype]
        if self.weight_dtype in _FLOAT_DTYPES or self.weight_dtype == "fp8":
            return float(bits)
        if self.weight_dtype == "int8":
            return bits + 16 / self.hidden_size  # one fp16 scale per output channel
        # int4 (AWQ): per group, an fp16 scale and a zero point packed like the weights
        return bits + (16 + bits) / self.quant_group_size

    @property
    def linear_weight_bytes(self) -> float:
        return self.linear_params * self.bits_per_linear_weight / 8

    @property
    def high_precision_bytes(self) -> float:
        """Embedding, LM head and norms: kept in 16-bit (32-bit if the whole model is fp32)."""
        b = 4 if self.weight_dtype == "fp32" else 2
        return (self.embedding_params + self.lm_head_params + self.norm_params) * b

    @property
    def weight_bytes(self) -> float:
        """Memory the weights occupy on the device."""
        return self.linear_weight_bytes + self.high_precision_bytes

    @property
    def naive_weight_bytes(self) -> float:
        """``params x bits / 8`` for every parameter: the back-of-envelope figure."""
        return self.num_params * DTYPE_BITS[self.weight_dtype] / 8

    @property
    def lm_head_bytes(self) -> float:
        """Bytes of the output projection (the embedding matrix itself when tied)."""
        b = 4 if self.weight_dtype == "fp32" else 2
        return self.vocab_size * self.hidden_size * b

    @property
    def body_weight_bytes(self) -> float:
        """Weights streamed from memory once per forward pass, LM head excluded.

        The embedding table is *not* streamed: a step gathers only its tokens' rows.
        """
        b = 4 if self.weight_dtype == "fp32" else 2
        return self.linear_weight_bytes + self.norm_params * b

    def kv_bytes_per_token(self, kv_dtype: str | None = None) -> float:
        """K and V of one token in every layer and KV head, ``kv_dtype``'s bits per value plus
        ``kv_scale_bytes`` per row (``minivllm.model.config.kv_bytes_per_token``, the engine's
        rule). A quantised format's scale is one per tensor here unless ``kv_scale_bytes`` says
        otherwise: ``Simulator(kv_cache_dtype="int8")`` models the engine's 8-bit cache, whose
        float32 scale per token and KV head is 4 bytes per row."""
        bits = DTYPE_BITS[_check_dtype(kv_dtype or self.kv_dtype)]
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, bits, self.kv_scale_bytes)

    # --- FLOPs ---------------------------------------------------------------------------
    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs for one query attending to one key, all layers: QK^T (2d) + PV (2d) per head."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    @property
    def lm_head_flops(self) -> int:
        return 2 * self.vocab_size * self.hidden_size

    def flops_per_token(self, context_len: int = 0, sample: bool = True) -> float:
        """Forward FLOPs for one new token that attends to ``context_len`` earlier tokens."""
        flops = 2 * self.linear_params + self.attention_flops_per_pair * (context_len + 1)
        return flops + (self.lm_head_flops if sample else 0)

    def describe(self) -> str:
        return (
            f"{self.name}: {self.num_params / 1e9:.2f}B params, {self.num_layers} layers, "
            f"{self.num_heads} heads / {self.num_kv_heads} KV heads x {self.head_dim}, weights "
            f"{self.weight_dtype} = {self.weight_bytes / 1e9:.1f} GB, KV {self.kv_dtype} = "
            f"{self.kv_bytes_per_token() / 1024:.0f} KiB/token"
        )


# --- presets: trimmed copies of the public config.json files --------------------------------
# meta-llama/Meta-Llama-3-8B and -70B config.json (shapes identical in Llama 3.1, whose
# max_position_embeddings is 131072 with llama3 RoPE scaling; we use the 3.1 context so that
# 30k-token reasoning sequences fit). Qwen/Qwen3-0.6B config.json.
_PRESET_CONFIGS: dict[str, dict] = {
    "llama-3-8b": dict(
        architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0,
        tie_word_embeddings=False,
    ),
    "llama-3-70b": dict(
        architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=8192,
        intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0,
        tie_word_embeddings=False,
    ),
    "qwen3-0.6b": dict(
        architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=1024,
        intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rope_theta=1000000.0, tie_word_embeddings=True,
    ),
}
PRESETS = (*_PRESET_CONFIGS, "tiny")


def preset(name: str, weight_dtype: str = "bf16", kv_dtype: str = "bf16") -> ModelSpec:
    """``preset("llama-3-70b", weight_dtype="int4", kv_dtype="int8")``.

    ``"tiny"`` reads the shipped tiny model's ``config.json`` at call time (it is retrained
    from time to time, so its shape is never copied here).
    """
    key = name.lower()
    if key == "tiny":
        return tiny_model_spec(weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    if key not in _PRESET_CONFIGS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    cfg = ModelConfig.from_dict(_PRESET_CONFIGS[key])
    return ModelSpec.from_config(cfg, key, weight_dtype=weight_dtype, kv_dtype=kv_dtype)


def tiny_model_spec(**overrides) -> ModelSpec:
    from minivllm.model.loader import TINY_MODEL_DIR

    path = Path(TINY_MODEL_DIR) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"the tiny model has no config.json yet ({path}); train it first")
    return ModelSpec.from_pretrained(path.parent, "tiny", **overrides)
