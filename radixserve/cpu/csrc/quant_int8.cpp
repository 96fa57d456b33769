// 4-bit codes times activations rounded to int8, for a decode step's few rows: integer dot
// products of 32 bytes at a time (VNNI's vpdpbusd where the CPU has it, AVX2's
// maddubs + madd otherwise, which cannot saturate: a code is at most 15) instead of
// converting every weight to float. Each row of x is rounded per group of 32: scale
// d = max|x| / 127, q = nearest(x / d); the product is then the float product of the
// dequantized weight with those rounded rows (x's int8 twin), to float32 rounding.
#include "quant_int8.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace radixserve {

#if defined(__AVX2__)
namespace {

constexpr int kGroup = 32;
constexpr int kBlock = 4;

// acc + the sums of each 4 adjacent products of unsigned u and signed s bytes.
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// A group's 32 codes (16 bytes, value i in byte i's low nibble, i + 16 in its high one) as
// 32 bytes in value order.
inline __m256i unpack(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// The rows of x rounded per group: q [rows, in], d and d * sum(q) [rows, groups].
struct Rounded {
  std::vector<int8_t> q;
  std::vector<float> d, dsum;
};

void round_rows(const float* x, int64_t rows, int64_t in, Rounded& r) {
  const int64_t groups = in / kGroup;
  r.q.resize(rows * in);
  r.d.resize(rows * groups);
  r.dsum.resize(rows * groups);
  for (int64_t g = 0; g < rows * groups; ++g) {
    const float* v = x + g * kGroup;
    float amax = 0.0f;
    for (int i = 0; i < kGroup; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int i = 0; i < kGroup; ++i) {
      const int q = static_cast<int>(std::nearbyint(v[i] * inv));
      r.q[g * kGroup + i] = static_cast<int8_t>(q);
      sum += q;
    }
    r.d[g] = d;
    r.dsum[g] = d * static_cast<float>(sum);
  }
}

// y[r][j + b] for R rounded rows and B weight rows.
template <int B, int R>
void tile(const Rounded& x, int64_t row0, const QuantMatrix& w, int64_t j, float* y) {
  const int64_t groups = w.in / kGroup, code_bytes = w.in / 2;
  __m256 acc[B][R];
  for (auto& a : acc) {
    for (auto& v : a) v = _mm256_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int b = 0; b < B; ++b) {
      const __m256i u = unpack(w.codes + (j + b) * code_bytes + g * (kGroup / 2));
      const float dw = group_value(w, w.scale, (j + b) * groups + g);
      for (int r = 0; r < R; ++r) {
        const int64_t at = (row0 + r) * groups + g;
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&x.q[at * kGroup]));
        const __m256i p = dot_u8s8(_mm256_setzero_si256(), u, q);
        acc[b][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * x.d[at]), acc[b][r]);
      }
    }
  }
  for (int b = 0; b < B; ++b) {
    const int64_t row = (j + b) * groups;
    for (int r = 0; r < R; ++r) {
      const float* dsum = &x.dsum[(row0 + r) * groups];
      float sum = hsum8(acc[b][r]);
      for (int64_t g = 0; g < groups; ++g) {  // offsets, and the zero taken from every code
        const float off = w.offset ? group_value(w, w.offset, row + g) : 0.0f;
        const float dw = group_value(w, w.scale, row + g);
        const float constant = off - static_cast<float>(w.zero) * dw;
        sum += constant * dsum[g];
      }
      y[(row0 + r) * w.out + j + b] = sum;
    }
  }
}

template <int B>
void rows_of_block(const Rounded& x, int64_t rows, const QuantMatrix& w, int64_t j, float* y) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) tile<B, 2>(x, r, w, j, y);
  if (r < rows) tile<B, 1>(x, r, w, j, y);
}

}  // namespace

bool int8_dot_supported() { return true; }

void quant_linear_int8(const float* x, int64_t rows, const QuantMatrix& w, float* y) {
  Rounded rounded;
  round_rows(x, rows, w.in, rounded);
  const int64_t blocks = w.out / kBlock;
  at::parallel_for(0, blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) rows_of_block<kBlock>(rounded, rows, w, b * kBlock, y);
  });
  for (int64_t j = blocks * kBlock; j < w.out; ++j) rows_of_block<1>(rounded, rows, w, j, y);
}

#else

bool int8_dot_supported() { return false; }

void quant_linear_int8(const float*, int64_t, const QuantMatrix&, float*) {}

#endif

}  // namespace radixserve
