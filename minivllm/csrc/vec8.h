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

inline float sum8(f8 x) { return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7])); }

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
