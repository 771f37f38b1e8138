// Eight float32 lanes as one value, for the CPU kernels of minivllm/csrc.
#pragma once

#include <cstdint>
#include <cstring>

// Eight floats in one value of GCC's and Clang's vector extension: the compiler maps it onto
// the machine's SIMD registers (AVX, AVX-512, NEON) and keeps the loops below in them.
typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

inline f8 load8(const float* p) {
  f8 x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}

inline void store8(float* p, f8 x) { std::memcpy(p, &x, sizeof(x)); }

// Lanes of two vectors picked by index (0-7 the first's, 8-15 the second's): clang's builtin, or
// GCC's older one, which GCC before 12 (Colab's 11, for one) has alone.
#if defined(__clang__)
#define SHUFFLE8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE8(a, b, ...) __builtin_shuffle(a, b, i8{__VA_ARGS__})
#endif

inline float sum8(f8 x) { return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7])); }

// Eight sums at once: lane p of the result is sum8(t[p]), added in the same order (so the same
// float), with 7 additions of whole vectors and their shuffles instead of 8 reductions of one.
inline f8 sum8x8(const f8* t) {
  // h[i]: lanes 0-3 a_j = x_j + x_(j+4) of t[2i], lanes 4-7 the same of t[2i + 1]
  f8 h[4];
  for (int i = 0; i < 4; ++i)
    h[i] = SHUFFLE8(t[2 * i], t[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           SHUFFLE8(t[2 * i], t[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  // g[i]: b0 = a0 + a1 and b1 = a2 + a3 of t[4i], t[4i + 2], t[4i + 1], t[4i + 3], pair after pair
  f8 g[2];
  for (int i = 0; i < 2; ++i)
    g[i] = SHUFFLE8(h[2 * i], h[2 * i + 1], 0, 2, 8, 10, 4, 6, 12, 14) +
           SHUFFLE8(h[2 * i], h[2 * i + 1], 1, 3, 9, 11, 5, 7, 13, 15);
  // b0 + b1 of t[0] .. t[7], in order
  return SHUFFLE8(g[0], g[1], 0, 4, 2, 6, 8, 12, 10, 14) +
         SHUFFLE8(g[0], g[1], 1, 5, 3, 7, 9, 13, 11, 15);
}

inline float max8(f8 x) {
  float m = x[0];
  for (int i = 1; i < 8; ++i) m = m > x[i] ? m : x[i];
  return m;
}

// exp_nonpositive for eight values at once (round to nearest is trunc(t - 0.5) for t <= 0).
inline f8 exp8_nonpositive(f8 x) {
  const i8 keep = x > -87.f;  // all ones where e^x is kept
  x = keep ? x : f8{} - 87.f;
  const i8 k = __builtin_convertvector(x * 1.44269504f - 0.5f, i8);
  const f8 kf = __builtin_convertvector(k, f8);
  const f8 r = (x - kf * 0.693145752f) - kf * 1.42860677e-6f;
  f8 p = r * (1.f / 720.f) + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const f8 two_k = (f8)((k + 127) << 23);
  return (f8)((i8)(p * two_k) & keep);
}
