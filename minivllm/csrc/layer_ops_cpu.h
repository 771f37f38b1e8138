// The per-token operations of a decoder layer on a CPU, one pass over the data each: RMSNorm,
// rotary embeddings applied in place, and SiLU(gate) * up.
//
// In PyTorch each of these is several operators (RoPE alone: two slices, a negation, a
// concatenation, two products and a sum, for q and again for k), each with its own pass over
// memory, its own temporary and its own dispatch. For a small model that overhead costs more
// than the arithmetic; vLLM's CPU build has the same three as C++ ops for the same reason.
// minivllm/model/llama.py keeps the PyTorch forms as the reference, and
// tests/model/test_layer_ops.py holds these to them. float32 only (the CPU's default dtype).

#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vec8.h"

namespace {

// Rows per task of at::parallel_for: about 16k floats, so a small step runs on one thread.
inline int64_t row_grain(int64_t row_len) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(row_len, 1)); }

void check_float_rows(const torch::Tensor& x, const char* op, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat, op, ": ", name,
              " must be a float32 CPU tensor, got ", x.scalar_type(), " on ", x.device());
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, op, ": ", name, " must be [rows, columns] with unit column stride");
}

}  // namespace

// weight * x / sqrt(mean(x^2) + eps) for each row of x [T, H]; returns a new [T, H].
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  check_float_rows(x, "rms_norm", "x");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.scalar_type() == torch::kFloat,
              "rms_norm: weight must be float32 [", x.size(1), "]");
  weight = weight.contiguous();
  const int64_t rows = x.size(0), h = x.size(1), stride = x.stride(0);
  auto out = torch::empty({rows, h}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t vec_end = h / 8 * 8;
  at::parallel_for(0, rows, row_grain(h), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* xr = xp + t * stride;
      float* o = op + t * h;
      f8 acc = {};
      for (int64_t i = 0; i < vec_end; i += 8) {
        const f8 v = load8(xr + i);
        acc += v * v;
      }
      float ss = sum8(acc);
      for (int64_t i = vec_end; i < h; ++i) ss += xr[i] * xr[i];
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(h) + static_cast<float>(eps));
      for (int64_t i = 0; i < h; ++i) o[i] = w[i] * (xr[i] * inv);
    }
  });
  return out;
}

// Rotate x [T, heads, head_dim] in place (any row and head strides, unit stride within a head:
// a view of q's or k's columns in the fused projection's output will do) by position t's
// angles, cos and sin [T, head_dim] in the "rotate half" layout:
//   x[i]        <- x[i] * cos[i] - x[i + half] * sin[i]
//   x[i + half] <- x[i + half] * cos[i + half] + x[i] * sin[i + half]
// with each product rounded before the sum (no fused multiply-add), as PyTorch's
// x * cos + rotate_half(x) * sin is: the result is the reference's to the bit.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
void rotary_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat && x.dim() == 3 && x.stride(2) == 1,
              "rotary_: x must be a float32 CPU tensor [T, heads, head_dim] with unit stride within a head");
  const int64_t rows = x.size(0), heads = x.size(1), head_dim = x.size(2), half = head_dim / 2;
  TORCH_CHECK(head_dim % 2 == 0, "rotary_: head_dim ", head_dim, " is odd");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(0) == rows && cos.size(1) == head_dim &&
                  cos.scalar_type() == torch::kFloat && sin.scalar_type() == torch::kFloat,
              "rotary_: cos and sin must be float32 [", rows, ", ", head_dim, "]");
  cos = cos.contiguous();
  sin = sin.contiguous();
  const int64_t row_stride = x.stride(0), head_stride = x.stride(1);
  float* p = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  at::parallel_for(0, rows, row_grain(heads * head_dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cp + t * head_dim;
      const float* s = sp + t * head_dim;
      for (int64_t h = 0; h < heads; ++h) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
        float* v = p + t * row_stride + h * head_stride;
        for (int64_t i = 0; i < half; ++i) {
          const float lo = v[i], hi = v[i + half];
          const float lo_cos = lo * c[i], hi_sin = -hi * s[i];
          const float hi_cos = hi * c[i + half], lo_sin = lo * s[i + half];
          v[i] = lo_cos + hi_sin;
          v[i + half] = hi_cos + lo_sin;
        }
      }
    }
  });
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

// gate_up [T, 2I] (gate's I columns, then up's) -> silu(gate) * up [T, I], with
// silu(g) = g * sigmoid(g) and sigmoid from e = exp(-|g|): 1 / (1 + e) for g >= 0, e / (1 + e) below.
torch::Tensor silu_and_mul(torch::Tensor gate_up) {
  check_float_rows(gate_up, "silu_and_mul", "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "silu_and_mul: gate_up has an odd number of columns, ", gate_up.size(1));
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2, stride = gate_up.stride(0);
  auto out = torch::empty({rows, inter}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t vec_end = inter / 8 * 8;
  at::parallel_for(0, rows, row_grain(2 * inter), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* g = gp + t * stride;
      const float* u = g + inter;
      float* o = op + t * inter;
      for (int64_t i = 0; i < vec_end; i += 8) {
        const f8 x = load8(g + i);
        const i8 neg = x < 0.f;
        const f8 e = exp8_nonpositive(neg ? x : -x);
        const f8 sig = (neg ? e : f8{} + 1.f) / (e + 1.f);
        store8(o + i, x * sig * load8(u + i));
      }
      for (int64_t i = vec_end; i < inter; ++i) {
        const float x = g[i], e = std::exp(-std::fabs(x));
        o[i] = x * ((x < 0.f ? e : 1.f) / (1.f + e)) * u[i];
      }
    }
  });
  return out;
}
