// Float vectors in the compiler's vector extensions, and loads of float32 or bfloat16 data
// into them: eight-float ones for any x86 or ARM target (up to 256 bits), and width-generic
// twins (load_vec, store_vec) for the kernels that pick sixteen floats with AVX-512.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace radixserve {

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

// Whether this build multiplies bfloat16 pairs into float32 sums (AVX512_BF16's vdpbf16ps):
// bfloat16 weight panels and attention blocks need it.
#if defined(__AVX512BF16__)
constexpr bool kBf16Dot = true;
#else
constexpr bool kBf16Dot = false;
#endif

// Sixteen-float vectors, where the CPU has AVX-512 (kernels that pick their width use them).
#ifdef __AVX512F__
typedef float f16v __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
#endif

// The integer vector of a float vector's width.
template <typename V>
struct IntVec;
template <>
struct IntVec<f8> {
  using type = i8;
};
#ifdef __AVX512F__
template <>
struct IntVec<f16v> {
  using type = i16v;
};
#endif

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

// x in every lane. Written as x - 0, which the compiler folds to a plain broadcast (0 + x is
// not x for x = -0, so that form costs an add and a register shuffle per call).
template <typename V = f8>
inline V splat(float x) {
  return x - V{};
}

template <typename V>
inline V vmax(V a, V b) {
  return a > b ? a : b;
}

// exp(x) for x <= 0, lane-wise: 2^(x log2 e) split into an integer power (built in the
// exponent bits) and e^f, |f| <= ln2 / 2, by a degree-6 polynomial (relative error ~2e-7).
// Arguments below -87 give ~1e-38 rather than 0; callers mask what must be exactly 0.
template <typename V>
inline V exp_nonpositive(V x) {
  const V t = vmax(x, splat<V>(-87.0f)) * 1.44269504088896341f;
  const V n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23 trick)
  const V f = (t - n) * 0.693147180559945309f;
  const V p =
      1.0f +
      f * (1.0f + f * (0.5f + f * (0.166666667f + f * (0.0416666667f +
                                                          f * (0.00833333333f +
                                                               f * 0.00138888889f)))));
  using I = typename IntVec<V>::type;
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// 32-bit lanes of a float vector's width.
template <typename V>
struct UVecOf {
  typedef uint32_t type __attribute__((vector_size(sizeof(V))));
};
template <typename V>
using UVec = typename UVecOf<V>::type;

// Round-to-nearest-even of floats to bfloat16 bits (NaN stays NaN), in each lane's low half.
template <typename V = f8>
inline UVec<V> bf16_bits(V v) {
  UVec<V> bits;
  std::memcpy(&bits, &v, sizeof bits);
  const UVec<V> rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const UVec<V> nan = reinterpret_cast<UVec<V>>(v != v);
  return (rounded & ~nan) | (nan & 0x7FC0u);
}

// v rounded to bfloat16 and widened back: what a bfloat16 operation keeps of it.
template <typename V = f8>
inline V round_bf16(V v) {
  const UVec<V> bits = bf16_bits(v) << 16;
  V f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#if defined(__AVX512BF16__)
// With AVX512_BF16 the rounding is one instruction (vcvtneps2bf16: nearest even, NaN quiet).
template <>
inline f16v round_bf16(f16v v) {
  const __m256bh h = _mm512_cvtneps_pbh(v);
  return (f16v)_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16);
}

inline void store_vec(uint16_t* p, f16v v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
}
#endif

// Unaligned loads and stores of a vector V of floats from float32 or bfloat16 data (the
// width-generic twins of load8 and store8).
template <typename V>
inline V load_vec(const float* p) {
  typedef float U __attribute__((vector_size(sizeof(V)), aligned(4), may_alias));
  return *reinterpret_cast<const U*>(p);
}

template <typename V>
inline V load_vec(const uint16_t* p) {
  typedef uint16_t H __attribute__((vector_size(sizeof(V) / 2), aligned(2), may_alias));
  const UVec<V> bits = __builtin_convertvector(*reinterpret_cast<const H*>(p), UVec<V>) << 16;
  V f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <typename V>
inline void store_vec(float* p, V v) {
  typedef float U __attribute__((vector_size(sizeof(V)), aligned(4), may_alias));
  *reinterpret_cast<U*>(p) = v;
}

template <typename V>
inline void store_vec(uint16_t* p, V v) {
  typedef uint16_t H __attribute__((vector_size(sizeof(V) / 2), aligned(2), may_alias));
  *reinterpret_cast<H*>(p) = __builtin_convertvector(bf16_bits(v), H);
}

inline void store8(uint16_t* p, f8 v) {
  *reinterpret_cast<u16x8*>(p) = __builtin_convertvector(bf16_bits(v), u16x8);
}

inline void store8(float* p, f8 v) { *reinterpret_cast<f8u*>(p) = v; }

inline float hsum(f8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// Lines of memory handed to the prefetcher: `per` lines every `every` calls of step(), so that
// a whole next block is asked for within the current block's arithmetic, however few its rows.
// kLocality is __builtin_prefetch's hint (3: into L1, 2: into L2). A countdown, not a
// division: step() runs in the innermost loops.
constexpr int64_t kCacheLine = 64;

template <int kLocality>
struct LinePrefetch {
  const char* next;
  const char* end;
  int64_t every;
  int64_t per;
  int64_t wait = 0;  // calls until the next lines

  void step() {
    if (wait-- > 0) return;
    wait = every - 1;
    for (int64_t l = 0; l < per && next < end; ++l, next += kCacheLine) {
      __builtin_prefetch(next, 0, kLocality);
    }
  }
};

}  // namespace radixserve
