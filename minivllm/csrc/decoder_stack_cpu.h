// Every decoder layer of a step in one call from Python, for a float32 model on a CPU whose step
// is all short sequences (decodes, verifications of drafts, short chunks over a cached context).
//
// For a small model a layer's dozen operators each cost a few microseconds of Python (a module
// call, an attribute look-up, a dispatch) on top of their arithmetic, and at one sequence per
// step that is most of the step: a 2-layer draft model cost about half a pass of the 4-layer
// target whatever their widths. Here the same operators run in the same order from C++: the
// matrix products are the same at::linear calls as nn.Linear's, and RMSNorm, the rotation, the
// cache write, the attention and SiLU-and-multiply are the kernels of layer_ops_cpu.h and
// paged_attention_cpu.h. So the result is the per-layer path's to the bit
// (tests/model/test_decoder_stack.py); only the interpreter's share is gone.
// minivllm/model/decoder_stack.py says when a step can take it.

#pragma once

#include <torch/extension.h>

#include <vector>

#include "layer_ops_cpu.h"
#include "paged_attention_cpu.h"

namespace {

// The tensors of one layer, in the order minivllm/model/decoder_stack.py lists them; a missing
// bias or q/k norm is an empty tensor.
enum LayerTensor {
  kInputNorm, kQkvWeight, kQkvBias, kQNorm, kKNorm, kOWeight, kOBias,
  kPostNorm, kGateUpWeight, kGateUpBias, kDownWeight, kDownBias, kTensorsPerLayer
};

inline torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  return bias.numel() ? at::linear(x, weight, bias) : at::linear(x, weight);
}

// RMSNorm of each head's vector of x [T, heads, head_dim] (Qwen3's q and k norms).
inline torch::Tensor head_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return rms_norm(x.reshape({-1, x.size(2)}), weight, eps).view(x.sizes());
}

// Row t of rows [T, KVH, D] to slot slots[t] of cache [num_blocks, block_size, KVH, D], cast to
// the cache's dtype.
inline void store_rows(const torch::Tensor& rows, const torch::Tensor& cache, const torch::Tensor& slots) {
  auto flat = cache.view({cache.size(0) * cache.size(1), cache.size(2), cache.size(3)});
  flat.index_copy_(0, slots, rows.scalar_type() == cache.scalar_type() ? rows : rows.to(cache.scalar_type()));
}

}  // namespace

// x [T, hidden] (the embedded tokens), cos and sin [T, head_dim]; layers: kTensorsPerLayer
// tensors per layer; one float K and V cache per layer; slots [T] int64, every one a real slot;
// block_tables [S, W], seq_lens [S] and query_start [S + 1] int32 as paged_attention takes them.
// Returns the final norm of the last layer's output, [T, hidden].
torch::Tensor decoder_stack(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> layers,
                            std::vector<torch::Tensor> k_caches, std::vector<torch::Tensor> v_caches,
                            torch::Tensor slots, torch::Tensor block_tables, torch::Tensor seq_lens,
                            torch::Tensor query_start, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                            double scale, double eps, torch::Tensor final_norm) {
  const auto num_layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(static_cast<int64_t>(v_caches.size()) == num_layers &&
                  static_cast<int64_t>(layers.size()) == num_layers * kTensorsPerLayer,
              "decoder_stack: ", layers.size(), " layer tensors and ", k_caches.size(), " + ", v_caches.size(),
              " caches, expected ", kTensorsPerLayer, " tensors and one K and one V cache per layer");
  TORCH_CHECK(x.dim() == 2 && x.size(0) > 0, "decoder_stack: x must be [T > 0, hidden]");
  TORCH_CHECK(slots.scalar_type() == torch::kLong && slots.numel() == x.size(0),
              "decoder_stack: one int64 slot per row");
  const int64_t t = x.size(0), q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  for (int64_t l = 0; l < num_layers; ++l) {
    const torch::Tensor* w = layers.data() + l * kTensorsPerLayer;
    TORCH_CHECK(k_caches[l].scalar_type() != torch::kChar, "decoder_stack: an int8 cache takes the per-layer path");
    auto qkv = linear(rms_norm(x, w[kInputNorm], eps), w[kQkvWeight], w[kQkvBias]);
    auto q = qkv.narrow(1, 0, q_size).view({t, num_heads, head_dim});
    auto k = qkv.narrow(1, q_size, kv_size).view({t, num_kv_heads, head_dim});
    auto v = qkv.narrow(1, q_size + kv_size, kv_size).view({t, num_kv_heads, head_dim});
    if (w[kQNorm].numel()) {
      q = head_norm(q, w[kQNorm], eps);
      k = head_norm(k, w[kKNorm], eps);
    }
    rotary_(q, cos, sin);
    rotary_(k, cos, sin);
    store_rows(k, k_caches[l], slots);
    store_rows(v, v_caches[l], slots);
    auto attended = paged_attention(q, k_caches[l], v_caches[l], block_tables, seq_lens, query_start, scale);
    x = x + linear(attended.reshape({t, q_size}), w[kOWeight], w[kOBias]);
    auto gate_up = linear(rms_norm(x, w[kPostNorm], eps), w[kGateUpWeight], w[kGateUpBias]);
    x = x + linear(silu_and_mul(gate_up), w[kDownWeight], w[kDownBias]);
  }
  return rms_norm(x, final_norm, eps);
}

// The passes of a greedy draft model that proposes num_steps tokens per sequence, in one call.
// Pass 0 feeds each sequence the tokens its draft K/V lacks (first_tokens [T0] int64, rows of
// sequence s from first_query_start[s], written at first_slots, rotated by first_cos/first_sin
// [T0, head_dim], attending over first_seq_lens [S] positions); its logits are those of each
// sequence's last row (last_rows [S] int64). Pass j >= 1 feeds the previous pass's argmax, one
// token per sequence, written at slots[j - 1] ([num_steps - 1, S] int64), over seq_lens[j - 1]
// ([num_steps - 1, S] int32) positions, rotated by cos[j - 1], sin[j - 1] ([num_steps - 1, S,
// head_dim]). The logits are lm_head's product as nn.Linear takes it and the argmax is torch's
// (the first of equal maxima): the draft tokens of the pass-by-pass loop. Returns them,
// [num_steps, S] int64.
torch::Tensor greedy_draft_steps(torch::Tensor first_tokens, torch::Tensor first_cos, torch::Tensor first_sin,
                                 torch::Tensor first_slots, torch::Tensor first_seq_lens,
                                 torch::Tensor first_query_start, torch::Tensor last_rows, torch::Tensor cos,
                                 torch::Tensor sin, torch::Tensor slots, torch::Tensor seq_lens,
                                 torch::Tensor block_tables, torch::Tensor embedding, torch::Tensor lm_head,
                                 std::vector<torch::Tensor> layers, std::vector<torch::Tensor> k_caches,
                                 std::vector<torch::Tensor> v_caches, int64_t num_heads, int64_t num_kv_heads,
                                 int64_t head_dim, double scale, double eps, torch::Tensor final_norm) {
  TORCH_CHECK(last_rows.dim() == 1 && last_rows.scalar_type() == torch::kLong && first_tokens.scalar_type() == torch::kLong,
              "greedy_draft_steps: first_tokens and last_rows must be int64");
  const int64_t num_seqs = last_rows.size(0), num_steps = slots.size(0) + 1;
  TORCH_CHECK(first_seq_lens.size(0) == num_seqs && first_query_start.size(0) == num_seqs + 1 &&
                  block_tables.size(0) == num_seqs,
              "greedy_draft_steps: one table, length and last row per sequence, first_query_start one longer");
  TORCH_CHECK(slots.dim() == 2 && slots.size(1) == num_seqs && seq_lens.sizes() == slots.sizes() && cos.dim() == 3 &&
                  cos.size(0) == num_steps - 1 && cos.size(1) == num_seqs && sin.sizes() == cos.sizes(),
              "greedy_draft_steps: slots and seq_lens [steps - 1, S], cos and sin [steps - 1, S, head_dim] for S = ",
              num_seqs);
  auto out = torch::empty({num_steps, num_seqs}, last_rows.options());
  auto hidden = decoder_stack(at::embedding(embedding, first_tokens), first_cos, first_sin, layers, k_caches, v_caches,
                              first_slots, block_tables, first_seq_lens, first_query_start, num_heads, num_kv_heads,
                              head_dim, scale, eps, final_norm);
  auto tokens = at::linear(hidden.index_select(0, last_rows), lm_head).argmax(-1);
  out[0].copy_(tokens);
  const auto query_start = torch::arange(num_seqs + 1, first_query_start.options());
  for (int64_t j = 1; j < num_steps; ++j) {
    hidden = decoder_stack(at::embedding(embedding, tokens), cos[j - 1], sin[j - 1], layers, k_caches, v_caches,
                           slots[j - 1], block_tables, seq_lens[j - 1], query_start, num_heads, num_kv_heads, head_dim,
                           scale, eps, final_norm);
    tokens = at::linear(hidden, lm_head).argmax(-1);
    out[j].copy_(tokens);
  }
  return out;
}
