// Pieces the paged-attention paths share (paged_attention.cpp, paged_few.cpp): constants,
// the pool's rows, a plan item, prefetching, and the few-query path's entry.
#pragma once

#include "paged_attention.h"
#include "vec.h"

#ifdef __AVX__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <limits>

namespace radixserve::paged {

constexpr int64_t kLanes = 8;  // queries per vector
constexpr int64_t kKeys = 8;   // keys per step
constexpr int64_t kAhead = 32;  // keys between a prefetch and its use
// "Nothing seen yet": finite, so that a lane with no visible key never computes inf - inf.
constexpr float kNone = -1e30f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Lane j of the result: the sum of a[j]'s lanes.
inline f8 hsum8(const f8* a) {
#ifdef __AVX__
  const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
#else
  f8 s;
  for (int j = 0; j < kKeys; ++j) s[j] = hsum(a[j]);
  return s;
#endif
}

inline float hmax(f8 v) {
  return std::max(std::max(std::max(v[0], v[4]), std::max(v[1], v[5])),
                  std::max(std::max(v[2], v[6]), std::max(v[3], v[7])));
}

template <typename KV>
struct Pools {
  const KV* k;
  const KV* v;
  const int64_t* slots;
  int64_t row_stride;  // kv_heads * head_dim
};

// One plan item, unpacked (fields as in paged_attention.h).
struct Item {
  int64_t row0, rows, key_start, num_keys, causal_offset;
  bool block;

  explicit Item(const int64_t* f)
      : row0(f[0]),
        rows(f[1]),
        key_start(f[2]),
        num_keys(f[3]),
        causal_offset(f[4]),
        block(f[5] != 0) {}

  // Keys of the item's stretch that its row `row` may see.
  int64_t visible(int64_t row) const {
    return std::clamp<int64_t>(causal_offset + row, 0, num_keys);
  }
};

// Cache lines of future rows (K and V, every KV head), handed to the prefetcher a few at a
// time between computations: a burst of hundreds would fill the core's miss buffers and
// stall the arithmetic behind it, so memory and compute would take turns instead of
// overlapping.
template <typename KV>
struct SpreadPrefetch {
  const Pools<KV>& pools;
  const int64_t* slots;
  int64_t key = 0, end = 0, byte = 0, per_call = 0;

  void start(int64_t begin, int64_t stop, int64_t calls) {
    key = begin;
    end = stop;
    byte = 0;
    const int64_t lines = (stop - begin) * pools.row_stride * int64_t(sizeof(KV)) / 64;
    per_call = (std::max<int64_t>(lines, 0) + calls - 1) / std::max<int64_t>(calls, 1);
  }

  void issue() {
    const int64_t row_bytes = pools.row_stride * int64_t(sizeof(KV));
    for (int64_t n = 0; n < per_call && key < end; ++n) {
      const int64_t off = slots[key] * pools.row_stride;
      __builtin_prefetch(reinterpret_cast<const char*>(pools.k + off) + byte);
      __builtin_prefetch(reinterpret_cast<const char*>(pools.v + off) + byte);
      byte += 64;
      if (byte >= row_bytes) {
        byte = 0;
        ++key;
      }
    }
  }
};

// The few-query path (paged_few.cpp): whether it takes an item of `rows` rows, and the item.
template <typename KV>
bool takes_few(int64_t rows, const AttentionShape& shape);
template <typename KV>
void run_few(const float* q, const Pools<KV>& pools, const int64_t* item,
             const AttentionPlan& plan, const AttentionShape& shape, float* part_o,
             float* part_m, float* part_l);

}  // namespace radixserve::paged
