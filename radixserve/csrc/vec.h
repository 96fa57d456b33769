// Eight-float vectors in the compiler's vector extensions, and loads of float32 or bfloat16
// data into them: the kernels build for any x86 or ARM target and use its widest float
// vectors up to 256 bits.
#pragma once

#include <cstdint>
#include <cstring>

namespace radixserve {

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

// An unaligned 8-float load or store.
typedef float f8u __attribute__((vector_size(32), aligned(4), may_alias));
inline f8 load8(const float* p) { return *reinterpret_cast<const f8u*>(p); }

// Eight bfloat16 values widened to float: each is the top half of a float's bits.
typedef uint16_t u16x8 __attribute__((vector_size(16), aligned(2), may_alias));
inline f8 load8(const uint16_t* p) {
  const u32x8 bits = __builtin_convertvector(*reinterpret_cast<const u16x8*>(p), u32x8) << 16;
  f8 f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float to_float(float x) { return x; }

inline float to_float(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline f8 splat(float x) { return f8{} + x; }

inline float hsum(f8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

}  // namespace radixserve
