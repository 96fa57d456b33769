// Few-row products on quantized weights (quant_linear.h for layouts): a decode step reads
// each weight once, so reading a quarter or an eighth of float32's bytes is the point.
//
// The loop is linear_rows.cpp's: a tile of kBlock weight rows by up to kRowsMax input rows,
// the next block of codes and scales prefetched a line at a time over the current block's
// arithmetic. A weight vector is dequantized in registers (codes widened to int32, the zero
// subtracted, converted, times the group's scale plus its offset) once and used for every
// input row of the tile. One or two rows take tile_scaled instead: with no dequantized
// weight to share, each code is converted and multiplied into its group's dot product, and
// the scale, offset and zero come in once per group.
#include "quant_linear.h"

#include "quant_int8.h"
#include "vec.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace radixserve {
namespace {

#if defined(__AVX512F__)
typedef float Vec __attribute__((vector_size(64)));
constexpr int kLanes = 16;
constexpr int kBlock = 4;
constexpr int kRowsMax = 6;
constexpr int kFewRows = 2;

inline float hsumv(Vec v) {
  f8 lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
  return hsum(lo + hi);
}
#else
typedef f8 Vec;
constexpr int kLanes = 8;
constexpr int kBlock = 3;
constexpr int kRowsMax = 4;
constexpr int kFewRows = 1;

inline float hsumv(Vec v) { return hsum(v); }
#endif

typedef int32_t IVec __attribute__((vector_size(sizeof(Vec))));

// kLanes bytes widened to int32 lanes, sign- or zero-extended (one vpmov[sz]xbd: the
// compiler's generic byte-vector conversion comes out as a byte at a time).
template <bool Signed>
inline IVec widen(const uint8_t* p) {
#if defined(__AVX512F__)
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return (IVec)(Signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
#else
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return (IVec)(Signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
#endif
}

constexpr int64_t kRowChunk = 64;

using Prefetch = LinePrefetch<3>;

// The layout of one weight: bytes of codes and number of groups per row.
struct Rows {
  const QuantMatrix& w;
  int64_t code_bytes, groups;
  explicit Rows(const QuantMatrix& m)
      : w(m), code_bytes(m.in * m.bits / 8), groups(m.in / m.group) {}
};

// Codes s * kLanes .. s * kLanes + kLanes - 1 of a group (codes `g`) as int32 lanes.
template <int Bits, int G>
inline IVec codes_at(const uint8_t* g, int s) {
  if constexpr (Bits == 8) {
    return widen<true>(g + s * kLanes);
  } else {
    constexpr int half = G / 2 / kLanes;  // vectors per nibble half of a group
    const IVec b = widen<false>(g + (s % half) * kLanes);
    return s < half ? (b & 15) : (b >> 4);
  }
}

// The same values, dequantized.
template <int Bits, int G>
inline Vec values(const uint8_t* g, int s, float scale, float offset, int zero) {
  return __builtin_convertvector(codes_at<Bits, G>(g, s) - zero, Vec) * scale + offset;
}

// A group's scale and the base its values start from: value = code * scale + base.
template <bool Off, bool H>
inline void scale_base(const QuantMatrix& w, int64_t at, float& scale, float& base) {
  scale = group_value<H>(w.scale, at);
  base = (Off ? group_value<H>(w.offset, at) : 0.0f) - static_cast<float>(w.zero) * scale;
}

// y[r][b] = x[r] . w[j + b] for R input rows and B weight rows (y's row stride: out).
template <int Bits, int G, bool Off, bool H, int B, int R>
void tile(const float* x, const Rows& m, int64_t j, float* y, Prefetch* pf) {
  constexpr int S = G / kLanes;
  const QuantMatrix& w = m.w;
  Vec acc[B][R] = {};
  for (int64_t g = 0; g < m.groups; ++g) {
    pf[0].step();
    pf[1].step();
    for (int s = 0; s < S; ++s) {
      Vec wv[B];
      for (int b = 0; b < B; ++b) {
        const int64_t at = (j + b) * m.groups + g;
        const uint8_t* codes = w.codes + (j + b) * m.code_bytes + g * (G * Bits / 8);
        wv[b] = values<Bits, G>(codes, s, group_value<H>(w.scale, at),
                                  Off ? group_value<H>(w.offset, at) : 0.0f, w.zero);
      }
      const int64_t k = g * G + s * kLanes;
      for (int r = 0; r < R; ++r) {
        const Vec xv = load_vec<Vec>(x + r * w.in + k);
        for (int b = 0; b < B; ++b) acc[b][r] += wv[b] * xv;
      }
    }
  }
  for (int b = 0; b < B; ++b) {
    for (int r = 0; r < R; ++r) y[r * w.out + b] = hsumv(acc[b][r]);
  }
}

// kLanes consecutive entries of a scale or offset array as floats.
template <bool H>
inline Vec group_vec(const void* p, int64_t i) {
  if constexpr (H) {
    const uint16_t* h = static_cast<const uint16_t*>(p) + i;
#if defined(__AVX512F__)
    const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
#else
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
#endif
    Vec out;
    std::memcpy(&out, &v, sizeof out);
    return out;
  } else {
    return load_vec<Vec>(static_cast<const float*>(p) + i);
  }
}

constexpr int64_t kMaxGroups = 1024;

// The tile for few input rows, scaling after the sums: with base = offset - zero * scale,
// x . w[j] = sum over groups of scale * (x . codes) + base * (the sum of x over the group).
// Each code costs a conversion and a multiply-add for each row, the scale one per group and
// row, the bases one product per 16 groups (xsum [R, groups]: each row's group sums).
template <int Bits, int G, bool Off, bool H, int B, int R>
void tile_scaled(const float* x, const float* xsum, const Rows& m, int64_t j, float* y,
                 Prefetch* pf) {
  constexpr int S = G / kLanes;
  const QuantMatrix& w = m.w;
  const int64_t groups = m.groups, whole = groups / kLanes * kLanes;
  float scale[B][kMaxGroups];
  float tail[B][R] = {};
  for (int b = 0; b < B; ++b) {
    const int64_t row = (j + b) * groups;
    Vec part[R] = {};
    for (int64_t g = 0; g < whole; g += kLanes) {
      const Vec sc = group_vec<H>(w.scale, row + g);
      Vec base = -static_cast<float>(w.zero) * sc;
      if constexpr (Off) base += group_vec<H>(w.offset, row + g);
      std::memcpy(&scale[b][g], &sc, sizeof sc);
      for (int r = 0; r < R; ++r) part[r] += base * load_vec<Vec>(xsum + r * groups + g);
    }
    for (int r = 0; r < R; ++r) tail[b][r] = hsumv(part[r]);
    for (int64_t g = whole; g < groups; ++g) {
      float sc, base;
      scale_base<Off, H>(w, row + g, sc, base);
      scale[b][g] = sc;
      for (int r = 0; r < R; ++r) tail[b][r] += base * xsum[r * groups + g];
    }
  }
  Vec acc[B][R] = {};
  for (int64_t g = 0; g < groups; ++g) {
    pf[0].step();
    Vec dot[B][R] = {};
    for (int s = 0; s < S; ++s) {
      const int64_t k = g * G + s * kLanes;
      for (int b = 0; b < B; ++b) {
        const uint8_t* codes = w.codes + (j + b) * m.code_bytes + g * (G * Bits / 8);
        const Vec c = __builtin_convertvector(codes_at<Bits, G>(codes, s), Vec);  // unscaled
        for (int r = 0; r < R; ++r) dot[b][r] += c * load_vec<Vec>(x + r * w.in + k);
      }
    }
    for (int b = 0; b < B; ++b) {
      for (int r = 0; r < R; ++r) acc[b][r] += dot[b][r] * scale[b][g];
    }
  }
  for (int b = 0; b < B; ++b) {
    for (int r = 0; r < R; ++r) y[r * w.out + b] = hsumv(acc[b][r]) + tail[b][r];
  }
}

template <int Bits, int G, bool Off, bool H, int B, int R>
void rest(int64_t left, const float* x, const Rows& m, int64_t j, float* y, Prefetch* pf) {
  if (left == R) {
    tile<Bits, G, Off, H, B, R>(x, m, j, y, pf);
  } else if constexpr (R > 1) {
    rest<Bits, G, Off, H, B, R - 1>(left, x, m, j, y, pf);
  }
}

// Every input row against weight rows j .. j + B - 1, kRowsMax rows at a time.
template <int Bits, int G, bool Off, bool H, int B>
void block(const float* x, const float* xsum, int64_t rows, const Rows& m, int64_t j, float* y,
           Prefetch* pf) {
  const int64_t in = m.w.in, out = m.w.out;
  if (xsum != nullptr) {
    if (rows == 1) return tile_scaled<Bits, G, Off, H, B, 1>(x, xsum, m, j, y + j, pf);
    if constexpr (kFewRows >= 2) {
      if (rows == 2) return tile_scaled<Bits, G, Off, H, B, 2>(x, xsum, m, j, y + j, pf);
    }
  }
  int64_t r = 0;
  for (; r + kRowsMax <= rows; r += kRowsMax) {
    tile<Bits, G, Off, H, B, kRowsMax>(x + r * in, m, j, y + r * out + j, pf);
  }
  if (r < rows) {
    rest<Bits, G, Off, H, B, kRowsMax - 1>(rows - r, x + r * in, m, j, y + r * out + j, pf);
  }
}

// A prefetcher handing out [begin, begin + bytes) over `steps` calls.
Prefetch spread(const void* begin, int64_t bytes, int64_t steps) {
  const char* p = static_cast<const char*>(begin);
  const int64_t lines = std::max<int64_t>(1, bytes / kCacheLine);
  steps = std::max<int64_t>(1, steps);
  return Prefetch{p, p + bytes, std::max<int64_t>(1, steps / lines), (lines + steps - 1) / steps};
}

template <int Bits, int G, bool Off, bool H>
void run(const float* x, int64_t rows, const QuantMatrix& w, float* y) {
  constexpr int64_t kScaleBytes = H ? 2 : 4;
  const Rows m(w);
  const int64_t blocks = w.out / kBlock;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowChunk) {
    const int64_t n = std::min(kRowChunk, rows - r0);
    const float* xc = x + r0 * w.in;
    float* yc = y + r0 * w.out;
    const int64_t steps = (n + kRowsMax - 1) / kRowsMax * m.groups;
    std::vector<float> sums;
    if (n <= kFewRows && m.groups <= kMaxGroups) {
      sums.resize(n * m.groups);
      for (int64_t i = 0; i < n * m.groups; ++i) {
        float t = 0.0f;
        for (int k = 0; k < G; ++k) t += xc[i * G + k];
        sums[i] = t;
      }
    }
    const float* xsum = sums.empty() ? nullptr : sums.data();
    at::parallel_for(0, blocks, 16, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t j = b * kBlock, next = std::min(j + kBlock, w.out - kBlock);
        Prefetch pf[2] = {
            spread(w.codes + next * m.code_bytes, kBlock * m.code_bytes, steps),
            spread(static_cast<const char*>(w.scale) + next * m.groups * kScaleBytes,
                   kBlock * m.groups * kScaleBytes, steps)};
        block<Bits, G, Off, H, kBlock>(xc, xsum, n, m, j, yc, pf);
      }
    });
    for (int64_t j = blocks * kBlock; j < w.out; ++j) {  // the last out % kBlock weight rows
      Prefetch none[2] = {{nullptr, nullptr, 1, 0}, {nullptr, nullptr, 1, 0}};
      block<Bits, G, Off, H, 1>(xc, xsum, n, m, j, yc, none);
    }
  }
}

template <int Bits, int G, bool Off, bool H>
void dequantize(const QuantMatrix& w, const int64_t* rows, int64_t n, float* y) {
  const Rows m(w);
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = rows ? rows[i] : i;
      for (int64_t g = 0; g < m.groups; ++g) {
        const int64_t at = row * m.groups + g;
        const uint8_t* codes = w.codes + row * m.code_bytes + g * (G * Bits / 8);
        for (int s = 0; s < G / kLanes; ++s) {
          const Vec v = values<Bits, G>(codes, s, group_value<H>(w.scale, at),
                                  Off ? group_value<H>(w.offset, at) : 0.0f, w.zero);
          store_vec(y + i * w.in + g * G + s * kLanes, v);
        }
      }
    }
  });
}

// Calls f.operator()<Bits, G, Off, H>() for w's layout.
template <int Bits, int G, typename F>
void dispatch_scales(const QuantMatrix& w, F&& f) {
  const bool off = w.offset != nullptr;
  if (w.half) {
    off ? f.template operator()<Bits, G, true, true>()
        : f.template operator()<Bits, G, false, true>();
  } else {
    off ? f.template operator()<Bits, G, true, false>()
        : f.template operator()<Bits, G, false, false>();
  }
}

template <typename F>
void dispatch(const QuantMatrix& w, F&& f) {
  if (w.bits == 4 && w.group == 32) {
    dispatch_scales<4, 32>(w, f);
  } else if (w.bits == 8 && w.group == 32) {
    dispatch_scales<8, 32>(w, f);
  } else {
    dispatch_scales<8, 16>(w, f);
  }
}

struct Product {
  const float* x;
  int64_t rows;
  const QuantMatrix& w;
  float* y;
  template <int Bits, int G, bool Off, bool H>
  void operator()() const {
    run<Bits, G, Off, H>(x, rows, w, y);
  }
};

struct Values {
  const QuantMatrix& w;
  const int64_t* rows;
  int64_t n;
  float* y;
  template <int Bits, int G, bool Off, bool H>
  void operator()() const {
    dequantize<Bits, G, Off, H>(w, rows, n, y);
  }
};

}  // namespace

bool quant_shape_supported(int group, int bits) {
  return (bits == 4 && group == 32) || (bits == 8 && (group == 16 || group == 32));
}

void quant_linear(const float* x, int64_t rows, const QuantMatrix& w, float* y) {
  if (w.bits == 4 && w.group == 32 && rows <= w.int8_rows && int8_dot_supported()) {
    return quant_linear_int8(x, rows, w, y);
  }
  dispatch(w, Product{x, rows, w, y});
}

void dequantize_rows(const QuantMatrix& w, const int64_t* rows, int64_t n, float* y) {
  dispatch(w, Values{w, rows, n, y});
}

}  // namespace radixserve
