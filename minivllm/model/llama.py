"""A decoder for the Llama family (Llama 2/3, Mistral, Qwen2, Qwen3) over one flat batch.

The model never sees a padded ``[batch, seq]`` tensor. A step's input is every scheduled
sequence's new tokens laid end to end (``input_ids [T]``, ``positions [T]``) plus an
:class:`~minivllm.attention.AttentionMetadata` that says where each sequence starts, where each
token's K/V goes in the paged cache, and which blocks each sequence may read. Everything except
attention is per token, so it runs on the flat batch unchanged; attention is delegated to a
backend that reads each sequence's context through its block table. The per-token operations
(RMSNorm, RoPE, SiLU-and-multiply) come from ``layer_ops`` (:mod:`minivllm.model.layer_ops`): the
PyTorch forms, or the same in C++ for a float32 model on a CPU.

Module and parameter names match Hugging Face checkpoints so that weights load by name, except
two merges that save matmul launches at every layer (as vLLM does): ``q_proj``/``k_proj``/
``v_proj`` are stacked into ``qkv_proj`` and ``gate_proj``/``up_proj`` into ``gate_up_proj``;
``minivllm.model.loader`` copies each checkpoint tensor into its rows.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.attention import KVCacheRequirements
from minivllm.attention.kv_quant import INT8_BACKENDS, int8_row_width
from minivllm.attention.metadata import AttentionMetadata
from minivllm.model.config import ModelConfig
from minivllm.model.layer_ops import LayerOps, TorchLayerOps
from minivllm.model.rope import RotaryEmbedding


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, ops: LayerOps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.ops = eps, ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend, ops: LayerOps):
        super().__init__()
        self.ops = ops
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = self.head_dim**-0.5
        # q, k and v in one matmul (checkpoints store them apart; the loader stacks them)
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head's q and k before RoPE
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, ops)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, ops)
        self.backend = backend
        # Bound by Model.bind_kv_cache: [num_blocks, block_size, num_kv_heads, head_dim] each
        # (head_dim + 4 int8 bytes per row for an 8-bit cache).
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata):
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.ops.rotary(q, cos, sin), self.ops.rotary(k, cos, sin)
        if self.k_cache is None:
            raise RuntimeError("no KV cache bound: call Model.bind_kv_cache(...) first")
        out = self.backend.forward(q, k, v, self.k_cache, self.v_cache, meta, self.scale)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: LayerOps):
        super().__init__()
        self.ops = ops
        # gate and up in one matmul (stacked by the loader)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend, ops: LayerOps):
        super().__init__()
        self.self_attn = Attention(cfg, backend, ops)
        self.mlp = MLP(cfg, ops)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)

    def forward(self, x, cos, sin, meta):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """Hugging Face's ``model.*`` submodule: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig, backend, ops: LayerOps):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, backend, ops) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)


class LlamaFamilyModel(nn.Module):
    """``forward(input_ids [T], positions [T], meta) -> hidden [T, hidden]``;
    ``compute_logits(hidden [N, hidden]) -> [N, vocab]`` only for the rows that are sampled.
    ``layer_ops``: how RMSNorm, RoPE and SiLU-and-multiply are computed
    (:mod:`minivllm.model.layer_ops`; PyTorch's by default). Every step, prompt or decode, on
    any device, runs these modules: there is one definition of the model."""

    def __init__(self, cfg: ModelConfig, backend, layer_ops: LayerOps | None = None):
        super().__init__()
        self.config = cfg
        self.layer_ops = layer_ops or TorchLayerOps()
        self.model = DecoderStack(cfg, backend, self.layer_ops)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn for layer in self.model.layers]

    @property
    def attention_backend(self):
        """The backend every attention layer uses (one per model)."""
        return self.model.layers[0].self_attn.backend

    def set_attention_backend(self, backend) -> None:
        for attn in self.attention_layers:
            attn.backend = backend

    def bind_kv_cache(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Give every layer its ``(k_cache, v_cache)``; one pair per layer."""
        if len(kv_caches) != self.config.num_layers:
            raise ValueError(f"got {len(kv_caches)} KV cache pairs for {self.config.num_layers} layers")
        for attn, (k, v) in zip(self.attention_layers, kv_caches, strict=True):
            attn.k_cache, attn.v_cache = k, v

    def allocate_kv_cache(
        self, num_blocks: int, block_size: int, dtype: torch.dtype | None = None, device=None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Allocate zeroed paged caches for every layer, bind them, and return them.

        ``dtype``: the model's by default; ``torch.int8`` for an 8-bit cache, whose rows are
        ``head_dim`` codes and a float32 scale (``[num_blocks, block_size, num_kv_heads,
        head_dim + 4]``, see ``minivllm/attention/kv_quant.py``). A backend with requirements on
        its cache (:class:`~minivllm.attention.KVCacheRequirements`) is asked first, and may
        refuse; one without cannot know the int8 layout, so an int8 cache is refused for it."""
        p = self.lm_head.weight
        dtype, device = dtype or p.dtype, torch.device(device or p.device)
        backend = self.attention_backend
        row = self.config.head_dim
        if dtype == torch.int8:
            row = int8_row_width(self.config.head_dim)  # refuses head_dim % 4 != 0
        if isinstance(backend, KVCacheRequirements):
            backend.check_kv_cache(block_size, dtype, device)
        elif dtype == torch.int8:
            raise ValueError(
                f"attention backend {getattr(backend, 'name', type(backend).__name__)!r} has no "
                "check_kv_cache(block_size, dtype, device), so it cannot say it reads the 8-bit "
                f"layout (codes + float32 scale per row); use one of {INT8_BACKENDS} or "
                "kv_cache_dtype='auto'"
            )
        shape = (num_blocks, block_size, self.config.num_kv_heads, row)
        caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(self.config.num_layers)
        ]
        self.bind_kv_cache(caches)
        return caches

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, attn_metadata)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
