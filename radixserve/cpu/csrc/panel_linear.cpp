// A few dozen rows times a weight packed into column panels: see panel_linear.h for layouts.
//
// A decode step multiplies 1-64 rows by every weight matrix. Read in the checkpoint's layout
// (linear_rows.cpp) each weight row is a dot product per input row, and the kernel spends its
// loads on the inputs; packed, one panel holds `width` output columns for every input
// position, so each step of the loop loads a few weight vectors once and multiplies them into
// a tile of rows x width accumulators, an input broadcast at a time (an outer product, as
// GEMM libraries do). Each panel is one contiguous stream: the first row tile pulls it from
// memory, later tiles find it in L2, and meanwhile the next panel is prefetched so the memory
// stream does not wait for the arithmetic.
#include "panel_linear.h"
#include "vec.h"

#include <ATen/Parallel.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>

namespace radixserve {
namespace {

#if defined(__AVX512F__)
// 32 vector registers: a tile of 8 rows x 3 vectors is 24 accumulators, 3 weight vectors
// and a broadcast input.
typedef float Vec __attribute__((vector_size(64)));
constexpr int kLanes = 16;
constexpr int kRowsMax = 8;
#else
// 16 registers: 4 rows x 3 vectors, 3 weight vectors and the broadcast.
typedef float Vec __attribute__((vector_size(32)));
constexpr int kLanes = 8;
constexpr int kRowsMax = 4;
#endif
constexpr int kVecs = 3;
constexpr int64_t kWidth = kVecs * kLanes;

// The next panel goes to L2: this one's later row tiles read it from there too.
using Prefetch = LinePrefetch<2>;

// y[r][c] = sum_k x[r][k] * panel[k][c] for R rows and the panel's first `cols` columns.
template <int R>
void tile(const float* x, int64_t in, const float* p, float* y, int64_t out, int64_t cols,
          Prefetch& pf) {
  Vec acc[R][kVecs] = {};
  for (int64_t k = 0; k < in; ++k) {
    pf.step();
    Vec w[kVecs];
    for (int v = 0; v < kVecs; ++v) w[v] = load_vec<Vec>(p + k * kWidth + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec xb = splat<Vec>(x[r * in + k]);
      for (int v = 0; v < kVecs; ++v) acc[r][v] += w[v] * xb;
    }
  }
  for (int r = 0; r < R; ++r) {
    if (cols == kWidth) {
      for (int v = 0; v < kVecs; ++v) store_vec(y + r * out + v * kLanes, acc[r][v]);
    } else {  // the last panel's padding columns are not the output's
      alignas(64) float row[kWidth];
      for (int v = 0; v < kVecs; ++v) store_vec(row + v * kLanes, acc[r][v]);
      std::memcpy(y + r * out, row, cols * sizeof(float));
    }
  }
}

// The tile of exactly `rows` (1..R) rows.
template <int R>
void tile_of(int64_t rows, const float* x, int64_t in, const float* p, float* y, int64_t out,
             int64_t cols, Prefetch& pf) {
  if (rows == R) {
    tile<R>(x, in, p, y, out, cols, pf);
  } else if constexpr (R > 1) {
    tile_of<R - 1>(rows, x, in, p, y, out, cols, pf);
  }
}

// Every panel (the threads share them out) against every row tile of near-equal height (at
// most kRowsMax: 20 rows are 7 + 7 + 6, not 8 + 8 + 4), the next panel prefetched meanwhile.
// `depth`: loop steps per panel (input positions, or pairs of them); T: the values' type.
template <typename T, typename Tile>
void over_panels(const T* x, int64_t rows, int64_t in, int64_t depth, const T* panels,
                 int64_t out, T* y, Tile tile) {
  if (rows == 0 || out == 0) return;
  if (depth == 0) {  // no inputs: every sum is empty
    std::fill(y, y + rows * out, T(0));
    return;
  }
  const int64_t n_panels = (out + kWidth - 1) / kWidth;
  const int64_t panel_bytes = depth * kWidth * int64_t(sizeof(float));
  const int64_t panel_values = panel_bytes / int64_t(sizeof(T));
  const int64_t tiles = (rows + kRowsMax - 1) / kRowsMax;
  const int64_t steps = tiles * depth;
  const int64_t lines = std::max<int64_t>(1, panel_bytes / kCacheLine);
  const int64_t every = std::max<int64_t>(1, steps / lines);
  const int64_t per = (lines + steps - 1) / steps;
  at::parallel_for(0, n_panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const T* p = panels + j * panel_values;
      const char* next = reinterpret_cast<const char*>(p + panel_values);
      Prefetch pf{next, j + 1 < end ? next + panel_bytes : next, every, per};
      const int64_t cols = std::min(kWidth, out - j * kWidth);
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t r0 = t * rows / tiles, r1 = (t + 1) * rows / tiles;
        tile(r1 - r0, x + r0 * in, p, y + r0 * out + j * kWidth, cols, pf);
      }
    }
  });
}

}  // namespace

int64_t panel_width() { return kWidth; }

void pack_panels(const float* w, int64_t out, int64_t in, float* panels) {
  const int64_t n_panels = (out + kWidth - 1) / kWidth;
  at::parallel_for(0, n_panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      float* dst = panels + j * in * kWidth;
      for (int64_t c = 0; c < kWidth; ++c) {
        const int64_t n = j * kWidth + c;
        for (int64_t k = 0; k < in; ++k) dst[k * kWidth + c] = n < out ? w[n * in + k] : 0.0f;
      }
    }
  });
}

void panel_linear(const float* x, int64_t rows, int64_t in, const float* panels, int64_t out,
                  float* y) {
  over_panels(x, rows, in, in, panels, out, y,
              [&](int64_t n, const float* xt, const float* p, float* yt, int64_t cols,
                  Prefetch& pf) { tile_of<kRowsMax>(n, xt, in, p, yt, out, cols, pf); });
}

#if defined(__AVX512BF16__)
namespace {

// bfloat16: the panels hold input positions in pairs, [in / 2][width][2], so that one 32-bit
// lane holds the pair a dot-product instruction (vdpbf16ps) multiplies by an input pair and
// adds to a float32 accumulator: twice float32's multiply-adds per instruction, half its
// bytes. Outputs are rounded to bfloat16 once, as torch's bfloat16 GEMM rounds them.
constexpr int64_t kPair = 2 * kWidth;  // bfloat16 values per input pair of a panel

inline __m512i broadcast_pair(const uint16_t* x) {
  int32_t bits;
  std::memcpy(&bits, x, sizeof bits);
  return _mm512_set1_epi32(bits);
}

template <int R>
void tile_bf16(const uint16_t* x, int64_t in, const uint16_t* p, uint16_t* y, int64_t out,
               int64_t cols, Prefetch& pf) {
  __m512 acc[R][kVecs];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_setzero_ps();
  // One pair of input positions a step; an odd last position pairs with a zero (the
  // panel's padding is zero too).
  auto step = [&](int64_t kp, auto input_pair) {
    __m512i w[kVecs];
    for (int v = 0; v < kVecs; ++v) w[v] = _mm512_loadu_si512(p + kp * kPair + v * 2 * kLanes);
    for (int r = 0; r < R; ++r) {
      const __m512i xb = input_pair(x + r * in + 2 * kp);
      for (int v = 0; v < kVecs; ++v)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)w[v], (__m512bh)xb);
    }
  };
  const int64_t full = in / 2;
  for (int64_t kp = 0; kp < full; ++kp) {
    pf.step();
    step(kp, broadcast_pair);
  }
  if (in % 2) step(full, [](const uint16_t* xp) { return _mm512_set1_epi32(*xp); });
  for (int r = 0; r < R; ++r) {
    alignas(64) uint16_t row[kWidth];
    // a whole panel's columns go straight to y; the last panel's through `row`, whose
    // padding columns are not the output's
    uint16_t* dst = cols == kWidth ? y + r * out : row;
    for (int v = 0; v < kVecs; ++v) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + v * kLanes),
                          (__m256i)_mm512_cvtneps_pbh(acc[r][v]));
    }
    if (cols < kWidth) std::memcpy(y + r * out, row, cols * sizeof(uint16_t));
  }
}

template <int R>
void tile_bf16_of(int64_t rows, const uint16_t* x, int64_t in, const uint16_t* p, uint16_t* y,
                  int64_t out, int64_t cols, Prefetch& pf) {
  if (rows == R) {
    tile_bf16<R>(x, in, p, y, out, cols, pf);
  } else if constexpr (R > 1) {
    tile_bf16_of<R - 1>(rows, x, in, p, y, out, cols, pf);
  }
}

}  // namespace

void pack_panels(const uint16_t* w, int64_t out, int64_t in, uint16_t* panels) {
  const int64_t n_panels = (out + kWidth - 1) / kWidth;
  const int64_t pairs = (in + 1) / 2;
  at::parallel_for(0, n_panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      uint16_t* dst = panels + j * pairs * kPair;
      for (int64_t c = 0; c < kWidth; ++c) {
        const int64_t n = j * kWidth + c;
        for (int64_t k = 0; k < 2 * pairs; ++k) {
          dst[(k / 2) * kPair + 2 * c + k % 2] = n < out && k < in ? w[n * in + k] : 0;
        }
      }
    }
  });
}

void panel_linear(const uint16_t* x, int64_t rows, int64_t in, const uint16_t* panels,
                  int64_t out, uint16_t* y) {
  over_panels(x, rows, in, (in + 1) / 2, panels, out, y,
              [&](int64_t n, const uint16_t* xt, const uint16_t* p, uint16_t* yt, int64_t cols,
                  Prefetch& pf) { tile_bf16_of<kRowsMax>(n, xt, in, p, yt, out, cols, pf); });
}
#endif

}  // namespace radixserve
