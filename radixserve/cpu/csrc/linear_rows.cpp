// A few rows times a large weight matrix: see linear_rows.h for layouts.
//
// With a handful of rows, a linear layer is one pass over its weights, and the pass is the
// cost: bench-135m's decode reads ~0.5 GB of weights per step. The kernel takes a block of
// weight rows, keeps it in L1 while every input row is multiplied into it (dot products
// along `in`, vectorised 16 wide with AVX-512 and 8 wide otherwise, summed across lanes once
// at the end), and meanwhile prefetches the *next* block a line at a time, spread over the
// block's arithmetic, so the
// memory stream and the multiply-adds overlap instead of taking turns (measured on the
// project's CPU: that overlap alone is 1.3-2x; without it the kernel is barely ahead of
// torch's GEMM at 12-16 rows). bfloat16 weights are widened in registers, so they cost half
// the bytes of float32 ones.
#include "linear_rows.h"
#include "vec.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace radixserve {
namespace {

#if defined(__AVX512F__)
// 16-float vectors where the CPU has them: twice the multiply-adds per instruction, and 32
// vector registers hold a tile of 4 weight rows by 6 input rows (24 accumulators, 4 weight
// vectors, one input vector): faster than 8-float tiles from a few dozen rows, alike below.
typedef float Vec __attribute__((vector_size(64)));
constexpr int kLanes = 16;
constexpr int kBlock = 4;
constexpr int kRowsMax = 6;

inline float hsumv(Vec v) {
  f8 lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
  return hsum(lo + hi);
}
#else
// A tile is kBlock weight rows by kRowsMax input rows: 12 accumulators and 3 weight vectors,
// 15 of AVX2's 16 vector registers.
typedef f8 Vec;
constexpr int kLanes = 8;
constexpr int kBlock = 3;
constexpr int kRowsMax = 4;

inline float hsumv(Vec v) { return hsum(v); }
#endif

constexpr int64_t kRowChunk = 64;

using Prefetch = LinePrefetch<3>;

// y[r][j] = x[r] . w[j] for R input rows and B weight rows (y's row stride: out).
template <typename W, int B, int R>
void tile(const float* x, int64_t in, const W* w, float* y, int64_t out, Prefetch& pf) {
  Vec acc[B][R] = {};
  int64_t k = 0;
  for (; k + kLanes <= in; k += kLanes) {
    pf.step();
    Vec wv[B];
    for (int b = 0; b < B; ++b) wv[b] = load_vec<Vec>(w + b * in + k);
    for (int r = 0; r < R; ++r) {
      const Vec xv = load_vec<Vec>(x + r * in + k);
      for (int b = 0; b < B; ++b) acc[b][r] += wv[b] * xv;
    }
  }
  for (int b = 0; b < B; ++b) {
    for (int r = 0; r < R; ++r) {
      float s = hsumv(acc[b][r]);
      for (int64_t t = k; t < in; ++t) s += to_float(w[b * in + t]) * x[r * in + t];
      y[r * out + b] = s;
    }
  }
}

// The last `left` (< kRowsMax) input rows: the tile of exactly that height.
template <typename W, int B, int R>
void rest(int64_t left, const float* x, int64_t in, const W* w, float* y, int64_t out,
          Prefetch& pf) {
  if (left == R) {
    tile<W, B, R>(x, in, w, y, out, pf);
  } else if constexpr (R > 1) {
    rest<W, B, R - 1>(left, x, in, w, y, out, pf);
  }
}

// Every input row against B weight rows, R rows at a time.
template <typename W, int B>
void block(const float* x, int64_t rows, int64_t in, const W* w, float* y, int64_t out,
           Prefetch& pf) {
  int64_t r = 0;
  for (; r + kRowsMax <= rows; r += kRowsMax) {
    tile<W, B, kRowsMax>(x + r * in, in, w, y + r * out, out, pf);
  }
  if (r < rows) rest<W, B, kRowsMax - 1>(rows - r, x + r * in, in, w, y + r * out, out, pf);
}

}  // namespace

template <typename W>
void linear_rows(const float* x, int64_t rows, int64_t in, const W* w, int64_t out, float* y) {
  const int64_t blocks = out / kBlock;
  const int64_t block_bytes = kBlock * in * int64_t(sizeof(W));
  const char* w_end = reinterpret_cast<const char*>(w + out * in);
  // Many rows go kRowChunk at a time, so the rows a weight block meets stay in L2.
  for (int64_t r0 = 0; r0 < rows; r0 += kRowChunk) {
    const int64_t n = std::min(kRowChunk, rows - r0);
    const float* xc = x + r0 * in;
    float* yc = y + r0 * out;
    // Vector steps spent on one block, over the lines of the next one to fetch meanwhile.
    const int64_t steps = (n + kRowsMax - 1) / kRowsMax * (in / kLanes);
    const int64_t lines = std::max<int64_t>(1, block_bytes / kCacheLine);
    const int64_t every = std::max<int64_t>(1, steps / lines);
    const int64_t per = (lines + steps - 1) / std::max<int64_t>(1, steps);
    at::parallel_for(0, blocks, 16, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const W* wb = w + b * kBlock * in;
        const char* next = reinterpret_cast<const char*>(wb + kBlock * in);
        Prefetch pf{next, std::min(next + block_bytes, w_end), every, per};
        block<W, kBlock>(xc, n, in, wb, yc + b * kBlock, out, pf);
      }
    });
    for (int64_t j = blocks * kBlock; j < out; ++j) {  // the last out % kBlock weight rows
      Prefetch none{nullptr, nullptr, 1, 0};
      block<W, 1>(xc, n, in, w + j * in, yc + j, out, none);
    }
  }
}

template void linear_rows<float>(const float*, int64_t, int64_t, const float*, int64_t, float*);
template void linear_rows<uint16_t>(const float*, int64_t, int64_t, const uint16_t*, int64_t,
                                    float*);

}  // namespace radixserve
