// Pieces the paged-attention paths share (paged_attention.cpp, paged_few.cpp): constants,
// the pool's rows, a plan item, and the few-query path's entry.
#pragma once

#include "paged_attention.h"
#include "vec.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace radixserve::paged {

constexpr int64_t kLanes = 8;  // queries per vector
constexpr int64_t kKeys = 8;   // keys per step
// "Nothing seen yet": finite, so that a lane with no visible key never computes inf - inf.
constexpr float kNone = -1e30f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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

// The few-query path (paged_few.cpp): whether it takes an item of `rows` rows, and the item.
template <typename KV>
bool takes_few(int64_t rows, const AttentionShape& shape);
// `next`: the item this thread runs after this one (its first keys are fetched meanwhile), or
// null.
template <typename KV>
void run_few(const float* q, const Pools<KV>& pools, const int64_t* item, const int64_t* next,
             const AttentionPlan& plan, const AttentionShape& shape, float* part_o,
             float* part_m, float* part_l);

}  // namespace radixserve::paged
