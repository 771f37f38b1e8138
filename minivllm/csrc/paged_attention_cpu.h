// PagedAttention on a CPU, reading the paged KV cache where it lies: the "cpp" backend's kernel.
//
// One call per layer attends every short sequence of the step (a decode, a decode verifying a
// few speculative drafts, a short chunk over a cached context). For sequence s with q new
// tokens over seq_len positions, new token j sits at position seq_len - q + j and reads the
// positions 0 .. that one, found through block_tables[s]. A work item is one (sequence, KV
// head): the group of query heads that share the KV head, times the q new tokens, are its rows,
// so each key and value row is read once for all of them. Keys are visited block by block
// with an online softmax (running maximum m, running sum l, rescaled accumulator), as in the
// Triton kernel: nothing is gathered, no mask is built, and no slot the sequence does not own is
// read (only positions < seq_len of its own blocks), so whatever other slots hold, NaN
// included, cannot reach the result. Scores are taken eight keys at a time and values summed
// for up to four rows at once, so that independent chains of multiply-adds overlap; every sum
// is added in the order it would be alone, so the result does not depend on that grouping.
//
// A cache holds float32, bfloat16 or float16 rows [num_blocks, block_size, KVH, D], or int8
// rows [num_blocks, block_size, KVH, D + 4]: D codes and a float32 scale (kv_quant.py).
// Arithmetic is float32 whatever the storage; the output has the query's dtype.

#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "vec8.h"

namespace {

// One cached row (D values of one position and KV head) as float32 into dst.
template <typename cache_t>
inline void load_row(const cache_t* row, int64_t head_dim, float* dst) {
  for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<float>(row[d]);
}

template <>
inline void load_row<int8_t>(const int8_t* row, int64_t head_dim, float* dst) {
  float scale;
  std::memcpy(&scale, row + head_dim, sizeof(float));  // the 4 bytes after the codes
  for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<float>(row[d]) * scale;
}

// One query row over the `visible` keys of one block, the online softmax's first half: the
// scores become their weights e^(score - new max) in sc, the running maximum m and sum l are
// updated, and the factor e^(old max - new max) the row's accumulator is to be rescaled by is
// returned. kD > 0, a multiple of 8: the row and its scores live in vector registers; kD = 0:
// any head_dim.
template <int kD>
inline float weigh_block(const float* qr, const float* const* k_rows, int64_t visible, float* sc, float& m,
                         float& l, int64_t head_dim) {
  float block_max = m;
  if constexpr (kD > 0) {
    constexpr int kV = kD / 8;
    f8 q[kV];
    for (int j = 0; j < kV; ++j) q[j] = load8(qr + 8 * j);
    int64_t o = 0;
    // eight keys at a time: eight independent dot products, then their eight sums in one go
    f8 max_lanes = f8{} + block_max;
    for (; o + 8 <= visible; o += 8) {
      f8 t[8];
      for (int p = 0; p < 8; ++p) {
        const float* k = k_rows[o + p];
        t[p] = q[0] * load8(k);
        for (int j = 1; j < kV; ++j) t[p] += q[j] * load8(k + 8 * j);
      }
      const f8 s = sum8x8(t);
      store8(sc + o, s);
      max_lanes = max_lanes > s ? max_lanes : s;
    }
    block_max = max8(max_lanes);
    for (; o < visible; ++o) {
      const float* k = k_rows[o];
      f8 t = q[0] * load8(k);
      for (int j = 1; j < kV; ++j) t += q[j] * load8(k + 8 * j);
      sc[o] = sum8(t);
      block_max = std::max(block_max, sc[o]);
    }
  } else {
    for (int64_t o = 0; o < visible; ++o) {
      float t = 0.f;
      for (int64_t d = 0; d < head_dim; ++d) t += qr[d] * k_rows[o][d];
      sc[o] = t;
      block_max = std::max(block_max, t);
    }
  }
  // the scores' tail up to a multiple of 8 (the buffer is that long) weighs 0
  const int64_t padded = (visible + 7) / 8 * 8;
  for (int64_t o = visible; o < padded; ++o) sc[o] = -std::numeric_limits<float>::max();
  f8 sum = {};
  for (int64_t o = 0; o < padded; o += 8) {
    const f8 e = exp8_nonpositive(load8(sc + o) - block_max);
    store8(sc + o, e);
    sum += e;
  }
  const float alpha = exp8_nonpositive(f8{} + (m - block_max))[0];  // 0 on the first block
  m = block_max;
  l = l * alpha + sum8(sum);
  return alpha;
}

// The second half for kR rows that read the same keys (the query heads of one KV head, for one
// new token): acc_i <- acc_i * alpha_i + sum_o w_i[o] * v[o]. Each value row is loaded once for
// all kR rows, and their kR * kD / 8 accumulators are independent chains of multiply-adds, so
// they overlap; each row's sum is taken in the same order as with one row at a time.
template <int kD, int kR>
inline void accumulate_values(const float* const* weights, const float* alphas, const float* const* v_rows,
                              int64_t visible, float* const* accs) {
  constexpr int kV = kD / 8;
  f8 a[kR][kV];
  for (int i = 0; i < kR; ++i)
    for (int j = 0; j < kV; ++j) a[i][j] = load8(accs[i] + 8 * j) * alphas[i];
  for (int64_t o = 0; o < visible; ++o) {
    const float* v = v_rows[o];
    f8 vv[kV];
    for (int j = 0; j < kV; ++j) vv[j] = load8(v + 8 * j);
    for (int i = 0; i < kR; ++i) {
      const float w = weights[i][o];
      for (int j = 0; j < kV; ++j) a[i][j] += w * vv[j];
    }
  }
  for (int i = 0; i < kR; ++i)
    for (int j = 0; j < kV; ++j) store8(accs[i] + 8 * j, a[i][j]);
}

// Any head_dim, one row.
inline void accumulate_values_any(const float* w, float alpha, const float* const* v_rows, int64_t visible,
                                  float* acc, int64_t head_dim) {
  for (int64_t d = 0; d < head_dim; ++d) acc[d] *= alpha;
  for (int64_t o = 0; o < visible; ++o)
    for (int64_t d = 0; d < head_dim; ++d) acc[d] += w[o] * v_rows[o][d];
}

// How many rows accumulate_values takes at once: their accumulators and a value row fit the
// 32 vector registers of AVX-512 (16 of AVX2 spill a little at head_dim 32).
template <int kD>
constexpr int rows_at_once() {
  return kD / 8 >= 16 ? 1 : (kD / 8 >= 8 ? 2 : 4);
}

template <int kD, typename scalar_t, typename cache_t>
void attend(const torch::Tensor& query, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
            const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
            const torch::Tensor& query_start, double scale, torch::Tensor& out) {
  constexpr bool kFloatCache = std::is_same_v<cache_t, float>;  // rows read where they lie
  const int64_t num_seqs = seq_lens.size(0);
  const int64_t num_heads = query.size(1), head_dim = kD > 0 ? kD : query.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t row_width = k_cache.size(3);  // head_dim, or head_dim + 4 for int8
  const int64_t group = num_heads / num_kv_heads;
  const int64_t table_width = block_tables.size(1);

  const scalar_t* q_ptr = query.data_ptr<scalar_t>();
  scalar_t* out_ptr = out.data_ptr<scalar_t>();
  const cache_t* k_ptr = k_cache.data_ptr<cache_t>();
  const cache_t* v_ptr = v_cache.data_ptr<cache_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* starts = query_start.data_ptr<int32_t>();
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, num_seqs * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    // per thread: the item's query rows and accumulators; the block's K and V rows as float32
    // pointers (into the cache itself for a float32 cache, else into a converted copy)
    constexpr int64_t kRows = kD > 0 ? rows_at_once<kD>() : 1;  // rows whose values are summed together
    const int64_t padded_block = (block_size + 7) / 8 * 8;
    std::vector<float> q_rows, acc, m, l, k_copy, v_copy, scores(kRows * padded_block);
    float* weights[kRows];
    float* accs[kRows];
    float alphas[kRows];
    std::vector<const float*> k_rows(block_size), v_rows(block_size);
    if (!kFloatCache) {
      k_copy.resize(block_size * head_dim);
      v_copy.resize(block_size * head_dim);
    }
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / num_kv_heads, kvh = item % num_kv_heads;
      const int64_t first = starts[s], q_len = starts[s + 1] - first;
      const int64_t seq_len = lens[s], context = seq_len - q_len;
      const int64_t rows = q_len * group;  // row r: new token r / group, head kvh * group + r % group
      if (rows == 0) continue;
      q_rows.resize(rows * head_dim);
      acc.assign(rows * head_dim, 0.f);
      // finite, so that e^(m - new max) is a plain 0 on the first block
      m.assign(rows, -std::numeric_limits<float>::max());
      l.assign(rows, 0.f);
      for (int64_t r = 0; r < rows; ++r) {
        const scalar_t* src = q_ptr + ((first + r / group) * num_heads + kvh * group + r % group) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) q_rows[r * head_dim + d] = static_cast<float>(src[d]) * fscale;
      }
      const int32_t* table = tables + s * table_width;
      for (int64_t start = 0; start < seq_len; start += block_size) {
        const int64_t n = std::min(block_size, seq_len - start);  // positions of this block to read
        const int64_t block = table[start / block_size];
        for (int64_t o = 0; o < n; ++o) {
          const int64_t at = ((block * block_size + o) * num_kv_heads + kvh) * row_width;
          if constexpr (kFloatCache) {
            k_rows[o] = k_ptr + at;
            v_rows[o] = v_ptr + at;
          } else {
            load_row<cache_t>(k_ptr + at, head_dim, k_copy.data() + o * head_dim);
            load_row<cache_t>(v_ptr + at, head_dim, v_copy.data() + o * head_dim);
            k_rows[o] = k_copy.data() + o * head_dim;
            v_rows[o] = v_copy.data() + o * head_dim;
          }
        }
        for (int64_t token = 0; token < q_len; ++token) {
          // new token `token` (rows token * group .. + group) reads positions <= context + token
          const int64_t visible = std::min(n, context + token - start + 1);
          if (visible <= 0) continue;
          for (int64_t r0 = token * group; r0 < (token + 1) * group; r0 += kRows) {
            const int64_t nr = std::min<int64_t>(kRows, (token + 1) * group - r0);
            for (int64_t i = 0; i < nr; ++i) {
              const int64_t r = r0 + i;
              weights[i] = scores.data() + i * padded_block;
              accs[i] = acc.data() + r * head_dim;
              alphas[i] = weigh_block<kD>(q_rows.data() + r * head_dim, k_rows.data(), visible, weights[i],
                                          m[r], l[r], head_dim);
            }
            if constexpr (kD > 0) {
              switch (nr) {
                case 4: accumulate_values<kD, 4>(weights, alphas, v_rows.data(), visible, accs); break;
                case 3: accumulate_values<kD, 3>(weights, alphas, v_rows.data(), visible, accs); break;
                case 2: accumulate_values<kD, 2>(weights, alphas, v_rows.data(), visible, accs); break;
                default: accumulate_values<kD, 1>(weights, alphas, v_rows.data(), visible, accs);
              }
            } else {
              accumulate_values_any(weights[0], alphas[0], v_rows.data(), visible, accs[0], head_dim);
            }
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        scalar_t* dst = out_ptr + ((first + r / group) * num_heads + kvh * group + r % group) * head_dim;
        const float inv = 1.f / l[r];  // l >= 1: a row always reads its own position
        for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<scalar_t>(acc[r * head_dim + d] * inv);
      }
    }
  });
}

template <typename scalar_t, typename cache_t>
void dispatch_head_dim(const torch::Tensor& query, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                       const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                       const torch::Tensor& query_start, double scale, torch::Tensor& out) {
  switch (query.size(2)) {
    case 32: attend<32, scalar_t, cache_t>(query, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out); break;
    case 64: attend<64, scalar_t, cache_t>(query, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out); break;
    case 128: attend<128, scalar_t, cache_t>(query, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out); break;
    default: attend<0, scalar_t, cache_t>(query, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out);
  }
}

template <typename scalar_t>
void dispatch_cache(const torch::Tensor& query, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                    const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                    const torch::Tensor& query_start, double scale, torch::Tensor& out) {
  switch (k_cache.scalar_type()) {
    case torch::kFloat: dispatch_head_dim<scalar_t, float>(query, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out); break;
    case torch::kBFloat16: dispatch_head_dim<scalar_t, at::BFloat16>(query, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out); break;
    case torch::kHalf: dispatch_head_dim<scalar_t, at::Half>(query, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out); break;
    case torch::kChar: dispatch_head_dim<scalar_t, int8_t>(query, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out); break;
    default: TORCH_CHECK(false, "paged_attention: cache dtype ", k_cache.scalar_type(), " is not float32, bfloat16, float16 or int8");
  }
}

}  // namespace

// query [T, H, D]; caches [num_blocks, block_size, KVH, D (+4 for int8)]; block_tables [S, W]
// int32; seq_lens [S] int32; query_start [S + 1] int32 (rows of sequence s: query_start[s] ..
// query_start[s + 1]). Returns [T, H, D] in the query's dtype.
torch::Tensor paged_attention(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
                              torch::Tensor block_tables, torch::Tensor seq_lens, torch::Tensor query_start,
                              double scale) {
  TORCH_CHECK(query.device().is_cpu() && k_cache.device().is_cpu(), "paged_attention: CPU tensors only");
  TORCH_CHECK(query.dim() == 3 && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "paged_attention: query [T, H, D] and two caches [blocks, block_size, KVH, width] of one shape");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "paged_attention: K and V caches differ in dtype");
  TORCH_CHECK(query.size(1) % k_cache.size(2) == 0, "paged_attention: ", query.size(1),
              " query heads are not a multiple of ", k_cache.size(2), " KV heads");
  const int64_t width = k_cache.scalar_type() == torch::kChar ? query.size(2) + 4 : query.size(2);
  TORCH_CHECK(k_cache.size(3) == width, "paged_attention: cache rows of ", k_cache.size(3),
              " elements, expected ", width, " for head_dim ", query.size(2));
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt && seq_lens.scalar_type() == torch::kInt &&
                  query_start.scalar_type() == torch::kInt,
              "paged_attention: block_tables, seq_lens and query_start must be int32");
  TORCH_CHECK(query_start.size(0) == seq_lens.size(0) + 1 && block_tables.size(0) == seq_lens.size(0),
              "paged_attention: one table and one length per sequence, query_start one longer");
  query = query.contiguous();
  k_cache = k_cache.contiguous();
  v_cache = v_cache.contiguous();
  block_tables = block_tables.contiguous();
  auto out = torch::empty_like(query);
  switch (query.scalar_type()) {
    case torch::kFloat: dispatch_cache<float>(query, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out); break;
    case torch::kBFloat16: dispatch_cache<at::BFloat16>(query, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out); break;
    case torch::kHalf: dispatch_cache<at::Half>(query, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out); break;
    default: TORCH_CHECK(false, "paged_attention: query dtype ", query.scalar_type(), " is not float32, bfloat16 or float16");
  }
  return out;
}
